"""reinforge-report: plots of a training run with reward-hacking warnings, and live sentinels.

- ``reinforge report RUN_DIR`` (:func:`write_report`): a PNG dashboard, a self-contained HTML page
  and a JSON summary of a run folder's ``metrics.jsonl``;
- the same reward-hacking checks (:func:`detect_warnings`) during training, configured by the run
  file's ``sentinels:`` mapping (:class:`SentinelSettings`): print each new warning, or stop the run;
- the report written into the run folder when a training run ends.
"""

from __future__ import annotations

from .__about__ import __version__
from .detectors import DIVERGENCE, ENTROPY, LENGTH, HackingWarning, Thresholds, detect_warnings
from .metrics import RunMetrics, load_metrics, metrics_from_records, read_records
from .report import ReportResult, write_report
from .sentinels import Sentinel, SentinelSettings

__all__ = [
    "DIVERGENCE",
    "ENTROPY",
    "LENGTH",
    "HackingWarning",
    "ReportResult",
    "RunMetrics",
    "Sentinel",
    "SentinelSettings",
    "Thresholds",
    "__version__",
    "detect_warnings",
    "load_metrics",
    "metrics_from_records",
    "read_records",
    "write_report",
]
