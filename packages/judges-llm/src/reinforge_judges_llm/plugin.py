"""The module named by the ``reinforge`` entry point: what reinforge-judges-llm registers.

- judges ``llm-pointwise`` and ``llm-pairwise``;
- group reward ``llm-listwise``;
- commands ``reinforge judge calibrate`` and ``reinforge judge audit``.

The judges are classes registered with their settings classes: core checks a
run file's ``args`` against the settings before any model loads, builds one
judge per run (``PointwiseJudge(settings)``) and closes it when the run ends.
"""

from __future__ import annotations

from typing import Any

from reinforge.plugin import hookimpl

from .config import ListwiseConfig, PairwiseConfig, PointwiseConfig
from .judges import ListwiseJudge, PairwiseJudge, PointwiseJudge

REWARD_RANGE = (0.0, 1.0)  # every verdict is normalized onto [0, 1], boundary scores included


@hookimpl
def register_judges(register: Any) -> None:
    register(
        "llm-pointwise",
        PointwiseJudge,
        settings=PointwiseConfig,
        kind="model",
        reward_range=REWARD_RANGE,
        description="rubric + discrete scale + anchors, reason before verdict; optional length normalization",
    )
    register(
        "llm-pairwise",
        PairwiseJudge,
        settings=PairwiseConfig,
        kind="model",
        reward_range=REWARD_RANGE,
        description="the response against a reference response, asked in both orders",
    )


@hookimpl
def register_group_rewards(register: Any) -> None:
    register(
        "llm-listwise",
        ListwiseJudge,
        settings=ListwiseConfig,
        kind="model",
        reward_range=REWARD_RANGE,
        description="all responses of a group scored together over K shuffled orders",
    )


@hookimpl
def register_commands(register: Any) -> None:
    from .commands import audit_arguments, calibrate_arguments, run_audit, run_calibrate

    register(
        "judge calibrate",
        run_calibrate,
        help="agreement of a judge with a human-labelled gold set (Spearman, Kendall, Cohen's kappa)",
        arguments=calibrate_arguments,
    )
    register(
        "judge audit",
        run_audit,
        help="a judge's position-flip rate and length correlation on a sample",
        arguments=audit_arguments,
    )
