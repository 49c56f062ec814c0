"""Tools an agent can call: the ``@tool`` decorator, JSON schemas from type hints, arguments, timeouts.

A tool is a plain function, sync or async. ``@tool`` reads its name, its
description and each argument's description from the docstring (Google, numpy
or Sphinx style) and each argument's JSON-schema type from the type hints, and
returns a :class:`Tool` that is still callable as the function::

    @tool(timeout=5)
    def calculator(expression: str) -> str:
        \"\"\"Evaluate an arithmetic expression.

        Args:
            expression: The arithmetic to compute, e.g. "127 * 48".
        \"\"\"
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import enum
import functools
import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reinforge.plugin import ReinforgeError

from .docstrings import parse_docstring

__all__ = [
    "Tool",
    "ToolArgumentError",
    "ToolDefinitionError",
    "ToolTimeoutError",
    "format_result",
    "json_schema",
    "tool",
]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what OpenAI accepts as a function name


class ToolDefinitionError(ReinforgeError, TypeError):
    """A function cannot be made into a tool (a bad name, an argument type with no JSON schema, ...)."""


class ToolArgumentError(ValueError):
    """The arguments of a tool call do not fit the tool's parameters (the model's mistake)."""


class ToolTimeoutError(TimeoutError):
    """A tool ran past its timeout."""


# --------------------------------------------------------------------------- JSON schema from type hints

_SCALARS: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
}


def json_schema(annotation: Any, where: str = "") -> dict[str, Any]:
    """The JSON schema of a type hint: scalars, ``list[...]``, ``dict[str, ...]``, ``Literal``, ``Enum``, unions."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    if annotation in _SCALARS:
        return dict(_SCALARS[annotation])
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        described = json_schema(args[0], where)
        notes = [a for a in args[1:] if isinstance(a, str)]
        if notes:
            described["description"] = " ".join(notes)
        return described
    if origin is typing.Union or (hasattr(types, "UnionType") and isinstance(annotation, types.UnionType)):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:  # Optional[X]: the argument is optional, its type is X
            return json_schema(options[0], where)
        return {"anyOf": [json_schema(a, where) for a in args]}
    if origin is typing.Literal:
        schema: dict[str, Any] = {"enum": list(args)}
        kinds = {type(a) for a in args}
        if len(kinds) == 1 and next(iter(kinds)) in _SCALARS:
            schema.update(_SCALARS[next(iter(kinds))])
        return schema
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"enum": [member.value for member in annotation]}
    container = origin or annotation
    if container in (list, tuple, set, frozenset) or (isinstance(container, type) and container is Sequence):
        schema = {"type": "array"}
        item_types = [a for a in args if a is not Ellipsis]
        if len(set(item_types)) == 1:
            schema["items"] = json_schema(item_types[0], where)
        return schema
    if container in (dict, Mapping):
        schema = {"type": "object"}
        if len(args) == 2 and args[1] is not Any:
            schema["additionalProperties"] = json_schema(args[1], where)
        return schema
    raise ToolDefinitionError(
        f"{where}has type {annotation!r}, which has no JSON schema; use str, int, float, bool, list[...], "
        "dict[str, ...], Literal[...], an Enum or a union of those"
    )


def _parameters(func: Callable[..., Any], label: str, described: dict[str, str]) -> tuple[dict[str, Any], bool]:
    """The JSON schema of ``func``'s arguments, and whether it takes ``**kwargs``."""
    target = func
    while isinstance(target, functools.partial):
        target = target.func
    if not (inspect.isfunction(target) or inspect.ismethod(target)):
        target = getattr(target, "__call__", target)  # noqa: B004 - a callable object
    try:
        hints = typing.get_type_hints(target, include_extras=True)
    except Exception as exc:
        raise ToolDefinitionError(f"tool {label}: cannot resolve its type hints: {exc}") from exc
    properties: dict[str, Any] = {}
    required: list[str] = []
    extra = False
    for p in inspect.signature(func).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            extra = True
            continue
        if p.kind is p.VAR_POSITIONAL:
            raise ToolDefinitionError(f"tool {label}: *{p.name} cannot be described to a model; name each argument")
        if p.kind is p.POSITIONAL_ONLY:
            raise ToolDefinitionError(
                f"tool {label}: argument {p.name!r} is positional-only; tools get arguments by name"
            )
        schema = json_schema(hints.get(p.name, p.annotation), f"tool {label}: argument {p.name!r} ")
        if described.get(p.name):
            schema["description"] = described[p.name]
        if p.default is p.empty:
            required.append(p.name)
        else:
            try:
                json.dumps(p.default)
                schema["default"] = p.default
            except (TypeError, ValueError):
                pass
        properties[p.name] = schema
    unknown = sorted(set(described) - set(properties))
    if unknown and not extra:
        raise ToolDefinitionError(f"tool {label}: the docstring describes {unknown}, which are not arguments")
    parameters: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    if not extra:
        parameters["additionalProperties"] = False
    return parameters, extra


# --------------------------------------------------------------------------- argument coercion

_TRUE, _FALSE = {"true", "yes", "1"}, {"false", "no", "0"}


def _coerce(value: Any, schema: dict[str, Any], name: str) -> Any:
    """Make ``value`` fit a top-level argument schema where the intent is clear ("3" for an integer)."""
    kind = schema.get("type")
    out = value
    if kind == "integer":
        if isinstance(value, bool):
            raise ToolArgumentError(f"argument {name!r} must be an integer, got {value!r}")
        integral = isinstance(value, float) and value.is_integer()
        if integral or (isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+\s*", value)):
            out = int(value)
        elif not isinstance(value, int):
            raise ToolArgumentError(f"argument {name!r} must be an integer, got {value!r}")
    elif kind == "number":
        if isinstance(value, str):
            try:
                out = float(value)
            except ValueError:
                raise ToolArgumentError(f"argument {name!r} must be a number, got {value!r}") from None
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ToolArgumentError(f"argument {name!r} must be a number, got {value!r}")
    elif kind == "string":
        if isinstance(value, (dict, list)):
            out = json.dumps(value)
        elif value is not None and not isinstance(value, str):
            out = str(value)
    elif kind == "boolean":
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            out = value.strip().lower() in _TRUE
        elif isinstance(value, int) and value in (0, 1):
            out = bool(value)
        elif not isinstance(value, bool):
            raise ToolArgumentError(f"argument {name!r} must be true or false, got {value!r}")
    elif kind == "array" and not isinstance(value, list):
        if isinstance(value, (tuple, set)):
            out = list(value)
        else:
            raise ToolArgumentError(f"argument {name!r} must be a list, got {value!r}")
    elif kind == "object" and not isinstance(value, dict):
        raise ToolArgumentError(f"argument {name!r} must be an object, got {value!r}")
    if "enum" in schema and out not in schema["enum"]:
        raise ToolArgumentError(f"argument {name!r} must be one of {schema['enum']}, got {value!r}")
    return out


def format_result(value: Any) -> str:
    """A tool's return value as the text the model reads."""
    if isinstance(value, str):
        return value
    if value is None:
        return "(no output)"
    if isinstance(value, (dict, list, tuple, bool, int, float)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


# --------------------------------------------------------------------------- Tool


@dataclass
class Tool:
    """A function the agent may call, with the JSON schema of its arguments.

    Build one with :func:`tool`. Calling the object calls the function.
    ``timeout`` (seconds) overrides the agent's default for this tool.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    func: Callable[..., Any] = field(repr=False)
    timeout: float | None = None
    accepts_extra: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ToolDefinitionError(
                f"tool name {self.name!r} (function {_label(self.func)}) must be 1-64 letters, digits, '_' or '-'"
            )
        if self.timeout is not None and not self.timeout > 0:
            raise ToolDefinitionError(f"tool {self.name!r}: timeout must be a positive number of seconds")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    @property
    def is_async(self) -> bool:
        func = self.func
        while isinstance(func, functools.partial):
            func = func.func
        return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))  # noqa: B004

    @property
    def required(self) -> list[str]:
        return list(self.parameters.get("required", []))

    @property
    def argument_names(self) -> list[str]:
        return list(self.parameters.get("properties", {}))

    def replace(self, **changes: Any) -> Tool:
        """A copy with some fields changed (``timeout``, ``name``, ``description``)."""
        return dataclasses.replace(self, parameters=copy.deepcopy(self.parameters), **changes)

    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry of this tool."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def arguments(self, raw: Any) -> dict[str, Any]:
        """Check and coerce the arguments of one call.

        ``raw`` is a dict, or a single value when the tool has exactly one
        argument (small models often write ``Action Input: 12 * 7``).
        Raises :class:`ToolArgumentError` with a message for the model.
        """
        names = self.argument_names
        if raw is None or raw == "":
            raw = {}
        if not isinstance(raw, dict):
            targets = self.required if len(self.required) == 1 else names
            if len(targets) != 1:
                expected = ", ".join(names) or "no arguments"
                raise ToolArgumentError(
                    f"tool {self.name!r} takes {expected}; give the input as a JSON object with those keys"
                )
            raw = {targets[0]: raw}
        properties = self.parameters.get("properties", {})
        unknown = [k for k in raw if k not in properties]
        if unknown and not self.accepts_extra:
            raise ToolArgumentError(
                f"tool {self.name!r} has no argument {', '.join(map(repr, unknown))}; "
                f"its arguments are: {', '.join(names) or 'none'}"
            )
        missing = [k for k in self.required if k not in raw]
        if missing:
            raise ToolArgumentError(f"tool {self.name!r} needs argument {', '.join(map(repr, missing))}")
        return {
            k: _coerce(v, properties[k], k) if k in properties and not (v is None and k not in self.required) else v
            for k, v in raw.items()
        }

    async def run(self, arguments: dict[str, Any], timeout: float | None = None) -> Any:
        """Call the tool with checked arguments, within ``self.timeout`` (else ``timeout``) seconds.

        Raises :class:`ToolTimeoutError` on timeout; other exceptions are the
        tool's own. A sync tool runs in a thread; on timeout the thread is
        abandoned (Python cannot stop it), so sync tools should not block forever.
        """
        limit = self.timeout if self.timeout is not None else timeout
        if self.is_async:
            work = self.func(**arguments)
        else:
            work = asyncio.to_thread(functools.partial(self.func, **arguments))
        if limit is None:
            result = await work
        else:
            try:
                result = await asyncio.wait_for(work, limit)
            except asyncio.TimeoutError:
                raise ToolTimeoutError(f"tool {self.name!r} timed out after {limit:g}s") from None
        if inspect.isawaitable(result):  # a sync wrapper that returned a coroutine
            result = await result
        return result


def _label(func: Any) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}"


def tool(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
) -> Any:
    """Make a function into a :class:`Tool`; usable as ``@tool`` or ``@tool(name=..., timeout=...)``.

    :param name: the name the model calls it by (default: the function's name).
    :param description: default: the docstring's text before its sections.
    :param timeout: seconds the tool may run; default: the agent's ``tool_timeout``.
    :raises ToolDefinitionError: naming the function and the argument that cannot be described.
    """

    def make(fn: Callable[..., Any]) -> Tool:
        if isinstance(fn, Tool):
            pairs = (("name", name), ("description", description), ("timeout", timeout))
            changes = {k: v for k, v in pairs if v is not None}
            return fn.replace(**changes) if changes else fn
        if not callable(fn):
            raise ToolDefinitionError(f"@tool needs a function, got {type(fn).__name__}")
        label = _label(fn)
        doc = parse_docstring(inspect.getdoc(fn))
        parameters, extra = _parameters(fn, label, doc.params)
        tool_name = name or getattr(fn, "__name__", None) or type(fn).__name__
        return Tool(
            name=tool_name,
            description=description or doc.description or f"the {tool_name} tool",
            parameters=parameters,
            func=fn,
            timeout=timeout,
            accepts_extra=extra,
        )

    return make(func) if func is not None else make
