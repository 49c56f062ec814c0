"""Which requests the gateway samples: a sticky sampling rate, explicit marking, or a plugin's strategy.

The built-ins (``sampling_rate``, ``explicit``) are known by name; any other name is looked
up among the strategies plugins register through the ``register_selection_strategies``
hook (two plugins claiming one name is an error naming both).
"""

from __future__ import annotations

import hashlib
import hmac
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pluggy

from reinforge.plugin import ConfigError, Kind, Registry, collect, get_plugin_manager, load_settings, suggest

from .config import SelectionSettings

__all__ = [
    "SELECTION_STRATEGIES",
    "ExplicitMarking",
    "SamplingRate",
    "Selection",
    "SelectionRequest",
    "build_selection",
    "selection_registry",
    "selection_secret",
    "session_of",
]

SELECTION_STRATEGIES = Kind("selection_strategies", "selection strategy")


@dataclass
class SelectionRequest:
    """What a strategy sees of one request: its headers (lower-case names), JSON body and session."""

    route: str
    headers: Mapping[str, str]
    body: dict[str, Any]
    session_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Selection(Protocol):
    """A selection strategy: whether to sample one request (fast, on the event loop, never blocking)."""

    def select(self, request: SelectionRequest) -> bool: ...


def session_of(headers: Mapping[str, str], body: Mapping[str, Any], header: str = "x-session-id") -> str | None:
    """The session a request belongs to: the ``header``, else the body's ``user``, else None."""
    value = headers.get(header)
    if value:
        return value
    user = body.get("user")
    return user if isinstance(user, str) and user else None


class SamplingRate:
    """Sample a fraction ``p`` of sessions, sticky: a session is in or out for all its requests.

    The decision is ``HMAC-SHA256(secret, salt, session) < p`` as a fraction of 2**64: the same on
    every gateway replica with the same secret and salt, and not computable by a client, which cannot
    know the secret (the gateway's comes from the environment, never from online.yaml). Without a
    secret it is a plain SHA-256 of salt and session. A request without a session is drawn alone.
    """

    def __init__(self, p: float, salt: str = "", *, secret: bytes = b"") -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"SamplingRate: p must be in [0, 1], got {p}")
        self.p = p
        self.salt = salt.encode()
        self.secret = secret
        self._random = random.Random()

    def decide(self, session_id: str | None) -> bool:
        """The decision for one session (a fresh draw for None)."""
        if self.p >= 1.0:
            return True
        if self.p <= 0.0:
            return False
        if session_id is None:
            return self._random.random() < self.p
        message = self.salt + b"\x00" + session_id.encode()
        if self.secret:
            digest = hmac.new(self.secret, message, hashlib.sha256).digest()
        else:
            digest = hashlib.sha256(message).digest()
        return int.from_bytes(digest[:8], "big") < self.p * 2**64

    def select(self, request: SelectionRequest) -> bool:
        return self.decide(request.session_id)


class ExplicitMarking:
    """The caller marks requests: ``header: 1`` samples, ``0`` (or absent) does not.

    ``otherwise`` decides requests without the header (e.g. a :class:`SamplingRate`).
    """

    def __init__(self, header: str = "x-reinforge-sample", otherwise: Selection | None = None) -> None:
        self.header = header.lower()
        self.otherwise = otherwise

    def select(self, request: SelectionRequest) -> bool:
        value = request.headers.get(self.header)
        if value is not None:
            return value.strip().lower() in ("1", "true", "yes")
        return self.otherwise.select(request) if self.otherwise is not None else False


def selection_registry(pm: pluggy.PluginManager | None = None) -> Registry:
    """Every plugin's ``register_selection_strategies`` (this package's built-ins included)."""
    pm = pm or get_plugin_manager()
    registry = Registry(plugin_manager=pm)
    collect(pm, SELECTION_STRATEGIES, registry)
    return registry


def selection_secret(feedback_secret: bytes) -> bytes:
    """The gateway's sampling secret, derived from its feedback secret (shared by its replicas, never in the file)."""
    return hmac.new(feedback_secret, b"reinforge-online selection", hashlib.sha256).digest()


def _builtin(settings: SelectionSettings, secret: bytes) -> Selection | None:
    if settings.strategy == "sampling_rate":
        return SamplingRate(settings.sampling_rate, settings.salt, secret=secret)
    if settings.strategy == "explicit":
        rate = (
            SamplingRate(settings.sampling_rate, settings.salt, secret=secret) if settings.sampling_rate > 0 else None
        )
        return ExplicitMarking(settings.header, otherwise=rate)
    return None


def build_selection(
    settings: SelectionSettings,
    *,
    where: str = "online.yaml",
    pm: pluggy.PluginManager | None = None,
    secret: bytes = b"",
) -> Selection:
    """The strategy ``settings`` name: a built-in, or one a plugin registered (built with ``selection.args``).

    ``secret`` keys the built-in sampling rate's hash (:func:`selection_secret`).
    """
    found = _builtin(settings, secret)
    if found is not None:
        if settings.args:
            raise ConfigError(f"{where}: selection.args: the {settings.strategy} strategy takes no args")
        return found
    registry = selection_registry(pm)
    entry = registry.get(SELECTION_STRATEGIES, settings.strategy)
    if entry is None:
        names = sorted({"sampling_rate", "explicit", *registry.names(SELECTION_STRATEGIES)})
        raise ConfigError(
            f"{where}: selection.strategy: unknown strategy {settings.strategy!r}{suggest(settings.strategy, names)}"
            f"; known: {', '.join(names)}"
        )
    try:
        if entry.settings is not None:
            made = entry.obj(load_settings(entry.settings, settings.args, where=where, prefix="selection.args"))
        else:
            made = entry.obj(**settings.args)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"{where}: selection: building {settings.strategy!r} (from {entry.owner}) failed: {exc}"
        ) from exc
    if not callable(getattr(made, "select", None)):
        raise ConfigError(f"{where}: selection: {settings.strategy!r} (from {entry.owner}) has no select(request)")
    return made
