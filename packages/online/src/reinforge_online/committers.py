"""Committers: where rewarded batches go, published by plugins through the ``register_committers`` hook.

A committer is any object with ``send(batch_id, rows)`` (and optionally ``close()``). The outbox
(:mod:`reinforge_online.outbox`) hands it each batch, and hands it the same batch id again after a
failure, so ``send`` must accept an id twice. ``committer.kind`` in ``online.yaml`` names one by
the name a plugin registered; ``committer.args`` are checked against the settings class it
registered with (errors name the file and ``committer.args.<key>``) before anything binds::

    from dataclasses import dataclass
    from reinforge import hookimpl
    from reinforge.plugin import Settings

    @dataclass
    class KafkaSettings(Settings):
        topic: str = "rewarded"

    @hookimpl
    def register_committers(register):
        register("kafka", lambda settings, context: KafkaCommitter(settings.topic), settings=KafkaSettings)

``none`` (the default) is no committer: rewarded traces stay in the store. This package registers
``sink`` (JSONL files) through its own plugin module, the same hook; reinforge-backend-local
registers ``local`` and reinforge-backend-trinity ``trinity``. Two plugins registering one name is
an error naming both, when that name is used.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pluggy

from reinforge.plugin import (
    ConfigError,
    Kind,
    NoSettings,
    PluginError,
    Registry,
    Settings,
    collect,
    get_plugin_manager,
    load_settings,
    suggest,
)

from .versions import Version

__all__ = [
    "COMMITTERS",
    "NONE",
    "Committer",
    "CommitterContext",
    "CommitterFactory",
    "CommitterPlan",
    "build_committer",
    "committer_registry",
    "plan_committer",
]

COMMITTERS = Kind("committers", "committer")
NONE = "none"  # committer.kind: no committer (not a registered name)
# names that come with another package, for the hint when that package is missing
_ELSEWHERE = {
    "local": "reinforge-backend-local: pip install 'reinforge-online[local]'",
    "trinity": "reinforge-backend-trinity: pip install 'reinforge-online[trinity]'",
}


@runtime_checkable
class Committer(Protocol):
    """Where a batch of rewarded traces goes.

    ``send`` runs on the outbox's thread, never on the request path. It raises when the batch did
    not get through; the batch then stays ``committing`` and ``send`` is called again with the same
    ``batch_id`` (and the same rows), after a backoff or at the next start. A committer may also have
    ``close()``, called once when the gateway or trainer stops.
    """

    def send(self, batch_id: str, rows: list[dict[str, Any]]) -> Version | None:
        """Hand the batch on; None (a :class:`~reinforge_online.versions.VersionedCommitter` returns the
        version the batch made, which the promotion gate then decides about)."""


@dataclass(frozen=True)
class CommitterContext:
    """What a committer's factory gets beside its settings: where it is configured, and from what.

    :ivar where: the file (``online.yaml``) or ``OnlineTrainer()``, first in every message.
    :ivar base_dir: the file's folder (the working directory for the Python API): relative paths
        in the committer's settings are relative to it (:meth:`path`).
    :ivar policy_url: ``policy.url`` of ``online.yaml`` (the server that answers sampled requests),
        or None (no policy section, or the Python API, whose policy is a client object).
    :ivar args_key: the dotted key of the committer's settings, for messages (``committer.args``).
    :ivar kind_key: the dotted key that names the committer, for messages (``committer.kind``).
    """

    where: str = "online.yaml"
    base_dir: Path = Path(".")
    policy_url: str | None = None
    args_key: str = "committer.args"
    kind_key: str = "committer.kind"

    def key(self, name: str) -> str:
        """The dotted key of one of the committer's settings: ``committer.args.<name>``."""
        return f"{self.args_key}.{name}" if name else self.args_key

    def error(self, name: str, detail: str) -> ConfigError:
        """A :class:`ConfigError` naming the file and ``committer.args.<name>`` (for the factory to raise)."""
        return ConfigError(f"{self.where}: {self.key(name)}: {detail}")

    def path(self, value: str | os.PathLike[str]) -> Path:
        """``value`` (``~`` expanded) as an absolute path, relative ones against :attr:`base_dir`."""
        found = Path(value).expanduser()
        return found if found.is_absolute() else (Path(self.base_dir) / found).resolve()

    def secret(self, env_name: str | None, key: str) -> str:
        """The value of the environment variable ``env_name``, which ``committer.args.<key>`` names.

        Secrets never sit in ``online.yaml``: it names the variable that holds one.

        :raises ConfigError: no variable named, or it is unset or empty (the message names the file and key).
        """
        if not env_name:
            raise self.error(key, "is required: the name of the environment variable that holds the secret")
        value = os.environ.get(env_name)
        if not value:
            raise self.error(key, f"the environment variable {env_name} is not set or empty")
        return value


CommitterFactory = Callable[[Any, CommitterContext], Committer]  # factory(settings, context) -> committer


@dataclass
class CommitterPlan:
    """A committer resolved and its settings checked, not built yet (nothing started, nothing connected)."""

    name: str
    owner: str
    factory: Callable[..., Any]
    settings: Any

    def build(self, context: CommitterContext) -> Committer:
        """Call the factory once; what it returns must have ``send(batch_id, rows)``.

        :raises ConfigError: the factory raised (a :class:`ConfigError` of its own passes unchanged).
        """
        try:
            made = self.factory(self.settings, context)
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(
                f"{context.where}: {context.args_key}: building the committer {self.name!r} (from {self.owner}) "
                f"failed: {type(exc).__name__}: {exc}"
            ) from exc
        if not callable(getattr(made, "send", None)):
            raise ConfigError(
                f"{context.where}: the committer {self.name!r} (from {self.owner}) has no send(batch_id, rows)"
            )
        committer: Committer = made
        return committer


def _ensure_builtins(pm: pluggy.PluginManager) -> None:
    """This package's own plugin (its hookspecs and ``sink``) on ``pm``, as core keeps its default plugin."""
    from . import plugin

    if not pm.is_registered(plugin) and pm.get_plugin("reinforge-online") is None:
        pm.register(plugin, name="reinforge-online")


def committer_registry(pm: pluggy.PluginManager | None = None) -> Registry:
    """Every plugin's ``register_committers`` (this package's ``sink`` included, also on a given ``pm``)."""
    pm = pm or get_plugin_manager()
    _ensure_builtins(pm)
    registry = Registry(plugin_manager=pm)
    for broken in getattr(pm, "broken", ()):
        registry.broken[broken.distribution] = broken.reason
    collect(pm, COMMITTERS, registry)
    return registry


def plan_committer(
    kind: str,
    args: dict[str, Any] | None = None,
    *,
    where: str = "online.yaml",
    kind_key: str = "committer.kind",
    args_key: str = "committer.args",
    pm: pluggy.PluginManager | None = None,
) -> CommitterPlan | None:
    """The committer ``kind`` names with ``args`` checked against its settings; None for ``none``.

    :raises ConfigError: an unknown name (with the closest one and every known name), a name two
        plugins registered (naming both), or ``args`` its settings class refuses (naming ``args_key.<key>``).
    """
    if kind == NONE:
        if args:
            raise ConfigError(f"{where}: {args_key}: there is no committer ({kind_key}: none) to take them")
        return None
    registry = committer_registry(pm)
    try:
        entry = registry.get(COMMITTERS, kind)
    except PluginError as exc:
        raise ConfigError(f"{where}: {kind_key}: {exc}") from None
    if entry is None:
        names = sorted({NONE, *registry.names(COMMITTERS)})
        hint = f"; {kind!r} comes with {_ELSEWHERE[kind]}" if kind in _ELSEWHERE else ""
        raise ConfigError(
            f"{where}: {kind_key}: unknown committer {kind!r}{suggest(kind, names)}; known: {', '.join(names)}"
            f"{hint}{registry.broken_note()}"
        )
    settings_cls = entry.settings or NoSettings
    if not (isinstance(settings_cls, type) and issubclass(settings_cls, Settings)):
        raise ConfigError(
            f"{where}: {kind_key}: {kind!r} (from {entry.owner}) registered settings that are not a Settings class"
        )
    settings = load_settings(settings_cls, dict(args or {}), where=where, prefix=args_key)
    return CommitterPlan(kind, entry.owner, entry.obj, settings)


def build_committer(
    kind: str,
    args: dict[str, Any] | None = None,
    context: CommitterContext | None = None,
    *,
    pm: pluggy.PluginManager | None = None,
) -> Committer | None:
    """:func:`plan_committer`, then its factory called with ``context``: the committer, or None for ``none``.

    :raises ConfigError: see :func:`plan_committer`; or the factory refused its settings or failed.
    """
    context = context or CommitterContext()
    plan = plan_committer(kind, args, where=context.where, kind_key=context.kind_key, args_key=context.args_key, pm=pm)
    return plan.build(context) if plan is not None else None
