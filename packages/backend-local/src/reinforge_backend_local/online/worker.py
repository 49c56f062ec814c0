"""The ``local`` committer's worker process: where each batch of live traffic is trained and each version is
checked (torch loads here only).

The gateway's :class:`~reinforge_backend_local.online.committer.LocalCommitter` spawns one process
and calls the functions below in it with the committer's options (plain data) and the batch's
:class:`LocalTrace` objects, which cross the process boundary pickled; the samples the trainer takes
are built here, on this side of it. The trainer is built at the first call, by ``options["trainer"]``
(``module:function``; default :func:`adapter_trainer`, this package's
:class:`~reinforge_backend_local.training.adapter_trainer.AdapterTrainer`), and kept for the process's life.

All tensor work (loading, training, swapping versions' weights, decoding a check) runs on the
process's one compute thread (:mod:`~reinforge_backend_local.model.compute`); a check's event loop runs on
the calling thread.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..model.compute import on_compute_thread
from .baselines import Baseline

if TYPE_CHECKING:
    from ..training.trainer import Sample

__all__ = [
    "DEFAULT_TRAINER",
    "LocalTrace",
    "TrainingCall",
    "adapter_trainer",
    "check",
    "restore",
    "samples_of",
    "status",
    "train",
    "worker_init",
]

DEFAULT_TRAINER = "reinforge_backend_local.online.worker:adapter_trainer"
_TRAINER: Any = None  # the worker's trainer, built at its first task


@dataclass
class TrainingCall:
    """One policy call as the trainer needs it: exact tokens and the logprobs they were sampled with."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    temperature: float


@dataclass
class LocalTrace:
    """One rewarded trace: its prompt cluster, reward and trainable calls."""

    cluster: str
    reward: float
    calls: list[TrainingCall] = field(default_factory=list)
    skipped: int = 0  # calls without usable token ids


def adapter_trainer(options: dict[str, Any]) -> Any:
    """The worker's default trainer: an :class:`~..training.adapter_trainer.AdapterTrainer` with ``options``."""
    threads = options.get("threads")
    if threads:
        import torch

        torch.set_num_threads(int(threads))  # called on the compute thread (see _trainer): its OpenMP count too
    from reinforge.plugin import ModelConfig

    from ..training.adapter_trainer import AdapterTrainer
    from ..training.algorithms import GroupSettings

    model = options.get("model") or "smollm2-135m-instruct"
    lora = ModelConfig(model_path=model, lora_rank=options["lora_rank"], lora_alpha=options["lora_alpha"])
    if options.get("target_modules"):
        lora.lora_target_modules = list(options["target_modules"])
    loss = GroupSettings(
        kl_coef=options["kl_coef"],
        clip_range=options["clip_range"],
        ppo_epochs=options["ppo_epochs"],
        max_grad_norm=options["max_grad_norm"],
        scale_rewards="none",  # the baseline already made the advantages
    )
    return AdapterTrainer(
        options["run_dir"],
        model_path=model,
        adapter=options.get("adapter"),
        lora=lora,
        learning_rate=options["learning_rate"],
        loss=loss,
        micro_batch_tokens=options["micro_batch_tokens"],
        mini_batch_size=options.get("mini_batch_size"),
        keep=options["keep_checkpoints"],
        seed=options["seed"],
    )


def worker_init(parent: int) -> None:
    """In the worker, first: end with the gateway, even when it is killed (no orphan keeps training)."""
    import ctypes
    import signal
    import threading
    import time

    with contextlib.suppress(AttributeError, OSError):  # Linux: the kernel signals us when the parent dies
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    def watch() -> None:  # elsewhere (and as a backstop): the parent is gone once we are someone else's child
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    if os.getppid() != parent:  # it died while we started
        os._exit(1)
    threading.Thread(target=watch, name="reinforge-online-parent-watch", daemon=True).start()


def _trainer(options: dict[str, Any]) -> Any:
    """The worker's trainer, built by ``options["trainer"]`` (``module:function``) at the first task."""
    global _TRAINER
    if _TRAINER is None:
        import importlib

        if options.get("nice"):
            os.nice(int(options["nice"]))  # training yields the CPU to request handling (never the reverse)

        module, _, attr = str(options.get("trainer") or DEFAULT_TRAINER).partition(":")
        # niceness is per thread on Linux: the compute thread, started after it was set, inherits it
        _TRAINER = on_compute_thread(getattr(importlib.import_module(module), attr), options)
    return _TRAINER


def samples_of(traces: Sequence[LocalTrace], advantages: Sequence[float]) -> list[Sample]:
    """One :class:`~..training.trainer.Sample` per call: the trace's advantage, weight ``1 / calls``, the call's temperature."""
    from ..training.trainer import Sample

    out = []
    for trace, advantage in zip(traces, advantages):
        for call in trace.calls:
            out.append(
                Sample(
                    prompt_ids=call.prompt_ids,
                    completion_ids=call.completion_ids,
                    old_logprobs=call.logprobs,
                    advantage=advantage,
                    weight=1.0 / len(trace.calls),
                    temperature=call.temperature,
                )
            )
    return out


def status(options: dict[str, Any]) -> dict[str, Any]:
    """In the worker: where training stands (its version and step) and the newest checkpoint."""
    trainer = _trainer(options)
    latest = trainer.latest()
    return {"step": trainer.step, "head": trainer.head, "checkpoint": str(latest) if latest is not None else None}


def train(options: dict[str, Any], batch_id: str, traces: list[LocalTrace]) -> dict[str, Any]:
    """In the worker: advantages from the current version's baselines, one update, a checkpoint (once per batch id).

    A batch some checkpoint already trained is not trained again: the answer names that checkpoint.
    """
    trainer = _trainer(options)
    found = trainer.recorded(batch_id)
    if found is not None:
        done: dict[str, Any] = trainer.answer(found, trained=False)
        return done
    b = options["baseline"]
    baseline = Baseline(
        b["kind"],
        decay=b["decay"],
        min_count=b["min_count"],
        max_clusters=b["max_clusters"],
        scale=b["scale"],
        state=trainer.extra.get("baseline"),
    )
    items = [(t.cluster, t.reward) for t in traces]
    advantages = baseline.advantages(items)
    baseline.update(items)
    samples = samples_of(traces, advantages) if any(advantages) else []
    # no samples (every reward at its baseline): the checkpoint still records the batch and the baselines
    out: dict[str, Any] = on_compute_thread(trainer.train, batch_id, samples, extra={"baseline": baseline.state()})
    out["samples"] = len(samples)
    out["advantage_mean"] = sum(advantages) / len(advantages) if advantages else 0.0
    return out


def restore(options: dict[str, Any], name: str) -> dict[str, Any]:
    """In the worker: training goes on from version ``name`` (its weights, optimizer state and baselines)."""
    trainer = _trainer(options)
    changed = on_compute_thread(trainer.restore, name)
    return {"head": trainer.head, "step": trainer.step, "changed": bool(changed)}


def check(
    options: dict[str, Any], name: str, run: str, split: str | None, limit: int, timeout_s: float
) -> dict[str, Any]:
    """In the worker: version ``name`` scored on the run file ``run``'s eval set (:mod:`.version_check`)."""
    from .version_check import check_version

    return check_version(_trainer(options), name, run=run, split=split, limit=limit, timeout_s=timeout_s)
