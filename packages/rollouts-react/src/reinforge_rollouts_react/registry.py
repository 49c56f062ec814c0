"""Tools by name: the ``register_tools`` hook, and turning a run file's ``tools:`` list into tools.

A ``tools`` entry is a registered name (``calculator``), a ``module:attr``
reference to a function or :class:`Tool`, a function or :class:`Tool` (from
Python), or a mapping ``{name: <one of those>, timeout: 5, description: ...}``
that overrides the tool's settings.
"""

from __future__ import annotations

import difflib
import importlib
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pluggy

from reinforge.errors import ConfigError, PluginError
from reinforge.plugins import ENV_VAR, get_plugin_manager, plugin_distribution

from . import hookspecs
from .tools import Tool, tool

__all__ = ["RegisteredTool", "ToolRegistry", "resolve_tools", "tool_registry"]

_OVERRIDES = ("timeout", "description")


@dataclass
class RegisteredTool:
    """A tool and the distribution that registered it."""

    tool: Tool
    owner: str


@dataclass
class ToolRegistry:
    """Every tool published through ``register_tools``, by name."""

    tools: dict[str, RegisteredTool] = field(default_factory=dict)

    def names(self) -> list[str]:
        return sorted(self.tools)

    def get(self, name: str) -> Tool | None:
        entry = self.tools.get(name)
        return entry.tool if entry is not None else None

    def owner(self, name: str) -> str | None:
        entry = self.tools.get(name)
        return entry.owner if entry is not None else None

    def registrar(self, owner: str) -> Callable[..., None]:
        """The ``register`` callable handed to one plugin's ``register_tools``."""

        def register(name_or_tool: Any, obj: Any = None) -> None:
            if obj is None:
                made = tool(name_or_tool)
            else:
                if not isinstance(name_or_tool, str) or not name_or_tool:
                    raise PluginError(f"{owner}: register(name, tool) needs a non-empty string name")
                made = tool(obj, name=name_or_tool)
            existing = self.tools.get(made.name)
            if existing is not None:
                raise PluginError(
                    f"tool {made.name!r} is registered twice: by {existing.owner!r} and by {owner!r}; "
                    f"uninstall one or select plugins with {ENV_VAR}"
                )
            self.tools[made.name] = RegisteredTool(made, owner)

        return register


def add_hookspecs(pm: pluggy.PluginManager) -> None:
    """Teach ``pm`` the ``register_tools`` hook (once)."""
    caller = getattr(pm.hook, "register_tools", None)
    if caller is None or not caller.has_spec():
        pm.add_hookspecs(hookspecs)


def tool_registry(pm: pluggy.PluginManager | None = None) -> ToolRegistry:
    """Call every plugin's ``register_tools``, one plugin at a time so each tool has an owner.

    :param pm: a plugin manager from :func:`reinforge.get_plugin_manager`; the
        installed plugins' (respecting ``REINFORGE_LOAD_PLUGINS``) when None.
    :raises PluginError: when two plugins register the same tool name.
    """
    pm = pm or get_plugin_manager()
    add_hookspecs(pm)
    registry = ToolRegistry()
    for impl in pm.hook.register_tools.get_hookimpls():
        owner, _ = plugin_distribution(pm, impl.plugin)
        impl.function(register=registry.registrar(owner))
    return registry


_CACHE: dict[str | None, ToolRegistry] = {}


def installed_tools() -> ToolRegistry:
    """The installed plugins' tools, built once per value of ``REINFORGE_LOAD_PLUGINS``."""
    key = os.environ.get(ENV_VAR)
    if key not in _CACHE:
        _CACHE[key] = tool_registry()
    return _CACHE[key]


def _import(ref: str, where: str) -> Any:
    module_name, _, attr = ref.partition(":")
    if not module_name.strip() or not attr.strip():
        raise ConfigError(f"{where}: tool reference {ref!r} must look like 'module:attr'")
    try:
        obj: Any = importlib.import_module(module_name.strip())
    except Exception as exc:
        raise ConfigError(f"{where}: cannot import module {module_name.strip()!r} for tool {ref!r}: {exc}") from exc
    for part in attr.strip().split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{where}: tool {ref!r}: {getattr(obj, '__name__', obj)!r} has no attribute {part!r}")
        obj = getattr(obj, part)
    return obj


def _one(spec: Any, where: str, registry: ToolRegistry | None) -> Tool:
    if isinstance(spec, Mapping):
        options = dict(spec)
        ref = options.pop("name", None) or options.pop("ref", None)
        unknown = sorted(set(options) - set(_OVERRIDES))
        if ref is None or unknown:
            detail = f"unknown key(s) {unknown}" if unknown else "missing 'name'"
            raise ConfigError(
                f"{where}: {detail}; a tool entry is {{name: <tool>, timeout: <seconds>, description: ...}}"
            )
        base = _one(ref, where, registry)
        try:
            return base.replace(**options)
        except Exception as exc:
            raise ConfigError(f"{where}: {exc}") from exc
    if isinstance(spec, Tool):
        return spec
    if isinstance(spec, str):
        if ":" in spec:
            obj = _import(spec, where)
            if not callable(obj):
                raise ConfigError(f"{where}: {spec!r} is a {type(obj).__name__}, not a function or Tool")
            return tool(obj)
        registry = registry if registry is not None else installed_tools()
        found = registry.get(spec)
        if found is None:
            names = registry.names()
            close = difflib.get_close_matches(spec, names, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            listing = f"registered tools: {', '.join(names)}" if names else "no tools are registered"
            raise ConfigError(
                f"{where}: no tool named {spec!r} is registered{hint}; {listing}. "
                "To use your own function, write 'module:function'"
            )
        return found
    if callable(spec):
        return tool(spec)
    raise ConfigError(f"{where}: a tool is a name, 'module:attr', a function or a Tool, got {spec!r}")


def resolve_tools(
    specs: Iterable[Any] | None, registry: ToolRegistry | None = None, *, where: str = "tools"
) -> list[Tool]:
    """Turn a ``tools`` list into :class:`Tool` objects; errors name the entry (``tools[1]``).

    Names are looked up in ``registry`` (the installed plugins' tools when None).
    """
    if specs is None:
        return []
    if isinstance(specs, (str, Mapping, Tool)) or callable(specs):
        specs = [specs]
    tools: list[Tool] = []
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        made = _one(spec, f"{where}[{i}]", registry)
        if made.name in seen:
            raise ConfigError(f"{where}[{i}]: tool {made.name!r} is already given as {where}[{seen[made.name]}]")
        seen[made.name] = i
        tools.append(made)
    return tools
