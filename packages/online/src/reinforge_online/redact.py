"""The redaction hook: a function that sees every call before it is stored.

``redact: my_module:scrub`` in ``online.yaml`` (or ``build_app(..., redact=scrub)``) names
``scrub(call: CallRecord) -> CallRecord | None``: it may change the request and response
(mask e-mail addresses, drop tool outputs) or return None to keep the call out of the store.
It runs on the event loop after the response was prepared: keep it fast. Headers are never
stored in the first place, so credentials need no redaction.
"""

from __future__ import annotations

from collections.abc import Callable

from reinforge.plugin import ConfigError, Kind, Registry, ResolveError, resolve_ref

from .config import OnlineSettings
from .store import CallRecord

__all__ = ["REDACTORS", "Redactor", "resolve_redactor"]

Redactor = Callable[[CallRecord], "CallRecord | None"]
REDACTORS = Kind("redactors", "redactor")


def resolve_redactor(settings: OnlineSettings, where: str = "online.yaml") -> Redactor | None:
    """The function ``settings.redact`` names (``module:function``), None when it names none."""
    if settings.redact is None:
        return None
    registry = Registry()
    registry.add_kind(REDACTORS)  # no names: only module:function references resolve
    try:
        found = resolve_ref(settings.redact, REDACTORS, registry, where=f"{where}: redact", base_dir=settings.base_dir)
    except ResolveError as exc:
        raise ConfigError(str(exc)) from None
    if not callable(found):
        raise ConfigError(f"{where}: redact: {settings.redact!r} is not callable")
    redactor: Redactor = found
    return redactor
