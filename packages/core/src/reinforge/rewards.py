"""Reward composition: judges, sub-dimensions, metric weights, the rule gate.

Final reward = ``gate_pass * sum(judge_weight * judge_score)`` where a judge's
score is its own reward, or with ``metric_weights`` the weighted sum of its
metrics (layer 3), and a judge built with :func:`reward_func` combines its
sub-dimensions (layer 2). Every dimension is reported under a stable name:
``reward/<judge>``, ``reward/<judge>/<metric>``, ``gate/<judge>``,
``boundary/<kind>``.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import logging
import math
import os
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .config import ScoreConfig
from .errors import ConfigError, RewardError
from .outputs import GroupRewardOutput, JudgeOutput, TaskStatus
from .retry import call_with_retries
from .signatures import OPTIONAL, BoundFunction
from .text import response_text

log = logging.getLogger("reinforge.rewards")

GATE_PASS = 0.5  # a gate passes when its reward is above this


def normalize_weights(
    weights: dict[str, float], *, what: str, strict: bool, source: str | None = None, key: str | None = None
) -> dict[str, float]:
    """Scale weights to sum to 1; warn (or raise when ``strict``) if they did not.

    The warning points at the run file ``source`` (the line of ``key`` when it is
    found there), not at reinforge's own code.
    """
    if not weights:
        return {}
    for name, w in weights.items():
        if not isinstance(w, (int, float)) or isinstance(w, bool) or w < 0 or not math.isfinite(w):
            raise ConfigError(f"{what}: weight of {name!r} must be a finite number >= 0, got {w!r}")
    total = float(sum(weights.values()))
    if total <= 0:
        raise ConfigError(f"{what}: weights sum to 0")
    if abs(total - 1.0) > 1e-6:
        msg = f"{what}: weights {weights} sum to {total:g}, not 1"
        if strict:
            raise ConfigError(msg + " (reward.strict_weights is on)")
        warn_at(msg + "; normalizing them", source, key)
    return {k: float(w) / total for k, w in weights.items()}


def warn_at(message: str, source: str | None, key: str | None = None) -> None:
    """A ``UserWarning`` reported at ``source`` (a run file or a module), on the line of ``key`` when found.

    Without a source it points at the first caller outside reinforge (a script calling ``tune()``).
    """
    if not source:
        warnings.warn(message, stacklevel=_outside_stacklevel())
        return
    prefix = "" if message.startswith(source) else f"{source}: "
    warnings.warn_explicit(prefix + message, UserWarning, filename=source, lineno=_line_of(source, key))


def _outside_stacklevel() -> int:
    """The ``stacklevel`` of the innermost frame outside the reinforge package, seen from ``warn_at``'s caller."""
    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame = sys._getframe(2)  # the caller of warn_at
    level = 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(here):
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    return level


def _line_of(path: str, key: str | None) -> int:
    """The 1-based line where ``key:`` starts in the file (1 when it is not found or not readable)."""
    if not key:
        return 1
    try:
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                stripped = line.lstrip()
                if stripped.startswith((f"{key}:", f"class {key}")):
                    return number
    except OSError:
        pass
    return 1


# -- layer 2: multi-dimensional judges built from a class -----------------------------


def sub_reward_func(name: str, sub_weight: float = 1.0) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a method of a :func:`reward_func` class as one scored sub-dimension.

    The method takes ``(self, task, response, auxiliary_models=None, logger=None)``
    (the last two only if declared) and returns a number or a ``JudgeOutput``.
    """

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.__reinforge_sub__ = (name, float(sub_weight))  # type: ignore[attr-defined]
        return fn

    return mark


def aggregate_func(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark the method that combines sub-dimension scores.

    Either ``(self, scores, weights, metrics)`` or, DashScope style, ``(self)``
    using ``self.get_scores()``, ``self.get_weights()``, ``self.get_reward_metrics()``.
    Returns a number or a ``JudgeOutput``. Without one, the weighted sum is used.
    """
    fn.__reinforge_aggregate__ = True  # type: ignore[attr-defined]
    return fn


@dataclass(frozen=True)
class RewardMeta:
    """What :func:`reward_func` declares: the metric name, the judge kind, strict sub-weights."""

    name: str
    kind: str = "rule"
    strict_weights: bool = False


def reward_func(name: str, *, kind: str = "rule", strict_weights: bool = False) -> Callable[[Any], Any]:
    """Name a judge (``name`` is its metric name); on a class, make its ``@sub_reward_func`` methods one judge.

    For a function referenced as ``module:attr`` this is how it declares its
    name and kind (registered judges declare them at registration instead). A
    decorated class is built once per run, with the run file's ``args`` as
    keyword arguments of its constructor (``setup()`` is called if defined), so
    its state lives exactly as long as the run.
    """
    if kind not in ("rule", "model"):
        raise ConfigError(f"reward_func({name!r}): kind must be 'rule' or 'model', got {kind!r}")

    def wrap(target: Any) -> Any:
        meta = RewardMeta(name, kind, strict_weights)
        if isinstance(target, type):
            MultiDimensionJudge.inspect(target, meta)  # a class without sub-dimensions fails here, at import
        target.__reinforge_reward__ = meta
        return target

    return wrap


class MultiDimensionJudge:
    """A judge made of sub-dimensions (one per run): see :func:`reward_func`."""

    def __init__(self, cls: type, instance: Any, meta: RewardMeta) -> None:
        self.cls = cls
        self.instance = instance
        self.reinforge_name = meta.name
        self.reinforge_kind = meta.kind
        self.__name__ = cls.__name__
        self.__qualname__ = cls.__qualname__
        self.__module__ = cls.__module__
        self.__doc__ = cls.__doc__
        self.subs, raw, self.aggregate_attr = self.inspect(cls, meta)
        self.weights = normalize_weights(
            raw,
            what=f"judge {meta.name!r} sub_weight",
            strict=meta.strict_weights,
            source=_source_file(cls),
            key=cls.__name__,
        )

    @staticmethod
    def inspect(
        cls: type, meta: RewardMeta
    ) -> tuple[list[tuple[str, str, bool, tuple[str, ...]]], dict[str, float], str | None]:
        """(sub-dimensions, their raw weights, the aggregate method's name) of a ``@reward_func`` class."""
        subs: list[tuple[str, str, bool, tuple[str, ...]]] = []  # (dimension, attr, async, passes)
        raw: dict[str, float] = {}
        aggregate_attr: str | None = None
        for attr, member in inspect.getmembers(cls, predicate=inspect.isfunction):
            if hasattr(member, "__reinforge_sub__"):
                dim, weight = member.__reinforge_sub__
                if dim in raw:
                    raise ConfigError(f"judge {meta.name!r}: sub-dimension {dim!r} is defined twice")
                raw[dim] = weight
                params = tuple(p for p in inspect.signature(member).parameters if p in OPTIONAL)
                subs.append((dim, attr, inspect.iscoroutinefunction(member), params))
            if getattr(member, "__reinforge_aggregate__", False):
                aggregate_attr = attr
        if not subs:
            raise ConfigError(f"judge {meta.name!r} ({cls.__qualname__}) has no @sub_reward_func methods")
        return subs, raw, aggregate_attr

    @classmethod
    def build(cls, target: type, settings: Any, *, declared_settings: bool = False) -> MultiDimensionJudge:
        """Instantiate ``target`` with the run's settings (``target(**args)``) and call its ``setup()``."""
        meta: RewardMeta = target.__reinforge_reward__  # type: ignore[attr-defined]
        instance = target(settings) if declared_settings else target(**settings)
        setup = getattr(instance, "setup", None)
        if callable(setup):
            setup()
        return cls(target, instance, meta)

    def close(self) -> None:
        """Close the instance when it has ``close()`` (the run ended)."""
        close = getattr(self.instance, "close", None)
        if callable(close):
            close()

    async def __call__(
        self, task: dict, response: Any, auxiliary_models: Any = None, logger: Any = None
    ) -> JudgeOutput:
        async def one(dim: str, attr: str, is_async: bool, passes: tuple[str, ...]) -> tuple[str, JudgeOutput]:
            kwargs = {k: v for k, v in (("auxiliary_models", auxiliary_models), ("logger", logger)) if k in passes}
            method = getattr(self.instance, attr)
            out = (
                await method(task, response, **kwargs)
                if is_async
                else await asyncio.to_thread(method, task, response, **kwargs)
            )
            if isinstance(out, (int, float)):
                out = JudgeOutput(reward=float(out))
            if not isinstance(out, JudgeOutput):
                raise RewardError(
                    f"sub-dimension {dim!r} of judge {self.reinforge_name!r} returned {type(out).__name__}, "
                    "expected a number or JudgeOutput"
                )
            return dim, out

        results = dict(await asyncio.gather(*(one(*s) for s in self.subs)))
        failed = [d for d, o in results.items() if o.status is TaskStatus.FAILED]
        if failed:
            errors = "; ".join(f"{d}: {results[d].error}" for d in failed)
            return JudgeOutput(status=TaskStatus.FAILED, error=errors)
        scores = {d: float(o.reward) for d, o in results.items()}  # type: ignore[arg-type]
        metrics: dict[str, float] = dict(scores)
        for d, o in results.items():
            metrics.update({f"{d}/{k}": v for k, v in o.metrics.items()})
        if self.aggregate_attr is None:
            return JudgeOutput(reward=sum(scores[d] * self.weights[d] for d in scores), metrics=metrics)
        view = copy.copy(self.instance)
        view.get_scores = lambda: dict(scores)
        view.get_weights = lambda: dict(self.weights)
        view.get_reward_metrics = lambda: dict(metrics)
        agg = getattr(view, self.aggregate_attr)
        nparams = len(inspect.signature(agg).parameters)
        out = agg(scores, dict(self.weights), dict(metrics)) if nparams >= 3 else agg()
        if inspect.isawaitable(out):
            out = await out
        if isinstance(out, (int, float)):
            out = JudgeOutput(reward=float(out), metrics=metrics)
        if not isinstance(out, JudgeOutput):
            raise RewardError(f"aggregate of judge {self.reinforge_name!r} returned {type(out).__name__}")
        for k, v in metrics.items():
            out.metrics.setdefault(k, v)
        return out


def _source_file(obj: Any) -> str | None:
    try:
        return inspect.getsourcefile(obj)
    except TypeError:
        return None


# -- layers 1 and 3, the gate and boundary scores ------------------------------------------


@dataclass
class JudgeSlot:
    """One configured judge: function, metric name, weight and role."""

    name: str
    fn: BoundFunction
    weight: float = 1.0
    gate: bool = False
    kind: str = "rule"
    metric_weights: dict[str, float] | None = None


@dataclass
class Score:
    """What the composer decided for one response.

    Scores from :meth:`RewardComposer.score_group` are final: ``reward`` is
    the response's reward, or None when it FAILED (``error`` says why,
    ``failure`` which stage: ``"judge"`` or ``"group_reward"``).
    :meth:`RewardComposer.score` alone leaves ``reward`` None while a group
    reward is still to come.
    """

    reward: float | None = None  # None while a group reward is still to come, or when FAILED
    rewards: dict[str, float] = field(default_factory=dict)
    flags: dict[str, float] = field(default_factory=dict)
    status: TaskStatus = TaskStatus.SUCCESS
    error: str | None = None
    final: bool = False  # fixed by a boundary, a gate or the workflow: not sent to a group reward
    partial: float = 0.0  # weighted judge sum, before the group reward's share is added
    seconds: float = 0.0
    retries: int = 0
    failure: str | None = None  # "judge" or "group_reward" when FAILED
    group_metrics: dict[str, float] = field(default_factory=dict)  # the group reward's metrics of its group


@dataclass
class Rollout:
    """One workflow result to score: its response and what the runner saw of it.

    :ivar preset: a reward the workflow set itself (judges are skipped).
    :ivar timed_out: the workflow ran past its deadline (the boundary ``timeout`` score).
    :ivar truncated: the response hit the length limit.
    """

    response: Any = None
    preset: float | None = None
    timed_out: bool = False
    truncated: bool = False


class RewardComposer:
    """Scores responses with every configured judge and the group reward, and composes the reward.

    The one owner of reward composition: the runner hands it each group's
    workflow results (:meth:`score_group`) and writes back the final scores.
    ``group_reward`` ranks the responses of one task and adds the dimension
    ``reward/group`` with weight ``group_reward_weight`` (1.0 by default),
    normalized together with the judges' weights.
    """

    def __init__(
        self,
        judges: list[JudgeSlot],
        *,
        group_reward: BoundFunction | None = None,
        scores: ScoreConfig | None = None,
        group_reward_weight: float | None = None,
        strict_weights: bool = False,
        judge_timeout_s: float = 120.0,
        max_retries: int = 2,
        source: str | None = None,
    ) -> None:
        names = [j.name for j in judges]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ConfigError(f"judges: metric name(s) {dupes} used twice; give each judge a distinct 'name'")
        if group_reward_weight is not None and group_reward is None:
            raise ValueError("group_reward_weight is given but no group_reward")
        self.judges = judges
        self.group_reward = group_reward
        self.gates = [j for j in judges if j.gate]
        self.scorers = [j for j in judges if not j.gate]
        self.scores = scores or ScoreConfig()
        self.judge_timeout_s = judge_timeout_s
        self.max_retries = max_retries
        raw = {j.name: j.weight for j in self.scorers}
        if group_reward is not None:
            raw["group"] = 1.0 if group_reward_weight is None else group_reward_weight
        self.weights = (
            normalize_weights(raw, what="judge weights", strict=strict_weights, source=source, key="judges")
            if raw
            else {}
        )
        for j in self.scorers:
            if j.metric_weights:
                j.metric_weights = normalize_weights(
                    j.metric_weights,
                    what=f"judge {j.name!r} metric_weights",
                    strict=strict_weights,
                    source=source,
                    key="metric_weights",
                )

    @property
    def components(self) -> list[BoundFunction]:
        """The judges and the group reward, as built for the run."""
        return [slot.fn for slot in self.judges] + ([self.group_reward] if self.group_reward is not None else [])

    @property
    def dimensions(self) -> set[str]:
        """The reward dimension names this composer can report (besides each judge's own metrics)."""
        dims = {"reward"} | {f"reward/{j.name}" for j in self.scorers} | {f"gate/{j.name}" for j in self.gates}
        return dims | ({"reward/group"} if self.group_weight else set())

    @property
    def group_weight(self) -> float:
        return self.weights.get("group", 0.0)

    async def call_judge(
        self, slot: JudgeSlot, task: dict, response: Any, aux: Any, logger: Any, tally: list[int] | None = None
    ) -> JudgeOutput:
        """Call one judge with timeout and retries; FAILED after the budget (see :mod:`reinforge.retry`)."""
        attempts = await call_with_retries(
            lambda: slot.fn.call(task, response, auxiliary_models=aux, logger=logger),
            slot.fn.check_output,
            label=f"judge {slot.fn.name}",
            timeout_s=self.judge_timeout_s,
            max_retries=self.max_retries,
        )
        if tally is not None:
            tally[0] += attempts.retries
        if attempts.output is not None:
            return attempts.output
        log.warning("%s (after %d attempts)", attempts.error, 1 + self.max_retries)
        return JudgeOutput(status=TaskStatus.FAILED, error=attempts.error)

    def _judge_score(self, slot: JudgeSlot, out: JudgeOutput) -> float:
        if not slot.metric_weights:
            return float(out.reward)  # type: ignore[arg-type]
        missing = [m for m in slot.metric_weights if m not in out.metrics]
        if missing:
            raise RewardError(
                f"judge {slot.fn.name} ({slot.name!r}) did not report metric(s) {missing} named in metric_weights; "
                f"it reported {sorted(out.metrics)}"
            )
        return sum(float(out.metrics[m]) * w for m, w in slot.metric_weights.items())

    def boundary(self, text: str, *, timed_out: bool, truncated: bool) -> tuple[float | None, dict[str, float]]:
        """The fixed score for a timed-out, empty, oversized or truncated output, if any."""
        b = self.scores
        flags = {
            "boundary/timeout": float(timed_out),
            "boundary/empty": float(not text.strip()),
            "boundary/truncated": float(truncated),
            "boundary/oversized": float(b.max_response_chars is not None and len(text) > b.max_response_chars),
        }
        if timed_out:
            return b.timeout, flags
        if flags["boundary/empty"] and b.empty is not None:
            return b.empty, flags
        if flags["boundary/oversized"] and b.oversized is not None:
            return b.oversized, flags
        if truncated and b.truncated is not None:
            return b.truncated, flags
        return None, flags

    async def score(
        self,
        task: dict,
        response: Any,
        *,
        preset: float | None = None,
        timed_out: bool = False,
        truncated: bool = False,
        auxiliary_models: Any = None,
        logger: Any = None,
    ) -> Score:
        """One response scored by the judges; its ``reward`` stays None while a group reward is to come.

        A run scores through :meth:`score_group`, which adds the group reward;
        this is for one response alone (an online trace, ``reinforge try``).
        """
        start = time.perf_counter()
        tally = [0]
        result = await self._score(task, response, preset, timed_out, truncated, auxiliary_models, logger, tally)
        result.seconds = time.perf_counter() - start
        result.retries = tally[0]
        return result

    async def _score(self, task, response, preset, timed_out, truncated, aux, logger, tally) -> Score:  # noqa: ANN001
        fixed, flags = self.boundary(response_text(response), timed_out=timed_out, truncated=truncated)
        if fixed is not None:
            return Score(reward=fixed, rewards={}, flags=flags, final=True)
        if preset is not None:
            return Score(reward=preset, rewards={"reward/workflow": preset}, flags=flags, final=True)
        if not self.weights:
            raise RewardError("the workflow returned no reward and no judge or group reward is configured")
        rewards: dict[str, float] = {}
        gate_pass = True
        if self.gates:
            outs = await asyncio.gather(*(self.call_judge(g, task, response, aux, logger, tally) for g in self.gates))
            for slot, out in zip(self.gates, outs):
                if out.status is TaskStatus.FAILED:
                    return Score(status=TaskStatus.FAILED, error=out.error, flags=flags)
                passed = float(out.reward) > GATE_PASS  # type: ignore[arg-type]
                rewards[f"gate/{slot.name}"] = float(passed)
                gate_pass = gate_pass and passed
        # A response that fails the gate is never sent to a model judge.
        slots = self.scorers if gate_pass else [s for s in self.scorers if s.kind != "model"]
        outs = await asyncio.gather(*(self.call_judge(s, task, response, aux, logger, tally) for s in slots))
        partial = 0.0
        for slot, out in zip(slots, outs):
            if out.status is TaskStatus.FAILED:
                return Score(status=TaskStatus.FAILED, error=out.error, flags=flags)
            value = self._judge_score(slot, out)
            rewards[f"reward/{slot.name}"] = value
            for metric, v in out.metrics.items():
                rewards[f"reward/{slot.name}/{metric}"] = float(v)
            partial += self.weights.get(slot.name, 0.0) * value
        if not gate_pass:
            return Score(reward=self.scores.gate_fail, rewards=rewards, flags=flags, final=True)
        if self.group_weight:
            return Score(reward=None, rewards=rewards, flags=flags, partial=partial)
        return Score(reward=partial, rewards=rewards, flags=flags, final=True)

    async def score_group(
        self,
        task: dict,
        rollouts: list[Rollout],
        *,
        auxiliary_models: Any = None,
        logger: Any = None,
        counters: Counter[str] | None = None,
    ) -> list[Score]:
        """Final scores of one task's responses: judges per response, then the group reward over the rest.

        Responses fixed by a boundary score, a failed gate or the workflow's own
        reward are not sent to the group reward. A transient failure of a judge
        or the group reward is retried (``max_retries``) and then makes the
        response FAILED (``reward`` None, never 0); ``counters`` gets
        ``retries``, ``failed``, ``failed/judge`` and ``failed/group_reward``.
        """
        tally: Counter[str] = Counter() if counters is None else counters
        scores = list(
            await asyncio.gather(
                *(
                    self.score(
                        task,
                        r.response,
                        preset=r.preset,
                        timed_out=r.timed_out,
                        truncated=r.truncated,
                        auxiliary_models=auxiliary_models,
                        logger=logger,
                    )
                    for r in rollouts
                )
            )
        )
        for score in scores:
            tally["retries"] += score.retries
            if score.status is TaskStatus.FAILED:
                score.failure = "judge"
                tally["failed"] += 1
                tally["failed/judge"] += 1
        pending = [(r, s) for r, s in zip(rollouts, scores) if s.status is TaskStatus.SUCCESS and not s.final]
        if pending:
            await self._apply_group_reward(task, pending, auxiliary_models, logger, tally)
        return scores

    async def _apply_group_reward(
        self,
        task: dict,
        pending: list[tuple[Rollout, Score]],
        aux: Any,
        logger: Any,
        tally: Counter[str],
    ) -> None:
        gr = self.group_reward
        assert gr is not None, "a score is pending only when a group reward is configured"
        responses = [r.response for r, _ in pending]
        attempts = await call_with_retries(
            lambda: gr.call(task, responses, auxiliary_models=aux, logger=logger),
            lambda raw: gr.check_output(raw, group_size=len(responses)),
            label=f"group reward {gr.name}",
            timeout_s=self.judge_timeout_s,
            max_retries=self.max_retries,
        )
        tally["retries"] += attempts.retries
        out = attempts.output
        if out is None:
            log.warning("%s (after %d attempts)", attempts.error, 1 + self.max_retries)
            tally["failed"] += len(pending)
            tally["failed/group_reward"] += len(pending)
            for _, score in pending:
                score.status, score.error, score.reward, score.failure = (
                    TaskStatus.FAILED,
                    attempts.error,
                    None,
                    "group_reward",
                )
            return
        assert isinstance(out, GroupRewardOutput)
        metrics = {k: float(v) for k, v in out.metrics.items()}
        for (_, score), value in zip(pending, out.rewards):
            score.rewards["reward/group"] = float(value)
            score.rewards.update({f"reward/group/{k}": v for k, v in metrics.items()})
            score.group_metrics = dict(metrics)
            score.reward = score.partial + self.group_weight * float(value)
            score.final = True
