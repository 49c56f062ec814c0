"""Entry point of ``reinforge-backend-local``: registers the ``local`` backend, its commands, and reinforge-online's
``local`` committer.

The committer hook is reinforge-online's (``register_committers``); it is optional here, so this package loads
and works without reinforge-online installed (the hook then has no specification and is never called).
"""

from __future__ import annotations

from typing import Any

from reinforge import hookimpl


@hookimpl
def register_backends(register: Any) -> None:
    from .backend import LocalBackend

    register("local", LocalBackend)


@hookimpl
def register_commands(register: Any) -> None:
    from .serve import export

    register("export", export.run, help=export.HELP, arguments=export.add_arguments)

    from .serve import command as serve

    register("serve", serve.run, help="serve a model, run or checkpoint over OpenAI's API", arguments=serve.arguments)


@hookimpl(optionalhook=True)
def register_committers(register: Any) -> None:
    from .online.committer import LocalCommitterSettings, local_committer

    register(
        "local",
        local_committer,
        settings=LocalCommitterSettings,
        description="train the served policy's LoRA on each batch into a version that online's promotion gate serves",
    )
