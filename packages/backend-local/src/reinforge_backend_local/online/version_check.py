"""Scoring one policy version on a run file's held-out tasks, in the online ``local`` committer's worker.

Online's promotion gate serves a trained version only when its score on a check set (a run file's eval
dataset, workflow and judges) is good enough against the live version's. The worker already holds the
model, so it scores here: the run file's first ``limit`` eval rows, one greedy rollout each (temperature
0, the run's ``model`` settings otherwise), through core's shared runner and the run's judges, decoded by
this package's batched engine with the version's LoRA weights merged in. A version other than the
trainer's current one is lent its weights for the check and the current ones are put back exactly.

A check is not a run: nothing is reported to observers (no run lifecycle, no ``on_trajectory``), so report
plugins write nothing for it. It scores ``eval.accuracy_key`` at ``eval.threshold`` (core's
``accuracy_of``), or the mean reward when that key names no reward dimension of the run.

Timeout: past ``timeout_s`` the rollouts are cancelled and :class:`CheckTimeout` is raised. The decode
batch running then finishes first (it cannot be interrupted; at most one batch of ``max_tokens`` steps),
then the current weights are put back, so the worker is ready for the next call when this one raises.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from pathlib import Path
from typing import Any

from reinforge.plugin import (
    ConfigError,
    ModelConfig,
    RecordingChatModel,
    accuracy_of,
    build_job,
    check_accuracy_key,
    dimension_means,
    eval_dataset,
    load_run,
)

from ..inference.engine import Engine, MicroBatcher
from ..inference.policy import ChatTemplate, PolicyChatModel
from ..model.compute import on_compute_thread
from ..model.memory import release_free_memory
from ..model.modeling import DEFAULT_MODEL
from ..model.run_versions import step_of
from ..model.weights import merged_for_decode

__all__ = ["CheckTimeout", "check_version"]

_log = logging.getLogger("reinforge_backend_local.online.version_check")
MAX_BATCH = 64  # rows per decode batch


class CheckTimeout(TimeoutError):
    """A check ran past its ``timeout_s`` (its rollouts were cancelled; the worker's weights are back)."""


def check_version(
    trainer: Any,
    name: str,
    *,
    run: str,
    split: str | None,
    limit: int,
    timeout_s: float,
    plugin_manager: Any = None,
) -> dict[str, Any]:
    """Score version ``name`` of ``trainer`` (an :class:`~..training.adapter_trainer.AdapterTrainer`) on ``run``'s eval set.

    :param plugin_manager: where the run's components are looked up (default: the installed plugins).
    :returns: ``{"score", "tasks", "seconds", "metrics"}`` (tasks scored; every reward dimension's mean).
    :raises CheckTimeout: it took longer than ``timeout_s``.
    :raises ConfigError: the run file or its eval set is wrong (named), or the check set is empty.
    :raises RuntimeError: no task was scored (every rollout failed).
    """
    start = time.perf_counter()
    deadline = start + timeout_s
    cfg = load_run(run)
    job = build_job(cfg, plugin_manager, need_backend=False)  # the workflow and judges; no backend is involved
    job.plugin_manager = None  # observers hear runs, not checks: the runner gets no hook relay (no on_trajectory)
    try:
        dataset = eval_dataset(cfg, split, limit)
        rows = dataset.rows()
        if not rows:
            raise ConfigError(f"{cfg.source or run}: the check set is empty ({dataset.describe()})")
        mc = cfg.model or ModelConfig(model_path=DEFAULT_MODEL)
        sampling = {**mc.sampling(), "temperature": 0.0}
        result = _rollouts(trainer, name, job, rows, mc, sampling, deadline, timeout_s)
        score, metrics = _score(job, result, run, len(rows))
    finally:
        job.close()
    return {
        "score": score,
        "tasks": len(result.trajectories),
        "seconds": time.perf_counter() - start,
        "metrics": metrics,
    }


def _score(job: Any, result: Any, run: str, tasks: int) -> tuple[float, dict[str, float]]:
    """The check's score (accuracy, or the mean reward) and every reward dimension's mean.

    :raises RuntimeError: no task was scored.
    """
    kept = result.trajectories
    if not kept:
        errors = [t.error for g in result.groups for t in g.discarded if t.error]
        raise RuntimeError(
            f"no task of the check set was scored ({tasks} tasks of {run}); first error: {errors[0] if errors else 'none'}"
        )
    metrics = {k: float(v) for k, v in dimension_means(result.metrics).items() if math.isfinite(float(v))}
    try:
        check_accuracy_key(job)
    except ConfigError as exc:
        _log.warning("%s; the check scores the mean reward", exc)
        return sum(float(t.reward or 0.0) for t in kept) / len(kept), metrics
    accuracy = accuracy_of(result, job.run.eval.accuracy_key, job.run.eval.threshold)
    metrics["accuracy"] = float(accuracy) if accuracy is not None else 0.0
    return metrics["accuracy"], metrics


def _rollouts(
    trainer: Any,
    name: str,
    job: Any,
    rows: list[dict[str, Any]],
    mc: ModelConfig,
    sampling: dict[str, Any],
    deadline: float,
    timeout_s: float,
) -> Any:
    """One greedy rollout per row on version ``name``'s weights, merged for decoding; the current ones back after."""
    model = trainer.model
    engine = on_compute_thread(
        Engine, model, trainer.tokenizer, max_model_len=mc.max_model_len, max_batch=MAX_BATCH, packer=trainer.packer
    )
    batcher = MicroBatcher(engine)
    template = ChatTemplate(trainer.tokenizer, mc.max_model_len)
    version = step_of(name) or 0
    model_name = str(mc.model_path or Path(str(trainer.folder)).name)

    def provider(t: Any) -> RecordingChatModel:
        chat = PolicyChatModel(
            batcher,
            template,
            seed_key=("check", t.task_index, t.rollout_index, t.attempts),
            order_key=(t.task_index, t.rollout_index),
            version=version,
            model_name=model_name,
            defaults=sampling,
        )
        return RecordingChatModel(chat, t, sampling)

    runner = job.make_runner(model_provider=provider, group_size=1, sampling=sampling)
    saved = on_compute_thread(trainer.swap_in, name)
    try:
        training = model.training
        model.eval()
        merged = merged_for_decode(model, True)
        on_compute_thread(merged.__enter__)  # the merge is tensor work: on the decoding thread (.compute)
        try:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise CheckTimeout(f"checking {name} took longer than {timeout_s:g} s before any rollout")
            try:
                return asyncio.run(asyncio.wait_for(runner.run_batch(rows), left))
            except asyncio.TimeoutError:
                raise CheckTimeout(
                    f"checking {name} on {len(rows)} tasks took longer than {timeout_s:g} s (check timeout_s)"
                ) from None
        finally:
            on_compute_thread(merged.__exit__, None, None, None)  # the unmerged weights back, whatever happened
            model.train(training)
    finally:
        on_compute_thread(trainer.put_back, saved)  # the current version's weights back, exactly
        engine.forget_all()
        on_compute_thread(release_free_memory)
