"""Turning references into functions: a callable, ``"module:attr"`` or a registered name.

A user needs no package to use their own function: ``"my_module:my_judge"``
works the same as a name some plugin registered. Failures say which reference,
which module or attribute, and what is registered instead.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from typing import TYPE_CHECKING, Any

from .errors import ResolveError, SignatureError
from .plugins import KINDS

if TYPE_CHECKING:
    from .config import ComponentSpec
    from .plugins import Registry
    from .signatures import BoundFunction

__all__ = ["resolve", "resolve_component"]

_SINGULAR = {"workflows": "workflow", "judges": "judge", "group_rewards": "group reward", "backends": "backend"}


def _kind(kind: str) -> str:
    plural = kind if kind in KINDS else f"{kind}s"
    if plural not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")
    return plural


def _prefix(where: str) -> str:
    return f"{where}: " if where else ""


def _hint(word: str, options: list[str]) -> str:
    match = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def resolve(
    ref: Any, kind: str, registry: Registry | None = None, *, where: str = "", base_dir: str | None = None
) -> Any:
    """Return the object ``ref`` points to.

    :param ref: a callable (returned as is), ``"module:attr"`` (``attr`` may be
        dotted) or a name registered for ``kind``.
    :param kind: ``workflows``, ``judges``, ``group_rewards`` or ``backends``
        (singular accepted).
    :param registry: where names are looked up; the installed plugins' when None.
    :param where: location for messages, e.g. ``"run.yaml: judges[0]"``.
    :param base_dir: put on ``sys.path`` while importing (the run file's folder).
    :raises ResolveError: naming the reference and what went wrong.
    """
    plural = _kind(kind)
    what = _SINGULAR[plural]
    if callable(ref) and not isinstance(ref, str):
        return ref
    if not isinstance(ref, str) or not ref.strip():
        raise ResolveError(f"{_prefix(where)}{what} reference must be a name, 'module:attr' or a callable, got {ref!r}")
    if ":" in ref:
        return _import_attr(ref, what, where, base_dir)
    return _lookup(ref, plural, registry, where)


def _import_attr(ref: str, what: str, where: str, base_dir: str | None) -> Any:
    module_name, _, attr = ref.partition(":")
    module_name, attr = module_name.strip(), attr.strip()
    if not module_name or not attr:
        raise ResolveError(f"{_prefix(where)}{what} reference {ref!r} must look like 'module:attr'")
    added = bool(base_dir) and base_dir not in sys.path
    if added:
        sys.path.insert(0, base_dir)
    try:
        importlib.invalidate_caches()  # the module may have been written after start-up
        module = importlib.import_module(module_name)
    except Exception as exc:
        missing = isinstance(exc, ModuleNotFoundError) and exc.name is not None and module_name.startswith(exc.name)
        if missing:
            searched = f" (searched sys.path and {base_dir})" if base_dir else " (searched sys.path)"
            detail = f"no module named {exc.name!r}{searched}"
        else:
            detail = f"importing it raised {type(exc).__name__}: {exc}"
        raise ResolveError(
            f"{_prefix(where)}cannot import module {module_name!r} for {what} {ref!r}: {detail}"
        ) from exc
    finally:
        if added and base_dir in sys.path:
            sys.path.remove(base_dir)
    obj: Any = module
    walked = module_name
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = [n for n in dir(obj) if not n.startswith("_")]
            raise ResolveError(
                f"{_prefix(where)}{what} {ref!r}: {walked!r} has no attribute {part!r}{_hint(part, public)}"
            )
        obj = getattr(obj, part)
        walked = f"{walked}:{part}" if walked == module_name else f"{walked}.{part}"
    return obj


def _lookup(name: str, plural: str, registry: Registry | None, where: str) -> Any:
    if registry is None:
        from .plugins import build_registry, get_plugin_manager

        registry = build_registry(get_plugin_manager())
    component = registry.get(plural, name)
    if component is not None:
        return component.obj
    names = registry.names(plural)
    label = plural.replace("_", " ")
    listing = f"registered {label}: {', '.join(names)}" if names else f"no {label} are registered at all"
    raise ResolveError(
        f"{_prefix(where)}no {_SINGULAR[plural]} named {name!r} is registered{_hint(name, names)}; {listing}. "
        "To use your own function, write 'module:function'"
    )


def resolve_component(
    spec: ComponentSpec, role: str, registry: Registry | None = None, *, where: str = "", base_dir: str | None = None
) -> BoundFunction:
    """Resolve ``spec.ref`` and bind ``spec.args`` to it under the ``role`` contract.

    The bound function is named ``module:qualname`` so errors point at code;
    metrics use ``spec.metric_name``. Errors are :class:`ResolveError` or :class:`SignatureError` naming ``where``
    and the function.
    """
    from .signatures import REQUIRED, bind, describe

    if role not in REQUIRED:
        raise ValueError(f"unknown role {role!r}; expected one of {', '.join(REQUIRED)}")
    obj = resolve(spec.ref, role, registry, where=where, base_dir=base_dir)
    try:
        return bind(obj, role, spec.args)
    except SignatureError as exc:
        origin = describe(obj)
        suffix = "" if origin in str(exc) else f" (defined as {origin})"
        raise SignatureError(f"{_prefix(where)}{exc}{suffix}") from exc
