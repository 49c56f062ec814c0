"""The report's own sections of the run file, registered through ``register_run_sections``.

- ``sentinels:`` (:class:`~reinforge_report.sentinels.SentinelSettings`): the live checks;
- ``report:`` (:class:`ReportSettings`): whether the end-of-run report is written.

Core checks both like its own keys (a typo is a ``ConfigError`` naming ``sentinels.<key>``) and hands the
checked instances to the observers as ``run.config.section(name)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reinforge.plugin import Settings

from .sentinels import SentinelSettings

__all__ = ["REPORT", "SENTINELS", "ReportSettings", "register"]

SENTINELS = "sentinels"
REPORT = "report"


@dataclass
class ReportSettings(Settings):
    """The run file's ``report:`` keys.

    :ivar enabled: write the report into the run folder when the run ends (not for a diverged run).
    """

    enabled: bool = True


def register(register: Any) -> None:
    """Both sections, for :func:`reinforge_report.plugin.register_run_sections`."""
    register(SENTINELS, SentinelSettings, description="live reward-hacking checks during training")
    register(REPORT, ReportSettings, description="the end-of-run report")


def section_of(run: Any, name: str, cls: type[Settings]) -> Any:
    """The run's checked section ``name``, its defaults when the run file has none.

    A run context whose config is not a ``RunConfig`` (a test's stand-in) may carry the raw mapping under
    ``sections``; it is checked here with the same messages.
    """
    config = getattr(run, "config", None)
    sections = getattr(config, "sections", None) or {}
    value = sections.get(name)
    if isinstance(value, cls):
        return value
    from reinforge.plugin import load_settings

    source = getattr(config, "source", None) or ("tune()" if getattr(run, "kind", "tune") == "tune" else "evaluate()")
    return load_settings(cls, value or {}, where=str(source), prefix=name)
