"""The one settings checker of reinforge: typed dataclasses built from run-file data.

Core's run configuration, every backend's ``backend_args`` and algorithm keys,
and the settings of judges, group rewards and workflows are all checked here,
so a typo or a wrong type fails before any model loads with a message that
names the file and the dotted key::

    from dataclasses import dataclass
    from reinforge.settings import FieldError, Settings, at_least, load

    @dataclass
    class MySettings(Settings):
        micro_batch: int = 8
        mode: str = "fast"

        def check(self) -> None:
            at_least("micro_batch", self.micro_batch, 1)
            one_of("mode", self.mode, ("fast", "exact"))

    load(MySettings, {"micro_batch": "8"}, where="run.yaml", prefix="backend_args")
    # ConfigError: run.yaml: backend_args.micro_batch: expected an integer, got str '8'

Type hints drive the conversion: ``int`` and ``float`` (an int is accepted
for a float, a bool for neither), ``str``, ``bool``, ``list[T]``,
``dict[str, T]``, unions with ``None``, ``Any``, ``Callable`` and nested
settings dataclasses (built from mappings).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar, Union

from .errors import ConfigError

__all__ = [
    "FieldError",
    "Settings",
    "at_least",
    "convert",
    "describe_value",
    "finite",
    "in_range",
    "load",
    "one_of",
    "settings_keys",
    "suggest",
]

T = TypeVar("T")


class FieldError(ConfigError):
    """A problem with one key; callers prefix the key path and the file.

    Raise it from :meth:`Settings.check` with the field name; nested settings
    and lists add their own prefix (``judges[1].args.rubric``).
    """

    def __init__(self, path: str, detail: str, *, form: str = "value", owner: str | None = None) -> None:
        """``path`` is the key (``micro_batch``), ``detail`` what is wrong with it."""
        self.path, self.detail, self.form, self.owner = path, detail, form, owner
        super().__init__(self.render())

    def render(self) -> str:
        """The message without the owner: ``key: detail``."""
        if self.form == "unknown":
            return f"unknown key '{self.path}'{self.detail}"
        if self.form == "missing":
            return f"missing required key '{self.path}'"
        return f"{self.path}: {self.detail}" if self.path else self.detail

    def nested(self, prefix: str) -> FieldError:
        """The same error one level down, under ``prefix``."""
        joiner = "" if not self.path or self.path.startswith("[") else "."
        return FieldError(f"{prefix}{joiner}{self.path}" if prefix else self.path, self.detail, form=self.form)

    def __str__(self) -> str:
        return f"{self.owner}: {self.render()}" if self.owner else self.render()


# --------------------------------------------------------------------------- value checks


def suggest(word: str, options: Iterable[str], n: int = 1) -> str:
    """`` (did you mean 'x'?)`` for the closest options, or ``""``."""
    matches = difflib.get_close_matches(word, list(options), n=n, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(m) for m in matches)}?)" if matches else ""


def one_of(key: str, value: Any, options: Sequence[str]) -> None:
    """Raise :class:`FieldError` unless ``value`` is one of ``options``."""
    if value not in options:
        hint = suggest(value, options, n=2) if isinstance(value, str) else ""
        raise FieldError(key, f"must be one of {', '.join(options)}; got {value!r}{hint}")


def at_least(key: str, value: float | None, low: float, *, strict: bool = False) -> None:
    """Raise unless ``value >= low`` (``> low`` when ``strict``); ``None`` passes."""
    if value is None:
        return
    if (value <= low) if strict else (value < low):
        raise FieldError(key, f"must be {'greater than' if strict else 'at least'} {low}, got {value}")


def in_range(key: str, value: float | None, low: float, high: float) -> None:
    """Raise unless ``low <= value <= high``; ``None`` passes."""
    if value is not None and not low <= value <= high:
        raise FieldError(key, f"must be between {low} and {high}, got {value}")


def finite(key: str, value: float | None) -> None:
    """Raise for NaN and infinities; ``None`` passes."""
    if value is not None and not math.isfinite(value):
        raise FieldError(key, f"must be a finite number, got {value}")


# --------------------------------------------------------------------------- type conversion


def _describe_type(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_describe_type(a) for a in typing.get_args(tp))
    if origin in (list, tuple):
        return "a list"
    if origin is dict:
        return "a mapping"
    if origin is Callable or tp is Callable:
        return "a callable"
    described = getattr(tp, "_type_description", None)
    if isinstance(described, str):
        return described
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def describe_value(value: Any) -> str:
    """``type repr`` of a value, shortened, for messages."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the type hint ``tp``, building nested settings from mappings."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None:
            if type(None) in options:
                return None
        else:
            for option in options:
                if option is type(None):
                    continue
                try:
                    return _convert(value, option, key)
                except FieldError as exc:
                    if exc.path != key or exc.form != "value" or not exc.detail.startswith("expected "):
                        raise  # a nested problem inside a matching type: report it, not the union
        raise FieldError(key, f"expected {_describe_type(tp)}, got {describe_value(value)}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise FieldError(key, f"expected a list, got {describe_value(value)}")
        args = typing.get_args(tp) or (Any,)
        if origin is list or (len(args) == 2 and args[1] is Ellipsis):
            items = [_convert(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
            return items if origin is list else tuple(items)
        if len(args) != len(value):
            raise FieldError(key, f"expected a list of {len(args)} items, got {describe_value(value)}")
        return tuple(_convert(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict:
        if not isinstance(value, dict):
            raise FieldError(key, f"expected a mapping, got {describe_value(value)}")
        _, item = typing.get_args(tp) or (str, Any)
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise FieldError(key, f"keys must be strings, got {describe_value(k)}")
            out[k] = _convert(v, item, f"{key}.{k}")
        return out
    if origin is Callable or tp is Callable:
        if callable(value):
            return value
    elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        coerce = getattr(tp, "_coerce", None)
        if coerce is not None and not isinstance(value, dict):
            made = coerce(value)
            if made is not None:
                return made
        if isinstance(value, dict):
            try:
                return _build(tp, value)
            except FieldError as exc:
                raise exc.nested(key) from None
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(tp, type) and isinstance(value, tp):
        return value
    raise FieldError(key, f"expected {_describe_type(tp)}, got {describe_value(value)}")


_HINTS: dict[type, dict[str, Any]] = {}  # type hints per settings class (classes never change their hints)


def _hints(cls: type) -> dict[str, Any]:
    found = _HINTS.get(cls)
    if found is None:
        found = _HINTS[cls] = typing.get_type_hints(cls)
    return found


def settings_keys(cls: type) -> dict[str, dataclasses.Field[Any]]:
    """The keys a run file may set for ``cls``: init fields not marked ``metadata={"yaml": False}``."""
    return {f.name: f for f in dataclasses.fields(cls) if f.init and f.metadata.get("yaml", True)}


def _build(cls: type[T], data: dict[str, Any]) -> T:
    """Build ``cls`` from a mapping; keys in errors are relative to ``cls``."""
    normalize = getattr(cls, "_normalize", None)
    data = normalize(dict(data)) if normalize is not None else dict(data)
    known = settings_keys(cls)
    open_keys = getattr(cls, "_open_keys", False)  # e.g. algorithm: a backend checks the rest
    for key in data:
        if not isinstance(key, str):
            raise FieldError("", f"keys must be strings, got {describe_value(key)}")
        if key not in known and not open_keys:
            raise FieldError(key, suggest(key, known), form="unknown")
    for name, f in known.items():
        if name not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise FieldError(name, "", form="missing")
    return cls(**data)


class Settings:
    """Base of a settings dataclass: every field is converted and checked after ``__init__``.

    Subclass it together with ``@dataclass``. Override :meth:`check` for value
    checks that types cannot express (raise :class:`FieldError` with the field
    name). Instances built in Python are checked too, so ``MySettings(x="8")``
    fails the same way a run file does.
    """

    def __post_init__(self) -> None:
        try:
            self._prepare()
            hints = _hints(type(self))
            for f in dataclasses.fields(self):  # type: ignore[arg-type]
                setattr(self, f.name, _convert(getattr(self, f.name), hints[f.name], f.name))
            self.check()
        except FieldError as exc:
            exc.owner = type(self).__name__
            raise

    def _prepare(self) -> None:
        """Reshape shorthand inputs before the type checks (core's configs use it)."""

    def check(self) -> None:
        """Value checks that types cannot express; raise :class:`FieldError` naming the key."""


def load(cls: type[T], data: Any, *, where: str, prefix: str = "") -> T:
    """Build the settings dataclass ``cls`` from plain data (parsed YAML/JSON or keyword arguments).

    :param cls: a dataclass, usually a :class:`Settings` subclass.
    :param data: a mapping (``None`` means no keys set).
    :param where: the file (or ``"tune()"``), first in every message.
    :param prefix: the dotted key of ``data`` in that file, e.g. ``"backend_args"``.
    :raises ConfigError: ``"run.yaml: backend_args.micro_batch: expected an integer, got str '8'"``.
    """
    if data is None:
        data = {}
    if isinstance(data, cls):
        return data
    if not isinstance(data, dict):
        label = prefix or "the top level"
        raise ConfigError(f"{where}: {label} must be a mapping, got {describe_value(data)}")
    try:
        return _build(cls, data)
    except FieldError as exc:
        raise ConfigError(f"{where}: {exc.nested(prefix).render()}") from None


def convert(value: Any, tp: Any, *, where: str, key: str) -> Any:
    """Check one value against a type hint, with the same messages as :func:`load`."""
    try:
        return _convert(value, tp, key)
    except FieldError as exc:
        raise ConfigError(f"{where}: {exc.render()}" if where else exc.render()) from None
