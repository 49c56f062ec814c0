"""The ``local`` committer: each batch trains the served policy's LoRA adapter, then hot-swaps it in.

A committed batch holds rewarded traces whose calls the policy (``reinforge serve``) answered with
token ids and logprobs. :class:`LocalSink` turns them into training samples: the trace's reward minus
a baseline for ungrouped data (:mod:`reinforge_online.baselines`) is the advantage of each of its
calls, each weighted ``1 / calls`` so a long conversation does not outweigh a short one, and every
call is trained at its own request's temperature (the one its logprobs were sampled under).

Training runs in a worker process of its own (spawned, holding reinforge-backend-local's
:class:`~reinforge_backend_local.adapter_trainer.AdapterTrainer` and its model), so torch never
loads into the gateway and the gateway's threads are never stalled by it. The worker writes one
checkpoint per batch into the run folder (``committer.path``) and reports its folder; the sink then
asks the server to load it (``POST {admin_url}/admin/adapter``). The batch is committed only once
the server serves it. A failure anywhere raises, so the committer sends the same batch id again:
the worker finds that batch already trained (its id is in the checkpoint) and only the swap is
retried. A worker that died is started again at the next send and resumes from the latest
checkpoint, baselines included.

Calls without token ids (the upstream answered them: a fallback, or ``record`` mode against a
server that returns none) cannot be trained on and are counted as skipped.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import multiprocessing
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .baselines import Baseline, cluster_key

__all__ = ["DEFAULT_TRAINER", "LocalSink", "LocalTrace", "SwapError", "TrainingCall", "options_of", "traces_of"]

_log = logging.getLogger("reinforge_online.local")


class SwapError(RuntimeError):
    """The policy server did not take the new adapter (the batch is resent, the swap retried)."""


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


def _temperature(request: Any) -> float:
    value = request.get("temperature") if isinstance(request, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 1.0


def _call(call: dict[str, Any]) -> TrainingCall | None:
    prompt, tokens, logprobs = call.get("prompt_token_ids"), call.get("token_ids"), call.get("logprobs")
    if not prompt or not tokens or not isinstance(logprobs, list) or len(logprobs) != len(tokens):
        return None
    return TrainingCall(
        prompt_ids=[int(t) for t in prompt],
        completion_ids=[int(t) for t in tokens],
        logprobs=[float(x) for x in logprobs],
        temperature=_temperature(call.get("request")),
    )


def traces_of(rows: Sequence[dict[str, Any]]) -> list[LocalTrace]:
    """A batch's rows (the committer's :func:`~reinforge_online.committer.batch_rows`) as training traces.

    The cluster is the first call's request messages; a row without a reward is left out.
    """
    out = []
    for row in rows:
        reward = row.get("reward")
        calls = row.get("calls") or []
        if reward is None or not calls:
            continue
        first = calls[0].get("request") or {}
        trace = LocalTrace(cluster=cluster_key(first.get("messages") or []), reward=float(reward))
        for call in calls:
            usable = _call(call)
            if usable is None:
                trace.skipped += 1
            else:
                trace.calls.append(usable)
        out.append(trace)
    return out


# -- the worker process ---------------------------------------------------------------------------

_TRAINER: Any = None  # the worker's trainer, built at its first task
DEFAULT_TRAINER = "reinforge_online.local:adapter_trainer"


def adapter_trainer(options: dict[str, Any]) -> Any:
    """The worker's default trainer: reinforge-backend-local's ``AdapterTrainer`` with ``options``."""
    threads = options.get("threads")
    if threads:
        import torch

        torch.set_num_threads(int(threads))
    from reinforge.plugin import ModelConfig
    from reinforge_backend_local.adapter_trainer import AdapterTrainer
    from reinforge_backend_local.algorithms import GroupSettings

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


def _worker_init(parent: int) -> None:
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
        _TRAINER = getattr(importlib.import_module(module), attr)(options)
    return _TRAINER


def _samples(traces: list[dict[str, Any]], advantages: list[float]) -> list[dict[str, Any]]:
    """One sample per call (the fields of backend-local's ``Sample``): the trace's advantage, weight 1/calls."""
    out = []
    for trace, advantage in zip(traces, advantages):
        calls = trace["calls"]
        for call in calls:
            out.append(
                {
                    "prompt_ids": call["prompt_ids"],
                    "completion_ids": call["completion_ids"],
                    "old_logprobs": call["logprobs"],
                    "advantage": advantage,
                    "weight": 1.0 / len(calls),
                    "temperature": call["temperature"],
                }
            )
    return out


def _status(options: dict[str, Any]) -> dict[str, Any]:
    """In the worker: what the run folder holds (step, latest checkpoint)."""
    trainer = _trainer(options)
    latest = trainer.latest()
    return {"step": trainer.step, "checkpoint": str(latest) if latest is not None else None}


def _train(options: dict[str, Any], batch_id: str, traces: list[dict[str, Any]]) -> dict[str, Any]:
    """In the worker: advantages from the saved baselines, one update, a checkpoint (once per batch id)."""
    trainer = _trainer(options)
    if trainer.trained(batch_id):
        latest = trainer.latest()
        return {"checkpoint": str(latest) if latest is not None else None, "trained": False, "step": trainer.step}
    b = options["baseline"]
    baseline = Baseline(
        b["kind"],
        decay=b["decay"],
        min_count=b["min_count"],
        max_clusters=b["max_clusters"],
        scale=b["scale"],
        state=trainer.extra.get("baseline"),
    )
    items = [(t["cluster"], float(t["reward"])) for t in traces]
    advantages = baseline.advantages(items)
    baseline.update(items)
    samples = _samples(traces, advantages) if any(advantages) else []
    # no samples (every reward at its baseline): the checkpoint still records the batch and the baselines
    out: dict[str, Any] = trainer.train(batch_id, samples, extra={"baseline": baseline.state()})
    out["samples"] = len(samples)
    out["advantage_mean"] = sum(advantages) / len(advantages) if advantages else 0.0
    return out


# -- the sink -------------------------------------------------------------------------------------


class LocalSink:
    """Trains each batch into ``run_dir`` in a worker process, then swaps the checkpoint into the server.

    :param run_dir: the run folder (``reinforge serve RUN_DIR`` and ``reinforge export RUN_DIR`` read it).
    :param admin_url: the policy server's root (``http://127.0.0.1:8000``; ``/admin/adapter`` is added).
    :param admin_key: the server's admin key (``reinforge serve --admin-key-env``).
    :param options: the trainer's settings (``committer.local``'s keys, as :func:`options_of` gives them).
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        admin_url: str,
        admin_key: str | None,
        options: dict[str, Any],
        timeout_s: float = 60.0,
    ) -> None:
        self.run_dir = Path(run_dir).expanduser().absolute()
        self.admin_url = admin_url.rstrip("/")
        self.options = {**options, "run_dir": str(self.run_dir)}
        self._headers = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
        self._timeout = timeout_s
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self.skipped_calls = 0  # calls without token ids, never trained on
        self.last: dict[str, Any] = {}  # the last batch's answer from the worker, and the server's

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")  # no fork of a threaded gateway
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1, mp_context=ctx, initializer=_worker_init, initargs=(os.getpid(),)
            )
        return self._pool

    def _run(self, fn: Any, *args: Any) -> Any:
        """``fn(options, *args)`` in the worker; a dead worker is replaced at the next call."""
        try:
            return self._executor().submit(fn, self.options, *args).result()
        except concurrent.futures.process.BrokenProcessPool:
            _log.error("the training worker died; a new one resumes from %s at the next send", self.run_dir)
            self._drop_pool()
            raise

    def _drop_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def status(self) -> dict[str, Any]:
        """Start the worker (loads the model) and report the run folder's step and latest checkpoint."""
        result: dict[str, Any] = self._run(_status)
        return result

    def send(self, batch_id: str, rows: list[dict[str, Any]]) -> None:
        """Train on the batch (once per id), then have the server load the checkpoint; raises on any failure."""
        traces = traces_of(rows)
        skipped = sum(t.skipped for t in traces)
        usable = [asdict(t) for t in traces if t.calls]
        result = self._run(_train, batch_id, usable)
        if result["trained"]:
            self.skipped_calls += skipped
        checkpoint = result.get("checkpoint")
        if checkpoint is not None:
            result["server"] = self.swap(checkpoint)
        self.last = result
        _log.info(
            "batch %s: %s at step %s (%s samples), serving %s",
            batch_id,
            "trained" if result["trained"] else "already trained",
            result.get("step"),
            result.get("samples", 0),
            checkpoint,
        )

    def swap(self, checkpoint: str) -> dict[str, Any]:
        """``POST /admin/adapter {"path": checkpoint}``; the server's answer (its new ``policy_version``)."""
        url = f"{self.admin_url}/admin/adapter"
        try:
            resp = httpx.post(url, json={"path": checkpoint}, headers=self._headers, timeout=self._timeout)
        except httpx.HTTPError as exc:
            raise SwapError(f"{url}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code != 200:
            raise SwapError(f"{url}: HTTP {resp.status_code}: {resp.text[:500]}")
        data: dict[str, Any] = resp.json()
        return data

    def close(self, timeout: float = 5.0) -> None:
        """Stop the worker: a batch in training gets ``timeout`` seconds, then is abandoned (its batch is still
        ``committing`` and is resent at the next start; checkpoints are written aside and renamed, never half)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        workers = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for worker in workers:
            worker.join(timeout)
            if worker.is_alive():
                _log.warning("the training worker %s did not stop in %.0f s; terminating it", worker.pid, timeout)
                worker.terminate()
                worker.join(10)


def options_of(local: Any, *, threads_default: int | None = None) -> dict[str, Any]:
    """``committer.local`` (:class:`~reinforge_online.config.LocalCommitterSettings`) as the worker's options."""
    b = local.baseline
    return {
        "trainer": DEFAULT_TRAINER,
        "model": local.model,
        "adapter": local.adapter,
        "learning_rate": local.learning_rate,
        "lora_rank": local.lora_rank,
        "lora_alpha": local.lora_alpha,
        "target_modules": list(local.target_modules) if local.target_modules else None,
        "clip_range": local.clip_range,
        "kl_coef": local.kl_coef,
        "ppo_epochs": local.ppo_epochs,
        "max_grad_norm": local.max_grad_norm,
        "micro_batch_tokens": local.micro_batch_tokens,
        "mini_batch_size": local.mini_batch_size,
        "keep_checkpoints": local.keep_checkpoints,
        "seed": local.seed,
        "threads": local.threads or threads_default or os.cpu_count(),
        "nice": local.nice,
        "baseline": {
            "kind": b.kind,
            "decay": b.decay,
            "min_count": b.min_count,
            "max_clusters": b.max_clusters,
            "scale": b.scale,
        },
    }
