"""The three LLM judges: pointwise, pairwise (both orders) and listwise (K shuffled orders).

Each is a class configured once with its settings (:mod:`.config`) and called
with core's contract. Core registers the classes with their settings classes
and builds one judge per run (``PointwiseJudge(settings)``): the judge owns its
model client, its verdict cache, its concurrency limit and its length trend,
and :meth:`LLMJudge.close` (called by core when the run ends) closes them, so
two runs in one process share nothing. From Python, build one with keyword
settings (``PointwiseJudge(model="gpt-4o-mini", rubric=...)``) or a settings
object, and close it (or use it as a context manager) when done.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import threading
import warnings
import weakref
from collections.abc import Mapping
from typing import Any, ClassVar

from reinforge import GroupRewardOutput, JudgeOutput, TaskStatus
from reinforge.plugin import ConfigError, load_settings

from .cache import cache_key
from .client import JudgeClient, JudgeFailed, Usage
from .config import JudgeConfig, ListwiseConfig, PairwiseConfig, PointwiseConfig
from .families import same_family
from .length import LengthTrend
from .prompts import (
    Shown,
    listwise_messages,
    pairwise_messages,
    parse_anchors,
    parse_listwise,
    parse_pairwise,
    parse_pointwise,
    pointwise_messages,
    reference_text,
    show,
    task_text,
)
from .stats import spearman

__all__ = [
    "LLMJudge",
    "ListwiseJudge",
    "PairwiseJudge",
    "PointwiseJudge",
]


class LLMJudge:
    """What the three judges share: settings, the client, guards and boundary scores.

    :param config: the settings object (what core passes, already checked), or
        a mapping of settings; or leave it out and give the settings as keywords.
    :param name: what messages call the judge (default: its registered name).
    :raises ConfigError: a bad setting, naming the judge and the key
        (``judge 'llm-pointwise': args.temperature: must be at least 0, got -1``).
    """

    config_class: ClassVar[type[JudgeConfig]] = JudgeConfig
    # core's rule gate skips model judges for responses that fail it; the registration declares
    # kind="model", and this attribute says the same for a judge object passed from Python
    reinforge_kind = "model"

    def __init__(
        self,
        config: JudgeConfig | Mapping[str, Any] | None = None,
        /,
        *,
        name: str | None = None,
        _shared_client: JudgeClient | None = None,
        **settings: Any,
    ) -> None:
        self.reinforge_name = name or self.config_class.registered_name
        self.config = self._settings(config, settings)
        self._owns_client = _shared_client is None
        self.client = _shared_client or JudgeClient(self.config, self.reinforge_name)
        self._pairs_checked: dict[tuple[str | None, str | None], float] = {}
        self._lock = threading.Lock()
        self.closed = False

    def _settings(self, config: Any, settings: dict[str, Any]) -> Any:
        where = f"judge {self.reinforge_name!r}"
        if config is None:
            return load_settings(self.config_class, settings, where=where, prefix="args")
        if settings:
            raise TypeError(f"{type(self).__name__}: give a settings object or keyword settings, not both")
        if isinstance(config, self.config_class):
            return config
        if isinstance(config, Mapping):
            return load_settings(self.config_class, dict(config), where=where, prefix="args")
        raise TypeError(
            f"{type(self).__name__} takes a {self.config_class.__name__} (or keyword settings), "
            f"got {type(config).__name__}"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.reinforge_name!r}, model={self.config.model!r})"

    @property
    def usage(self) -> Usage:
        """Totals of every judgment this judge made (since it was built: one run, when core built it)."""
        return self.client.totals

    def close(self) -> None:
        """Close what the judge opened: its verdict cache (core calls this when the run ends; idempotent).

        An in-memory cache forgets its verdicts; a ``cache_path`` file keeps them for the next run.
        """
        self.closed = True
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- guards ----------------------------------------------------------------------------------
    def _policy_name(self, responses: list[Any]) -> str | None:
        if self.config.policy_model:
            return self.config.policy_model
        for r in responses:
            name = getattr(r, "model", None) if not isinstance(r, dict) else r.get("model")
            if isinstance(name, str) and name:
                return name
        return None

    def _self_preference(self, model: Any, responses: list[Any]) -> float:
        """1.0 when judge and policy share a family and the guard only warns; raises under ``error``."""
        cfg = self.config
        if cfg.self_preference == "off":
            return 0.0
        judge_name, policy_name = JudgeClient.model_name(model), self._policy_name(responses)
        with self._lock:
            known = self._pairs_checked.get((judge_name, policy_name))
        if known is not None:
            return known
        family = same_family(judge_name, policy_name)
        risk = 0.0
        if family is not None:
            message = (
                f"judge {self.reinforge_name!r}: the judge model {judge_name!r} and the policy model {policy_name!r} "
                f"are both {family} models; a judge prefers outputs of its own family (self-preference bias). Use a "
                "judge from another family, or set args.self_preference: warn (or off) to accept the risk"
            )
            if cfg.self_preference == "error":
                raise ConfigError(message)
            warnings.warn(message, stacklevel=2)
            risk = 1.0
        with self._lock:
            self._pairs_checked[(judge_name, policy_name)] = risk
        return risk

    def _boundary(self, shown: Shown) -> tuple[float, str] | None:
        """A fixed score for an empty, truncated or oversized response, when configured."""
        cfg = self.config
        if not shown.text.strip() and cfg.empty_score is not None:
            return cfg.empty_score, "empty"
        if shown.truncated and cfg.truncated_score is not None:
            return cfg.truncated_score, "truncated"
        if shown.oversized and cfg.oversized_score is not None:
            return cfg.oversized_score, "oversized"
        return None

    def _failed(self, error: str, usage: Usage) -> JudgeOutput:
        return JudgeOutput(status=TaskStatus.FAILED, error=error, metrics=usage.metrics())


class _SingleResponseJudge(LLMJudge):
    """Pointwise and pairwise judges: one response per call; may require a calibration pass."""

    def __init__(self, config: Any = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        self.calibration: Any = None  # the CalibrationReport once require_calibration has run
        self._calibration_error: Exception | None = None
        self._calibration_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    async def __call__(
        self, task: dict, response: Any, auxiliary_models: dict[str, Any] | None = None, logger: Any = None
    ) -> JudgeOutput:
        if self.config.require_calibration is not None:
            await self._ensure_calibrated(auxiliary_models)
        usage = Usage()
        shown = show(response, self.config)
        fixed = self._boundary(shown)
        if fixed is not None:
            return JudgeOutput(reward=fixed[0], metrics={"skipped": 1.0, **usage.metrics()})
        model = self.client.model_for(auxiliary_models)
        risk = self._self_preference(model, [response])
        try:
            reward, metrics = await self._judge(task, shown, model, usage)
        except JudgeFailed as exc:
            if logger is not None:
                logger.warning("%s", exc)
            return self._failed(str(exc), usage)
        metrics.update({"skipped": 0.0, "self_preference_risk": risk, **usage.metrics()})
        return JudgeOutput(reward=reward, metrics=metrics)

    async def _judge(self, task: dict, shown: Shown, model: Any, usage: Usage) -> tuple[float, dict[str, float]]:
        raise NotImplementedError

    async def _ensure_calibrated(self, auxiliary_models: dict[str, Any] | None) -> None:
        """Run ``require_calibration`` once per judge (per run); after a failed pass every call raises again."""
        if self._calibration_error is not None:
            raise self._calibration_error
        if self.calibration is not None:
            return
        with self._lock:
            lock = self._calibration_locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())
        async with lock:
            if self.calibration is None:
                from .calibration import CalibrationError, calibrate_async

                # the same judge without the requirement, sharing this one's client (its cache and limit)
                unrequired = dataclasses.replace(self.config, require_calibration=None)
                sibling = type(self)(unrequired, name=self.reinforge_name, _shared_client=self.client)
                report = await calibrate_async(
                    sibling,
                    self.config.require_calibration,
                    auxiliary_models=auxiliary_models,
                    min_spearman=self.config.calibration_min_rho,
                    judge_label=self.reinforge_name,
                )
                if not report.passed:
                    self._calibration_error = CalibrationError(
                        f"judge {self.reinforge_name!r}: args.require_calibration failed on {report.gold}: "
                        f"{report.verdict()}; fix the judge (rubric, anchors, model) before training on it"
                    )
                self.calibration = report
        if self._calibration_error is not None:
            raise self._calibration_error


class PointwiseJudge(_SingleResponseJudge):
    """Rubric + discrete scale (default 1-5) + anchors; reason before verdict; normalized to [0, 1].

    Metrics: ``verdict`` (the integer score), ``raw`` (normalized, before length
    normalization), ``length_adjustment``, ``skipped`` (1 when a boundary score
    was used), ``self_preference_risk`` and ``usage/*``.
    """

    config_class = PointwiseConfig

    def __init__(self, config: PointwiseConfig | Mapping[str, Any] | None = None, /, **options: Any) -> None:
        super().__init__(config, **options)
        cfg = self.config
        assert isinstance(cfg, PointwiseConfig)
        self.anchors = parse_anchors(cfg.anchors, cfg.scale)
        self.length_trend = LengthTrend(cfg.length_window, cfg.length_min_samples, cfg.length_slope)

    async def _judge(self, task: dict, shown: Shown, model: Any, usage: Usage) -> tuple[float, dict[str, float]]:
        cfg = self.config
        assert isinstance(cfg, PointwiseConfig)
        name = self.reinforge_name
        messages = pointwise_messages(
            task_text(task, cfg, name), reference_text(task, cfg, name, required=False), shown, cfg, self.anchors
        )
        score = await self.client.ask(messages, lambda text: parse_pointwise(text, cfg.low, cfg.high), usage, model)
        raw = cfg.normalize(score)
        reward, adjustment = raw, 0.0
        if cfg.length_normalization:
            key = self.client.key(model, messages, self.client.sampling(model))
            reward, adjustment = self.length_trend.adjust(key, shown.length, raw)
        return reward, {"verdict": float(score), "raw": raw, "length_adjustment": adjustment}


class PairwiseJudge(_SingleResponseJudge):
    """The response against ``task[reference_field]``, asked in both orders.

    Only a consistent verdict counts: win 1.0, loss 0.0, tie ``tie_score``. When
    the two orders disagree the result is a tie, and ``position_flip`` is 1 when
    the judge picked the same position both times. Metrics: ``win``, ``tie``,
    ``loss``, ``inconsistent``, ``position_flip``, ``usage/*``.
    """

    config_class = PairwiseConfig

    async def compare(self, task: dict, first: Shown, second: Shown, model: Any, usage: Usage) -> str:
        """``"A"``, ``"B"`` or ``"tie"`` for one order of two shown responses."""
        messages = pairwise_messages(task_text(task, self.config, self.reinforge_name), first, second, self.config)
        return await self.client.ask(messages, parse_pairwise, usage, model)

    async def _judge(self, task: dict, shown: Shown, model: Any, usage: Usage) -> tuple[float, dict[str, float]]:
        cfg = self.config
        assert isinstance(cfg, PairwiseConfig)
        reference = reference_text(task, cfg, self.reinforge_name, required=True)
        other = show(reference, cfg)
        if cfg.both_orders:
            forward, backward = await asyncio.gather(
                self.compare(task, shown, other, model, usage), self.compare(task, other, shown, model, usage)
            )
            verdicts = [_as_outcome(forward, candidate_is="A"), _as_outcome(backward, candidate_is="B")]
        else:
            verdicts = [_as_outcome(await self.compare(task, shown, other, model, usage), candidate_is="A")]
        consistent = len(set(verdicts)) == 1
        outcome = verdicts[0] if consistent else "tie"
        flip = float(set(verdicts) == {"win", "loss"})
        reward = {"win": 1.0, "loss": 0.0, "tie": cfg.tie_score}[outcome]
        metrics = {
            "win": float(outcome == "win"),
            "tie": float(outcome == "tie"),
            "loss": float(outcome == "loss"),
            "inconsistent": float(not consistent),
            "position_flip": flip,
        }
        return reward, metrics


def _as_outcome(winner: str, *, candidate_is: str) -> str:
    if winner == "tie":
        return "tie"
    return "win" if winner == candidate_is else "loss"


class ListwiseJudge(LLMJudge):
    """All responses of a group scored relative to each other, over K shuffled orders (RULER-like).

    Each order is one call; a response's reward is its mean normalized score
    over the orders. The orders are rotations of one seeded shuffle, so with
    ``permutations`` equal to the group size (the default, ``null``) every
    response is shown once at every position. The output always has one reward per response: a reply with
    the wrong count is retried, then the group is FAILED, never padded. Group
    metrics: ``position_bias`` (mean Spearman rho of shown position vs score),
    ``permutation_spread`` (mean per-response std across orders),
    ``permutations``, ``skipped``, ``self_preference_risk``, ``usage/*``.
    """

    config_class = ListwiseConfig

    def orders(self, task_key: str, m: int) -> list[list[int]]:
        """The K orders (lists of indices into the judged responses) for a group of ``m``."""
        cfg = self.config
        assert isinstance(cfg, ListwiseConfig)
        base = list(range(m))
        if cfg.shuffle and m > 1:
            random.Random(int(task_key[:16], 16) ^ (cfg.seed or 0)).shuffle(base)
        candidates = [base[i:] + base[:i] for i in range(m)]
        if m > 2:
            back = base[::-1]
            candidates += [back[i:] + back[:i] for i in range(m)]
        k = min(m if cfg.permutations is None else cfg.permutations, len(candidates))
        if k <= m:
            picks = [round(j * m / k) % m for j in range(k)]
        else:
            picks = list(range(m)) + [m + round(j * m / (k - m)) % m for j in range(k - m)]
        return [candidates[p] for p in picks]

    async def __call__(
        self, task: dict, responses: list[Any], auxiliary_models: dict[str, Any] | None = None, logger: Any = None
    ) -> GroupRewardOutput:
        cfg = self.config
        usage = Usage()
        n = len(responses)
        if n == 0:
            return GroupRewardOutput(rewards=[], metrics=usage.metrics())
        shown = [show(r, cfg) for r in responses]
        rewards: list[float | None] = [None] * n
        for i, s in enumerate(shown):
            fixed = self._boundary(s)
            if fixed is not None:
                rewards[i] = fixed[0]
        judged = [i for i in range(n) if rewards[i] is None]
        metrics: dict[str, float] = {"skipped": float(n - len(judged))}
        if not judged:
            return GroupRewardOutput(rewards=[float(r or 0.0) for r in rewards], metrics={**metrics, **usage.metrics()})
        model = self.client.model_for(auxiliary_models)
        metrics["self_preference_risk"] = self._self_preference(model, list(responses))
        prompt = task_text(task, cfg, self.reinforge_name)
        reference = reference_text(task, cfg, self.reinforge_name, required=False)
        texts = [shown[i].text for i in judged]
        orders = self.orders(cache_key(prompt, texts), len(judged))

        async def one(order: list[int]) -> list[int]:
            messages = listwise_messages(prompt, reference, [shown[judged[j]] for j in order], cfg)
            return await self.client.ask(
                messages, lambda text: parse_listwise(text, len(order), cfg.low, cfg.high), usage, model
            )

        try:
            verdicts = await asyncio.gather(*(one(order) for order in orders))
        except JudgeFailed as exc:
            if logger is not None:
                logger.warning("%s", exc)
            return GroupRewardOutput(status=TaskStatus.FAILED, error=str(exc), metrics=usage.metrics())
        per_response: list[list[float]] = [[] for _ in judged]
        biases = []
        for order, scores in zip(orders, verdicts):
            for j, score in zip(order, scores):
                per_response[j].append(cfg.normalize(score))
            rho = spearman(list(range(len(order))), [float(s) for s in scores])
            if rho is not None:
                biases.append(-rho)  # positive: earlier positions scored higher
        for j, i in enumerate(judged):
            rewards[i] = sum(per_response[j]) / len(per_response[j])
        spreads = [_std(values) for values in per_response]
        metrics.update(
            {
                "position_bias": sum(biases) / len(biases) if biases else 0.0,
                "permutation_spread": sum(spreads) / len(spreads),
                "permutations": float(len(orders)),
                **usage.metrics(),
            }
        )
        return GroupRewardOutput(rewards=[float(r or 0.0) for r in rewards], metrics=metrics)  # every one is set


def _std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
