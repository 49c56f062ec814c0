"""The plugin module named by this distribution's ``reinforge`` entry point.

- adds this package's ``register_tools`` hookspec through core's historic
  ``reinforge_addhooks`` hook, so other plugins can implement it and a typo in
  their hook names is caught like any other;
- registers the ``react`` workflow (:class:`ReactWorkflow`, with
  :class:`ReactSettings`: core checks ``workflow.args`` when a run loads and
  builds one workflow per run);
- registers the built-in tools: only ``calculator`` (no shell or network tool
  is registered, so none can be enabled by accident).
"""

from __future__ import annotations

from typing import Any

import pluggy

from reinforge.plugin import hookimpl


@hookimpl
def reinforge_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    from . import hookspecs

    caller = getattr(pluginmanager.hook, "register_tools", None)
    if caller is None or not caller.has_spec():
        pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def register_workflows(register: Any) -> None:
    from .workflow import ReactSettings, ReactWorkflow

    register(
        "react",
        ReactWorkflow,
        settings=ReactSettings,
        description="a ReAct agent episode per task: think, call tools, observe, answer",
    )


@hookimpl
def register_tools(register: Any) -> None:
    from .calculator import calculator

    register(calculator)
