"""The routes: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, ``/healthz``, ``/metrics``,
``/admin/adapter`` (hot adapter swap).

A hot swap drains: new completion requests wait at admission, the ones already admitted
(their ``x-policy-version`` header already sent) finish on the weights they started with,
then the new weights go in under the engine's lock (between batches) and admission reopens.
So every response's ``x-policy-version`` is the version of the weights that generated it.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from reinforge.plugin import ConfigError, CountResponses

from ..inference.engine import GenRequest, GenResult
from ..inference.policy import sampling_request
from ..inference.scheduler import Stream, TokenEvent
from . import auth, protocol, streaming, tool_calls
from .metrics import Metrics
from .model import AdapterError, ServedModel
from .protocol import ApiError  # core's, re-exported there
from .streaming import TextDeltas

MAX_BODY_BYTES = 4 * 2**20
VERSION_HEADER = "x-policy-version"
SAMPLING_DEFAULTS = {"temperature": 1.0, "top_p": 1.0}


@dataclass
class _Job:
    """The engine requests of one HTTP request (one per prompt and choice) and, once admitted, their streams."""

    prompt_ids: list[list[int]]
    requests: list[GenRequest]
    n: int
    streams: list[Stream] = field(default_factory=list)

    def prompt_of(self, choice: int) -> list[int]:
        return self.prompt_ids[choice // self.n]


class _CountRequests(CountResponses):
    """ASGI middleware: every response, errors included, counted by route and status (core's counter)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        super().__init__(
            app, lambda scope, status: metrics.requests.labels(metrics.route(scope["path"]), str(status)).inc()
        )


class Service:
    """State of the routes: the served model, its key, limits and metrics."""

    def __init__(
        self,
        served: ServedModel,
        metrics: Metrics,
        *,
        api_key: str | None,
        max_body_bytes: int = MAX_BODY_BYTES,
        admin_key: str | None = None,
    ) -> None:
        if admin_key is not None and admin_key == api_key:
            raise ConfigError("the admin key must differ from the traffic API key")
        self.served = served
        self.metrics = metrics
        self.api_key = api_key
        self.admin_key = admin_key
        self.max_body_bytes = max_body_bytes
        self.metrics.policy_version.set(served.policy_version)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inflight = 0
        self._tools_probe: tuple[Any, bool] = (None, False)

    # -- plumbing -----------------------------------------------------------------------------

    def _bind(self) -> None:
        """Admission state on the serving loop (made there: asyncio primitives belong to one loop)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._inflight = loop, 0
            self._open, self._idle, self._swap_lock = asyncio.Event(), asyncio.Event(), asyncio.Lock()
            self._open.set()
            self._idle.set()

    async def _start(self, job: _Job) -> int:
        """Admit ``job`` (waiting while a swap drains) and queue its requests: the version they run on."""
        self._bind()
        while not self._open.is_set():
            await self._open.wait()
        self._inflight += 1
        self._idle.clear()
        job.streams = [self.served.scheduler.submit(r) for r in job.requests]
        everything = asyncio.gather(*(s.done for s in job.streams))

        def done(_: asyncio.Future[list[None]]) -> None:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

        everything.add_done_callback(done)
        return self.served.policy_version

    async def _body(self, request: Request) -> dict[str, Any]:
        auth.check(request.headers.get("authorization"), self.api_key)
        return await self._json(request)

    async def _json(self, request: Request) -> dict[str, Any]:
        too_big = ApiError(
            f"the request body is over the limit of {self.max_body_bytes} bytes", status=413, code="request_too_large"
        )
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise too_big
            chunks.append(chunk)
        return protocol.parse_json(b"".join(chunks))

    def _model_name(self, requested: str | None) -> str:
        if requested is not None and requested != self.served.name:
            raise ApiError(
                f"the model {requested!r} does not exist here; this server serves {self.served.name!r}",
                status=404,
                param="model",
                code="model_not_found",
            )
        return self.served.name

    def _check_length(self, ids: list[int], param: str) -> None:
        limit = self.served.max_model_len
        if len(ids) >= limit:
            raise ApiError(
                f"this model's maximum context length is {limit} tokens, but the prompt has {len(ids)}",
                param=param,
                code="context_length_exceeded",
            )

    def _job(self, prompt_ids: list[list[int]], sampling: protocol.Sampling, top_logprobs: int = 0) -> _Job:
        params = sampling.as_dict(self.served.default_max_tokens)
        requests = []
        for p, ids in enumerate(prompt_ids):
            key = random.getrandbits(62)
            for i in range(sampling.n):
                r = sampling_request(ids, params, SAMPLING_DEFAULTS, (key, p, i), (key, p, i))
                r.top_logprobs = top_logprobs
                requests.append(r)
        return _Job(prompt_ids, requests, sampling.n)

    def _counted(self, job: _Job, results: list[GenResult | None]) -> int:
        """Count the job's tokens in the metrics; its completion tokens."""
        completion = sum(len(r.token_ids) for r in results if r is not None)
        self.metrics.prompt_tokens.inc(sum(len(p) for p in job.prompt_ids))
        self.metrics.completion_tokens.inc(completion)
        return completion

    def _piece(self, token: int) -> str:
        """A token's own text (special tokens included), as logprobs entries show it."""
        return str(self.served.tokenizer.decode([token], skip_special_tokens=False))

    def _alternatives(self, top: list[tuple[int, float]] | None) -> list[tuple[str, float]]:
        return [(self._piece(t), lp) for t, lp in top or []]

    def _tops(self, result: GenResult) -> protocol.Alternatives | None:
        if result.top_logprobs is None:
            return None
        return [self._alternatives(top) for top in result.top_logprobs]

    async def _finished(self, job: _Job, start: float) -> list[GenResult]:
        """The results of a non-streamed request; its first token reaches the client with the last."""
        try:
            results = list(await asyncio.gather(*(s.finished() for s in job.streams)))
        except Exception as exc:
            raise ApiError(f"generation failed: {type(exc).__name__}: {exc}", status=500) from exc
        elapsed = time.perf_counter() - start
        self.metrics.ttft.observe(elapsed)
        self.metrics.latency.observe(elapsed)
        self._counted(job, list(results))
        return results

    async def _events(self, job: _Job, start: float) -> AsyncIterator[tuple[int, TokenEvent | GenResult, str]]:
        """(choice, event, text delta) as tokens are sampled; a result's delta is what was held back."""
        deltas = [TextDeltas(self.served.tokenizer, r.stop) for r in job.requests]
        first = True
        try:
            async for i, event in streaming.merged(job.streams):
                if isinstance(event, TokenEvent):
                    if first:
                        self.metrics.ttft.observe(time.perf_counter() - start)
                        first = False
                    yield i, event, deltas[i].push(event.token)
                else:
                    yield i, event, deltas[i].finish(event.text)
        except ApiError:
            raise
        except Exception as exc:
            raise ApiError(f"generation failed: {type(exc).__name__}: {exc}", status=500) from exc

    # -- routes -------------------------------------------------------------------------------

    def _renders_tools(self) -> bool:
        """Whether the chat template renders ``tools`` (probed once per template: tests swap it)."""
        template = self.served.tokenizer.chat_template
        if self._tools_probe[0] != template:
            self._tools_probe = (template, tool_calls.template_renders_tools(self.served.tokenizer))
        return self._tools_probe[1]

    async def chat(self, request: Request) -> Response:
        start = time.perf_counter()
        body = await self._body(request)
        req = protocol.parse_chat(body)
        name = self._model_name(req.model)
        messages, tools = req.messages, req.tools
        rendered = bool(tools) and self._renders_tools()
        if tools and not rendered:  # the documented fallback: tools described in a system message, Hermes calls
            messages, tools = tool_calls.fallback_messages(messages, tools), None
        try:
            prompt_ids = self.served.template.prompt_ids(messages, tools)
        except ConfigError as exc:  # the only one it raises: the prompt does not fit max_model_len
            raise ApiError(
                f"this model's maximum context length is {self.served.max_model_len} tokens: {exc}",
                param="messages",
                code="context_length_exceeded",
            ) from exc
        except Exception as exc:
            raise ApiError(f"the chat template cannot render these messages: {exc}", param="messages") from exc
        self._check_length(prompt_ids, "messages")
        job = self._job([prompt_ids], req.sampling, req.top_logprobs)
        rid = protocol.new_id("chatcmpl")
        version = await self._start(job)
        headers = {VERSION_HEADER: str(version)}
        if req.tools:
            headers["x-reinforge-tools"] = "rendered" if rendered else "system-prompt"
        if req.stream:
            return self._stream(self._chat_chunks(req, job, rid, name, start), headers)
        results = await self._finished(job, start)
        choices = []
        for i, res in enumerate(results):
            message: dict[str, Any] = {"role": "assistant", "content": res.text}
            finish = res.finish_reason
            parsed = tool_calls.parse_tool_calls(res.text, req.tools)  # no tools offered: no calls
            if parsed.tool_calls:
                message = {"role": "assistant", "content": parsed.content, "tool_calls": parsed.tool_calls}
                finish = "tool_calls" if finish == "stop" else finish
            choice: dict[str, Any] = {"index": i, "message": message, "logprobs": None, "finish_reason": finish}
            if req.logprobs:
                pieces = [self._piece(t) for t in res.token_ids]
                choice["logprobs"] = protocol.chat_logprobs(pieces, res.logprobs, self._tops(res))
            if req.return_token_ids:
                choice["token_ids"] = res.token_ids
            choices.append(choice)
        extra: dict[str, Any] = {
            "usage": protocol.usage(len(prompt_ids), sum(len(r.token_ids) for r in results)),
            "system_fingerprint": None,
        }
        if req.return_token_ids:
            extra["prompt_token_ids"] = prompt_ids
        return JSONResponse(protocol.envelope("chat.completion", rid, name, choices, **extra), headers=headers)

    async def _chat_chunks(
        self, req: protocol.ChatRequest, job: _Job, rid: str, name: str, start: float
    ) -> AsyncIterator[dict[str, Any]]:
        def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
            return protocol.envelope("chat.completion.chunk", rid, name, choices, **extra)

        first: dict[str, Any] = {"prompt_token_ids": job.prompt_ids[0]} if req.return_token_ids else {}
        yield chunk(
            [
                {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                for i in range(job.n)
            ],
            **first,
        )
        results: list[GenResult | None] = [None] * job.n
        held = [tool_calls.ToolCallStream(req.tools) for _ in range(job.n)]  # a call's text never goes out
        async for i, event, delta in self._events(job, start):
            delta = held[i].push(delta)
            if isinstance(event, GenResult):
                results[i] = event
                rest, calls = held[i].finish()
                delta += rest
                if delta:
                    yield chunk([{"index": i, "delta": {"content": delta}, "logprobs": None, "finish_reason": None}])
                finish = event.finish_reason
                if calls:
                    tc = [{"index": k, **call} for k, call in enumerate(calls)]
                    yield chunk([{"index": i, "delta": {"tool_calls": tc}, "logprobs": None, "finish_reason": None}])
                    finish = "tool_calls" if finish == "stop" else finish
                yield chunk([{"index": i, "delta": {}, "logprobs": None, "finish_reason": finish}])
                continue
            if not (delta or req.logprobs or req.return_token_ids):
                continue
            c: dict[str, Any] = {"index": i, "delta": {"content": delta}, "logprobs": None, "finish_reason": None}
            if req.logprobs:
                top = [self._alternatives(event.top)] if event.top is not None else None
                c["logprobs"] = protocol.chat_logprobs([self._piece(event.token)], [event.logprob], top)
            if req.return_token_ids:
                c["token_ids"] = [event.token]
            yield chunk([c])
        self.metrics.latency.observe(time.perf_counter() - start)
        completion = self._counted(job, results)
        if req.include_usage:
            yield chunk([], usage=protocol.usage(len(job.prompt_ids[0]), completion))

    async def completions(self, request: Request) -> Response:
        start = time.perf_counter()
        body = await self._body(request)
        req = protocol.parse_completion(body)
        name = self._model_name(req.model)
        prompt_ids = []
        for p in req.prompts:
            ids = list(p) if isinstance(p, list) else list(self.served.tokenizer(p).input_ids)
            vocab = len(self.served.tokenizer)
            if any(t < 0 or t >= vocab for t in ids):
                raise ApiError(f"prompt token ids must be in [0, {vocab})", param="prompt")
            self._check_length(ids, "prompt")
            prompt_ids.append(ids)
        job = self._job(prompt_ids, req.sampling, req.top_logprobs)
        rid = protocol.new_id("cmpl")
        version = await self._start(job)
        headers = {VERSION_HEADER: str(version)}
        if req.stream:
            return self._stream(self._completion_chunks(req, job, rid, name, start), headers)
        results = await self._finished(job, start)
        choices = []
        for i, res in enumerate(results):
            choice: dict[str, Any] = {
                "index": i,
                "text": res.text,
                "logprobs": None,
                "finish_reason": res.finish_reason,
            }
            if req.logprobs:
                pieces = [self._piece(t) for t in res.token_ids]
                choice["logprobs"] = protocol.completion_logprobs(pieces, res.logprobs, self._tops(res))
            if req.return_token_ids:
                choice["prompt_token_ids"] = job.prompt_of(i)
                choice["token_ids"] = res.token_ids
            choices.append(choice)
        use = protocol.usage(sum(len(p) for p in prompt_ids), sum(len(r.token_ids) for r in results))
        return JSONResponse(protocol.envelope("text_completion", rid, name, choices, usage=use), headers=headers)

    async def _completion_chunks(
        self, req: protocol.CompletionRequest, job: _Job, rid: str, name: str, start: float
    ) -> AsyncIterator[dict[str, Any]]:
        def chunk(c: dict[str, Any]) -> dict[str, Any]:
            return protocol.envelope("text_completion", rid, name, [c])

        results: list[GenResult | None] = [None] * len(job.requests)
        offsets = [0] * len(job.requests)  # characters of each choice's text sent so far
        started = [False] * len(job.requests)
        async for i, event, delta in self._events(job, start):
            c: dict[str, Any] = {"index": i, "text": delta, "logprobs": None, "finish_reason": None}
            if req.return_token_ids and not started[i]:
                c["prompt_token_ids"] = job.prompt_of(i)
                started[i] = True
            if isinstance(event, GenResult):
                results[i] = event
                if delta:
                    yield chunk(c)
                    c = {"index": i, "text": "", "logprobs": None, "finish_reason": None}
                yield chunk({**c, "finish_reason": event.finish_reason})
                continue
            if req.logprobs:
                top = [self._alternatives(event.top)] if event.top is not None else None
                c["logprobs"] = protocol.completion_logprobs(
                    [self._piece(event.token)], [event.logprob], top, offsets[i]
                )
            if req.return_token_ids:
                c["token_ids"] = [event.token]
            offsets[i] += len(delta)
            if delta or req.logprobs or req.return_token_ids:
                yield chunk(c)
        self.metrics.latency.observe(time.perf_counter() - start)
        completion = self._counted(job, results)
        if req.include_usage:
            use = protocol.usage(sum(len(p) for p in job.prompt_ids), completion)
            yield protocol.envelope("text_completion", rid, name, [], usage=use)

    def _stream(
        self, chunks: AsyncIterator[dict[str, Any]], headers: dict[str, str] | None = None
    ) -> StreamingResponse:
        async def sse() -> AsyncIterator[bytes]:
            try:
                async for c in chunks:
                    yield f"data: {json.dumps(c)}\n\n".encode()
            except ApiError as exc:  # the status line is gone: the error travels as an event
                yield f"data: {json.dumps(exc.body())}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(
            sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", **(headers or {})}
        )

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.served.name,
            "object": "model",
            "created": self.served.created,
            "owned_by": "reinforge",
            "root": str(self.served.folder),
            "max_model_len": self.served.max_model_len,
            "policy_version": self.served.policy_version,
            "adapter": str(self.served.adapter) if self.served.adapter is not None else None,
        }

    async def models(self, request: Request) -> Response:
        auth.check(request.headers.get("authorization"), self.api_key)
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        auth.check(request.headers.get("authorization"), self.api_key)
        self._model_name(request.path_params["name"])
        return JSONResponse(self._model_card())

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self.served.name})

    async def metrics_text(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    async def admin_adapter(self, request: Request) -> Response:
        """``POST /admin/adapter {"path": DIR | null}``: swap the LoRA adapter (``null``: the base model)."""
        auth.check_admin(request.headers.get("authorization"), self.admin_key)
        body = await self._json(request)
        raw = body.get("path")
        if "path" not in body or not (raw is None or isinstance(raw, str)):
            raise ApiError(
                "'path' is required: an adapter, checkpoint or run folder, or null for the base model", param="path"
            )
        swapper = self.served.swapper
        if swapper is None:
            raise ApiError("this server cannot swap adapters", status=409, code="swap_unsupported")
        self._bind()
        async with self._swap_lock:  # one swap at a time
            target = Path(raw).expanduser() if raw is not None else None
            try:  # read and checked on the decode thread between two steps (all tensor work is there: .compute)
                folder, factors = await asyncio.wrap_future(self.served.scheduler.call(lambda: swapper.read(target)))
            except AdapterError as exc:
                self.metrics.swaps.labels("rejected").inc()
                raise ApiError(f"adapter rejected: {exc}", param="path", code="invalid_adapter") from exc
            self._open.clear()  # drain: admitted requests finish on the old weights
            try:
                await self._idle.wait()
                await asyncio.wrap_future(self.served.scheduler.call(lambda: swapper.apply(factors)))
                self.served.adapter = folder
                self.served.policy_version += 1
            except Exception as exc:
                self.metrics.swaps.labels("failed").inc()
                raise ApiError(f"the swap failed: {type(exc).__name__}: {exc}", status=500) from exc
            finally:
                self._open.set()
        version = self.served.policy_version
        self.metrics.policy_version.set(version)
        self.metrics.swaps.labels("ok").inc()
        out = {"policy_version": version, "adapter": str(folder) if folder is not None else None}
        return JSONResponse({"model": self.served.name, **out}, headers={VERSION_HEADER: str(version)})


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), status_code=exc.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    error = ApiError(f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code, kind=kind)
    return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)


def build_app(
    served: ServedModel,
    *,
    api_key: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    metrics: Metrics | None = None,
    admin_key: str | None = None,
) -> Starlette:
    """The ASGI app serving ``served`` (give ``metrics`` to share them with the scheduler's hooks).

    ``admin_key`` enables ``POST /admin/adapter`` (without it the route answers 403).
    """
    metrics = metrics or Metrics()
    svc = Service(served, metrics, api_key=api_key, max_body_bytes=max_body_bytes, admin_key=admin_key)
    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        ApiError: _api_error,
        HTTPException: _http_error,
    }
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", svc.chat, methods=["POST"]),
            Route("/v1/completions", svc.completions, methods=["POST"]),
            Route("/v1/models", svc.models, methods=["GET"]),
            Route("/v1/models/{name:path}", svc.model, methods=["GET"]),
            Route("/healthz", svc.healthz, methods=["GET"]),
            Route("/metrics", svc.metrics_text, methods=["GET"]),
            Route("/admin/adapter", svc.admin_adapter, methods=["POST"]),
        ],
        exception_handlers=handlers,
    )
    app.state.service = svc
    app.add_middleware(_CountRequests, metrics=metrics)
    return app
