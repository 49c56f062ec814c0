"""The module named by this distribution's ``reinforge`` entry point.

- adds the ``register_selection_strategies`` and ``register_committers`` hookspecs through core's
  historic ``reinforge_addhooks`` hook, so other plugins can publish strategies and committers;
- registers this package's own committer, ``sink``, through that same hook;
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

    caller = getattr(pluginmanager.hook, "register_committers", None)
    if caller is None or not caller.has_spec():
        pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def register_committers(register: Any) -> None:
    from .sink import SinkSettings, sink_committer

    register("sink", sink_committer, settings=SinkSettings, description="each batch as a JSONL file in args.path")


@hookimpl
def register_commands(register: Any) -> None:
    from .cli import HELP, add_arguments, run

    register("online serve", run, help=HELP, arguments=add_arguments)

    from .admin_cli import (
        ROLLBACK_HELP,
        VERSIONS_HELP,
        rollback_arguments,
        run_rollback,
        run_versions,
        versions_arguments,
    )

    register("online versions", run_versions, help=VERSIONS_HELP, arguments=versions_arguments)
    register("online rollback", run_rollback, help=ROLLBACK_HELP, arguments=rollback_arguments)
