"""The shared async runner: workflow x group_size per task, then the composer scores the group.

Every backend uses it. Transient failures (``TaskStatus.FAILED`` or an
exception) are retried up to ``max_retries`` and then discarded with a counter;
they never become a reward. A workflow that runs past its timeout is the
model's fault (a looping agent) and gets the configured timeout score.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import metric_names as mn
from .config import RunnerConfig
from .errors import ReinforgeError, RewardError, RunnerError, attributed
from .models import ChatModel, RecordingChatModel
from .outputs import TaskStatus
from .rewards import RewardComposer, Rollout, Score
from .signatures import BoundFunction
from .text import response_text
from .trajectory import Trajectory

if TYPE_CHECKING:
    from .lifecycle import RunContext

log = logging.getLogger("reinforge.runner")

ModelProvider = Callable[[Trajectory], ChatModel]
# What the workflow receives instead of its rollout's ChatModel (e.g. an AgentScope model over its endpoint).
ModelAdapter = Callable[[ChatModel], Any]


@dataclass
class RunnerSettings(RunnerConfig):
    """A run file's ``runner`` settings plus the group size of what is being run."""

    group_size: int = 1


@dataclass
class GroupResult:
    """All rollouts of one task: the kept ones and the discarded ones."""

    task: dict[str, Any]
    task_index: int
    group_id: str
    kept: list[Trajectory] = field(default_factory=list)
    discarded: list[Trajectory] = field(default_factory=list)
    dropped: bool = False
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class BatchResult:
    groups: list[GroupResult]
    counters: Counter
    metrics: dict[str, float]
    seconds: float

    @property
    def trajectories(self) -> list[Trajectory]:
        """Trajectories to train on, group by group."""
        return [t for g in self.groups for t in g.kept]


def _describe_stats(prefix: str, values: list[float], out: dict[str, float]) -> None:
    if not values:
        return
    out[f"{prefix}{mn.MEAN_SUFFIX}"] = statistics.fmean(values)
    out[f"{prefix}{mn.STD_SUFFIX}"] = statistics.pstdev(values) if len(values) > 1 else 0.0
    out[f"{prefix}/min"] = min(values)
    out[f"{prefix}/max"] = max(values)


async def _within(coro: Any, timeout: float) -> tuple[bool, Any, BaseException | None]:
    """Run ``coro`` with a deadline: (finished, result, exception) — a timeout raised *inside* is an exception."""
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=timeout)
    if not done:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return False, None, None
    exc = task.exception()
    return True, (None if exc else task.result()), exc


class Runner:
    """Runs batches of tasks; see the module docstring."""

    def __init__(
        self,
        workflow: BoundFunction,
        composer: RewardComposer,
        *,
        model: ChatModel | None = None,
        model_provider: ModelProvider | None = None,
        settings: RunnerSettings | None = None,
        auxiliary_models: dict[str, ChatModel] | None = None,
        sampling: dict[str, Any] | None = None,
        run: RunContext | None = None,
        logger: logging.Logger | None = None,
        model_adapter: ModelAdapter | None = None,
    ) -> None:
        if (model is None) == (model_provider is None):
            raise ValueError("give the Runner exactly one of model= or model_provider=")
        self.workflow = workflow
        self.composer = composer
        self.settings = settings or RunnerSettings()
        if self.settings.group_size < 1:
            raise ValueError("group_size must be >= 1")
        self.auxiliary_models = auxiliary_models
        self.sampling = dict(sampling or {})
        self.run_context = run  # observers hear of each trajectory through it (on_trajectory)
        self.logger = logger or logging.getLogger("reinforge.workflow")
        if model_provider is None:
            self.model_provider: ModelProvider = lambda t: RecordingChatModel(model, t, self.sampling)  # type: ignore[arg-type]
        else:
            self.model_provider = model_provider
        # The workflow gets model_adapter(model); the runner still releases the rollout's own model.
        self.model_adapter = model_adapter
        self._rollout_slots: asyncio.Semaphore | None = None

    # -- public ---------------------------------------------------------------------------

    def run(self, tasks: Sequence[dict[str, Any]], *, start_index: int = 0) -> BatchResult:
        """Synchronous wrapper of :meth:`run_batch` for scripts and the CLI."""
        return asyncio.run(self.run_batch(tasks, start_index=start_index))

    async def run_batch(self, tasks: Sequence[dict[str, Any]], *, start_index: int = 0) -> BatchResult:
        start = time.perf_counter()
        self._rollout_slots = asyncio.Semaphore(self.settings.max_concurrency)
        counters: Counter = Counter()
        groups = await asyncio.gather(
            *(self._run_group(task, start_index + i, counters) for i, task in enumerate(tasks))
        )
        result = BatchResult(list(groups), counters, {}, time.perf_counter() - start)
        failed = [t for g in groups for t in g.discarded if t.status is TaskStatus.FAILED]
        if failed and len(failed) == len(tasks) * self.settings.group_size:
            raise RunnerError(f"every rollout of the batch failed ({len(failed)}); first error: {failed[0].error}")
        result.metrics = self.summarize(result)
        return result

    # -- one group --------------------------------------------------------------------------

    async def _run_group(self, task: dict[str, Any], task_index: int, counters: Counter) -> GroupResult:
        group_id = uuid.uuid4().hex[:12]
        size = self.settings.group_size
        trajs = [Trajectory(task=task, task_index=task_index, rollout_index=k, group_id=group_id) for k in range(size)]
        outputs = await asyncio.gather(*(self._rollout(t, counters) for t in trajs))
        group = GroupResult(task=task, task_index=task_index, group_id=group_id)
        alive = [(t, out) for t, out in zip(trajs, outputs) if out is not None]
        scores = await self.composer.score_group(
            task,
            [out for _, out in alive],
            auxiliary_models=self.auxiliary_models,
            logger=self.logger,
            counters=counters,
        )
        for (t, _), score in zip(alive, scores):
            self._put_score(t, score, group)
        for t in trajs:
            (group.kept if t.ok else group.discarded).append(t)
        if group.discarded and group.kept:
            too_few = len(group.kept) < min(self.settings.min_group_size, size)
            if self.settings.drop_incomplete_groups or too_few:
                group.discarded.extend(group.kept)
                group.kept = []
        if not group.kept and size > 1:
            group.dropped = True
            counters["dropped_groups"] += 1
        counters["discarded"] += len(group.discarded)
        if self.run_context is not None:
            for t in trajs:
                self.run_context.trajectory_end(t)
        return group

    @staticmethod
    def _put_score(t: Trajectory, score: Score, group: GroupResult) -> None:
        """Write the composer's final score into the trajectory (the one place a reward is written)."""
        t.judge_seconds = score.seconds
        t.metrics.update(score.flags)
        if score.status is TaskStatus.FAILED:
            t.status, t.error, t.reward = TaskStatus.FAILED, score.error, None
            return
        t.reward = score.reward
        t.rewards.update(score.rewards)
        group.metrics.update({f"group/{k}": v for k, v in score.group_metrics.items()})

    # -- one rollout ------------------------------------------------------------------------

    async def _rollout(self, t: Trajectory, counters: Counter) -> Rollout | None:
        """The workflow, retried on transient failures; what there is to score, or None when every attempt failed."""
        settings = self.settings
        assert self._rollout_slots is not None
        for attempt in range(1 + settings.max_retries):
            if attempt:
                counters["retries"] += 1
            t.reset()
            t.attempts = attempt + 1
            counters["rollouts"] += 1
            start = time.perf_counter()
            preset = None
            async with self._rollout_slots:
                model = self.model_provider(t)
                try:
                    given = model if self.model_adapter is None else self.model_adapter(model)
                    call = self.workflow.call(t.task, given, auxiliary_models=self.auxiliary_models, logger=self.logger)
                    finished, out, exc = await _within(call, settings.rollout_timeout_s)
                finally:
                    release = getattr(model, "release", None)
                    if callable(release):  # tell a batching backend this rollout will not call again
                        release()
            if not finished:  # our deadline: a looping agent is the model's fault, so it is scored
                t.timed_out = True
                counters["timeouts"] += 1
            elif isinstance(exc, ReinforgeError):
                raise attributed(exc, f"workflow {self.workflow.name}") from exc
            elif exc is not None:  # includes a TimeoutError raised inside the workflow: transient
                t.status, t.error = (
                    TaskStatus.FAILED,
                    f"workflow {self.workflow.name} raised {type(exc).__name__}: {exc}",
                )
                t.seconds = time.perf_counter() - start
                continue
            t.seconds = time.perf_counter() - start
            if out is not None:
                out = self.workflow.check_output(out)
                if out.status is TaskStatus.FAILED:
                    t.status, t.error = TaskStatus.FAILED, f"workflow {self.workflow.name} returned FAILED: {out.error}"
                    continue
                t.response, preset = out.response, out.reward
                t.metrics.update({k: float(v) for k, v in out.metrics.items()})
                if out.call_rewards is not None:
                    self._put_call_rewards(t, out.call_rewards)
            return Rollout(t.response, preset=preset, timed_out=t.timed_out, truncated=t.truncated)
        counters["failed"] += 1
        counters["failed/workflow"] += 1
        return None

    # -- metrics ----------------------------------------------------------------------------

    def _put_call_rewards(self, t: Trajectory, rewards: list[float | None]) -> None:
        """Each of ``WorkflowOutput.call_rewards`` onto its recorded call; a count that does not match is a bug."""
        if len(rewards) != len(t.calls):
            raise RewardError(
                f"workflow {self.workflow.name}: call_rewards has {len(rewards)} entries but the rollout made "
                f"{len(t.calls)} model calls (task {t.task_index}); give one per call, None for a call without one"
            )
        for call, reward in zip(t.calls, rewards):
            call.reward = reward

    def summarize(self, result: BatchResult) -> dict[str, float]:
        """Batch metrics under stable names: reward and every dimension's mean/std/min/max."""
        kept = result.trajectories
        out: dict[str, float] = {}
        _describe_stats(mn.REWARD, [t.reward for t in kept if t.reward is not None], out)
        dims = sorted({k for t in kept for k in t.rewards})
        for dim in dims:
            _describe_stats(dim, [t.rewards[dim] for t in kept if dim in t.rewards], out)
        for name in sorted({k for t in kept for k in t.metrics}):
            values = [t.metrics[name] for t in kept if name in t.metrics]
            key = name if name.startswith("boundary/") else f"workflow/{name}"
            out[f"{key}/mean"] = statistics.fmean(values)
        _describe_stats(mn.RESPONSE_LENGTH, [float(len(response_text(t.response))) for t in kept], out)
        if kept:
            out[mn.TRUNCATED_RATE] = sum(t.truncated for t in kept) / len(kept)
            out["calls_per_rollout/mean"] = statistics.fmean(len(t.calls) for t in kept)
            out["rollout_seconds/mean"] = statistics.fmean(t.seconds for t in kept)
            out["judge_seconds/mean"] = statistics.fmean(t.judge_seconds for t in kept)
        for key, value in result.counters.items():
            out[f"{mn.COUNT_PREFIX}{key}"] = float(value)
        out[f"{mn.COUNT_PREFIX}kept"] = float(len(kept))
        out["batch_seconds"] = result.seconds
        return out
