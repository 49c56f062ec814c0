"""The registry of named components: kinds, what a registration declares, collisions.

Registration hooks (``register_workflows(register)``, ...) hand each plugin a
``register(name, obj, *, settings=None, kind=None, reward_range=None,
description="")`` callable bound to that plugin's distribution, so every name
has an owner. Two plugins registering the same name is not a silent rename:
the name is marked as a conflict naming both distributions, and using it is an
error, while everything else keeps working (``reinforge plugins`` lists it).
Core's own names (``json_valid``, ...) are not up for grabs: a plugin that
registers one is refused, so an installed plugin cannot break a built-in for
every run. What is registered is checked as it is registered: a workflow,
judge or group reward must be callable with its role's parameters, a backend
must be a class; the error names the distribution, the kind and the name.
Packages add their own kinds (rollouts-react's tools) with :class:`Kind`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import PluginError, SignatureError
from .signatures import check_registered

__all__ = [
    "Component",
    "Kind",
    "KINDS",
    "Registry",
    "kind_named",
]

ENV_VAR = "REINFORGE_LOAD_PLUGINS"
CORE_DIST = "reinforge"  # the owner of the built-in components (core's default plugin)


@dataclass(frozen=True)
class Kind:
    """One kind of component: its registry key, words for messages and the hook that registers it."""

    plural: str  # registry key and hook suffix: "judges" -> register_judges
    singular: str  # "judge"
    role: str | None = None  # the call contract in reinforge.signatures ("judge"), None when not a function

    @property
    def hook(self) -> str:
        """The registration hook's name: ``register_judges``."""
        return f"register_{self.plural}"

    @property
    def label(self) -> str:
        """Plural words for messages: ``group rewards``."""
        return self.plural.replace("_", " ")


WORKFLOWS = Kind("workflows", "workflow", "workflow")
JUDGES = Kind("judges", "judge", "judge")
GROUP_REWARDS = Kind("group_rewards", "group reward", "group_reward")
BACKENDS = Kind("backends", "backend")
RUN_SECTIONS = Kind("run_sections", "run-file section")
KINDS: tuple[Kind, ...] = (WORKFLOWS, JUDGES, GROUP_REWARDS, BACKENDS, RUN_SECTIONS)
_BY_NAME = {k.plural: k for k in KINDS} | {k.role: k for k in KINDS if k.role} | {"backend": BACKENDS}
_BY_NAME["run_section"] = RUN_SECTIONS


def kind_named(name: str | Kind) -> Kind:
    """The core :class:`Kind` for ``"judges"``, ``"judge"``, ``"group_reward"``, ...; ``ValueError`` otherwise."""
    if isinstance(name, Kind):
        return name
    found = _BY_NAME.get(name) or _BY_NAME.get(name.replace(" ", "_"))
    if found is None:
        raise ValueError(f"unknown kind {name!r}; expected one of {', '.join(k.plural for k in KINDS)}")
    return found


@dataclass
class Component:
    """A registered object and what its registration declared.

    :ivar obj: a function (called per task), a class (built once per run with
        its settings, closed at the end) or, for backends, a
        :class:`reinforge.plugin.Backend` subclass.
    :ivar settings: the settings dataclass its ``args`` are checked against, or
        None (then the function's or class's keyword parameters are).
    :ivar judge_kind: ``"rule"`` or ``"model"`` (a model judge is skipped for
        responses that fail the rule gate).
    :ivar reward_range: ``(low, high)``: a reward outside it is an error naming
        the component.
    """

    kind: str
    name: str
    obj: Any
    owner: str
    settings: type | None = None
    judge_kind: str | None = None
    reward_range: tuple[float, float] | None = None
    description: str = ""


def _check_range(owner: str, name: str, value: Any) -> tuple[float, float] | None:
    if value is None:
        return None
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise PluginError(f"{owner}: {name!r}: reward_range must be (low, high), got {value!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise PluginError(f"{owner}: {name!r}: reward_range must be two finite numbers low < high, got {value!r}")
    return low, high


@dataclass
class Registry:
    """Every named component, per kind, with the owner of each and the names two plugins claimed."""

    components: dict[str, dict[str, Component]] = field(default_factory=lambda: {k.plural: {} for k in KINDS})
    conflicts: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    kinds: dict[str, Kind] = field(default_factory=lambda: {k.plural: k for k in KINDS})
    broken: dict[str, str] = field(default_factory=dict)  # distribution -> why it could not load or register
    plugin_manager: Any = field(default=None, repr=False)  # what it was built from (for a package's own kinds)

    def add_kind(self, kind: Kind) -> None:
        """Make room for a package's own kind (e.g. tools)."""
        self.kinds.setdefault(kind.plural, kind)
        self.components.setdefault(kind.plural, {})

    def _kind(self, kind: str | Kind) -> Kind:
        key = kind.plural if isinstance(kind, Kind) else kind
        if key in self.kinds:
            return self.kinds[key]
        return kind_named(key)

    def get(self, kind: str | Kind, name: str) -> Component | None:
        """The component, None when nobody registered it; a name two plugins claimed is a :class:`PluginError`."""
        k = self._kind(kind)
        owners = self.conflicts.get((k.plural, name))
        if owners:
            raise PluginError(
                f"{k.singular} {name!r} is registered twice: by {owners[0]!r} and by {owners[1]!r}; "
                f"uninstall one or select plugins with {ENV_VAR}"
            )
        return self.components.get(k.plural, {}).get(name)

    def names(self, kind: str | Kind) -> list[str]:
        """The registered names of ``kind``, sorted (names in conflict left out)."""
        k = self._kind(kind)
        return sorted(self.components.get(k.plural, {}))

    def by_owner(self) -> dict[str, dict[str, list[str]]]:
        """``{distribution: {kind: [names]}}``, conflicting names included under each owner."""
        out: dict[str, dict[str, list[str]]] = {}
        for kind, items in self.components.items():
            for comp in items.values():
                out.setdefault(comp.owner, {}).setdefault(kind, []).append(comp.name)
        for (kind, name), owners in self.conflicts.items():
            for owner in owners:
                out.setdefault(owner, {}).setdefault(kind, []).append(name)
        return out

    def broken_note(self) -> str:
        """`` Note: plugin X is broken (reason).`` for messages about a missing name, or ``""``."""
        if not self.broken:
            return ""
        parts = "; ".join(f"{dist}: {reason}" for dist, reason in sorted(self.broken.items()))
        return f". Broken plugins, which may be what registers it: {parts}"

    def registrar(self, kind: str | Kind, owner: str) -> Callable[..., None]:
        """The ``register`` callable handed to one plugin's registration hook for ``kind``."""
        k = self._kind(kind)
        self.add_kind(k)

        def register(
            name: str,
            obj: Any,
            *,
            settings: type | None = None,
            kind: str | None = None,
            reward_range: Iterable[float] | None = None,
            description: str = "",
        ) -> None:
            if not isinstance(name, str) or not name:
                raise PluginError(f"{owner}: a {k.singular} must be registered under a non-empty string name")
            if kind is not None and kind not in ("rule", "model"):
                raise PluginError(f"{owner}: {k.singular} {name!r}: kind must be 'rule' or 'model', got {kind!r}")
            taken = self.components.get(k.plural, {}).get(name)
            if taken is not None and taken.owner == CORE_DIST and owner != CORE_DIST:
                raise PluginError(_builtin_taken(owner, k, name))
            _check_object(owner, k, name, obj)
            comp = Component(
                k.plural,
                name,
                obj,
                owner,
                settings=settings,
                judge_kind=kind,
                reward_range=_check_range(owner, name, reward_range),
                description=description,
            )
            self.add(comp)

        return register

    def add(self, comp: Component) -> None:
        """Add one component; a second owner of the same name makes it a conflict.

        A name core registered is not shared: a plugin registering it gets a
        :class:`PluginError` naming both (core's component stays).
        """
        key = (comp.kind, comp.name)
        if key in self.conflicts:
            self.conflicts[key].append(comp.owner)
            return
        existing = self.components.setdefault(comp.kind, {}).get(comp.name)
        if existing is not None and CORE_DIST in (existing.owner, comp.owner) and existing.owner != comp.owner:
            if comp.owner == CORE_DIST:  # core collected after the plugin: core's name still wins
                self.components[comp.kind][comp.name] = comp
                self.broken[existing.owner] = _builtin_taken(existing.owner, self._kind(comp.kind), comp.name)
                return
            raise PluginError(_builtin_taken(comp.owner, self._kind(comp.kind), comp.name))
        if existing is not None:
            del self.components[comp.kind][comp.name]
            self.conflicts[key] = [existing.owner, comp.owner]
            return
        self.components[comp.kind][comp.name] = comp


def _builtin_taken(plugin: str, kind: Kind, name: str) -> str:
    return (
        f"{plugin}: {kind.singular} {name!r} is a built-in of {CORE_DIST!r}; a plugin cannot register a built-in "
        f"name (it would replace it for every run): register it under another name"
    )


def _check_object(owner: str, kind: Kind, name: str, obj: Any) -> None:
    """What a core kind needs of a registered object, checked at registration; a :class:`PluginError` names all three.

    Workflows, judges and group rewards follow their call contract
    (:func:`reinforge.signatures.check_registered`); backends are classes.
    A package's own kinds (tools, committers) check their objects themselves.
    """
    where = f"{owner}: {kind.singular} {name!r}"
    if kind.plural == RUN_SECTIONS.plural:
        _check_section(where, name, obj)
        return
    if kind.plural == BACKENDS.plural:
        if not isinstance(obj, type):
            raise PluginError(
                f"{where}: expected a class (a reinforge.plugin.Backend subclass), got {type(obj).__name__} {obj!r}"
            )
        return
    if kind.role is None or kind.plural not in _CORE_KINDS:
        return
    if not callable(obj):
        raise PluginError(f"{where}: expected a function or a class, got {type(obj).__name__} {obj!r}")
    try:
        check_registered(obj, kind.role, name)
    except SignatureError as exc:
        raise PluginError(f"{where}: {exc}") from None


_CORE_KINDS = {k.plural for k in KINDS}


def _check_section(where: str, name: str, obj: Any) -> None:
    """A run-file section is a :class:`~reinforge.plugin.Settings` dataclass under a key core does not use."""
    import dataclasses

    from .config import RunConfig
    from .settings import Settings, settings_keys

    if name in settings_keys(RunConfig) or name in ("judge", "sections"):
        raise PluginError(f"{where}: {name!r} is a key of core's run file; register the section under another name")
    if not (isinstance(obj, type) and issubclass(obj, Settings) and dataclasses.is_dataclass(obj)):
        raise PluginError(f"{where}: expected a reinforge.plugin.Settings dataclass, got {type(obj).__name__} {obj!r}")
