"""The Python API, mirroring AgentScope Java's online ``TrainingRunner``: :class:`OnlineTrainer` and its chat model.

::

    trainer = OnlineTrainer(committer="sink", selection=SamplingRate(0.1), reward=my_judge, commit_interval_s=300)
    trainer.start()
    model = trainer.chat_model(upstream=AsyncOpenAI(), policy=AsyncOpenAI(base_url="http://127.0.0.1:8000/v1"))
    reply = await model.chat(messages, session_id=conversation_id, task={"answer": "42"})
    trainer.stop()  # drains within its deadline, never raises

The chat model works in process (no gateway, no HTTP of its own): it asks the trainer's
selection, sends sampled calls to the policy with token ids requested, and records them in
the same store through the same :class:`~reinforge_online.pipeline.Pipeline` the gateway uses,
so rewards, feedback and commits behave exactly as they do for HTTP traffic.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import secrets as _secrets
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reinforge import ChatResponse
from reinforge.plugin import ConfigError, load_settings

from . import feedback as _feedback
from .committers import Committer, CommitterContext
from .config import CHAT_ROUTE, OnlineSettings, RewardSettings, Secrets, load_config
from .metrics import Metrics
from .pipeline import Pipeline
from .redact import Redactor
from .selection import SamplingRate, Selection
from .store import CallRecord, TraceStore

__all__ = ["OnlineChatModel", "OnlineChatResponse", "OnlineTrainer"]

_log = logging.getLogger("reinforge_online.trainer")
_IN_PROCESS = "http://in-process.invalid/v1"  # settings need an upstream URL; the Python API sends nothing there
_WHERE = "OnlineTrainer()"
# the 0.1 keywords, and where each one went
_MOVED = {
    "backend": "backend= is now committer= ('sink', 'none', a registered committer's name, or an object with send())",
    "local": "local= moved to committer_args= (committer='local')",
    "trinity": "trinity= moved to committer_args= (committer='trinity')",
    "batches": "batches= moved to committer_args={'path': ...} (committer='sink')",
}


def _reward_settings(reward: Any, **options: Any) -> RewardSettings | None:
    """``reward`` as the calculator's settings: a judge, a list of judges, or a run file's path."""
    if reward is None:
        return None
    if isinstance(reward, RewardSettings):
        return reward
    if isinstance(reward, Path) or (isinstance(reward, str) and reward.endswith((".yaml", ".yml"))):
        path = Path(reward).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"OnlineTrainer(): reward: the run file {str(reward)!r} does not exist")
        data: dict[str, Any] = {"run": str(path)}
    else:
        data = {"judges": list(reward) if isinstance(reward, (list, tuple)) else [reward]}
    return load_settings(RewardSettings, {**data, **options}, where="OnlineTrainer()", prefix="reward")


class OnlineTrainer:
    """Samples an agent's model calls, records them, rewards them and commits rewarded batches.

    :param committer: where rewarded batches go: a registered committer's name (``"sink"``: JSONL files
        in ``committer_args["path"]``, default ``batches``; ``"local"`` with reinforge-backend-local:
        train the served policy's LoRA and hot-swap it in, ``committer_args`` holding ``admin_url`` and
        ``admin_key_env`` at least; ``"trinity"`` with reinforge-backend-trinity), ``"none"`` (they
        stay in the store), or any object with ``send(batch_id, rows)`` (called again with the same id
        after a failure; not closed here).
    :param committer_args: the named committer's settings (``committer.args`` of ``online.yaml``),
        checked against its settings class; relative paths are relative to the working directory.
    :param selection: which calls are sampled (default ``SamplingRate(0.1)``, sticky per session).
    :param reward: a judge (function, registered name, ``module:attr``), a list of them (weights as in a
        run file: ``{"ref": judge, "weight": 0.5}``), or a run file's path (its judges); None: rewards
        only come from :meth:`feedback`.
    :param commit_interval_s: commit this often (and as soon as ``min_traces`` traces have a reward).
    :param reward_range: ``(low, high)``; rewards outside it are clamped (judges' and feedback's).
    :param store: the SQLite file, or a ``postgresql://user@host:port/dbname`` URL (the ``[postgres]`` extra;
        its password from libpq's ``PGPASSWORD`` or ``.pgpass``, never in the URL).
    :param settings: a whole ``online.yaml``'s settings instead (:meth:`from_config`); the keywords above
        are then ignored.
    :param where: what error messages name first (default ``OnlineTrainer()``; :meth:`from_config`: the file).
    """

    def __init__(
        self,
        committer: str | Committer = "sink",
        *,
        committer_args: Mapping[str, Any] | None = None,
        selection: Selection | None = None,
        reward: Any = None,
        commit_interval_s: float = 300.0,
        min_traces: int = 100,
        store: str | Path = "traces.sqlite",
        reward_range: tuple[float | None, float | None] = (None, None),
        reward_timeout_s: float = 30.0,
        max_retries: int = 2,
        close_after_s: float = 0.0,
        feedback_conflict: str = "first-wins",
        redact: Redactor | None = None,
        feedback_secret: bytes | None = None,
        stop_timeout_s: float = 10.0,
        settings: OnlineSettings | None = None,
        metrics: Metrics | None = None,
        where: str = _WHERE,
        **moved: Any,
    ) -> None:
        for name in moved:
            if name not in _MOVED:
                raise TypeError(f"OnlineTrainer() got an unexpected keyword argument {name!r}")
            raise ConfigError(f"{_WHERE}: {_MOVED[name]}")
        given: Committer | None = None  # the caller's committer object
        context: CommitterContext | None = None  # for the committer named here (settings: the file's)
        default_selection: Selection | None = None  # from online.yaml's selection when settings are given
        if settings is None:
            default_selection = SamplingRate(0.1)
            kind = "none"
            if not isinstance(committer, str):
                if not callable(getattr(committer, "send", None)):
                    raise ConfigError(f"{_WHERE}: committer: {committer!r} has no send(batch_id, rows)")
                if committer_args:
                    raise ConfigError(f"{_WHERE}: committer_args: only for a committer given by name")
                given = committer
            else:
                kind = committer
            context = CommitterContext(
                where=_WHERE,
                base_dir=Path.cwd(),
                policy_url=None,  # the policy is a client object here: a committer that needs its URL asks for it
                args_key="committer_args",
                kind_key="committer",
            )
            if str(store).startswith(("postgresql://", "postgres://")):
                store_settings: dict[str, Any] = {"url": str(store)}  # password: libpq's PGPASSWORD or .pgpass
            else:
                store_path = Path(store).expanduser().resolve()
                store_path.parent.mkdir(parents=True, exist_ok=True)
                store_settings = {"path": str(store_path)}
            low, high = reward_range
            rewards = _reward_settings(
                reward,
                timeout_s=reward_timeout_s,
                max_retries=max_retries,
                close_after_s=close_after_s,
                reward_min=low,
                reward_max=high,
            )
            data: dict[str, Any] = {
                "upstream": {"url": _IN_PROCESS},
                "policy": {"url": _IN_PROCESS},
                "dev": True,
                "store": store_settings,
                "feedback": {"conflict": feedback_conflict, "reward_min": low, "reward_max": high},
                "committer": {
                    "kind": kind,
                    "interval_s": commit_interval_s,
                    "min_traces": min_traces,
                    "args": dict(committer_args or {}),
                },
            }
            settings = load_settings(OnlineSettings, data, where=_WHERE)
            settings.reward = rewards
            settings.base_dir = str(Path.cwd())
        self.settings = settings
        named = settings.auth.feedback_secret_env
        if feedback_secret is None and named:
            value = os.environ.get(named)
            if not value:
                raise ConfigError(f"auth.feedback_secret_env: the environment variable {named} is not set or empty")
            feedback_secret = value.encode()
        self.secrets = Secrets(
            traffic_key=None,
            admin_key=None,
            feedback_secret=feedback_secret or _secrets.token_bytes(32),
            upstream_key=None,
            policy_key=None,
        )
        self.stop_timeout_s = stop_timeout_s
        self.pipeline = Pipeline(
            settings,
            self.secrets,
            selection=selection or default_selection,
            metrics=metrics,
            redact=redact,
            committer=given,
            committer_context=context,
            where=where,
        )
        self._stopped = False

    @classmethod
    def from_config(cls, path: str | Path, **kwargs: Any) -> OnlineTrainer:
        """A trainer with the store, selection, rewards and committer of an ``online.yaml``."""
        kwargs.setdefault("where", str(path))
        return cls(settings=load_config(path, dev=True), **kwargs)

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> OnlineTrainer:
        """Start rewarding and committing (the seed's ``runner.start()``)."""
        self.pipeline.start()
        return self

    def stop(self, timeout_s: float | None = None) -> bool:
        """Finish scoring, send a last batch, drain the store, within ``timeout_s``; whether all of it finished.

        Never raises, also when the committer is down: its batch stays ``committing`` and is resent, with
        the same id, by the next start.
        """
        if self._stopped:
            return True
        self._stopped = True
        try:
            return self.pipeline.close(self.stop_timeout_s if timeout_s is None else timeout_s)
        except Exception:
            _log.exception("stopping the online trainer failed")
            return False

    def __enter__(self) -> OnlineTrainer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what an agent uses -----------------------------------------------------------------------

    @property
    def store(self) -> TraceStore:
        return self.pipeline.store

    @property
    def metrics(self) -> Metrics:
        return self.pipeline.metrics

    def chat_model(
        self, upstream: Any, policy: Any = None, *, model: str | None = None, policy_model: str | None = None
    ) -> OnlineChatModel:
        """A reinforge ``ChatModel`` over the agent's own model (see :class:`OnlineChatModel`)."""
        return OnlineChatModel(self.pipeline, upstream, policy, model=model, policy_model=policy_model)

    def feedback(self, trace_id: str, reward: float, idempotency_key: str | None = None) -> _feedback.FeedbackOutcome:
        """Reward a trace later (the same rules as ``POST /online/v1/feedback``, without the token: in process).

        :raises StoreUnavailable: the store does not take writes now.
        """
        f = self.settings.feedback
        req = _feedback.parse(
            {"trace_id": trace_id, "reward": reward, "idempotency_key": idempotency_key}, f.reward_min, f.reward_max
        )
        outcome = self.pipeline.feedback(req).result(self.stop_timeout_s)
        self.metrics.feedback.labels(str(outcome.status)).inc()
        return outcome

    def close_trace(self, trace_id: str) -> None:
        """The episode ended: score it now (instead of ``close_after_s`` after its last call)."""
        self.pipeline.close_trace(trace_id)


@dataclass
class OnlineChatResponse(ChatResponse):
    """A :class:`~reinforge.ChatResponse` that says whether it was sampled, and its trace when recorded."""

    sampled: bool = False
    trace_id: str | None = None
    feedback_token: str | None = None


def _as_dict(out: Any) -> dict[str, Any]:
    if isinstance(out, dict):
        return out
    dump = getattr(out, "model_dump", None)  # an openai ChatCompletion (extra fields such as token_ids kept)
    if callable(dump):
        result: dict[str, Any] = dump()
        return result
    raise TypeError(f"expected an OpenAI chat completion (a dict or an openai object), got {type(out).__name__}")


class _Target:
    """The user's model: an OpenAI(-compatible) client, sync or async, or a callable taking the request body."""

    def __init__(self, obj: Any) -> None:
        create = getattr(getattr(getattr(obj, "chat", None), "completions", None), "create", None)
        self.client = callable(create)
        self.fn: Any = create if self.client else obj
        if not callable(self.fn):
            raise TypeError(f"expected an OpenAI client or a callable taking a request body, got {obj!r}")

    async def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.client:  # the openai SDK takes its own fields as keywords, the rest through extra_body
            extra = {k: body[k] for k in ("return_token_ids",) if k in body}
            args: tuple[Any, ...] = ()
            kwargs = {k: v for k, v in body.items() if k not in extra}
            if extra:
                kwargs["extra_body"] = extra
        else:
            args, kwargs = (body,), {}
        if inspect.iscoroutinefunction(self.fn):
            out = await self.fn(*args, **kwargs)
        else:
            out = await asyncio.to_thread(self.fn, *args, **kwargs)
            if inspect.isawaitable(out):  # an async client whose create() hides behind a wrapper
                out = await out
        return _as_dict(out)


def _response(data: dict[str, Any], **extra: Any) -> OnlineChatResponse:
    choice = (data.get("choices") or [{}])[0]
    lp = [float(e["logprob"]) for e in ((choice.get("logprobs") or {}).get("content") or ()) if "logprob" in e]
    return OnlineChatResponse(
        message=dict(choice.get("message") or {"role": "assistant", "content": ""}),
        finish_reason=choice.get("finish_reason"),
        usage=dict(data.get("usage") or {}),
        prompt_token_ids=data.get("prompt_token_ids"),
        completion_token_ids=choice.get("token_ids"),
        logprobs=lp or None,
        model=data.get("model"),
        **extra,
    )


class OnlineChatModel:
    """A reinforge ``ChatModel`` for Python agents: the online gateway's training path, in process.

    Unsampled calls go to ``upstream`` unchanged. Sampled calls go to ``policy`` (route mode, with
    ``return_token_ids`` and ``logprobs`` asked for; a policy that fails falls back to the upstream,
    counted, and trips the same circuit breaker) or, without a policy, to ``upstream`` as the policy
    (record mode), and are recorded in the trainer's store with their token ids when the model returns
    them. ``upstream`` and ``policy`` are OpenAI clients (``OpenAI``/``AsyncOpenAI``) or callables
    taking the request body and returning a chat completion (a dict, or awaitable).
    """

    def __init__(
        self,
        pipeline: Pipeline,
        upstream: Any,
        policy: Any = None,
        *,
        model: str | None = None,
        policy_model: str | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.upstream = _Target(upstream)
        self.policy = _Target(policy) if policy is not None else None
        self.model = model
        self.policy_model = policy_model

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        session_id: str | None = None,
        task: dict[str, Any] | None = None,
        trace_id: str | None = None,
        headers: Mapping[str, str] | None = None,
        **sampling: Any,
    ) -> OnlineChatResponse:
        """One model call. ``trace_id`` (of an earlier sampled response) continues that episode;
        ``task`` is what the judges get (e.g. a reference answer); ``headers`` are what a selection
        strategy sees (``ExplicitMarking``'s header, a tenant).
        """
        if sampling.get("stream"):
            raise ValueError("OnlineChatModel.chat answers whole responses; call it without stream=True")
        body: dict[str, Any] = {"messages": [dict(m) for m in messages], **sampling}
        if self.model is not None:
            body.setdefault("model", self.model)
        if tools:
            body["tools"] = tools
        pl = self.pipeline
        sampled, session = pl.select(
            {k.lower(): v for k, v in (headers or {}).items()}, body, trace_id is not None, session=session_id
        )
        if not sampled:
            return _response(await self.upstream(body))
        pl.metrics.sampled.inc()
        mode = "route" if self.policy is not None else "record"
        target = self.policy or self.upstream
        payload = dict(body, return_token_ids=True, logprobs=True)
        if mode == "route" and self.policy_model:
            payload["model"] = self.policy_model
        sent = time.perf_counter()
        try:
            data = await target(payload)
            choices = data["choices"]
            if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
                raise TypeError("choices must be a non-empty list of objects")
        except Exception as exc:
            if mode == "record":
                raise  # the upstream is the policy: nobody else to ask, as for the agent without us
            _log.warning("the policy failed (%s: %s); answered by the upstream", type(exc).__name__, exc)
            pl.metrics.fallbacks.labels("unreachable").inc()
            pl.policy_failed()
            return _response(await self.upstream(body))
        if mode == "route":
            pl.policy_ok()
        tid = trace_id or uuid.uuid4().hex
        out = _response(data, sampled=True)
        record = CallRecord(
            trace_id=tid,
            call_id=uuid.uuid4().hex,
            route=CHAT_ROUTE,
            mode=mode,
            request=body,
            response=data,
            session_id=session,
            prompt_token_ids=out.prompt_token_ids,
            token_ids=out.completion_token_ids,
            logprobs=out.logprobs,
            policy_version=str(data["policy_version"]) if data.get("policy_version") is not None else None,
            timing={"received_at": time.time(), "upstream_s": time.perf_counter() - sent},
            task=task,
        )
        if await pl.acknowledge(record):  # durable before the caller learns its trace id
            out.trace_id, out.feedback_token = tid, pl.feedback_token(tid)
        return out

    async def wait_recorded(self) -> None:
        """Kept for callers of 0.1: :meth:`chat` returns once its call is acknowledged (a no-op now)."""
