"""Turning references into functions: a callable, ``"module:attr"`` or a registered name.

A user needs no package to use their own function: ``"my_module:my_judge"``
works the same as a name some plugin registered. Failures say which reference,
which module or attribute, and what is registered instead.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ResolveError
from .registry import Kind, kind_named

if TYPE_CHECKING:
    from .registry import Component, Registry

__all__ = ["resolve", "resolve_entry", "resolve_ref"]


def _prefix(where: str) -> str:
    return f"{where}: " if where else ""


def _hint(word: str, options: list[str]) -> str:
    match = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def resolve_entry(
    ref: Any, kind: str | Kind, registry: Registry | None, *, where: str = "", base_dir: str | None = None
) -> tuple[Any, Component | None]:
    """``(object, its registry entry or None)`` for ``ref``; see :func:`resolve_ref`."""
    k = registry._kind(kind) if registry is not None and not isinstance(kind, Kind) else kind_named(kind)
    if callable(ref) and not isinstance(ref, str):
        return ref, None
    if not isinstance(ref, str) or not ref.strip():
        raise ResolveError(
            f"{_prefix(where)}{k.singular} reference must be a name, 'module:attr' or a callable, got {ref!r}"
        )
    if ":" in ref:
        return _import_attr(ref, k.singular, where, base_dir), None
    comp = _lookup(ref, k, registry, where)
    return comp.obj, comp


def resolve_ref(
    ref: Any, kind: str | Kind, registry: Registry | None, *, where: str = "", base_dir: str | None = None
) -> Any:
    """Return the object ``ref`` points to.

    :param ref: a callable (returned as is), ``"module:attr"`` (``attr`` may be
        dotted) or a name registered for ``kind``.
    :param kind: ``workflows``, ``judges``, ``group_rewards``, ``backends``
        (singular accepted) or a package's own :class:`~reinforge.registry.Kind`.
    :param registry: where names are looked up: the run's registry
        (``TuneJob.registry``, ``ComponentContext.registry``), so a run sees the
        plugins it was loaded with and no others. Required; ``None`` says there
        is none, and then only callables and ``module:attr`` resolve.
    :param where: location for messages, e.g. ``"run.yaml: judges[0]"``.
    :param base_dir: put on ``sys.path`` while importing (the run file's folder).
    :raises ResolveError: naming the reference and what went wrong.
    :raises TypeError: ``ref`` is a name and ``registry`` is None.
    """
    return resolve_entry(ref, kind, registry, where=where, base_dir=base_dir)[0]


resolve = resolve_ref  # the 0.2 name


def _import_attr(ref: str, what: str, where: str, base_dir: str | None) -> Any:
    module_name, _, attr = ref.partition(":")
    module_name, attr = module_name.strip(), attr.strip()
    if not module_name or not attr:
        raise ResolveError(f"{_prefix(where)}{what} reference {ref!r} must look like 'module:attr'")
    if base_dir:
        _forget_foreign(module_name, base_dir)
    added = base_dir is not None and bool(base_dir) and base_dir not in sys.path
    if added and base_dir is not None:
        sys.path.insert(0, base_dir)
    try:
        importlib.invalidate_caches()  # the module may have been written after start-up
        module = importlib.import_module(module_name)
    except Exception as exc:
        missing_name = exc.name if isinstance(exc, ModuleNotFoundError) else None
        if missing_name is not None and module_name.startswith(missing_name):
            searched = f" (searched sys.path and {base_dir})" if base_dir else " (searched sys.path)"
            detail = f"no module named {missing_name!r}{searched}"
        else:
            detail = f"importing it raised {type(exc).__name__}: {exc}"
        raise ResolveError(
            f"{_prefix(where)}cannot import module {module_name!r} for {what} {ref!r}: {detail}"
        ) from exc
    finally:
        if added and base_dir in sys.path:
            sys.path.remove(base_dir)
    if base_dir:
        _note_run_folder_module(module_name, base_dir)
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


_from_run_folders: dict[str, Any] = {}  # top-level modules imported from a run file's folder


def _forget_foreign(module_name: str, base_dir: str) -> None:
    """Drop an imported ``module_name`` that came from elsewhere when ``base_dir`` holds its own.

    Run files name their folder's modules by short names (``judges:exact``); two run
    files loaded in one process (tests, a notebook, an eval after a tune) would otherwise
    share the first one's ``judges``. The run file's own module wins, as a fresh import.
    """
    top = module_name.split(".", 1)[0]
    loaded = sys.modules.get(top)
    if loaded is None or _from_run_folders.get(top) is not loaded:  # only what a run folder gave (never stdlib)
        return
    own = _own_file(top, base_dir)
    if own is None or _file_of(loaded) == own:
        return
    for name in [n for n in sys.modules if n == top or n.startswith(f"{top}.")]:
        del sys.modules[name]
    del _from_run_folders[top]


def _own_file(top: str, base_dir: str) -> Path | None:
    folder = Path(base_dir).resolve()
    return next((p for p in (folder / f"{top}.py", folder / top / "__init__.py") if p.is_file()), None)


def _file_of(module: Any) -> Path | None:
    origin = getattr(module, "__file__", None)
    return Path(origin).resolve() if origin else None


def _note_run_folder_module(module_name: str, base_dir: str) -> None:
    top = module_name.split(".", 1)[0]
    loaded = sys.modules.get(top)
    own = _own_file(top, base_dir)
    if loaded is not None and own is not None and _file_of(loaded) == own:
        _from_run_folders[top] = loaded


def _lookup(name: str, kind: Kind, registry: Registry | None, where: str) -> Component:
    if registry is None:  # never the installed plugins behind the caller's back: a run has its own registry
        raise TypeError(
            f"{_prefix(where)}{kind.singular} {name!r} is a registered name, but no registry was given to look it "
            "up in; pass the run's registry (TuneJob.registry, or reinforge.plugins.build_registry(plugin_manager))"
        )
    try:
        component = registry.get(kind, name)
    except Exception as exc:  # a name two plugins claim
        raise ResolveError(f"{_prefix(where)}{exc}") from None
    if component is not None:
        return component
    names = registry.names(kind)
    listing = f"registered {kind.label}: {', '.join(names)}" if names else f"no {kind.label} are registered at all"
    raise ResolveError(
        f"{_prefix(where)}no {kind.singular} named {name!r} is registered{_hint(name, names)}; {listing}. "
        f"To use your own function, write 'module:function'{registry.broken_note()}"
    )
