"""Entry point of ``reinforge-backend-local``: registers the ``local`` backend."""

from __future__ import annotations

from typing import Any

from reinforge import hookimpl


@hookimpl
def register_backends(register: Any) -> None:
    from .backend import LocalBackend

    register("local", LocalBackend)


@hookimpl
def register_commands(register: Any) -> None:
    from . import export

    register("export", export.run, help=export.HELP, arguments=export.add_arguments)

    from .serve import command as serve

    register("serve", serve.run, help="serve a model, run or checkpoint over OpenAI's API", arguments=serve.arguments)
