"""The plugin module named by this distribution's ``reinforge`` entry point.

Registers the ``react`` workflow and the built-in tools (only ``calculator``:
no shell or network tool is registered, so none can be enabled by accident).
"""

from __future__ import annotations

from typing import Any

from reinforge import hookimpl


@hookimpl
def register_workflows(register: Any) -> None:
    from .workflow import react_workflow

    register("react", react_workflow)


# optionalhook: the hookspec is ours, added to a plugin manager only when a tool registry is built,
# so core's checks of unknown hooks must not reject it before that.
@hookimpl(optionalhook=True)
def register_tools(register: Any) -> None:
    from .calculator import calculator

    register(calculator)
