"""The decode engine: batched generation with a KV cache, for many workflows at once.

Requests from concurrent workflows (and from the HTTP endpoint) are collected
by a micro-batcher and decoded together. Identical prompts (a GRPO group) are
prefilled once and their KV cache is shared across the group; rows that finish
are dropped from the batch, so a short answer does not pay for a long one.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..model.compute import compute_executor
from .sampling import request_generator, sample


@dataclass
class GenRequest:
    """One completion to produce."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed_key: tuple = ()
    order_key: tuple = ()
    top_logprobs: int = 0  # alternatives to report per token (the server's ``top_logprobs``)
    episode: Any = None  # the rollout this call belongs to: its next call reuses this one's keys and values


@dataclass
class GenResult:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" | "length"
    text: str
    top_logprobs: list[list[tuple[int, float]]] | None = None  # per token: (id, logprob) of the likeliest


@dataclass
class EngineStats:
    batches: int = 0
    rows: int = 0
    completion_tokens: int = 0
    prefill_tokens: int = 0
    # prompt tokens an episode's last call already covered (past the batch's shared prefix they are copied, not run)
    episode_tokens_reused: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "decode/batches": self.batches,
            "decode/rows": self.rows,
            "decode/completion_tokens": self.completion_tokens,
            "decode/prefill_tokens": self.prefill_tokens,
            "decode/episode_tokens_reused": self.episode_tokens_reused,
            "decode/seconds": self.seconds,
            "decode/tokens_per_s": self.completion_tokens / self.seconds if self.seconds else 0.0,
        }


class Engine:
    """Generates completions for batches of token prompts with one model.

    Llama-family models run on the hand-written :mod:`.decoder` (shared
    prefixes prefilled once, a preallocated cache); others, or
    ``fast=False``, on Hugging Face's forward with a dynamic cache. A batch
    whose cache would pass ``kv_cache_mb`` is decoded in several parts.
    Given a :class:`~..model.packing.Packer` (shared with training), the decoder uses
    oneDNN-prepacked weights.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_model_len: int,
        max_batch: int = 64,
        fast: bool = True,
        kv_cache_mb: float = 1024,
        packer: Any = None,
    ) -> None:
        from .decoder import LlamaDecoder, unsupported_reason

        self.model = model
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.max_batch = max_batch
        self.kv_cache_mb = kv_cache_mb
        self.device = next(model.parameters()).device
        eos = {tokenizer.eos_token_id}
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
        self.eos_ids = sorted(i for i in eos if i is not None)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.decoder = None
        self.slow_reason = "fast=False" if not fast else unsupported_reason(model)
        if self.slow_reason is None and self.device.type != "cpu":
            self.slow_reason = f"device {self.device.type}"
        if self.slow_reason is None:
            self.decoder = LlamaDecoder(model, packer)
        self.kv_bytes_per_token = _kv_bytes_per_token(model)
        self.stats = EngineStats()
        self.lock = threading.Lock()  # one generation at a time (training runs between rollout phases)
        self.weights_version = 0  # +1 whenever the weights change under a server (cached prefixes go stale)
        # an episode's conversation so far (keys and values of its last call), for its next call; None: off
        self.episodes: dict[Any, tuple[tuple[int, ...], Any, int]] | None = {} if self.decoder is not None else None
        self.episode_bytes = 0
        self._episodes_lock = threading.Lock()  # the decode thread keeps them, the rollouts' loop drops them

    def weights_changed(self) -> None:
        self.weights_version += 1
        self.forget_all()

    def _session(self) -> Any:
        return self.decoder.session() if self.decoder is not None else _HFSession(self)

    def _parts(self, requests: list[GenRequest]) -> list[list[GenRequest]]:
        """Consecutive slices whose KV cache fits ``kv_cache_mb`` (a single request always goes)."""
        per_slot = self.kv_bytes_per_token
        if per_slot is None or not self.kv_cache_mb:
            return [requests]
        budget = self.kv_cache_mb * 2**20
        parts: list[list[GenRequest]] = []
        part: list[GenRequest] = []
        width = 0
        for r in requests:
            need = min(len(r.prompt_ids) + r.max_tokens, self.max_model_len)
            w = max(width, need)
            if part and (len(part) + 1) * w * per_slot > budget:
                parts.append(part)
                part, w = [], need
            part.append(r)
            width = w
        parts.append(part)
        return parts

    # -- episodes: the next call of a rollout reuses its conversation so far -----------------------

    def forget(self, episode: Any) -> None:
        """Drop what an episode's calls left (its rollout ended)."""
        if self.episodes is not None and episode is not None:
            with self._episodes_lock:
                entry = self.episodes.pop(episode, None)
                if entry is not None:
                    self.episode_bytes -= entry[2]

    def forget_all(self) -> None:
        """Drop every episode's keys and values (the weights changed: they are stale)."""
        if self.episodes is not None:
            with self._episodes_lock:
                self.episodes.clear()
                self.episode_bytes = 0

    def _known(self, requests: list[GenRequest], row_src: list[int], prompts: list[list[int]]) -> list[Any]:
        """For each distinct prompt, the keys and values its episode's last call left, if it continues that call."""
        from .decoder import KnownTokens

        assert self.episodes is not None
        known: list[Any] = [None] * len(prompts)
        for r, j in zip(requests, row_src):
            with self._episodes_lock:
                entry = self.episodes.get(r.episode) if r.episode is not None else None
            if entry is None or known[j] is not None:
                continue
            tokens, kv, _ = entry
            n = len(os.path.commonprefix([tokens, tuple(prompts[j])]))
            if n:
                known[j] = KnownTokens(kv.pieces, n)
        return known

    def _remember(
        self, session: Any, requests: list[GenRequest], rows: list[int], still: list[int], tokens: list[list[int]]
    ) -> None:
        """Keep the keys and values of the rows that finished this step, for their episodes' next call.

        The shared prefix is cloned once per step for the rows that finish in it; each row adds its own tail.
        """
        from .decoder import KnownTokens

        assert self.episodes is not None
        going = set(still)
        shared = None
        for j, i in enumerate(rows):
            r = requests[i]
            if j in going or r.episode is None:
                continue
            if shared is None:
                n = session.shared
                k, v = session.row_kv(j)
                shared = (n, k[:, :, :n].clone(), v[:, :, :n].clone())
            n = shared[0]
            k, v = session.row_kv(j, n)
            kv = KnownTokens([(0, shared[1], shared[2]), (n, k, v)], n + k.shape[2])
            self.forget(r.episode)
            tail = k.numel() * k.element_size() * 2  # the shared prefix is counted by no one: it is the batch's
            with self._episodes_lock:
                self.episodes[r.episode] = ((*r.prompt_ids, *tokens[i][:-1]), kv, tail)
                self.episode_bytes += tail

    # -- the decode loop ----------------------------------------------------------------------

    @torch.inference_mode()
    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        """Decode a batch synchronously; results in request order."""
        start = time.perf_counter()
        results: list[GenResult] = []
        for part in self._parts(requests):
            results += self._generate(part)
        self.stats.batches += 1
        self.stats.rows += len(requests)
        self.stats.seconds += time.perf_counter() - start
        return results

    def _generate(self, requests: list[GenRequest]) -> list[GenResult]:
        n = len(requests)
        uniq: dict[tuple[int, ...], int] = {}
        row_src = [uniq.setdefault(tuple(r.prompt_ids), len(uniq)) for r in requests]
        prompts = [list(p) for p in uniq]
        budgets = [max(0, min(r.max_tokens, self.max_model_len - len(r.prompt_ids))) for r in requests]
        longest = max(budgets) if budgets else 0
        session = self._session()
        known = self._known(requests, row_src, prompts) if self.episodes is not None else None
        if known is not None and any(k is not None for k in known):
            logits = session.prefill(prompts, row_src, longest, known=known)
            self.stats.episode_tokens_reused += sum(k.length for k in known if k is not None)
        else:
            logits = session.prefill(prompts, row_src, longest)
        self.stats.prefill_tokens += sum(len(p) for p in prompts)
        uniforms = torch.stack(
            [torch.rand(max(longest, 1), generator=request_generator(*r.seed_key)) for r in requests]
        )
        temps = torch.tensor([r.temperature for r in requests], dtype=torch.float32)
        top_ps = torch.tensor([r.top_p for r in requests], dtype=torch.float32)
        tokens: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        finish = ["length"] * n
        eos = set(self.eos_ids)
        rows = [i for i in range(n) if budgets[i] > 0]  # the request decoded in each row of the session
        if rows and len(rows) != n:
            session.keep(rows)
            logits = logits.index_select(0, torch.tensor(rows))
        step = 0
        while rows:
            act = torch.tensor(rows)
            tok, lp = sample(logits, uniforms.index_select(0, act)[:, step], temps[act], top_ps[act])
            still: list[int] = []  # positions in ``rows`` that go on
            for j, (i, t, p) in enumerate(zip(rows, tok.tolist(), lp.tolist())):
                tokens[i].append(t)
                logprobs[i].append(p)
                if t in eos:
                    finish[i] = "stop"
                    continue
                if hits_stop(self.tokenizer, tokens[i], requests[i].stop):
                    finish[i] = "stop"
                    continue
                if len(tokens[i]) >= budgets[i]:
                    continue
                still.append(j)
            step += 1
            if self.episodes is not None and len(still) != len(rows):  # some rows finished: keep theirs
                self._remember(session, requests, rows, still, tokens)
            if not still:
                break
            if len(still) != len(rows):  # finished rows leave the batch
                session.keep(still)
                tok = tok.index_select(0, torch.tensor(still))
                rows = [rows[j] for j in still]
            logits = session.step(tok)
        results = []
        for i, r in enumerate(requests):
            results.append(
                GenResult(tokens[i], logprobs[i], finish[i], completion_text(self.tokenizer, tokens[i], r.stop))
            )
        self.stats.completion_tokens += sum(len(t) for t in tokens)
        return results


def hits_stop(tokenizer: Any, tokens: list[int], stops: list[str]) -> bool:
    """Whether the text of ``tokens`` contains one of the stop strings (decoded only when there are some)."""
    if not stops:
        return False
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    return any(s in text for s in stops)


def completion_text(tokenizer: Any, tokens: list[int], stops: list[str]) -> str:
    """The text of ``tokens``, cut before the first stop string."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    for s in stops:
        cut = text.find(s)
        if cut >= 0:
            text = text[:cut]
    return text


def _kv_bytes_per_token(model: Any) -> int | None:
    """Keys and values of one token, all layers, in the model's dtype (``None``: not a known config)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg: Any = getattr(base, "config", None)
    try:
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        layers = cfg.num_hidden_layers
    except AttributeError:
        return None
    return 2 * layers * heads * head_dim * next(model.parameters()).element_size()


class _HFSession:
    """The same interface as :class:`~.decoder.DecodeSession` over the model's own forward."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        model = engine.model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        params = inspect.signature(type(base).forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"

    def prefill(self, prompts: list[list[int]], row_src: list[int], capacity: int) -> torch.Tensor:
        from transformers import DynamicCache

        plen = max(len(p) for p in prompts)
        dev = self.engine.device
        ids = torch.full((len(prompts), plen), self.engine.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), plen), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding
            ids[i, plen - len(p) :] = torch.tensor(p)
            mask[i, plen - len(p) :] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp_(min=0)
        cache = DynamicCache()
        out = self.engine.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            logits_to_keep=1,
            **{self.cache_kw: cache},
        )
        self.cache = getattr(out, "past_key_values", None) or cache
        src = torch.tensor(row_src, device=dev)
        if len(prompts) != len(row_src) or row_src != list(range(len(row_src))):
            self.cache.reorder_cache(src)  # share each prompt's KV cache across its group
        self.mask = mask.index_select(0, src)
        self.next_pos = pos[:, -1].index_select(0, src) + 1
        return out.logits[:, -1, :].index_select(0, src).float().cpu()

    def keep(self, rows: list[int]) -> None:
        index = torch.tensor(rows, device=self.engine.device)
        self.cache.batch_select_indices(index)
        self.mask, self.next_pos = self.mask[index], self.next_pos[index]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(tokens), 1))], dim=1)
        out = self.engine.model(
            input_ids=tokens.to(self.engine.device).unsqueeze(1),
            attention_mask=self.mask,
            position_ids=self.next_pos.unsqueeze(1),
            use_cache=True,
            **{self.cache_kw: self.cache},
        )
        self.next_pos = self.next_pos + 1
        return out.logits[:, -1, :].float().cpu()


class MicroBatcher:
    """Collects concurrent requests and runs them as one ``Engine.generate`` call.

    A batch starts when every active rollout is waiting on the model (so
    batches do not depend on timing), when ``max_batch`` requests are
    pending, or ``window_s`` after the first pending request (a rollout busy
    in a tool does not hold the others up for long). Requests are ordered by
    their ``order_key`` inside a batch.
    """

    def __init__(self, engine: Engine, *, window_s: float = 0.05) -> None:
        self.engine = engine
        self.window_s = window_s
        self.active = 0  # rollouts that may still call the model
        self._pending: list[tuple[GenRequest, asyncio.Future]] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _ensure(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._wake, self._pending = loop, asyncio.Event(), []
            self._task = loop.create_task(self._run())

    def rollout_started(self) -> None:
        """Called on the runner's event loop: binds the batcher to it (HTTP calls queue there too)."""
        self._ensure()
        self.active += 1

    def rollout_finished(self) -> None:
        self.active -= 1
        if self._wake is not None:
            self._wake.set()

    async def submit(self, request: GenRequest) -> GenResult:
        self._ensure()
        assert self._wake is not None and self._loop is not None
        fut: asyncio.Future = self._loop.create_future()
        self._pending.append((request, fut))
        self._wake.set()
        return await fut

    def submit_threadsafe(self, request: GenRequest, timeout: float | None = None) -> GenResult:
        """For the HTTP endpoint's threads: queue on the batcher's loop and wait."""
        if self._loop is None:
            raise RuntimeError("the policy is not serving: no rollout is running")
        return asyncio.run_coroutine_threadsafe(self.submit(request), self._loop).result(timeout)

    def _ready(self) -> bool:
        return bool(self._pending) and (
            len(self._pending) >= max(self.active, 1) or len(self._pending) >= self.engine.max_batch
        )

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._pending:
                continue
            if not self._ready():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wait_ready(), self.window_s)
            batch = sorted(self._pending[: self.engine.max_batch], key=lambda p: p[0].order_key)
            del self._pending[: len(batch)]
            if self._pending:
                self._wake.set()
            try:
                loop = asyncio.get_running_loop()
                # the process's one tensor thread (.compute): the trainer runs there too
                results = await loop.run_in_executor(compute_executor(), self._generate, [r for r, _ in batch])
            except BaseException as exc:
                for _, fut in batch:
                    if not fut.done():
                        fut.set_exception(exc)
                continue
            for (_, fut), res in zip(batch, results):
                if not fut.done():
                    fut.set_result(res)

    async def _wait_ready(self) -> None:
        assert self._wake is not None
        while not self._ready():
            await self._wake.wait()
            self._wake.clear()

    def _generate(self, requests: list[GenRequest]) -> list[GenResult]:
        with self.engine.lock:
            return self.engine.generate(requests)
