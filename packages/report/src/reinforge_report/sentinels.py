"""Live sentinels: the report's reward-hacking checks, run on the metrics as training goes.

A run file's ``sentinels:`` mapping (core passes it through as ``run.config.sentinels``) is checked
into :class:`SentinelSettings`. One :class:`Sentinel` per run keeps the metrics seen so far in a
:class:`~reinforge_report.metrics.RunMetrics` and, after each record, returns the warnings of
:func:`~reinforge_report.detectors.detect_warnings` that it had not returned before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reinforge.plugin import FieldError, Settings, at_least, load_settings, suggest
from reinforge.plugin import metric_names as mn

from .detectors import HackingWarning, ThresholdError, Thresholds, detect_warnings
from .metrics import METRICS_FILE, RunMetrics

__all__ = ["Sentinel", "SentinelSettings", "load_sentinel_settings"]


@dataclass
class SentinelSettings(Settings):
    """The run file's ``sentinels:`` keys.

    :ivar enabled: run the checks during training (the end-of-run report runs either way).
    :ivar halt: stop the run (``run.request_stop``) at the first new warning; otherwise only print it.
    :ivar every: run the checks at training steps divisible by this (and after every evaluation).
    :ivar thresholds: overrides of :class:`~reinforge_report.detectors.Thresholds`, by name; used
        by the end-of-run report too.
    """

    enabled: bool = True
    halt: bool = False
    every: int = 1
    thresholds: dict[str, float] = field(default_factory=dict)

    def check(self) -> None:
        at_least("every", self.every, 1)
        self.detector_thresholds()

    def detector_thresholds(self) -> Thresholds:
        """:attr:`thresholds` as a :class:`Thresholds` (the defaults for keys not set)."""
        try:
            return Thresholds.from_mapping(self.thresholds)
        except ThresholdError as exc:
            key = f"thresholds.{exc.key}"
            if exc.unknown:
                raise FieldError(key, suggest(exc.key, Thresholds.names()), form="unknown") from None
            raise FieldError(key, exc.detail) from None


def load_sentinel_settings(data: Any, *, where: str) -> SentinelSettings:
    """Check a run file's ``sentinels:`` value; errors start with ``where`` and name ``sentinels.<key>``."""
    return load_settings(SentinelSettings, data, where=where, prefix="sentinels")


@dataclass
class Sentinel:
    """The checks of one run: the metrics seen so far and the warnings already raised."""

    settings: SentinelSettings
    thresholds: Thresholds
    metrics: RunMetrics = field(default_factory=lambda: RunMetrics(path=Path(METRICS_FILE)))
    raised: list[tuple[str, int, int]] = field(default_factory=list)  # (kind, first step, last step)

    @classmethod
    def from_settings(cls, settings: SentinelSettings, run_dir: str | None = None) -> Sentinel:
        path = Path(run_dir) / METRICS_FILE if run_dir else Path(METRICS_FILE)
        return cls(settings, settings.detector_thresholds(), RunMetrics(path=path))

    def observe(self, step: int, metrics: dict[str, Any], kind: str) -> list[HackingWarning]:
        """Take one ``on_step_end`` record; the warnings not raised before (none when the checks did not run)."""
        if not self.settings.enabled or not self.metrics.add({**metrics, mn.KIND: kind, mn.STEP: step}):
            return []
        if kind == mn.KIND_TRAIN and step % self.settings.every:
            return []
        return [w for w in detect_warnings(self.metrics, self.thresholds) if self._is_new(w)]

    def _is_new(self, warning: HackingWarning) -> bool:
        """False when a warning of the same kind already raised overlaps it (its span is then widened)."""
        for i, (kind, lo, hi) in enumerate(self.raised):
            if kind == warning.kind and warning.start_step <= hi and lo <= warning.end_step:
                self.raised[i] = (kind, min(lo, warning.start_step), max(hi, warning.end_step))
                return False
        self.raised.append((warning.kind, warning.start_step, warning.end_step))
        return True
