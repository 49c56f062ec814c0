"""The module named by the ``reinforge`` entry point: what reinforge-report registers.

- the command ``reinforge report RUN_DIR``;
- its run-file sections ``sentinels:`` and ``report:`` (:mod:`reinforge_report.sections`);
- observers: the live sentinels (``on_run_start``, ``on_step_end``) and the end-of-run report
  (``on_run_end``).

Loaded by every ``reinforge`` command, so it imports nothing heavy: the work is in
:mod:`reinforge_report.observers` and :mod:`reinforge_report.command`, imported when first used.
"""

from __future__ import annotations

from typing import Any

from reinforge.plugin import hookimpl


@hookimpl
def register_commands(register: Any) -> None:
    from .command import HELP, add_arguments, run

    register("report", run, help=HELP, arguments=add_arguments)


@hookimpl
def register_run_sections(register: Any) -> None:
    from .sections import register as register_sections

    register_sections(register)


@hookimpl
def on_run_start(run: Any) -> None:
    from .observers import run_start

    run_start(run)


@hookimpl
def on_step_end(step: int, metrics: dict[str, float], kind: str, run: Any) -> None:
    from .observers import step_end

    step_end(step, metrics, kind, run)


@hookimpl
def on_run_end(summary: dict[str, Any], run: Any) -> None:
    from .observers import run_end

    run_end(summary, run)
