"""The module named by the ``reinforge`` entry point: what reinforge-judges-llm registers.

- judges ``llm-pointwise`` and ``llm-pairwise``;
- group reward ``llm-listwise``;
- commands ``reinforge judge calibrate`` and ``reinforge judge audit``.
"""

from __future__ import annotations

from typing import Any

from reinforge import hookimpl

from .judges import llm_listwise, llm_pairwise, llm_pointwise


@hookimpl
def register_judges(register: Any) -> None:
    register("llm-pointwise", llm_pointwise)
    register("llm-pairwise", llm_pairwise)


@hookimpl
def register_group_rewards(register: Any) -> None:
    register("llm-listwise", llm_listwise)


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
