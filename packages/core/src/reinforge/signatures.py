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
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import ComponentError, RewardError, SignatureError
from .outputs import GroupRewardOutput, JudgeOutput, TaskStatus, WorkflowOutput
from .settings import suggest

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
    """A checked user function plus the settings bound to it, built once per run.

    ``name`` is what messages and logs call it (the registered name, the
    ``module:attr`` reference, or ``module:qualname`` of a callable);
    ``reward_range`` is checked on every output; ``closers`` run when the run
    ends (a component built from a class is closed through them).
    """

    func: Callable[..., Any]
    role: str
    name: str
    settings: dict[str, Any] = field(default_factory=dict)
    passes: tuple[str, ...] = ()
    is_async: bool = True
    metric_name: str | None = None
    judge_kind: str | None = None
    reward_range: tuple[float, float] | None = None
    closers: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def close(self) -> None:
        """Close what was built for this run (``close()``/``aclose()`` of a class component)."""
        while self.closers:
            self.closers.pop()()

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
        """Coerce plain numbers; reject what breaks the contract with a :class:`RewardError` naming the function.

        A non-finite reward, a reward outside the declared ``reward_range`` and
        ``TaskStatus.ERROR`` (a permanent error) are errors that stop the run.
        """
        what = self.role.replace("_", " ")
        if self.role == "workflow":
            if not isinstance(out, WorkflowOutput):
                raise RewardError(f"workflow {self.name} returned {type(out).__name__}, expected WorkflowOutput")
            if out.reward is not None:
                self._check_reward(out.reward, "reward")
        elif self.role == "judge":
            if isinstance(out, (int, float)) and not isinstance(out, bool):
                self._check_reward(out, "reward")
                return JudgeOutput(reward=float(out))
            if not isinstance(out, JudgeOutput):
                raise RewardError(f"judge {self.name} returned {type(out).__name__}, expected JudgeOutput or a number")
            if out.status is TaskStatus.SUCCESS:
                self._check_reward(out.reward, "reward")
        else:
            if isinstance(out, list):
                for i, r in enumerate(out):
                    self._check_reward(r, f"rewards[{i}]")
                out = GroupRewardOutput(rewards=out)
            if not isinstance(out, GroupRewardOutput):
                raise RewardError(f"group reward {self.name} returned {type(out).__name__}, expected GroupRewardOutput")
            if out.status is TaskStatus.SUCCESS:
                if group_size is not None and len(out.rewards) != group_size:
                    raise RewardError(
                        f"group reward {self.name} returned {len(out.rewards)} rewards for a group of {group_size}; "
                        "it must return exactly one reward per response"
                    )
                for i, r in enumerate(out.rewards):
                    self._check_reward(r, f"rewards[{i}]")
        if out.status is TaskStatus.ERROR:
            raise ComponentError(f"{what} {self.name} reported a permanent error: {out.error or 'no message'}")
        return out

    def _check_reward(self, value: Any, label: str) -> None:
        what = self.role.replace("_", " ")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RewardError(f"{what} {self.name} returned {label} {value!r}, which is not a number")
        if not math.isfinite(value):
            raise RewardError(f"{what} {self.name} returned a non-finite {label}: {value}")
        if self.reward_range is not None:
            low, high = self.reward_range
            if not low <= value <= high:
                raise RewardError(
                    f"{what} {self.name} returned {label} {value:g}, outside its declared range [{low:g}, {high:g}]"
                )


def _is_async(func: Any) -> bool:
    while isinstance(func, functools.partial):
        func = func.func
    if inspect.iscoroutinefunction(func):
        return True
    call = getattr(func, "__call__", None)  # noqa: B004 - callable objects
    return inspect.iscoroutinefunction(call)


def bind(
    func: Any,
    role: str,
    settings: dict[str, Any] | None = None,
    *,
    name: str | None = None,
    contract_only: bool = False,
) -> BoundFunction:
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
        if p.default is p.empty and p.name not in settings and not contract_only:
            raise SignatureError(
                f"{kind} {label} has parameter {p.name!r}, which is not part of the contract "
                f"({', '.join(required + OPTIONAL)}) and has no default; give it a default or set it in args"
            )
    accepts_any = any(p.kind is p.VAR_KEYWORD for p in params)
    for key in settings:
        if key in required or key in OPTIONAL:
            raise SignatureError(f"{kind} {label}: {key!r} is passed by reinforge and cannot be set in args")
        if key not in known and not accepts_any:
            settable = sorted(known - set(required) - set(OPTIONAL))
            raise SignatureError(
                f"{kind} {label} has no parameter {key!r} (set in args){suggest(key, settable)}; "
                f"its settings: {', '.join(settable) or 'none'}"
            )
    return BoundFunction(func, role, label, settings, tuple(passes), _is_async(func))


def check_registered(obj: Any, role: str, name: str) -> None:
    """Check a registered object against the ``role`` contract without calling or building it.

    Why at registration: a judge without a ``response`` parameter, or a class
    without ``__call__``, would otherwise be listed as fine by
    ``reinforge plugins`` and fail only in a run. A function is checked as
    :func:`bind` checks it (settings may fill its parameters without
    defaults); a class through its ``__call__`` as its instances see it; a
    ``@reward_func`` class was checked when it was decorated.

    :raises SignatureError: naming the component and what is wrong.
    """
    kind = role.replace("_", " ")
    if isinstance(obj, type):
        if getattr(obj, "__reinforge_reward__", None) is not None:
            return
        owner = next((c for c in obj.__mro__ if c is not object and "__call__" in vars(c)), None)
        if owner is None:
            raise SignatureError(
                f"{kind} class {name} has no __call__; its instances must be callable as "
                f"({', '.join(REQUIRED[role])}, auxiliary_models=None, logger=None)"
            )
        try:
            params = list(inspect.signature(vars(owner)["__call__"]).parameters.values())[1:]
        except (TypeError, ValueError) as exc:
            raise SignatureError(f"cannot read the signature of {kind} {name}.__call__: {exc}") from exc
        bind(_SignatureOnly(inspect.Signature(params)), role, {}, name=name)
        return
    bind(obj, role, {}, name=name, contract_only=True)


class _SignatureOnly:
    """A stand-in with a given signature, for checking a class's ``__call__`` as its instances see it."""

    def __init__(self, sig: inspect.Signature) -> None:
        self.__signature__ = sig

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never called
        raise NotImplementedError
