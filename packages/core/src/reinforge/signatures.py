"""Checking user functions against the contracts and calling them.

As in AgentScope's tuner, ``auxiliary_models`` and ``logger`` are passed only
when the function declares them. Parameters with defaults beyond those are the
function's settings, filled from a run file's ``args``. Sync functions run in a
thread so they never block the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import RewardError, SignatureError
from .outputs import GroupRewardOutput, JudgeOutput, WorkflowOutput

REQUIRED = {
    "workflow": ("task", "model"),
    "judge": ("task", "response"),
    "group_reward": ("task", "responses"),
}
OPTIONAL = ("auxiliary_models", "logger")


def describe(func: Any) -> str:
    """``module:qualname`` of a function, bound method, partial or callable object."""
    while isinstance(func, functools.partial):
        func = func.func
    target = func if (inspect.isfunction(func) or inspect.ismethod(func)) else type(func)
    module = getattr(target, "__module__", None) or "?"
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    return f"{module}:{name}"


@dataclass
class BoundFunction:
    """A checked user function plus the settings bound to it."""

    func: Callable[..., Any]
    role: str
    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    passes: tuple[str, ...] = ()
    is_async: bool = True

    async def call(self, first: Any, second: Any, *, auxiliary_models: Any = None, logger: Any = None) -> Any:
        kwargs = dict(self.settings)
        if "auxiliary_models" in self.passes:
            kwargs["auxiliary_models"] = auxiliary_models
        if "logger" in self.passes:
            kwargs["logger"] = logger
        a, b = REQUIRED[self.role]
        kwargs[a], kwargs[b] = first, second
        if self.is_async:
            return await self.func(**kwargs)
        return await asyncio.to_thread(functools.partial(self.func, **kwargs))

    def check_output(self, out: Any, group_size: int | None = None) -> Any:
        """Coerce plain numbers; reject anything else that is not the contract's type."""
        if self.role == "workflow":
            if not isinstance(out, WorkflowOutput):
                raise RewardError(f"workflow {self.name} returned {type(out).__name__}, expected WorkflowOutput")
            return out
        if self.role == "judge":
            if isinstance(out, (int, float)):
                return JudgeOutput(reward=float(out))
            if not isinstance(out, JudgeOutput):
                raise RewardError(f"judge {self.name} returned {type(out).__name__}, expected JudgeOutput or a number")
            return out
        if isinstance(out, list):
            out = GroupRewardOutput(rewards=out)
        if not isinstance(out, GroupRewardOutput):
            raise RewardError(f"group reward {self.name} returned {type(out).__name__}, expected GroupRewardOutput")
        if out.status.value == "success" and group_size is not None and len(out.rewards) != group_size:
            raise RewardError(
                f"group reward {self.name} returned {len(out.rewards)} rewards for a group of {group_size}; "
                "it must return exactly one reward per response"
            )
        return out


def _is_async(func: Any) -> bool:
    while isinstance(func, functools.partial):
        func = func.func
    if inspect.iscoroutinefunction(func):
        return True
    call = getattr(func, "__call__", None)  # noqa: B004 - callable objects
    return inspect.iscoroutinefunction(call)


def bind(func: Any, role: str, settings: dict[str, Any] | None = None, *, name: str | None = None) -> BoundFunction:
    """Check ``func`` against the ``role`` contract and bind ``settings`` to it.

    Raises :class:`SignatureError` naming the function and the offending
    parameter or setting.
    """
    if role not in REQUIRED:
        raise ValueError(f"unknown role {role!r}")
    label = name or describe(func)
    kind = role.replace("_", " ")
    if not callable(func):
        raise SignatureError(f"{kind} {label} is not callable (got {type(func).__name__})")
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError) as exc:
        raise SignatureError(f"cannot read the signature of {kind} {label}: {exc}") from exc
    params = list(sig.parameters.values())
    required = REQUIRED[role]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for i, want in enumerate(required):
        if i >= len(positional) or positional[i].name != want:
            got = positional[i].name if i < len(positional) else None
            detail = f"parameter {i + 1} is {got!r}" if got else "it has no such parameter"
            raise SignatureError(
                f"{kind} {label} must take ({', '.join(required)}, auxiliary_models=None, logger=None) as "
                f"its first parameters; {detail}, expected {want!r}"
            )
    settings = dict(settings or {})
    passes: list[str] = []
    known: set[str] = set(required)
    for p in params:
        if p.name in required:
            continue
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        known.add(p.name)
        if p.name in OPTIONAL:
            passes.append(p.name)
            continue
        if p.kind is p.POSITIONAL_ONLY:
            raise SignatureError(
                f"{kind} {label}: parameter {p.name!r} is positional-only; reinforge passes settings by name"
            )
        if p.default is p.empty and p.name not in settings:
            raise SignatureError(
                f"{kind} {label} has parameter {p.name!r}, which is not part of the contract "
                f"({', '.join(required + OPTIONAL)}) and has no default; give it a default or set it in args"
            )
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in params)
    for key in settings:
        if key in required or key in OPTIONAL:
            raise SignatureError(f"{kind} {label}: {key!r} is passed by reinforge and cannot be set in args")
        if key not in known and not accepts_any:
            raise SignatureError(f"{kind} {label} has no parameter {key!r} (set in args)")
    return BoundFunction(func, role, label, settings, tuple(passes), _is_async(func))
