"""Loading plugins: the plugin manager, entry points, broken plugins, and building the registry.

Plugins are found through the ``reinforge`` entry-point group. Like
``LLM_LOAD_PLUGINS`` in simonw/llm, ``REINFORGE_LOAD_PLUGINS`` selects them:
unset loads all installed, empty loads none, a comma list loads only those
(distribution or entry-point names). Core's own components come from
:mod:`reinforge.default_plugin` through the same hooks.

One broken plugin never takes the others down: a plugin that fails to import,
implements a hook nobody specifies (a misspelt ``register_judge``) or raises
while registering is unregistered and recorded with its reason in
:attr:`PluginManager.broken`; ``reinforge plugins`` lists it, and a command
fails only when it needs a name that plugin would have registered.
``reinforge plugins --check`` exits 1 on any broken plugin or name two plugins
claim (:func:`plugin_problems`), for CI.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import pluggy

from . import hookspecs
from .errors import PluginError
from .registry import CORE_DIST, ENV_VAR, KINDS, Component, Kind, Registry

__all__ = [
    "CORE_DIST",
    "ENTRY_POINT_GROUP",
    "ENV_VAR",
    "KINDS",
    "BrokenPlugin",
    "Component",
    "PluginManager",
    "Registry",
    "build_registry",
    "check_hookimpls",
    "collect",
    "describe_plugins",
    "get_plugin_manager",
    "plugin_distribution",
    "plugin_problems",
]

ENTRY_POINT_GROUP = hookspecs.PROJECT_NAME


def normalize_name(name: str) -> str:
    """PEP 503 normal form, so ``reinforge_judge_x`` and ``reinforge-judge-x`` match."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class BrokenPlugin:
    """A plugin that could not be used, and why."""

    name: str  # entry-point or registration name
    distribution: str
    version: str | None
    reason: str


class PluginManager(pluggy.PluginManager):
    """pluggy's manager plus the plugins that failed to load, with their reasons."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT_NAME)
        self.broken: list[BrokenPlugin] = []
        self.origins: dict[int, tuple[str, str | None]] = {}  # id(plugin) -> (distribution, version)

    def mark_broken(self, plugin: object | None, name: str, dist: str, version: str | None, reason: str) -> None:
        """Unregister ``plugin`` (if registered) and record why."""
        if plugin is not None and self.is_registered(plugin):
            self.unregister(plugin)
        self.broken.append(BrokenPlugin(name, dist, version, reason))


def get_plugin_manager(*, load_entrypoints: bool = True, env: dict[str, str] | None = None) -> PluginManager:
    """Build a fresh plugin manager; the env var is read now, not at import.

    Core's hookspecs and default plugin are registered, then (unless
    ``load_entrypoints`` is false) the selected entry points; each plugin's
    ``reinforge_addhooks`` runs as it registers, and finally every hookimpl is
    checked against the specifications (:func:`check_hookimpls`).
    """
    pm = PluginManager()
    pm.add_hookspecs(hookspecs)
    pm.hook.reinforge_addhooks.call_historic(kwargs={"pluginmanager": pm})
    from . import default_plugin

    pm.register(default_plugin, name=CORE_DIST)
    if load_entrypoints:
        environ = os.environ if env is None else env
        selected = environ.get(ENV_VAR)
        if selected is None:
            _load_entry_points(pm)
        elif selected.strip():
            _load_entry_points(pm, only={n.strip() for n in selected.split(",") if n.strip()})
    for plugin, problem in check_hookimpls(pm):
        dist, version = plugin_distribution(pm, plugin)
        pm.mark_broken(plugin, pm.get_name(plugin) or dist, dist, version, problem)
    return pm


def _load_entry_points(pm: PluginManager, only: set[str] | None = None) -> None:
    wanted = {normalize_name(n): n for n in only} if only is not None else None
    found: set[str] = set()
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist is not None else ep.name
        version = ep.dist.version if ep.dist is not None else None
        names = {normalize_name(ep.name), normalize_name(dist)}
        if wanted is not None:
            if not names & set(wanted):
                continue
            found |= names & set(wanted)
        if pm.get_plugin(ep.name) is not None:
            continue  # the same entry point seen twice (an editable install beside a wheel)
        try:
            plugin = ep.load()
        except Exception as exc:
            pm.mark_broken(None, ep.name, dist, version, f"failed to import {ep.value!r}: {type(exc).__name__}: {exc}")
            continue
        try:
            pm.register(plugin, name=ep.name)
            pm.origins[id(plugin)] = (dist, version)
        except Exception as exc:
            pm.mark_broken(plugin, ep.name, dist, version, f"could not be registered: {exc}")
    if wanted is not None:
        missing = sorted(original for norm, original in wanted.items() if norm not in found)
        if missing:
            installed = sorted(
                {ep.dist.name if ep.dist else ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
            )
            raise PluginError(
                f"{ENV_VAR} names {', '.join(repr(m) for m in missing)}, which is not an installed reinforge plugin; "
                f"installed: {', '.join(installed) or 'none'}"
            )


def check_hookimpls(pm: pluggy.PluginManager) -> list[tuple[object, str]]:
    """Hookimpls that match no hook specification (usually a typo), as ``(plugin, message)``.

    Like pluggy's ``check_pending()``, but it names every plugin and hook
    instead of stopping at the first, and suggests the hook that was meant.
    """
    from .settings import suggest

    specified = sorted(name for name in dir(pm.hook) if not name.startswith("_") and _has_spec(pm, name))
    problems: dict[int, tuple[object, list[str]]] = {}
    for name in dir(pm.hook):
        if name.startswith("_"):
            continue
        caller = getattr(pm.hook, name)
        if not isinstance(caller, pluggy.HookCaller) or _has_spec(pm, name):
            continue
        for impl in caller.get_hookimpls():
            if impl.optionalhook:
                continue
            entry = problems.setdefault(id(impl.plugin), (impl.plugin, []))
            entry[1].append(f"{name!r}{suggest(name, specified)}")
    out = []
    for plugin, hooks in problems.values():
        label = pm.get_name(plugin) or repr(plugin)
        out.append((plugin, f"plugin {label!r} implements hook(s) {', '.join(hooks)}, which no plugin specifies"))
    return out


def _has_spec(pm: pluggy.PluginManager, name: str) -> bool:
    caller = getattr(pm.hook, name, None)
    return isinstance(caller, pluggy.HookCaller) and caller.has_spec()


def plugin_distribution(pm: pluggy.PluginManager, plugin: object) -> tuple[str, str | None]:
    """(distribution name, version) of a registered plugin; core and ad-hoc plugins included."""
    origin = getattr(pm, "origins", {}).get(id(plugin))
    if origin is not None:
        return origin
    for plug, dist in pm.list_plugin_distinfo():
        if plug is plugin:
            return dist.project_name, dist.version
    name = pm.get_name(plugin) or repr(plugin)
    if name == CORE_DIST:
        from .__about__ import __version__

        return CORE_DIST, __version__
    return name, None


def collect(pm: pluggy.PluginManager, kind: Kind, registry: Registry) -> None:
    """Call the registration hook of ``kind`` one plugin at a time, so each name has an owner.

    Core's built-ins are collected first, so a plugin registering one of
    their names is the one refused. Each call goes through pluggy's hook
    machinery (a caller restricted to that plugin), so hook-call monitoring
    (:class:`reinforge.testing.HookRecorder`) sees it. A plugin whose hook
    raises is recorded in ``registry.broken`` (and in ``pm.broken``); what it
    registered before raising is kept.
    """
    registry.add_kind(kind)
    caller = getattr(pm.hook, kind.hook, None)
    if caller is None:
        return
    impls = sorted(caller.get_hookimpls(), key=lambda impl: pm.get_name(impl.plugin) != CORE_DIST)
    for impl in impls:
        owner, version = plugin_distribution(pm, impl.plugin)
        others = [p for p in pm.get_plugins() if p is not impl.plugin]
        only_this = pm.subset_hook_caller(kind.hook, remove_plugins=others)
        try:
            only_this(register=registry.registrar(kind, owner))
        except Exception as exc:
            reason = f"{kind.hook} raised {type(exc).__name__}: {exc}"
            registry.broken[owner] = reason
            if isinstance(pm, PluginManager):
                pm.broken.append(BrokenPlugin(pm.get_name(impl.plugin) or owner, owner, version, reason))


def build_registry(pm: pluggy.PluginManager) -> Registry:
    """Every workflow, judge, group reward and backend the loaded plugins register."""
    registry = Registry(plugin_manager=pm)
    for broken in getattr(pm, "broken", ()):
        registry.broken[broken.distribution] = broken.reason
    for kind in KINDS:
        collect(pm, kind, registry)
    return registry


def describe_plugins(pm: pluggy.PluginManager) -> list[dict[str, Any]]:
    """What ``reinforge plugins`` prints: name, version, hooks, registered names, conflicts and broken plugins."""
    return _describe(pm)[0]


def _describe(pm: pluggy.PluginManager) -> tuple[list[dict[str, Any]], Registry]:
    registry = build_registry(pm)
    owned = registry.by_owner()
    conflicts: dict[str, list[str]] = {}
    for (kind, name), owners in registry.conflicts.items():
        for owner in owners:
            others = [o for o in owners if o != owner]
            conflicts.setdefault(owner, []).append(f"{kind} {name!r} also registered by {', '.join(others)}")
    rows: dict[str, dict[str, Any]] = {}
    for plugin in pm.get_plugins():
        dist, version = plugin_distribution(pm, plugin)
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        rows[dist] = {
            "name": dist,
            "version": version,
            "hooks": hooks,
            "registers": owned.get(dist, {}),
            "conflicts": sorted(conflicts.get(dist, [])),
            "broken": registry.broken.get(dist),
        }
    for broken in getattr(pm, "broken", ()):
        row = rows.setdefault(
            broken.distribution,
            {
                "name": broken.distribution,
                "version": broken.version,
                "hooks": [],
                "registers": {},
                "conflicts": [],
                "broken": None,
            },
        )
        row["broken"] = broken.reason
    return sorted(rows.values(), key=lambda r: (r["name"] != CORE_DIST, r["name"])), registry


def plugin_problems(pm: pluggy.PluginManager) -> tuple[list[dict[str, Any]], list[str]]:
    """:func:`describe_plugins`'s rows, and what makes ``reinforge plugins --check`` fail, one line each.

    The problems are broken plugins and names two plugins registered; each
    line names the distribution(s) and the problem, so a CI log says what to fix.
    """
    rows, registry = _describe(pm)
    problems = [f"plugin {row['name']} is broken: {row['broken']}" for row in rows if row["broken"]]
    for (kind, name), owners in sorted(registry.conflicts.items()):
        k = registry.kinds.get(kind)
        what = k.singular if k is not None else kind
        problems.append(f"{what} {name!r} is registered by more than one plugin: {', '.join(owners)}")
    return rows, problems
