"""Continuous batching for the server: a request joins the running decode batch at the next step.

The training path batches by rollout phase (:class:`~.engine.MicroBatcher`: a batch starts
when every rollout waits, so batches do not depend on timing). A server cannot wait for
callers it does not know, and a long answer must not hold a short one back: here one decode
loop runs while any request is live, and at every step it admits what arrived meanwhile
(prefilled together, a shared prefix once, identical prompts once) into the running batch.
Each request keeps its own sampling parameters and random stream, and its tokens go out as
they are sampled.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .decoder import MIN_SHARED_PREFIX, Prefix
from .engine import Engine, GenRequest, GenResult, completion_text, hits_stop
from .sampling import request_generator, sample, top_logprobs

HEADROOM = 64  # extra KV slots a new batch is allocated with, so requests join it in place


@dataclass
class TokenEvent:
    """One sampled token of a request, as it leaves the decode loop."""

    token: int
    logprob: float
    top: list[tuple[int, float]] | None = None  # (token id, logprob) of the most likely tokens


class Stream:
    """One request's output, read on the event loop that submitted it (tokens, then the result)."""

    def __init__(self, request: GenRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.loop = loop
        self.queue: asyncio.Queue[TokenEvent | GenResult | BaseException] = asyncio.Queue()
        self.submitted = time.perf_counter()
        self.cancelled = False
        self.result: GenResult | None = None
        self.done: asyncio.Future[None] = loop.create_future()  # set when the result (or failure) is delivered

    def cancel(self) -> None:
        """The caller is gone: the row leaves the batch at the next step (its result says ``abort``)."""
        self.cancelled = True

    async def events(self) -> AsyncIterator[TokenEvent]:
        """The tokens as they are sampled; afterwards :attr:`result` holds the whole completion."""
        while self.result is None:
            item = await self.queue.get()
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, GenResult):
                self.result = item
                return
            yield item

    async def finished(self) -> GenResult:
        """The whole completion (the token events are consumed)."""
        async for _ in self.events():
            pass
        assert self.result is not None
        return self.result


@dataclass
class _Row:
    """A request in the running batch."""

    stream: Stream
    budget: int
    uniforms: list[float]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)

    @property
    def request(self) -> GenRequest:
        return self.stream.request

    @property
    def remaining(self) -> int:
        return self.budget - len(self.tokens)


@dataclass
class SchedulerStats:
    steps: int = 0
    admitted: int = 0
    joined: int = 0  # admitted into a batch that was already decoding
    relayouts: int = 0  # joins that needed a new cache layout
    max_rows: int = 0
    completion_tokens: int = 0
    prefill_tokens: int = 0
    prefix_tokens_reused: int = 0  # prompt tokens whose keys and values came from the cached prefix
    cancelled: int = 0


class Scheduler:
    """One decode loop on its own thread, fed by :meth:`submit` from any event loop.

    ``max_batch`` bounds the rows decoded together; ``kv_cache_mb`` bounds what admitted
    requests may need (prompt plus ``max_tokens`` each): a request that does not fit waits
    for rows to finish. Models the hand-written decoder does not know (and so cannot join
    mid-decode) are batched as they arrive, one batch at a time. ``on_admit(waits, joined)``
    and ``on_step(rows)`` are called on the decode thread (metrics).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_batch: int = 64,
        kv_cache_mb: float | None = None,
        on_admit: Callable[[list[float], int], None] | None = None,
        on_step: Callable[[int], None] | None = None,
    ) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self.kv_budget = (kv_cache_mb if kv_cache_mb is not None else engine.kv_cache_mb) * 2**20
        self.on_admit = on_admit
        self.on_step = on_step
        self.joinable = engine.decoder is not None
        self.stats = SchedulerStats()
        self._pending: collections.deque[Stream] = collections.deque()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._calls: collections.deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = collections.deque()
        self._eos = set(engine.eos_ids)
        self._anchor: tuple[Prefix, int] | None = None  # the last computed shared prefix, and its weights version

    # -- the callers' side --------------------------------------------------------------------

    def submit(self, request: GenRequest) -> Stream:
        """Queue ``request`` (on the running event loop); it joins the batch at the next decode step."""
        stream = Stream(request, asyncio.get_running_loop())
        with self._cv:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            self._pending.append(stream)
            self._wake()
        return stream

    def call(self, fn: Callable[[], Any]) -> concurrent.futures.Future[Any]:
        """Run ``fn()`` on the decode thread between two steps (the process's tensor work stays on one
        thread: :mod:`~..model.compute`); its future. Used for the adapter swap."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            self._calls.append((fn, future))
            self._wake()
        return future

    def _wake(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="reinforge-serve-decode", daemon=True)
            self._thread.start()
        self._cv.notify()

    async def generate(self, request: GenRequest) -> GenResult:
        """Submit and wait for the whole completion."""
        return await self.submit(request).finished()

    def close(self) -> None:
        """Stop the loop; requests still queued or decoding fail with a RuntimeError."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()

    @property
    def pending(self) -> int:
        return len(self._pending)

    # -- the decode thread --------------------------------------------------------------------

    def _run(self) -> None:
        rows: list[_Row] = []
        session: Any = None
        logits: torch.Tensor | None = None
        while True:
            with self._cv:
                while not self._pending and not rows and not self._calls and not self._closed:
                    self._cv.wait()
                if self._closed:
                    gone = RuntimeError("the server is shutting down")
                    self._deliver([(r.stream, gone) for r in rows] + [(s, gone) for s in self._pending])
                    self._pending.clear()
                    for _, future in self._calls:
                        future.set_exception(gone)
                    self._calls.clear()
                    return
                calls = list(self._calls)
                self._calls.clear()
                admitted = self._admit(rows)
            for fn, future in calls:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except BaseException as exc:
                        future.set_exception(exc)
            new: list[_Row] = []
            try:
                with self.engine.lock, torch.inference_mode():
                    new = self._rows(admitted)
                    session, logits = self._step(session, logits, rows, new)
            except BaseException as exc:
                live = {id(r): r for r in rows + new}.values()
                self._deliver([(r.stream, exc) for r in live])
                rows.clear()
                session, logits = None, None

    def _admit(self, rows: list[_Row]) -> list[Stream]:
        """What joins now: as many queued requests as the batch and the KV budget take (one at least)."""
        if not self.joinable and rows:
            return []
        per_token = self.engine.kv_bytes_per_token or 0
        need = sum(len(r.request.prompt_ids) + r.budget for r in rows)
        taken: list[Stream] = []
        while self._pending and len(rows) + len(taken) < self.max_batch:
            s = self._pending[0]
            if s.cancelled:
                self._pending.popleft()
                self.stats.cancelled += 1
                self._deliver([(s, GenResult([], [], "abort", ""))])
                continue
            more = len(s.request.prompt_ids) + s.request.max_tokens
            if (rows or taken) and per_token and (need + more) * per_token > self.kv_budget:
                break
            need += more
            taken.append(self._pending.popleft())
        return taken

    def _rows(self, admitted: list[Stream]) -> list[_Row]:
        """Rows for the admitted requests; those with nothing to generate finish at once."""
        out = []
        done: list[tuple[Stream, GenResult | BaseException]] = []
        for s in admitted:
            r = s.request
            budget = max(0, min(r.max_tokens, self.engine.max_model_len - len(r.prompt_ids)))
            if budget == 0:
                done.append((s, GenResult([], [], "length", "")))
                continue
            uniforms = torch.rand(budget, generator=request_generator(*r.seed_key)).tolist()
            out.append(_Row(s, budget, uniforms))
        self._deliver(done)
        return out

    def _step(
        self, session: Any, logits: torch.Tensor | None, rows: list[_Row], new: list[_Row]
    ) -> tuple[Any, torch.Tensor | None]:
        """Sample one token for every row, drop the finished, feed the rest; ``new`` rows are admitted
        in that same pass (:meth:`_admit_in_step`), or before it when there is no batch to join."""
        if new and (not rows or not self.joinable):
            session, logits = self._join(session, logits, rows, new)
            new = []
        if not rows:
            return None, None
        assert logits is not None
        self.stats.steps += 1
        self.stats.max_rows = max(self.stats.max_rows, len(rows))
        if self.on_step is not None:
            self.on_step(len(rows))
        temps = torch.tensor([r.request.temperature for r in rows], dtype=torch.float32)
        top_ps = torch.tensor([r.request.top_p for r in rows], dtype=torch.float32)
        uniforms = torch.tensor([r.uniforms[len(r.tokens)] for r in rows], dtype=torch.float64)
        tok, lp = sample(logits, uniforms, temps, top_ps)
        tops = self._tops(logits, temps, rows)
        events: list[tuple[Stream, TokenEvent | GenResult | BaseException]] = []
        still: list[int] = []
        for j, (row, t, p) in enumerate(zip(rows, tok.tolist(), lp.tolist())):
            if row.stream.cancelled:
                self.stats.cancelled += 1
                events.append((row.stream, self._result(row, "abort")))
                continue
            top = tops.get(j)
            row.tokens.append(t)
            row.logprobs.append(p)
            if top is not None:
                row.tops.append(top)
            events.append((row.stream, TokenEvent(t, p, top)))
            finish = self._finish(row)
            if finish is None:
                still.append(j)
            else:
                events.append((row.stream, self._result(row, finish)))
        self.stats.completion_tokens += len(rows)
        self._deliver(events)
        if not still:
            rows.clear()
            return self._join(None, None, rows, new) if new else (None, None)
        if len(still) != len(rows):
            session.keep(still)
            tok = tok.index_select(0, torch.tensor(still))
            rows[:] = [rows[j] for j in still]
        if self.joinable and not session.fits(1):  # cannot happen while joins reserve capacity; stay safe
            session.compact(max(r.remaining for r in rows), self.max_batch)
        tok = tok.to(self.engine.device)
        if new:
            return self._admit_in_step(session, tok, rows, new)
        return session, session.step(tok)

    def _admit_in_step(
        self, session: Any, tok: torch.Tensor, rows: list[_Row], new: list[_Row]
    ) -> tuple[Any, torch.Tensor]:
        """Step the batch and prefill ``new`` in one forward when their prompts fit in front of the
        current slot (:meth:`~.decoder.DecodeSession.step_admitting`); else step, then join."""
        prompts = [list(r.request.prompt_ids) for r in new]
        distinct = len({tuple(p) for p in prompts}) == len(prompts)  # ``n`` choices share one prefill: join
        prefix = self._prefix(prompts) if distinct else None
        known = len(prefix[0]) if prefix is not None else 0
        capacity = max(r.remaining for r in rows + new)
        if distinct and not session.can_admit(prompts, known, capacity):  # make room: right-aligned, longer
            session.compact(capacity + 1, self.max_batch, end_at=max(map(len, prompts)) - 1, more_rows=len(new))
            self.stats.relayouts += 1
        if not distinct or not session.can_admit(prompts, known, capacity):
            return self._join(session, session.step(tok), rows, new)
        self.stats.prefill_tokens += sum(map(len, prompts))
        hits = session.prefix_hits
        logits = session.step_admitting(tok, prompts, prefix)
        self.stats.prefix_tokens_reused += session.prefix_hits - hits
        self._anchor = (session.computed_prefix, self.engine.weights_version)
        self._admitted(rows, new, joined=len(new))
        return session, logits

    def _join(
        self, session: Any, logits: torch.Tensor | None, rows: list[_Row], new: list[_Row]
    ) -> tuple[Any, torch.Tensor]:
        uniq: dict[tuple[int, ...], int] = {}
        row_src = [uniq.setdefault(tuple(r.request.prompt_ids), len(uniq)) for r in new]
        prompts = [list(p) for p in uniq]
        self.stats.prefill_tokens += sum(len(p) for p in prompts)
        capacity = max(r.remaining for r in rows + new)
        joined = len(new) if rows else 0
        prefix = self._prefix(prompts)
        if not rows:  # a new batch, on the weights as they are now
            session = part = self.engine._session()
            width = min(self.max_batch, max(len(new), -(-len(new) // 8) * 8))
            if self.joinable:
                logits = session.prefill(prompts, row_src, capacity + HEADROOM, row_capacity=width, prefix=prefix)
            else:
                logits = session.prefill(prompts, row_src, capacity)
        else:
            assert logits is not None
            part = session.fresh()
            first = part.prefill(prompts, row_src, 0, prefix=prefix)
            before = session.cache
            session.join(part, capacity, self.max_batch)
            if session.cache is not before:
                self.stats.relayouts += 1
            logits = torch.cat([logits, first])
        if self.joinable:
            self.stats.prefix_tokens_reused += part.prefix_hits
            if part.computed_prefix is not None:
                self._anchor = (part.computed_prefix, self.engine.weights_version)
        self._admitted(rows, new, joined)
        assert logits is not None
        return session, logits

    def _admitted(self, rows: list[_Row], new: list[_Row], joined: int) -> None:
        """``new`` are rows of the batch now (``joined`` of them into one that was already decoding)."""
        now = time.perf_counter()
        waits = [now - r.stream.submitted for r in new]
        rows += new
        self.stats.admitted += len(new)
        self.stats.joined += joined
        if self.on_admit is not None:
            self.on_admit(waits, joined)

    def _prefix(self, prompts: list[list[int]]) -> Prefix | None:
        """What the last prefill computed that these prompts all start with (a chat template's system part)."""
        if self._anchor is None or not self.joinable:
            return None
        (ids, k, v), version = self._anchor
        if version != self.engine.weights_version:  # computed with weights that are gone
            self._anchor = None
            return None
        common = min(len(os.path.commonprefix([list(ids), p])) for p in prompts)
        common = min(common, min(map(len, prompts)) - 1)
        if common < MIN_SHARED_PREFIX:
            return None
        return ids[:common], k[:, :, :, :common], v[:, :, :, :common]

    def _tops(self, logits: torch.Tensor, temps: torch.Tensor, rows: list[_Row]) -> dict[int, list[tuple[int, float]]]:
        want = [j for j, r in enumerate(rows) if r.request.top_logprobs > 0]
        if not want:
            return {}
        k = max(rows[j].request.top_logprobs for j in want)
        index = torch.tensor(want)
        values, ids = top_logprobs(logits.index_select(0, index), temps.index_select(0, index), k)
        out = {}
        for j, vs, ts in zip(want, values.tolist(), ids.tolist()):
            n = rows[j].request.top_logprobs
            out[j] = list(zip(ts[:n], vs[:n]))
        return out

    def _finish(self, row: _Row) -> str | None:
        if row.tokens[-1] in self._eos:
            return "stop"
        if hits_stop(self.engine.tokenizer, row.tokens, row.request.stop):
            return "stop"
        if len(row.tokens) >= row.budget:
            return "length"
        return None

    def _result(self, row: _Row, finish: str) -> GenResult:
        text = completion_text(self.engine.tokenizer, row.tokens, row.request.stop)
        return GenResult(row.tokens, row.logprobs, finish, text, row.tops if row.request.top_logprobs else None)

    def _deliver(self, events: list[tuple[Stream, Any]]) -> None:
        """Hand each event to its stream's loop: one thread-safe call per loop and step."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Stream, Any]]] = {}
        for stream, event in events:
            by_loop.setdefault(stream.loop, []).append((stream, event))
        for loop, items in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody is listening
                loop.call_soon_threadsafe(functools.partial(_put_all, items))


def _put_all(items: list[tuple[Stream, Any]]) -> None:
    for stream, event in items:
        stream.queue.put_nowait(event)
        if not isinstance(event, TokenEvent) and not stream.done.done():
            stream.done.set_result(None)
