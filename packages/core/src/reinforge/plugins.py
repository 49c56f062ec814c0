"""Plugin manager and the registry of named components.

Plugins are found through the ``reinforge`` entry-point group. Like
``LLM_LOAD_PLUGINS`` in simonw/llm, ``REINFORGE_LOAD_PLUGINS`` selects them:
unset loads all installed, empty loads none, a comma list loads only those
distributions. Core's own components come from :mod:`reinforge.default_plugin`
through the same hooks.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from . import hookspecs
from .errors import PluginError

ENTRY_POINT_GROUP = hookspecs.PROJECT_NAME
ENV_VAR = "REINFORGE_LOAD_PLUGINS"
KINDS = ("workflows", "judges", "group_rewards", "backends")
CORE_DIST = "reinforge"


def _singular(kind: str) -> str:
    return {"workflows": "workflow", "judges": "judge", "group_rewards": "group reward", "backends": "backend"}[kind]


def get_plugin_manager(*, load_entrypoints: bool = True, env: dict[str, str] | None = None) -> pluggy.PluginManager:
    """Build a fresh plugin manager; the env var is read now, not at import."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    from . import default_plugin

    pm.register(default_plugin, name=CORE_DIST)
    if not load_entrypoints:
        return pm
    environ = os.environ if env is None else env
    selected = environ.get(ENV_VAR)
    if selected is None:
        _load_all(pm)
    elif selected.strip():
        wanted = {name.strip() for name in selected.split(",") if name.strip()}
        _load_all(pm, only=wanted)
    return pm


def _load_all(pm: pluggy.PluginManager, only: set[str] | None = None) -> None:
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if only is not None and ep.name not in only:
            continue
        try:
            ep.load()  # load here first so a broken plugin is named in the error
        except Exception as exc:
            raise PluginError(f"plugin {ep.name!r} ({ep.value}) failed to load: {exc!r}") from exc
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=ep.name)
    for name in sorted(only or ()):
        if pm.get_plugin(name) is None:
            raise PluginError(f"{ENV_VAR} names {name!r}, which is not an installed reinforge plugin")


def plugin_distribution(pm: pluggy.PluginManager, plugin: object) -> tuple[str, str | None]:
    """(distribution name, version) of a registered plugin; core and ad-hoc plugins included."""
    for plug, dist in pm.list_plugin_distinfo():
        if plug is plugin:
            return dist.project_name, dist.version
    name = pm.get_name(plugin) or repr(plugin)
    if name == CORE_DIST:
        from .__about__ import __version__

        return CORE_DIST, __version__
    return name, None


@dataclass
class Component:
    """A named function or factory and the distribution that registered it."""

    kind: str
    name: str
    obj: Any
    owner: str


@dataclass
class Registry:
    """Every named component, per kind, built by calling the registration hooks."""

    components: dict[str, dict[str, Component]] = field(default_factory=lambda: {k: {} for k in KINDS})

    def get(self, kind: str, name: str) -> Component | None:
        return self.components[kind].get(name)

    def names(self, kind: str) -> list[str]:
        return sorted(self.components[kind])

    def by_owner(self) -> dict[str, dict[str, list[str]]]:
        out: dict[str, dict[str, list[str]]] = {}
        for kind, items in self.components.items():
            for comp in items.values():
                out.setdefault(comp.owner, {}).setdefault(kind, []).append(comp.name)
        return out


def build_registry(pm: pluggy.PluginManager) -> Registry:
    """Call every registration hook, one plugin at a time, so each name has an owner."""
    registry = Registry()
    for kind in KINDS:
        caller = getattr(pm.hook, f"register_{kind}")
        for impl in caller.get_hookimpls():
            owner, _ = plugin_distribution(pm, impl.plugin)
            impl.function(register=_registrar(registry, kind, owner))
    return registry


def _registrar(registry: Registry, kind: str, owner: str) -> Callable[..., None]:
    def register(name: str, obj: Any) -> None:
        if not isinstance(name, str) or not name:
            raise PluginError(f"{owner}: a {_singular(kind)} must be registered under a non-empty string name")
        existing = registry.components[kind].get(name)
        if existing is not None:
            raise PluginError(
                f"{_singular(kind)} {name!r} is registered twice: by {existing.owner!r} and by {owner!r}; "
                f"uninstall one or select plugins with {ENV_VAR}"
            )
        registry.components[kind][name] = Component(kind, name, obj, owner)

    return register


def describe_plugins(pm: pluggy.PluginManager) -> list[dict[str, Any]]:
    """What ``reinforge plugins`` prints: name, version, hooks and registered names."""
    registry = build_registry(pm)
    owned = registry.by_owner()
    rows = []
    for plugin in pm.get_plugins():
        dist, version = plugin_distribution(pm, plugin)
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        rows.append({"name": dist, "version": version, "hooks": hooks, "registers": owned.get(dist, {})})
    return sorted(rows, key=lambda r: (r["name"] != CORE_DIST, r["name"]))
