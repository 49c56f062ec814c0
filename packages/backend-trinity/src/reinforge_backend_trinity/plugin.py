"""Entry point of ``reinforge-backend-trinity``: registers the ``trinity`` backend and reinforge-online's ``trinity``
committer.

The committer hook is reinforge-online's (``register_committers``); it is optional here, so this package loads
and works without reinforge-online installed (the hook then has no specification and is never called).
"""

from __future__ import annotations

from typing import Any

from reinforge import hookimpl


@hookimpl
def register_backends(register: Any) -> None:
    from .backend import TrinityBackend

    register("trinity", TrinityBackend)


@hookimpl(optionalhook=True)
def register_committers(register: Any) -> None:
    from .online_committer import TrinityCommitterSettings, trinity_committer

    register(
        "trinity",
        trinity_committer,
        settings=TrinityCommitterSettings,
        description="feedback and commit to a Trinity-RFT serve-mode explorer",
    )
