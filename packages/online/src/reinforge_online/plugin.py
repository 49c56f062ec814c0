"""The module named by this distribution's ``reinforge`` entry point.

- adds the ``register_selection_strategies`` hookspec through core's historic
  ``reinforge_addhooks`` hook, so other plugins can publish selection strategies;
- registers the command ``reinforge online serve online.yaml``.

Loaded by every ``reinforge`` command, so it imports nothing heavy (no starlette, no httpx).
"""

from __future__ import annotations

from typing import Any

import pluggy

from reinforge.plugin import hookimpl


@hookimpl
def reinforge_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    from . import hookspecs

    caller = getattr(pluginmanager.hook, "register_selection_strategies", None)
    if caller is None or not caller.has_spec():
        pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def register_commands(register: Any) -> None:
    from .cli import HELP, add_arguments, run

    register("online serve", run, help=HELP, arguments=add_arguments)
