"""Building a run's workflow, judges and group reward: checked first, built once per run, closed at its end.

A component is a function (bound to its settings, called per task) or a class
(built once per run with its settings, so its caches and connections live
exactly as long as the run; ``close()`` or ``aclose()`` is called when the run
ends). A ``@reward_func`` class is a judge class whose ``@sub_reward_func``
methods are its dimensions. Settings come from the run file's ``args``; when
the registration declared a settings dataclass they are checked against it
(types included), otherwise against the function's or constructor's keyword
parameters. :func:`plan_component` does every check without building
anything, so ``load_run`` and ``tune --dry-run`` can fail early.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import types
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from .errors import SignatureError
from .refs import resolve_entry
from .registry import kind_named
from .settings import convert, load, suggest
from .signatures import REQUIRED, BoundFunction, bind, describe

if TYPE_CHECKING:
    from .config import ComponentSpec
    from .registry import Component, Registry

__all__ = ["ComponentContext", "ComponentPlan", "build_component", "plan_component"]


@dataclass(frozen=True)
class ComponentContext:
    """What a class component may ask for with a keyword parameter ``context`` in its constructor.

    :ivar registry: the run's registry (``registry.plugin_manager`` is the plugin manager it was built from).
    :ivar base_dir: the run file's folder, for ``module:attr`` references a component resolves itself.
    :ivar where: the run-file location of this component (``run.yaml: workflow``), for messages.
    """

    registry: Registry | None
    base_dir: str | None
    where: str

    @property
    def plugin_manager(self) -> Any:
        """The plugin manager of the run (None when the registry was built by hand)."""
        return getattr(self.registry, "plugin_manager", None)


@dataclass
class ComponentPlan:
    """A resolved, checked component that is not built yet."""

    spec: ComponentSpec
    role: str
    obj: Any
    entry: Component | None
    name: str  # for messages and logs
    metric_name: str
    settings: Any  # the checked settings object, or the args mapping when no settings class is declared
    where: str
    context: ComponentContext | None = None

    @property
    def is_class(self) -> bool:
        """True when the component is a class, built once per run."""
        return isinstance(self.obj, type)

    def build(self) -> BoundFunction:
        """Build the component for one run (a class is instantiated here); close it with ``bound.close()``."""
        declared = self.entry.settings if self.entry is not None else None
        closers = []
        if self.is_class:
            instance = _instantiate(self)
            target: Any = instance
            kwargs: dict[str, Any] = {}
            closers.append(_closer(instance))
        else:
            target = self.obj
            kwargs = _fields(self.settings) if declared is not None else dict(self.settings)
        try:
            bound = bind(target, self.role, kwargs, name=self.name)
        except SignatureError as exc:
            raise SignatureError(f"{self.where}: {exc}{_defined(self.obj, exc)}") from exc
        bound.metric_name = self.metric_name
        meta_kind = self.entry.judge_kind if self.entry is not None else None
        bound.judge_kind = self.spec.kind or meta_kind or _declared_kind(self.obj) or "rule"
        bound.reward_range = self.entry.reward_range if self.entry is not None else None
        bound.closers.extend(c for c in closers if c is not None)
        return bound


def plan_component(
    spec: ComponentSpec, role: str, registry: Registry | None = None, *, where: str = "", base_dir: str | None = None
) -> ComponentPlan:
    """Resolve ``spec.ref`` and check ``spec.args`` against the component, building nothing.

    :raises ResolveError: the reference does not resolve.
    :raises SignatureError: the function or class does not follow the ``role``
        contract, or ``args`` names a setting it does not have.
    :raises ConfigError: ``args`` breaks the declared settings class (key and type named).
    """
    if role not in REQUIRED:
        raise ValueError(f"unknown role {role!r}; expected one of {', '.join(REQUIRED)}")
    kind = kind_named(role)
    obj, entry = resolve_entry(spec.ref, kind, registry, where=where, base_dir=base_dir)
    name = _label(spec, obj, entry)
    metric = spec.name or _declared_name(obj) or (entry.name if entry is not None else None) or _attr_name(spec, obj)
    declared = entry.settings if entry is not None else None
    if declared is not None:
        settings: Any = load(declared, dict(spec.args), where=where, prefix="args")
    else:
        settings = dict(spec.args)
    plan = ComponentPlan(
        spec, role, obj, entry, name, metric, settings, where, ComponentContext(registry, base_dir, where)
    )
    _check_signature(plan)
    return plan


def build_component(
    spec: ComponentSpec, role: str, registry: Registry | None = None, *, where: str = "", base_dir: str | None = None
) -> BoundFunction:
    """:func:`plan_component`, then build it (for one run)."""
    return plan_component(spec, role, registry, where=where, base_dir=base_dir).build()


# -- checks -----------------------------------------------------------------------------------


def _check_signature(plan: ComponentPlan) -> None:
    """The contract and the settings, without calling or instantiating anything."""
    declared = plan.entry.settings if plan.entry is not None else None
    if plan.is_class:
        if _is_reward_class(plan.obj):
            _check_init(plan, plan.obj, dict(plan.settings) if declared is None else None)
            return
        _check_init(plan, plan.obj, None if declared is not None else dict(plan.settings))
        call = getattr(plan.obj, "__call__", None)  # noqa: B004 - instances are the callables
        if call is None or call is object.__call__:
            raise SignatureError(f"{plan.where}: {plan.role.replace('_', ' ')} class {plan.name} has no __call__")
        try:
            bind(_Unbound(call), plan.role, {}, name=plan.name)
        except SignatureError as exc:
            raise SignatureError(f"{plan.where}: {exc}{_defined(plan.obj, exc)}") from exc
        return
    kwargs = _fields(plan.settings) if declared is not None else dict(plan.settings)
    try:
        bind(plan.obj, plan.role, kwargs, name=plan.name)
    except SignatureError as exc:
        raise SignatureError(f"{plan.where}: {exc}{_defined(plan.obj, exc)}") from exc
    if declared is None:
        _check_arg_types(plan, plan.obj, kwargs)


def _check_init(plan: ComponentPlan, cls: type, kwargs: dict[str, Any] | None) -> None:
    """A class takes ``cls(settings)`` (declared settings) or ``cls(**args)``; check that it can."""
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return
    what = f"{plan.role.replace('_', ' ')} {plan.name}"
    extra = {"context": plan.context} if _wants_context(cls) else {}
    try:
        if kwargs is None:
            sig.bind(object(), **extra)
        else:
            sig.bind(**kwargs, **extra)
    except TypeError as exc:
        accepted = [p.name for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        given = "its settings object" if kwargs is None else f"args {sorted(kwargs)}"
        unknown = [k for k in kwargs or {} if k not in sig.parameters]
        hint = suggest(unknown[0], [a for a in accepted if a != "context"]) if unknown else ""
        raise SignatureError(
            f"{plan.where}: {what} cannot be built with {given}: {exc}{hint} "
            f"(it takes: {', '.join(accepted) or 'nothing'})"
        ) from None
    if kwargs is not None:
        _check_arg_types(plan, cls, kwargs)


def _check_arg_types(plan: ComponentPlan, func: Any, kwargs: dict[str, Any]) -> None:
    """Each ``args`` value against its parameter's annotation, as a settings class's fields are checked.

    Only annotations the settings checker reads exactly are checked (numbers, strings, booleans, lists,
    mappings, unions with None, ``Any``); a class or a ``Literal`` is left to the function.
    """
    if not kwargs:
        return
    target = cast(Any, func).__init__ if isinstance(func, type) else func  # a class: its constructor's hints
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # an annotation that does not evaluate here (a TYPE_CHECKING import): nothing to check
        return
    where = plan.where if plan.name in plan.where else f"{plan.where}: {plan.role.replace('_', ' ')} {plan.name}"
    for key, value in kwargs.items():
        hint = hints.get(key)
        if hint is not None and _checkable(hint):
            convert(value, hint, where=where, key=f"args.{key}")


_SCALARS = (int, float, str, bool, list, dict, tuple, type(None))


def _checkable(hint: Any) -> bool:
    """True when :func:`reinforge.settings.convert` checks ``hint`` exactly (no false alarms)."""
    if hint is Any or hint in _SCALARS:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType, list, tuple, dict):
        return all(arg is Ellipsis or _checkable(arg) for arg in typing.get_args(hint))
    return False


class _Unbound:
    """A class's ``__call__`` seen as the instance will see it (without ``self``), for the contract check."""

    def __init__(self, method: Any) -> None:
        params = list(inspect.signature(method).parameters.values())[1:]
        self.__signature__ = inspect.Signature(params)
        self._async = inspect.iscoroutinefunction(method)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never called
        raise NotImplementedError


# -- building ---------------------------------------------------------------------------------


def _instantiate(plan: ComponentPlan) -> Any:
    declared = plan.entry.settings if plan.entry is not None else None
    if _is_reward_class(plan.obj):
        from .rewards import MultiDimensionJudge

        return MultiDimensionJudge.build(plan.obj, plan.settings, declared_settings=declared is not None)
    extra = {"context": plan.context} if _wants_context(plan.obj) else {}
    if declared is not None:
        return plan.obj(plan.settings, **extra)
    return plan.obj(**plan.settings, **extra)


def _wants_context(cls: type) -> bool:
    """True when the constructor has a parameter named ``context`` (keyword or positional-or-keyword)."""
    try:
        param = inspect.signature(cls).parameters.get("context")
    except (TypeError, ValueError):
        return False
    return param is not None and param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD)


def _closer(instance: Any) -> Any:
    close = getattr(instance, "aclose", None)
    if callable(close):
        return lambda: _run_async(close())
    close = getattr(instance, "close", None)
    if callable(close):

        def run_close() -> None:
            result = close()
            if inspect.isawaitable(result):
                _run_async(result)

        return run_close
    return None


def _run_async(awaitable: Any) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(_await(awaitable))
        return
    raise RuntimeError("a component's aclose() cannot run inside a running event loop; close the run outside it")


async def _await(awaitable: Any) -> None:
    await awaitable


# -- names ------------------------------------------------------------------------------------


def _label(spec: ComponentSpec, obj: Any, entry: Component | None) -> str:
    if entry is not None:
        return entry.name
    if isinstance(spec.ref, str):
        return spec.ref
    return describe(obj)


def _attr_name(spec: ComponentSpec, obj: Any) -> str:
    if isinstance(spec.ref, str):
        return spec.ref.rpartition(":")[2].rpartition(".")[2] if ":" in spec.ref else spec.ref
    return getattr(obj, "__name__", None) or type(obj).__name__


def _declared_name(obj: Any) -> str | None:
    meta = getattr(obj, "__reinforge_reward__", None)
    if meta is not None:
        return meta.name
    return getattr(obj, "reinforge_name", None)


def _declared_kind(obj: Any) -> str | None:
    meta = getattr(obj, "__reinforge_reward__", None)
    if meta is not None:
        return meta.kind
    return getattr(obj, "reinforge_kind", None)


def _is_reward_class(obj: Any) -> bool:
    return isinstance(obj, type) and getattr(obj, "__reinforge_reward__", None) is not None


def _fields(settings: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(settings) and not isinstance(settings, type):
        return {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings) if f.init}
    return dict(settings)


def _defined(obj: Any, exc: Exception) -> str:
    origin = describe(obj)
    return "" if origin in str(exc) else f" (defined as {origin})"
