"""What the observer hooks of :mod:`reinforge_report.plugin` do, per run.

- at the start of a run: read the run's ``sentinels:`` section and keep a :class:`~.sentinels.Sentinel`
  in ``run.state["reinforge-report"]`` (never at module level: one process runs many runs);
- after every training step and evaluation: feed it the record, print each new warning and, with
  ``halt: true``, ask the run to stop;
- at the end of a run with a run folder: write the report there (not for a diverged run, nor
  when the run file says ``report: {enabled: false}``) and put the page's path in ``summary["report"]``.
  A report that cannot be written is printed, never raised: it must not lose the run.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

from reinforge.plugin import RunStatus

from .sections import REPORT, SENTINELS, ReportSettings, section_of
from .sentinels import Sentinel, SentinelSettings

__all__ = ["STATE_KEY", "run_end", "run_start", "sentinel_of", "step_end"]

STATE_KEY = "reinforge-report"  # this distribution's slot in run.state


def _say(message: str) -> None:
    print(f"reinforge: {message}", file=sys.stderr, flush=True)


def run_start(run: Any) -> Sentinel:
    """Set up the run's sentinel from its ``sentinels:`` section (checked by core; a stand-in's raw mapping here)."""
    settings = section_of(run, SENTINELS, SentinelSettings)
    sentinel = Sentinel.from_settings(settings, getattr(run, "run_dir", None))
    run.state[STATE_KEY] = sentinel
    return sentinel


def sentinel_of(run: Any) -> Sentinel | None:
    """The run's sentinel (None when its settings could not be checked)."""
    state = getattr(run, "state", None)
    return state.get(STATE_KEY) if isinstance(state, dict) else None


def step_end(step: int, metrics: dict[str, Any], kind: str, run: Any) -> None:
    """Check the run so far; print each new warning and, with ``halt``, request a stop naming it."""
    sentinel = sentinel_of(run)
    if sentinel is None:
        return
    try:
        warnings = sentinel.observe(step, metrics, kind)
    except Exception as exc:  # a broken check is reported and switched off; it does not end the training
        sentinel.settings.enabled = False
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        _say(f"sentinel: the checks failed at step {step} and are off for the rest of the run: {detail}")
        return
    for w in warnings:
        _say(f"sentinel: {w.kind} at steps {w.start_step}-{w.end_step}: {w.message}")
        if sentinel.settings.halt and not run.stop_requested:
            run.request_stop(f"sentinel {w.kind}: {w.message}")


def run_end(summary: dict[str, Any], run: Any = None) -> None:
    """Write the report into ``summary["run_dir"]`` and set ``summary["report"]``; failures are printed."""
    sentinel = sentinel_of(run) if run is not None else None
    if run is not None and sentinel is not None:
        run.state.pop(STATE_KEY, None)
    if not isinstance(summary, dict) or not summary.get("run_dir"):
        return
    if summary.get("status") == RunStatus.DIVERGED:
        return
    if run is not None and not section_of(run, REPORT, ReportSettings).enabled:
        return
    try:
        from .report import write_report

        thresholds = sentinel.thresholds if sentinel is not None else None
        result = write_report(summary["run_dir"], thresholds=thresholds)
    except Exception as exc:  # a report problem must not lose the run
        _say(f"could not write the report: {exc}")
        return
    summary["report"] = str(result.html)
    _say(f"report {result.html}")
