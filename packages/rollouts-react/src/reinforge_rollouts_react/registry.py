"""Tools by name: the ``register_tools`` hook, and turning a run file's ``tools:`` list into tools.

Tools are a kind of their own in core's registry (``Kind("tools", "tool")``),
collected from every plugin's ``register_tools`` hook by
:func:`reinforge.plugin.collect`, one plugin at a time so each name has an
owner; two plugins registering the same name make it a conflict naming both,
which is an error when the name is used. The registry is built when it is
needed (once per run by the registered ``react`` workflow), never cached at
module level.

A ``tools`` entry is a registered name (``calculator``), a ``module:attr``
reference to a function or :class:`Tool`, a function or :class:`Tool` (from
Python), or a mapping ``{name: <one of those>, timeout: 5, description: ...}``
that overrides the tool's settings. Names and references are resolved with
:func:`reinforge.plugin.resolve_ref`, with its did-you-mean hints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy

from reinforge.plugin import (
    ConfigError,
    FieldError,
    Kind,
    PluginError,
    Registry,
    ResolveError,
    collect,
    get_plugin_manager,
    resolve_ref,
)

from .tools import Tool, tool

__all__ = ["TOOLS", "ToolRegistry", "check_tools", "resolve_tools", "tool_registry"]

TOOLS = Kind("tools", "tool")
_OVERRIDES = ("timeout", "description")


class _ToolRegistrations(Registry):
    """Core's registry; for tools, ``register`` also takes a lone :class:`Tool` or function (named by itself)."""

    def registrar(self, kind: str | Kind, owner: str) -> Callable[..., None]:
        register = super().registrar(kind, owner)
        if self._kind(kind).plural != TOOLS.plural:
            return register

        def register_tool(name_or_tool: Any, obj: Any = None, *, description: str = "") -> None:
            if obj is None:
                made = tool(name_or_tool)
            else:
                if not isinstance(name_or_tool, str) or not name_or_tool:
                    raise PluginError(f"{owner}: register(name, tool) needs a non-empty string name")
                made = tool(obj, name=name_or_tool)
            if description:
                made = made.replace(description=description)
            register(made.name, made, description=made.description)

        return register_tool


@dataclass
class ToolRegistry:
    """Every tool published through ``register_tools``, by name, over core's :class:`~reinforge.plugin.Registry`."""

    registry: Registry

    def names(self) -> list[str]:
        """Registered tool names (a name two plugins claim is left out: using it is an error)."""
        return self.registry.names(TOOLS)

    def get(self, name: str) -> Tool | None:
        """The tool, None when nobody registered it; a name two plugins claim is a :class:`PluginError`."""
        entry = self.registry.get(TOOLS, name)
        return entry.obj if entry is not None else None

    def owner(self, name: str) -> str | None:
        """The distribution that registered ``name``."""
        entry = self.registry.get(TOOLS, name)
        return entry.owner if entry is not None else None

    @property
    def conflicts(self) -> dict[str, list[str]]:
        """Tool names two or more plugins registered, with their owners."""
        return {name: owners for (kind, name), owners in self.registry.conflicts.items() if kind == TOOLS.plural}

    @property
    def broken(self) -> dict[str, str]:
        """Plugins whose ``register_tools`` raised (distribution -> reason)."""
        return dict(self.registry.broken)


def tool_registry(pm: pluggy.PluginManager | None = None) -> ToolRegistry:
    """Build the tool registry: every plugin's ``register_tools``, one plugin at a time.

    :param pm: a plugin manager from :func:`reinforge.plugin.get_plugin_manager`
        (the ``register_tools`` hookspec comes with this package's plugin, through
        ``reinforge_addhooks``); the installed plugins' (respecting
        ``REINFORGE_LOAD_PLUGINS``) when None. Nothing is cached: each call
        builds a new registry.
    :return: the tools; a plugin whose hook raised is in ``.broken``, a name two
        plugins registered in ``.conflicts`` (an error naming both when used).
    """
    pm = pm or get_plugin_manager()
    registry = _ToolRegistrations()
    for broken in getattr(pm, "broken", ()):
        registry.broken[broken.distribution] = broken.reason
    collect(pm, TOOLS, registry)
    return ToolRegistry(registry)


# --------------------------------------------------------------------------- tools lists


class _Lazy:
    """The registry, built on the first name that needs it (a list of functions or references needs none)."""

    def __init__(self, registry: ToolRegistry | None) -> None:
        self._registry = registry

    def get(self) -> ToolRegistry:
        if self._registry is None:
            self._registry = tool_registry()
        return self._registry


def _split_entry(spec: Mapping[str, Any], key: str) -> tuple[Any, dict[str, Any]]:
    """``{name: <tool>, timeout: ..., description: ...}`` as (the tool reference, the overrides)."""
    options = dict(spec)
    ref = options.pop("name", None) or options.pop("ref", None)
    unknown = sorted(set(options) - set(_OVERRIDES))
    if ref is None or unknown:
        detail = f"unknown key(s) {unknown}" if unknown else "missing 'name'"
        raise FieldError(key, f"{detail}; a tool entry is {{name: <tool>, timeout: <seconds>, description: ...}}")
    return ref, options


def _one(spec: Any, key: str, registry: _Lazy, base_dir: str | None) -> Tool:
    if isinstance(spec, Mapping):
        ref, options = _split_entry(spec, key)
        base = _one(ref, key, registry, base_dir)
        try:
            return base.replace(**options)
        except Exception as exc:
            raise FieldError(key, str(exc)) from exc
    if isinstance(spec, Tool):
        return spec
    if isinstance(spec, str):
        lookup = None if ":" in spec else registry.get().registry
        try:
            obj = resolve_ref(spec, TOOLS, lookup, base_dir=base_dir)
        except ResolveError as exc:
            raise FieldError(key, str(exc)) from None
        if not callable(obj):
            raise FieldError(key, f"{spec!r} is a {type(obj).__name__}, not a function or Tool")
        return tool(obj)
    if callable(spec):
        return tool(spec)
    raise FieldError(key, f"a tool is a name, 'module:attr', a function or a Tool, got {spec!r}")


def check_tool_entries(specs: Iterable[Any], *, key: str = "tools") -> None:
    """The shape of a ``tools`` list, resolving nothing: raises :class:`~reinforge.plugin.FieldError` for the entry."""
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        entry = f"{key}[{i}]"
        name = _split_entry(spec, entry)[0] if isinstance(spec, Mapping) else spec
        if isinstance(name, str):
            if not name.strip():
                raise FieldError(entry, "a tool name must not be empty")
            if name in seen:
                raise FieldError(entry, f"tool {name!r} is already given as {key}[{seen[name]}]")
            seen[name] = i
        elif not (isinstance(name, Tool) or callable(name)):
            raise FieldError(entry, f"a tool is a name, 'module:attr', a function or a Tool, got {name!r}")


def check_tools(
    specs: Iterable[Any] | None,
    registry: ToolRegistry | None = None,
    *,
    key: str = "tools",
    base_dir: str | None = None,
) -> list[Tool]:
    """:func:`resolve_tools`, raising :class:`~reinforge.plugin.FieldError` with the key of the entry (``tools[1]``).

    Used by the settings check, so core puts the file and ``workflow.args`` in front.
    """
    if specs is None:
        return []
    if isinstance(specs, (str, Mapping, Tool)) or callable(specs):
        specs = [specs]
    lazy = _Lazy(registry)
    tools: list[Tool] = []
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        made = _one(spec, f"{key}[{i}]", lazy, base_dir)
        if made.name in seen:
            raise FieldError(f"{key}[{i}]", f"tool {made.name!r} is already given as {key}[{seen[made.name]}]")
        seen[made.name] = i
        tools.append(made)
    return tools


def resolve_tools(
    specs: Iterable[Any] | None,
    registry: ToolRegistry | None = None,
    *,
    where: str = "tools",
    base_dir: str | None = None,
) -> list[Tool]:
    """Turn a ``tools`` list into :class:`Tool` objects; errors name the entry (``tools[1]``).

    :param registry: where names are looked up; when None and a name needs it,
        the installed plugins' tools (a registry built for this call).
    :param where: the key of the list in messages.
    :param base_dir: a folder put on ``sys.path`` while ``module:attr`` references import.
    :raises ConfigError: ``tools[0]: no tool named 'calculater' is registered (did you mean 'calculator'?); ...``.
    """
    try:
        return check_tools(specs, registry, key=where, base_dir=base_dir)
    except FieldError as exc:
        raise ConfigError(exc.render()) from exc
