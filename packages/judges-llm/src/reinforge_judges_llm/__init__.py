"""reinforge-judges-llm: bias-controlled LLM judges for reinforge.

Registered: judges ``llm-pointwise`` and ``llm-pairwise``, group reward
``llm-listwise`` (the classes :class:`PointwiseJudge`, :class:`PairwiseJudge`
and :class:`ListwiseJudge` with their settings classes; core builds one judge
per run and closes it at the end), commands ``reinforge judge calibrate`` and
``reinforge judge audit``. Importing this package does not import LiteLLM.
"""

from __future__ import annotations

from .__about__ import __version__
from .audit import AuditReport, audit, audit_async
from .calibration import (
    CalibrationError,
    CalibrationReport,
    calibrate,
    calibrate_async,
    load_examples,
    require_calibration,
)
from .client import JudgeConfigError, Usage
from .config import ListwiseConfig, PairwiseConfig, PointwiseConfig
from .families import model_family
from .judges import ListwiseJudge, PairwiseJudge, PointwiseJudge
from .stats import cohen_kappa, kendall_tau, pearson, rankdata, spearman

__all__ = [
    "__version__",
    "AuditReport",
    "CalibrationError",
    "CalibrationReport",
    "JudgeConfigError",
    "ListwiseConfig",
    "ListwiseJudge",
    "PairwiseConfig",
    "PairwiseJudge",
    "PointwiseConfig",
    "PointwiseJudge",
    "Usage",
    "audit",
    "audit_async",
    "calibrate",
    "calibrate_async",
    "cohen_kappa",
    "kendall_tau",
    "load_examples",
    "model_family",
    "pearson",
    "rankdata",
    "require_calibration",
    "spearman",
]
