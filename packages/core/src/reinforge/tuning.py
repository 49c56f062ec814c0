"""``tune(...)``: the Python entry point, with AgentScope tuner argument names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .job import DEFAULT_BACKEND, get_backend

if TYPE_CHECKING:
    from .config import AlgorithmConfig, DatasetConfig, ModelConfig, RunConfig
    from .job import TuneJob

__all__ = ["DEFAULT_BACKEND", "get_backend", "run_job", "tune"]


def run_job(job: TuneJob, *, dry_run: bool = False) -> Any:
    """Hand a checked job to its backend inside the run lifecycle (``dry_run`` only describes it).

    Returns the run's summary: what the backend returned, plus ``status`` and
    whatever observers added (``report``, ``stop_reason``).
    """
    backend = job.backend
    if backend is None:
        raise ConfigError(f"{job.run.source or 'run'}: this job was built without a backend")
    if dry_run:
        try:
            return backend.dry_run(job)
        finally:
            job.close()
    with job.running("tune") as ctx:
        result = backend.run(job)
        if isinstance(result, dict):
            decided = ctx.summary.get("status")
            ctx.summary.update(result)
            if decided is not None:  # Ctrl-C or an observer decided it; the backend's "finished" does not undo that
                ctx.summary["status"] = decided
        elif result is not None:
            ctx.summary["result"] = result
    return ctx.summary


def tune(
    workflow_func: Any = None,
    judge_func: Any = None,
    train_dataset: DatasetConfig | None = None,
    eval_dataset: DatasetConfig | None = None,
    model: ModelConfig | None = None,
    auxiliary_models: dict[str, Any] | None = None,
    algorithm: AlgorithmConfig | None = None,
    project_name: str | None = None,
    experiment_name: str | None = None,
    config_path: str | None = None,
    *,
    judges: list[Any] | None = None,
    group_reward: Any = None,
    backend: str | None = None,
    run: RunConfig | None = None,
    dry_run: bool = False,
    plugin_manager: Any = None,
    **run_options: Any,
) -> Any:
    """Train ``workflow_func`` against the judges on ``train_dataset``.

    Functions may be callables, registered names or ``module:attr`` strings;
    ``judges`` items may also be dicts ``{ref, weight, args, gate, kind,
    metric_weights, name}``. ``run_options`` sets any other run-file key
    (``runner``, ``reward``, ``eval``, ``backend_args`` ...). Pass ``run=`` to
    use an already loaded :class:`RunConfig` instead, and ``plugin_manager=``
    to use a given plugin manager instead of the installed plugins.
    """
    from . import config as cfg
    from .job import build_job
    from .runfile import build_run

    if run is None:
        if workflow_func is None:
            raise ConfigError("tune(): workflow_func is required")
        specs = [cfg.as_component(j, where="tune(judges)") for j in (judges or [])]
        if judge_func is not None:
            specs.insert(0, cfg.as_component(judge_func, where="tune(judge_func)"))
        aux_cfgs = {k: v for k, v in (auxiliary_models or {}).items() if isinstance(v, cfg.ModelConfig)}
        data: dict[str, Any] = {
            "workflow": cfg.as_component(workflow_func, where="tune(workflow_func)"),
            "judges": specs,
            "group_reward": cfg.as_component(group_reward, where="tune(group_reward)") if group_reward else None,
            "train_dataset": train_dataset,
            "eval_dataset": eval_dataset,
            "model": model,
            "auxiliary_models": aux_cfgs,
            "algorithm": algorithm or cfg.AlgorithmConfig(),
            "config_path": config_path,
            "backend": backend,
        }
        if project_name:
            data["project_name"] = project_name
        if experiment_name:
            data["experiment_name"] = experiment_name
        run = build_run(data, options=run_options, where="tune()")
    job = build_job(run, plugin_manager, backend=backend, need_backend=True)
    for name, value in (auxiliary_models or {}).items():
        if not isinstance(value, cfg.ModelConfig):
            job.auxiliary_models[name] = value  # a ready ChatModel object
    return run_job(job, dry_run=dry_run)
