"""``reinforge eval``: workflow + judges over a split, no training (baseline numbers)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    from .config import DatasetConfig, RunConfig
    from .job import TuneJob
    from .models import ChatModel
    from .runner import BatchResult


@dataclass
class EvalReport:
    """Accuracy, every reward dimension and the failure counters of one evaluation.

    :meth:`summary` (what ``reinforge eval --json`` prints) has exactly these
    fields as keys, with the same values, except the lists of trajectories and groups:
    ``dimensions`` holds the mean of every reward dimension under its name
    (``reward``, ``reward/correct``, ``gate/format``), ``metrics`` every
    statistic under its stable metric name (``reward/mean``,
    ``reward/correct/std``, ``count/kept``; :mod:`reinforge.metric_names`).

    :ivar split: the split read, or None when ``dataset`` is one file read
        whole (no split named).
    :ivar trajectories: the kept (scored) trajectories.
    :ivar discarded_trajectories: the discarded ones (failed, or in a dropped group).
    :ivar tool_use: the tool-use rate on tasks that need a tool (:func:`tool_use_of`,
        ``eval.tool_use_metric``), None when the workflow reports no such metric.
    """

    accuracy: float | None
    accuracy_key: str
    threshold: float
    tasks: int
    kept: int
    metrics: dict[str, float]
    counters: dict[str, int]
    seconds: float
    split: str | None
    dataset: str = ""
    discarded: int = 0
    dimensions: dict[str, float] = field(default_factory=dict)
    trajectories: list[Any] = field(default_factory=list, repr=False)
    discarded_trajectories: list[Any] = field(default_factory=list, repr=False)
    groups: list[Any] = field(default_factory=list, repr=False)
    tool_use: float | None = None

    def __post_init__(self) -> None:
        if not self.dimensions:
            self.dimensions = dimension_means(self.metrics)

    def summary(self) -> dict[str, Any]:
        """The report as plain data: ``reinforge eval --json`` and the ``summary`` of ``--output``."""
        return {
            "accuracy": self.accuracy,
            "accuracy_key": self.accuracy_key,
            "tool_use": self.tool_use,
            "threshold": self.threshold,
            "split": self.split,
            "dataset": self.dataset,
            "tasks": self.tasks,
            "kept": self.kept,
            "discarded": self.discarded,
            "dimensions": dict(self.dimensions),
            "metrics": dict(self.metrics),
            "counters": dict(self.counters),
            "seconds": round(self.seconds, 3),
        }

    def trajectory_records(self) -> list[dict[str, Any]]:
        """Every trajectory, kept and discarded, in task order, as ``reinforge eval --output`` writes them.

        Each is :meth:`Trajectory.to_dict` (``status``, ``error``, ...) plus
        ``kept`` and, for a discarded one, ``discard_reason``.
        """
        records = []
        for group in self.groups:
            kept = {id(t) for t in group.kept}
            for t in sorted([*group.kept, *group.discarded], key=lambda t: t.rollout_index):
                record = t.to_dict()
                record["kept"] = id(t) in kept
                if not record["kept"]:
                    record["discard_reason"] = _discard_reason(t, group)
                records.append(record)
        return records


def _discard_reason(t: Any, group: Any) -> str:
    if t.error:
        return t.error
    if t.ok:
        scored = sum(1 for x in [*group.kept, *group.discarded] if x.ok)
        total = len(group.kept) + len(group.discarded)
        return (
            f"its group was dropped: {scored} of its {total} rollouts were scored "
            "(runner.min_group_size, runner.drop_incomplete_groups)"
        )
    return f"status {t.status.value} with no reward"


def dimension_means(metrics: dict[str, float]) -> dict[str, float]:
    """``{"reward/correct": mean}`` from ``{"reward/correct/mean": mean, ...}``: the reward and gate dimensions."""
    return {
        k[: -len("/mean")]: v for k, v in metrics.items() if k.endswith("/mean") and k.startswith(("reward", "gate/"))
    }


def eval_dataset(run: RunConfig, split: str | None = None, limit: int | None = None) -> DatasetConfig:
    """The dataset an evaluation reads: ``eval_dataset`` (its own split), else the train set's ``eval.split``.

    ``split`` (``--split``) overrides either; ``limit`` (``--limit``) overrides ``eval.limit``.
    """
    import dataclasses

    base = run.eval_dataset or run.train_dataset
    if base is None:
        raise ConfigError(f"{run.source or 'run'}: eval needs 'eval_dataset' (or 'train_dataset' with eval.split)")
    changes: dict[str, Any] = {}
    if split is not None:
        changes["split"] = split
    elif run.eval_dataset is None:
        changes["split"] = run.eval.split
    lim = limit if limit is not None else run.eval.limit
    if lim is not None:
        changes["limit"] = lim
    return dataclasses.replace(base, **changes) if changes else base


def _eval_model_config(run: RunConfig, api_base: str | None, model_name: str | None) -> Any:
    import dataclasses

    from .config import ModelConfig

    cfg = run.model
    if api_base or model_name:
        base = cfg or ModelConfig(model_path=model_name or "default")
        cfg = dataclasses.replace(base, api_base=api_base or base.api_base, model_path=model_name or base.model_path)
    if cfg is None:
        raise ConfigError(f"{run.source or 'run'}: eval needs 'model' (or --model/--api-base)")
    return cfg


def eval_model(job: TuneJob, api_base: str | None = None, model_name: str | None = None) -> ChatModel:
    """The model to evaluate: an API (litellm) when one is named, else the backend's policy."""
    from .job import get_backend, make_chat_model

    cfg = _eval_model_config(job.run, api_base, model_name)
    if cfg.api_base:
        return make_chat_model(cfg, where=job.run.where("model"))
    backend = job.backend or get_backend(job.run.backend, job.registry)
    return backend.chat_model(cfg)


def check_accuracy_key(job: TuneJob) -> None:
    """Fail before any rollout when ``eval.accuracy_key`` names no dimension of the run."""
    key = job.run.eval.accuracy_key
    known = job.composer.dimensions
    if key not in known and not any(key.startswith(d + "/") for d in known):
        raise ConfigError(
            f"{job.run.where('eval.accuracy_key')}: {key!r} is not a reward dimension; known: {sorted(known)}"
        )


def accuracy_of(result: BatchResult, key: str, threshold: float) -> float | None:
    """Share of scored rollouts whose ``key`` dimension reaches ``threshold``.

    A rollout without that dimension (a boundary score or a failed gate
    skipped the judge) counts as not reaching it.
    """
    kept = result.trajectories
    if not kept:
        return None
    hits = 0
    for t in kept:
        value = t.reward if key == "reward" else t.rewards.get(key)
        hits += value is not None and value >= threshold
    return hits / len(kept)


def tool_use_of(result: BatchResult, metric: str | None, task_field: str | None = None) -> float | None:
    """Share of scored rollouts whose workflow metric ``metric`` is positive (a tool was used).

    Only tasks that need a tool count: those whose ``task_field`` is true, or
    that lack the field. None when no rollout reports the metric (a workflow
    without tools) or no task needs a tool.
    """
    if not metric or not any(metric in t.metrics for t in result.trajectories):
        return None
    counted = [
        t
        for t in result.trajectories
        if not task_field or not isinstance(t.task, dict) or bool(t.task.get(task_field, True))
    ]
    if not counted:
        return None
    return sum(float(t.metrics.get(metric) or 0.0) > 0 for t in counted) / len(counted)


def evaluate(
    run: RunConfig,
    *,
    split: str | None = None,
    limit: int | None = None,
    model: ChatModel | None = None,
    api_base: str | None = None,
    model_name: str | None = None,
    job: TuneJob | None = None,
    plugin_manager: Any = None,
) -> EvalReport:
    """Run the workflow and judges over a split and report accuracy and every dimension.

    The components come from ``job``, else are built from ``plugin_manager``'s
    plugins, else from the registry the run was loaded with (``load_run(path,
    registry=...)``), else from every installed plugin.
    """
    from .job import build_job

    if job is None:
        uses_backend = model is None and not _eval_model_config(run, api_base, model_name).api_base
        job = build_job(run, plugin_manager, need_backend=uses_backend)
    check_accuracy_key(job)
    dataset = eval_dataset(run, split, limit)
    with job.running("eval") as ctx:
        rows = dataset.rows()
        chat_model = model or eval_model(job, api_base, model_name)
        runner = job.make_runner(model=chat_model, group_size=run.eval.group_size)
        start = time.perf_counter()
        result = runner.run(rows)
        report = EvalReport(
            accuracy=accuracy_of(result, run.eval.accuracy_key, run.eval.threshold),
            tool_use=tool_use_of(result, run.eval.tool_use_metric, run.eval.tool_use_field),
            accuracy_key=run.eval.accuracy_key,
            threshold=run.eval.threshold,
            tasks=len(rows),
            kept=len(result.trajectories),
            metrics=result.metrics,
            counters=dict(result.counters),
            seconds=time.perf_counter() - start,
            split=None if dataset.is_file and dataset.split is None else dataset.split_name,
            dataset=dataset.path,
            discarded=sum(len(g.discarded) for g in result.groups),
            trajectories=result.trajectories,
            discarded_trajectories=[t for g in result.groups for t in g.discarded],
            groups=list(result.groups),
        )
        metrics = dict(result.metrics)
        if report.accuracy is not None:
            metrics["accuracy"] = report.accuracy
        ctx.eval_end(metrics, step=0)
        ctx.summary.update(report.summary())
    return report
