"""Asking the judge model: retries with backoff, the verdict cache, a concurrency limit, usage.

Transient failures (timeouts, 429, 5xx, connection errors, malformed bodies and
verdicts the parser rejects) are retried with exponential backoff and jitter
within ``max_retries``; then :class:`JudgeFailed` is raised and the judge
returns ``TaskStatus.FAILED`` (never a reward of 0). A refused key or an
unknown model (401/403/404) fails every call alike, so it stops the run with a
:class:`JudgeConfigError` naming the judge, the model and the key to fix.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from reinforge.plugin import ConfigError, LiteLLMChatModel, ReinforgeError, require

from .cache import VerdictCache, cache_key
from .config import JudgeConfig
from .prompts import PROMPT_VERSION, MalformedVerdict

__all__ = ["JudgeClient", "JudgeConfigError", "JudgeFailed", "Usage", "backoff_delay", "classify_error"]

T = TypeVar("T")


class JudgeFailed(Exception):
    """No verdict within the retry budget (or a per-input refusal): the judgment is FAILED."""


class JudgeConfigError(ConfigError):
    """The judge model refuses every call (bad key, unknown model): fix the settings."""


@dataclass
class Usage:
    """What judging cost: model calls, cache hits, retries, tokens and dollars."""

    calls: int = 0
    cache_hits: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def add(self, other: Usage) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def metrics(self) -> dict[str, float]:
        """Reported by every judgment under the stable names ``usage/<field>``."""
        return {f"usage/{f.name}": float(getattr(self, f.name)) for f in fields(self)}


def backoff_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry ``attempt`` (1-based): exponential, capped, with "equal jitter"."""
    if attempt < 1 or base <= 0:
        return 0.0
    ceiling = min(cap, base * 2 ** (attempt - 1))
    return ceiling / 2 + (rng or random).random() * ceiling / 2


_TRANSIENT_NAMES = {
    "Timeout",
    "APITimeoutError",
    "APIConnectionError",
    "RateLimitError",
    "ServiceUnavailableError",
    "InternalServerError",
    "BadGatewayError",
    "APIError",
}
_PER_INPUT_NAMES = {"ContextWindowExceededError", "ContentPolicyViolationError"}


def classify_error(exc: BaseException) -> str:
    """``"transient"`` (retry), ``"input"`` (FAILED, no retry) or ``"config"`` (stop the run)."""
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        return "transient"
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    if name in _PER_INPUT_NAMES:
        return "input"
    if status in (401, 403) or name in ("AuthenticationError", "PermissionDeniedError"):
        return "config"
    if status == 404 or name == "NotFoundError":
        return "config"
    if name in _TRANSIENT_NAMES:
        return "transient"
    if isinstance(status, int):
        if status in (408, 409, 425, 429) or status >= 500:
            return "transient"
        if 400 <= status < 500:
            return "input"
    return "transient"  # a connection reset, a client bug on one reply: worth another try


@dataclass
class _LoopState:
    slots: asyncio.Semaphore
    inflight: dict[str, asyncio.Future]


class JudgeClient:
    """One judge's connection to its model and its verdict cache, for the run the judge was built for.

    :meth:`close` closes the cache (an in-memory one forgets its verdicts).
    """

    def __init__(self, cfg: JudgeConfig, name: str) -> None:
        self.cfg = cfg
        self.name = name
        try:
            self.cache: VerdictCache | None = VerdictCache(cfg.cache_path) if cfg.cache else None
        except ConfigError as exc:
            raise ConfigError(f"judge {name!r}: args.{exc}") from None
        self._model: LiteLLMChatModel | None = None
        if cfg.model is not None:
            api_key = None
            if cfg.api_key_env is not None:
                api_key = os.environ.get(cfg.api_key_env)
                if not api_key:
                    raise ConfigError(
                        f"judge {name!r}: args.api_key_env names the environment variable {cfg.api_key_env!r}, "
                        "which is not set"
                    )
            # our own deadline (timeout_s) fires first; LiteLLM's is a backstop
            self._model = LiteLLMChatModel(cfg.model, api_base=cfg.api_base, api_key=api_key, timeout=cfg.timeout_s + 5)
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._rng = random.Random()
        self._unpriced: set[str] = set()  # models LiteLLM has no price for: not looked up on every call
        self.totals = Usage()

    def close(self) -> None:
        """Close the verdict cache (idempotent); a file cache keeps its rows for the next run."""
        if self.cache is not None:
            self.cache.close()

    # -- the model ---------------------------------------------------------------------------------
    def model_for(self, auxiliary_models: dict[str, Any] | None) -> Any:
        """``args.model`` through LiteLLM, else ``auxiliary_models[args.auxiliary_model]``."""
        if self._model is not None:
            return self._model
        name = self.cfg.auxiliary_model
        if not auxiliary_models or name not in auxiliary_models:
            have = sorted(auxiliary_models or {})
            listing = f"the run's auxiliary models are {have}" if have else "the run has no auxiliary_models"
            raise ConfigError(
                f"judge {self.name!r} needs a model: set args.model (a LiteLLM model name, with args.api_base for "
                f"an OpenAI-compatible server) or an auxiliary model named {name!r} (args.auxiliary_model); {listing}"
            )
        return auxiliary_models[name]

    @staticmethod
    def model_name(model: Any) -> str | None:
        return getattr(model, "model_name", None) or getattr(model, "model", None)

    def model_id(self, model: Any) -> str:
        name = self.model_name(model) or type(model).__qualname__
        base = getattr(model, "base_url", None)
        return f"{name}@{base}" if base else str(name)

    def sampling(self, model: Any) -> dict[str, Any]:
        params: dict[str, Any] = {"temperature": self.cfg.temperature, "max_tokens": self.cfg.max_tokens}
        if self.cfg.seed is not None:
            params["seed"] = self.cfg.seed
        if self.cfg.json_mode:
            params["response_format"] = {"type": "json_object"}
        if isinstance(model, LiteLLMChatModel):
            params["drop_params"] = True  # providers without seed/response_format: drop them, do not fail
        return params

    def _state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        with self._lock:
            state = self._loops.get(loop)
            if state is None:
                state = self._loops[loop] = _LoopState(asyncio.Semaphore(self.cfg.max_concurrency), {})
            return state

    def key(self, model: Any, messages: list[dict[str, Any]], sampling: dict[str, Any]) -> str:
        sent = {k: v for k, v in sampling.items() if k != "drop_params"}
        return cache_key(PROMPT_VERSION, self.cfg.kind, self.model_id(model), messages, sent)

    # -- one question ------------------------------------------------------------------------------
    async def ask(self, messages: list[dict[str, Any]], parse: Callable[[str], T], usage: Usage, model: Any) -> T:
        """The parsed verdict for ``messages``: from the cache, a call already in flight, or the model."""
        if isinstance(model, LiteLLMChatModel):
            _import_litellm()
        sampling = self.sampling(model)
        key = self.key(model, messages, sampling)
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                try:
                    value = parse(hit)
                except MalformedVerdict:
                    self.cache.delete(key)  # written by an older parser: ask again
                else:
                    self._count(usage, Usage(cache_hits=1))
                    return value
        state = self._state()
        leader = state.inflight.get(key)
        if leader is not None:  # the same question is being asked right now: share its answer
            content = await asyncio.shield(leader)
            self._count(usage, Usage(cache_hits=1))
            return parse(content)
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda f: f.cancelled() or f.exception())  # never "exception not retrieved"
        state.inflight[key] = future
        try:
            content, value = await self._call(messages, parse, usage, model, sampling, state)
        except BaseException as exc:
            if not future.done():
                future.set_exception(exc if isinstance(exc, Exception) else JudgeFailed("the judgment was cancelled"))
            raise
        finally:
            state.inflight.pop(key, None)
        future.set_result(content)
        if self.cache is not None:
            self.cache.put(key, content, self.model_id(model))
        return value

    async def _call(
        self,
        messages: list[dict[str, Any]],
        parse: Callable[[str], T],
        usage: Usage,
        model: Any,
        sampling: dict[str, Any],
        state: _LoopState,
    ) -> tuple[str, T]:
        cfg = self.cfg
        last = "no attempt was made"
        attempts = 1 + cfg.max_retries
        for attempt in range(attempts):
            if attempt:
                self._count(usage, Usage(retries=1))
                await asyncio.sleep(backoff_delay(attempt, cfg.backoff_s, cfg.backoff_max_s, self._rng))
            async with state.slots:
                self._count(usage, Usage(calls=1))
                try:
                    reply = await asyncio.wait_for(model.chat([dict(m) for m in messages], **sampling), cfg.timeout_s)
                except ReinforgeError:
                    raise
                except Exception as exc:
                    kind = classify_error(exc)
                    detail = f"{type(exc).__name__}: {str(exc)[:300]}" if str(exc) else type(exc).__name__
                    if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
                        detail = f"no reply within timeout_s={cfg.timeout_s:g}s"
                    if kind == "config":
                        raise JudgeConfigError(
                            f"judge {self.name!r}: the judge model {self.model_id(model)} refused the call ({detail}); "
                            "check args.model, args.api_base and args.api_key_env (or the auxiliary model)"
                        ) from exc
                    if kind == "input":
                        raise JudgeFailed(
                            f"judge {self.name!r}: the judge model rejected this input: {detail}"
                        ) from exc
                    last = detail
                    continue
            self._count(usage, self._usage_of(reply, model))
            content = reply.content if hasattr(reply, "content") else str(reply)
            try:
                return content, parse(content)
            except MalformedVerdict as exc:
                last = f"malformed verdict: {exc}"
        raise JudgeFailed(f"judge {self.name!r}: no valid verdict after {attempts} attempt(s); last error: {last}")

    def _usage_of(self, reply: Any, model: Any) -> Usage:
        raw = getattr(reply, "usage", None) or {}
        prompt = int(raw.get("prompt_tokens") or 0)
        completion = int(raw.get("completion_tokens") or 0)
        cost = _cost(model, prompt, completion, self._unpriced)
        return Usage(prompt_tokens=prompt, completion_tokens=completion, cost_usd=cost)

    def _count(self, usage: Usage, delta: Usage) -> None:
        usage.add(delta)
        with self._lock:
            self.totals.add(delta)


def _import_litellm() -> None:
    """Import LiteLLM (seconds, once per process) before the first call's deadline starts."""
    if "litellm" not in sys.modules:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # as core does: no network at import
        require("litellm", "litellm")


def _cost(model: Any, prompt_tokens: int, completion_tokens: int, unpriced: set[str]) -> float:
    """Dollars by LiteLLM's price list; 0.0 for a model it does not price (a local server, say)."""
    if not isinstance(model, LiteLLMChatModel) or not (prompt_tokens or completion_tokens):
        return 0.0
    litellm = sys.modules.get("litellm")  # imported by the model's first call
    name = model.litellm_model
    if litellm is None or name in unpriced:
        return 0.0
    try:
        prompt_cost, completion_cost = litellm.cost_per_token(
            model=name, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
        )
        return float(prompt_cost) + float(completion_cost)
    except Exception:  # a model LiteLLM does not price
        unpriced.add(name)
        return 0.0
