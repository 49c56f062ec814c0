"""Entry point of ``reinforge-backend-trinity``: registers the ``trinity`` backend."""

from __future__ import annotations

from typing import Any

from reinforge import hookimpl


@hookimpl
def register_backends(register: Any) -> None:
    from .backend import TrinityBackend

    register("trinity", TrinityBackend)
