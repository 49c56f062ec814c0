"""Entry point of ``reinforge-backend-local``: registers the ``local`` backend."""

from __future__ import annotations

from typing import Any

from reinforge import hookimpl


@hookimpl
def register_backends(register: Any) -> None:
    from .backend import LocalBackend

    register("local", LocalBackend)
