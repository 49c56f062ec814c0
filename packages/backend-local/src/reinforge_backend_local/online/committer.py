"""reinforge-online's ``local`` committer: each batch of live traffic trains the served LoRA into a new policy version.

Registered through reinforge-online's ``register_committers`` hook (an optional hookimpl in
:mod:`reinforge_backend_local.plugin`: this package works without reinforge-online), so
``online.yaml`` says ``committer: {kind: local, args: {...}}`` (:class:`LocalCommitterSettings`).

A committed batch holds rewarded traces whose calls the policy (``reinforge serve``) answered with
token ids and logprobs. :class:`LocalCommitter` turns them into training data: the trace's reward
minus a baseline for ungrouped data (:mod:`reinforge_backend_local.online.baselines`) is the advantage of
each of its calls, each weighted ``1 / calls`` so a long conversation does not outweigh a short one,
and every call is trained at its own request's temperature (the one its logprobs were sampled under).

It is a :class:`reinforge_online.versions.VersionedCommitter`: each batch makes a version
(``step-N``, a checkpoint in the run folder) that is only a candidate. Online's promotion gate drives
the rest: :meth:`~LocalCommitter.check` scores a version on a run file's eval set,
:meth:`~LocalCommitter.serve` has the server load it (``POST {admin_url}/admin/adapter``), and
:meth:`~LocalCommitter.train_from` sends training back to a version (a refused candidate's live
predecessor, or the version a rollback serves again). ``send`` no longer swaps the server.

Training and checks run in a worker process of its own (spawned; :mod:`reinforge_backend_local.online.worker`
holds an :class:`~reinforge_backend_local.training.adapter_trainer.AdapterTrainer` and its model), so torch
never loads into the gateway and the gateway's threads are never stalled by it. A failure anywhere
raises, so the outbox sends the same batch id again: the worker finds that batch already trained (a
checkpoint names it) and answers its version. A worker that died is started again at the next call and
resumes where training stood (``run_versions``), baselines included.

Calls without token ids (the upstream answered them: a fallback, or ``record`` mode against a
server that returns none) cannot be trained on and are counted as skipped.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reinforge.plugin import FieldError, Settings, at_least, finite, in_range, one_of

from ..model.run_versions import INITIAL, RunVersions, UnknownVersion, step_name, step_of
from . import worker
from .baselines import BASELINES, SCALES, cluster_key
from .worker import LocalTrace, TrainingCall

if TYPE_CHECKING:
    from reinforge_online import CommitterContext
    from reinforge_online.versions import CheckResult, CheckSpec, Version

__all__ = [
    "BaselineSettings",
    "LocalCommitter",
    "LocalCommitterSettings",
    "SwapError",
    "UnknownVersion",
    "WorkerTimeout",
    "admin_url_of",
    "local_committer",
    "options_of",
    "traces_of",
]

_log = logging.getLogger("reinforge_backend_local.online.committer")
CHECK_GRACE_S = 300.0  # a check's worker that has not answered this long after its timeout_s is stopped


@dataclass
class BaselineSettings(Settings):
    """What the committer subtracts from a trace's reward (:mod:`reinforge_backend_local.online.baselines`)."""

    kind: str = "cluster"
    decay: float = 0.9
    min_count: int = 2
    max_clusters: int = 10000
    scale: str = "none"

    def check(self) -> None:
        one_of("kind", self.kind, BASELINES)
        one_of("scale", self.scale, SCALES)
        in_range("decay", self.decay, 0.0, 1.0)
        at_least("min_count", self.min_count, 1)
        at_least("max_clusters", self.max_clusters, 1)


def _url(key: str, value: str) -> None:
    if not value.startswith(("http://", "https://")):
        raise FieldError(key, f"expected an http:// or https:// URL, got {value!r}")


@dataclass
class LocalCommitterSettings(Settings):
    """``committer.args`` of ``kind: local``: train the served policy's LoRA on each batch into a new version.

    Needs a ``reinforge serve`` started with ``--admin-key-env``; ``admin_key_env`` names the
    variable holding that key (the gateway reads it at start).
    """

    admin_key_env: str | None = None  # required: the variable holding reinforge serve's admin key
    admin_url: str | None = None  # default: policy.url without its trailing /v1
    run_dir: str = "online-run"  # the run folder (relative to online.yaml's folder); reinforge serve/export read it
    model: str | None = None  # the base model the server serves (default: the built-in SmolLM2)
    adapter: str | None = None  # the adapter the server started with: step-0 (read while the run folder is new)
    learning_rate: float = 1e-4
    lora_rank: int = 16
    lora_alpha: int = 32
    target_modules: list[str] | None = None  # default: q/k/v/o projections
    clip_range: float = 0.2
    kl_coef: float = 0.0
    ppo_epochs: int = 1
    max_grad_norm: float = 1.0
    micro_batch_tokens: int = 1024
    mini_batch_size: int | None = None  # samples per optimizer step (a batch is split); None: one step per batch
    threads: int | None = None  # torch threads of the training worker (default: all cores)
    nice: int = 10  # the worker's niceness: training yields the CPU to the gateway and the server
    keep_checkpoints: int = 3  # checkpoints never served that are kept (served ones always are)
    seed: int = 0
    swap_timeout_s: float = 60.0  # how long the server may take to load a version
    baseline: BaselineSettings = field(default_factory=BaselineSettings)

    def check(self) -> None:
        if not self.admin_key_env:
            raise FieldError(
                "admin_key_env",
                "is required: the environment variable holding the policy server's admin key"
                " (reinforge serve --admin-key-env)",
            )
        if self.admin_url is not None:
            _url("admin_url", self.admin_url)
        if not self.run_dir.strip():
            raise FieldError("run_dir", "must not be empty")
        at_least("learning_rate", self.learning_rate, 0.0, strict=True)
        finite("learning_rate", self.learning_rate)
        at_least("lora_rank", self.lora_rank, 1)
        at_least("lora_alpha", self.lora_alpha, 1)
        at_least("clip_range", self.clip_range, 0.0, strict=True)
        at_least("kl_coef", self.kl_coef, 0.0)
        at_least("ppo_epochs", self.ppo_epochs, 1)
        at_least("max_grad_norm", self.max_grad_norm, 0.0, strict=True)
        at_least("micro_batch_tokens", self.micro_batch_tokens, 1)
        if self.mini_batch_size is not None:
            at_least("mini_batch_size", self.mini_batch_size, 1)
        if self.threads is not None:
            at_least("threads", self.threads, 1)
        in_range("nice", self.nice, 0, 19)
        at_least("keep_checkpoints", self.keep_checkpoints, 1)
        at_least("swap_timeout_s", self.swap_timeout_s, 0.0, strict=True)


class SwapError(RuntimeError):
    """The policy server did not take the adapter (online keeps serving what it served)."""


class WorkerTimeout(TimeoutError):
    """The worker did not answer in time and was stopped (the next call starts another)."""


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
    """A batch's rows (what the outbox hands a committer) as training traces.

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


class LocalCommitter:
    """Trains each batch into ``run_dir`` in a worker process; checks, serves and goes back to its versions.

    :param run_dir: the run folder (``reinforge serve RUN_DIR`` and ``reinforge export RUN_DIR`` read it).
    :param admin_url: the policy server's root (``http://127.0.0.1:8000``; ``/admin/adapter`` is added).
    :param admin_key: the server's admin key (``reinforge serve --admin-key-env``).
    :param options: the trainer's settings (:class:`LocalCommitterSettings` as :func:`options_of` gives them).
    :param timeout_s: how long the server may take to load a version.
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
        self.versions = RunVersions(self.run_dir)
        self._headers = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
        self._timeout = timeout_s
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self.skipped_calls = 0  # calls without token ids, never trained on
        self.last: dict[str, Any] = {}  # the last batch's answer from the worker (and its "version")

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")  # no fork of a threaded gateway
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1, mp_context=ctx, initializer=worker.worker_init, initargs=(os.getpid(),)
            )
        return self._pool

    def _run(self, fn: Any, *args: Any, timeout: float | None = None) -> Any:
        """``fn(options, *args)`` in the worker; a dead worker is replaced at the next call.

        :raises WorkerTimeout: no answer in ``timeout`` seconds: the worker is stopped (the next call starts
            another, which resumes where training stood).
        """
        future = self._executor().submit(fn, self.options, *args)
        try:
            return future.result(timeout)
        except concurrent.futures.process.BrokenProcessPool:
            _log.error("the training worker died; a new one resumes from %s at the next call", self.run_dir)
            self._drop_pool()
            raise
        except concurrent.futures.TimeoutError:
            _log.error("the training worker did not answer in %.0f s; stopping it", timeout)
            self.close(timeout=1.0)
            raise WorkerTimeout(
                f"the training worker did not answer {fn.__name__} in {timeout:g} s; it was stopped"
            ) from None

    def _drop_pool(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def status(self) -> dict[str, Any]:
        """Start the worker (loads the model) and report where training stands and the newest checkpoint."""
        result: dict[str, Any] = self._run(worker.status)
        return result

    # -- the VersionedCommitter protocol (reinforge_online.versions) -----------------------------

    def send(self, batch_id: str, rows: list[dict[str, Any]]) -> Version | None:
        """Train on the batch once per id and return the version it made, *without serving it*.

        A batch some checkpoint already trained returns that checkpoint's version again (also after
        :meth:`train_from` went back to an older one). None: the batch has no trainable call, so nothing was
        trained (nothing is recorded either: a resend answers None again). Raises on any failure.
        """
        traces = traces_of(rows)
        skipped = sum(t.skipped for t in traces)
        usable = [t for t in traces if t.calls]
        if not usable:
            self.skipped_calls += skipped
            self.last = {"trained": False, "version": None, "skipped": skipped}
            _log.info("batch %s: no call with token ids (%s skipped); nothing trained", batch_id, skipped)
            return None
        result = self._run(worker.train, batch_id, usable)
        if result["trained"]:
            self.skipped_calls += skipped
        version = _version(result)
        self.last = {**result, "version": version}
        _log.info(
            "batch %s: %s %s from %s (%s samples)",
            batch_id,
            "trained" if result["trained"] else "already trained as",
            version.name,
            result.get("parent"),
            result.get("samples", "-"),
        )
        return version

    def initial_version(self) -> Version:
        """``step-0``: what the server serves before any batch (the adapter it started with, or the base model)."""
        from reinforge_online.versions import Version

        return Version(INITIAL, {"checkpoint": None, "adapter": self.options.get("adapter")})

    def check(self, version: Version, spec: CheckSpec) -> CheckResult:
        """Score ``version`` on ``spec``'s check set in the worker (greedy, the run file's workflow and judges).

        Past ``spec.timeout_s`` the worker cancels the rollouts, puts the current weights back and raises
        (:class:`~.version_check.CheckTimeout`); a worker that has not answered :data:`CHECK_GRACE_S` after that
        (a workflow stuck in blocking code) is stopped and :class:`WorkerTimeout` raised.
        """
        from reinforge_online.versions import CheckResult

        name = _name(version)
        out = self._run(
            worker.check,
            name,
            str(Path(spec.run).expanduser().absolute()),
            spec.split,
            int(spec.limit),
            float(spec.timeout_s),
            timeout=float(spec.timeout_s) + CHECK_GRACE_S,
        )
        _log.info(
            "version %s: check score %.4f on %s tasks in %.1f s", name, out["score"], out["tasks"], out["seconds"]
        )
        return CheckResult(score=out["score"], tasks=out["tasks"], seconds=out["seconds"], metrics=out["metrics"])

    def serve(self, version: Version) -> str | None:
        """Have the server load ``version`` (its checkpoint; ``step-0``: the initial adapter, or null for the
        base model); the policy version its responses carry from now. The version is recorded as served
        first (``served.json``): it is never pruned.

        :raises UnknownVersion: its checkpoint is not in the run folder.
        :raises SwapError: the server did not take it.
        """
        name = _name(version)
        if name == INITIAL:
            adapter = self.options.get("adapter")
            path = str(adapter) if adapter else None
        else:
            path = str(self.versions.existing(name))
            self.versions.mark_served(name)
        answer = self.swap(path)
        served = answer.get("policy_version")
        _log.info("serving %s (%s): policy version %s", name, path or "the base model", served)
        return None if served is None else str(served)

    def train_from(self, version: Version) -> None:
        """The next batch trains on top of ``version`` (its weights, optimizer state and baselines)."""
        name = _name(version)
        out = self._run(worker.restore, name)
        if out.get("changed"):
            _log.info("training goes on from %s", name)

    # -- the server ------------------------------------------------------------------------------

    def swap(self, path: str | None) -> dict[str, Any]:
        """``POST /admin/adapter {"path": path}`` (None: the base model); the server's answer (its ``policy_version``)."""
        import httpx

        url = f"{self.admin_url}/admin/adapter"
        try:
            resp = httpx.post(url, json={"path": path}, headers=self._headers, timeout=self._timeout)
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
        for process in workers:
            process.join(timeout)
            if process.is_alive():
                _log.warning("the training worker %s did not stop in %.0f s; terminating it", process.pid, timeout)
                process.terminate()
                process.join(10)


def _name(version: Any) -> str:
    """The name of one of this committer's versions (``step-N``).

    :raises ValueError: another committer's version.
    """
    name = str(getattr(version, "name", version))
    if step_of(name) is None:
        raise ValueError(f"{name!r} is not a version of the local committer (step-N)")
    return name


def _version(result: dict[str, Any]) -> Version:
    """The version the worker's answer names; its detail is plain JSON, the same for a batch and its resend."""
    from reinforge_online.versions import Version

    step = int(result["step"])
    detail = {
        "checkpoint": result["checkpoint"],
        "step": step,
        "parent": result.get("parent"),
        "metrics": dict(result.get("metrics") or {}),
    }
    return Version(step_name(step), detail)


def options_of(settings: LocalCommitterSettings, *, threads_default: int | None = None) -> dict[str, Any]:
    """The settings as the worker's options (plain data: they cross the process boundary)."""
    b = settings.baseline
    return {
        "trainer": worker.DEFAULT_TRAINER,
        "model": settings.model,
        "adapter": settings.adapter,
        "learning_rate": settings.learning_rate,
        "lora_rank": settings.lora_rank,
        "lora_alpha": settings.lora_alpha,
        "target_modules": list(settings.target_modules) if settings.target_modules else None,
        "clip_range": settings.clip_range,
        "kl_coef": settings.kl_coef,
        "ppo_epochs": settings.ppo_epochs,
        "max_grad_norm": settings.max_grad_norm,
        "micro_batch_tokens": settings.micro_batch_tokens,
        "mini_batch_size": settings.mini_batch_size,
        "keep_checkpoints": settings.keep_checkpoints,
        "seed": settings.seed,
        "threads": settings.threads or threads_default or os.cpu_count(),
        "nice": settings.nice,
        "baseline": {
            "kind": b.kind,
            "decay": b.decay,
            "min_count": b.min_count,
            "max_clusters": b.max_clusters,
            "scale": b.scale,
        },
    }


def admin_url_of(settings: LocalCommitterSettings, context: CommitterContext) -> str:
    """Where adapters are swapped in: ``admin_url``, else ``policy.url`` without its ``/v1``.

    :raises ConfigError: neither is there (the Python API has no policy URL: set ``admin_url``).
    """
    if settings.admin_url:
        return settings.admin_url.rstrip("/")
    if context.policy_url is None:
        raise context.error("admin_url", "the local committer needs this URL (the reinforge serve root) or policy.url")
    url = context.policy_url.rstrip("/")
    return url.removesuffix("/v1")


def local_committer(settings: LocalCommitterSettings, context: CommitterContext) -> LocalCommitter:
    """The factory registered as ``local``: URL and admin key resolved now, the worker started at the first send."""
    options = options_of(settings)
    if settings.adapter:  # relative to online.yaml, like run_dir: the worker and the server read it from elsewhere
        options["adapter"] = str(context.path(settings.adapter))
    return LocalCommitter(
        context.path(settings.run_dir),
        admin_url=admin_url_of(settings, context),
        admin_key=context.secret(settings.admin_key_env, "admin_key_env"),
        options=options,
        timeout_s=settings.swap_timeout_s,
    )
