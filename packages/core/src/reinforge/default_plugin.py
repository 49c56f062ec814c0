"""Core's own plugin: the built-in components, registered through the public hooks."""

from __future__ import annotations

from typing import Any

from .hookspecs import hookimpl


@hookimpl
def register_judges(register: Any) -> None:
    from .judges.rules import RULE_JUDGES

    for name, func in RULE_JUDGES.items():
        register(name, func)
