"""The run lifecycle core owns: one :class:`RunContext` per ``tune`` or ``eval``.

A backend runs inside ``with job.running() as run:`` and reports
``run.step_end(metrics)`` and ``run.eval_end(metrics)``; core emits the
observer hooks. ``on_run_end`` is sent from a ``finally``, exactly once,
whatever ended the run, and the run's components are closed after it.
Backends never call hooks themselves.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import metric_names as mn

if TYPE_CHECKING:
    from .config import RunConfig
    from .trajectory import Trajectory

__all__ = ["RunContext", "RunStatus"]

log = logging.getLogger("reinforge.lifecycle")


class RunStatus:
    """The values of ``summary["status"]``."""

    FINISHED = "finished"
    STOPPED = "stopped"  # an observer (a sentinel) asked it to stop
    INTERRUPTED = "interrupted"  # Ctrl-C
    FAILED = "failed"  # an exception ended it
    DIVERGED = "diverged"  # the loss or gradients became non-finite


@dataclass
class RunContext:
    """What observers and the backend share about one run.

    :ivar config: the run's :class:`~reinforge.config.RunConfig`.
    :ivar kind: ``"tune"`` or ``"eval"``.
    :ivar run_dir: the run folder, once the backend made one (:meth:`set_run_dir`).
    :ivar step: the last step reported.
    :ivar state: per-run storage for observer plugins, keyed by distribution name.
    :ivar summary: what ``on_run_end`` receives; the backend adds its final metrics.
    """

    config: RunConfig
    kind: str = "tune"
    hook: Any = field(default=None, repr=False)
    run_dir: str | None = None
    step: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    stop_reason: str | None = None
    started: float = field(default_factory=time.time)
    _closers: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _ended: bool = field(default=False, repr=False)

    # -- for observers ---------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Ask the backend to stop after the current step (then evaluate, save and report).

        The first reason wins and is reported as ``summary["stop_reason"]``.
        """
        if self.stop_reason is None:
            self.stop_reason = str(reason)
            log.warning("stop requested: %s", reason)

    @property
    def stop_requested(self) -> bool:
        """True once an observer (or the user, through the backend) asked to stop."""
        return self.stop_reason is not None

    # -- for backends ----------------------------------------------------------------------

    def set_run_dir(self, path: Any) -> None:
        """Tell observers where the run writes (metrics, checkpoints, report)."""
        self.run_dir = str(path)
        self.summary["run_dir"] = self.run_dir

    def step_end(self, metrics: dict[str, Any], *, step: int | None = None) -> None:
        """Report one finished training step; observers see it through ``on_step_end(kind="train")``."""
        self.step = self.step + 1 if step is None else step
        self._emit(metrics, mn.KIND_TRAIN)

    def eval_end(self, metrics: dict[str, Any], *, step: int | None = None) -> None:
        """Report one evaluation (step 0 = the base model); ``on_step_end(kind="eval")``."""
        self._emit(metrics, mn.KIND_EVAL, self.step if step is None else step)

    def trajectory_end(self, trajectory: Trajectory) -> None:
        """Report one finished rollout, kept or discarded; observers see it through ``on_trajectory``.

        Core's runner calls it for every trajectory of a run's batches.
        """
        if self.hook is not None:
            self.hook.on_trajectory(trajectory=trajectory, run=self)

    def on_close(self, closer: Callable[[], None]) -> None:
        """Run ``closer`` when the run ends, after ``on_run_end`` (last registered, first run)."""
        self._closers.append(closer)

    def _emit(self, metrics: dict[str, Any], kind: str, step: int | None = None) -> None:
        if self.hook is None:
            return
        numbers = {k: v for k, v in metrics.items() if _is_number(v)}
        self.hook.on_step_end(step=self.step if step is None else step, metrics=numbers, kind=kind, run=self)

    # -- core ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _lifecycle(self) -> Iterator[RunContext]:
        """Emit ``on_run_start``, yield, then ``on_run_end`` from a ``finally`` and close the components."""
        try:
            if self.hook is not None:
                self.hook.on_run_start(run=self)
            yield self
        except KeyboardInterrupt:
            self.summary.setdefault("status", RunStatus.INTERRUPTED)
            raise
        except BaseException as exc:
            self.summary["status"] = RunStatus.FAILED
            self.summary["error"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._end()

    def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        summary = self.summary
        if self.stop_reason is not None:
            summary.setdefault("stop_reason", self.stop_reason)
            if summary.get("status") in (None, RunStatus.FINISHED):
                summary["status"] = RunStatus.STOPPED
        summary.setdefault("status", RunStatus.FINISHED)
        if self.run_dir is not None:
            summary.setdefault("run_dir", self.run_dir)
        try:
            if self.hook is not None:
                self.hook.on_run_end(summary=summary, run=self)
        finally:
            while self._closers:
                closer = self._closers.pop()
                try:
                    closer()
                except Exception:  # closing must not hide what ended the run
                    log.exception("closing a component of the run failed")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
