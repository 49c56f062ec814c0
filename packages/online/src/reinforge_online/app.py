"""The gateway's ASGI app: ``/v1/chat/completions``, ``/v1/models``, ``/healthz``, ``/metrics``, feedback and close.

Fail-open throughout: an unsampled request is a byte-for-byte pass-through; a sampled one
that the policy cannot answer goes to the upstream instead; a trace the store cannot take
is dropped (counted) and never delays or fails the response. Only the upstream being
unreachable is the client's problem (a 502), since the gateway has no one else to ask.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import auth, feedback
from .config import CHAT_ROUTE, OnlineSettings, Secrets
from .errors import ApiError, parse_json
from .metrics import Metrics
from .pipeline import Pipeline, task_of
from .proxy import Upstream, UpstreamError, UpstreamResponse, raw_chunks, request_headers, response_headers
from .ratelimit import RateLimiter
from .redact import Redactor
from .selection import Selection
from .shadow import ShadowRunner, resolve_tools
from .store import CallRecord, StoreUnavailable, TraceStore

__all__ = ["CLOSE_ROUTE", "FEEDBACK_ROUTE", "Gateway", "build_app"]

FEEDBACK_ROUTE = "/online/v1/feedback"
CLOSE_ROUTE = "/online/v1/traces/{trace_id}/close"
_CLOSE_PREFIX, _CLOSE_SUFFIX = CLOSE_ROUTE.split("{trace_id}")
_PATH_KEY = "reinforge_online.path"  # the path a request took, for the request counter
_log = logging.getLogger("reinforge_online")


class _Fallback(Exception):
    """The policy could not answer: serve the request from the upstream instead."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class _Choice:
    """One choice of a streamed completion, put back together for the trace."""

    content: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    role: str = "assistant"

    def add(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta") or {}
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        if isinstance(delta.get("role"), str):
            self.role = delta["role"]
        for call in delta.get("tool_calls") or ():
            k = call.get("index", len(self.tool_calls))
            have = self.tool_calls.get(k)
            if have is None:
                self.tool_calls[k] = json.loads(json.dumps(call))
            else:
                args = (call.get("function") or {}).get("arguments")
                if args:
                    fn = have.setdefault("function", {})
                    fn["arguments"] = fn.get("arguments", "") + args
        self.token_ids.extend(choice.get("token_ids") or ())
        self.logprobs.extend(_logprobs(choice))
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": "".join(self.content)}
        if self.tool_calls:
            message["tool_calls"] = [
                {k: v for k, v in c.items() if k != "index"} for _, c in sorted(self.tool_calls.items())
            ]
        return message


def _logprobs(choice: dict[str, Any]) -> list[float]:
    content = (choice.get("logprobs") or {}).get("content") or ()
    return [float(e["logprob"]) for e in content if isinstance(e, dict) and "logprob" in e]


def _strip(data: dict[str, Any], token_ids: bool, logprobs: bool) -> dict[str, Any]:
    """The policy's response without the token ids and logprobs the client did not ask for."""
    if not token_ids:
        data.pop("prompt_token_ids", None)
    for choice in data.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if not token_ids:
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
        if not logprobs and "logprobs" in choice:
            choice["logprobs"] = None
    return data


_BUFFERED = 1 << 20  # bodies up to this size with a content-length go out in one piece


async def _relayed(resp: UpstreamResponse) -> Response:
    """The upstream's response as the client gets it: status, headers, body bytes as sent.

    A small body of known length is read whole and sent in one message (cheaper than a
    streamed response); anything else, server-sent events included, streams through chunk by chunk.
    """
    headers = response_headers(resp.raw_headers)
    length = resp.header("content-length") or ""
    streamed = "text/event-stream" in (resp.header("content-type") or "")
    if not streamed and length.isdigit() and int(length) <= _BUFFERED:
        try:
            body = await resp.read()
        except UpstreamError as exc:
            raise ApiError(
                f"the upstream's response broke off: {exc}",
                status=502,
                code="upstream_broke_off",
                kind="server_error",
            ) from exc
        out = Response(body, status_code=resp.status_code)
    else:
        out = _Stream(raw_chunks(resp), status_code=resp.status_code)
    out.raw_headers = headers
    return out


class _Stream(Response):
    """A streamed response that sends each piece as it comes, with no task group per request.

    Starlette's ``StreamingResponse`` runs the body and a disconnect listener in an anyio task group
    (about a fifth of the gateway's CPU on a streamed sampled call here). This sends the pieces from
    the serving task itself; a watcher task only notes a client's disconnect, and the next piece ends
    the stream (the generator is closed, so the upstream's response is released).
    """

    def __init__(
        self, chunks: AsyncIterator[bytes], status_code: int = 200, headers: dict[str, str] | None = None
    ) -> None:
        self.status_code = status_code
        self.background = None
        self.chunks = chunks
        # no content-length: the body's length is not known until it has been sent
        self.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.ensure_future(watch())
        chunks = self.chunks
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            async for chunk in chunks:
                if gone.is_set():
                    return
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if not gone.is_set():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            closer = getattr(chunks, "aclose", None)
            if closer is not None:
                await closer()


class _CountRequests:
    """ASGI middleware: every response counted by route, the path it took and its status."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.requests.labels(_route(scope["path"]), scope.get(_PATH_KEY, "gateway"), str(status[0])).inc()


class _GatewayApp(Starlette):
    """Starlette, with ``POST /v1/chat/completions`` sent straight to :meth:`Gateway.serve_chat`."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == CHAT_ROUTE and scope["method"] == "POST":
            scope["app"] = self
            await self.state.gateway.serve_chat(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


_ROUTES = (CHAT_ROUTE, "/v1/models", "/healthz", "/metrics", FEEDBACK_ROUTE)


def _route(path: str) -> str:
    """The route label of a request path: one of the gateway's routes (the close route as its template), or other."""
    if path in _ROUTES:
        return path
    if path.startswith(_CLOSE_PREFIX) and path.endswith(_CLOSE_SUFFIX):
        trace_id = path[len(_CLOSE_PREFIX) : len(path) - len(_CLOSE_SUFFIX)]
        if trace_id and "/" not in trace_id:
            return CLOSE_ROUTE
    return "other"


class Gateway:
    """The routes' state: settings, keys, the upstream and policy clients, and the shared :class:`Pipeline`.

    The pipeline (selection, store, redaction, rewards, committer, metrics) is built from the
    settings unless one is given; a given pipeline belongs to its caller (started and closed there).
    """

    def __init__(
        self,
        settings: OnlineSettings,
        secrets: Secrets,
        *,
        store: TraceStore | None = None,
        selection: Selection | None = None,
        metrics: Metrics | None = None,
        redact: Redactor | None = None,
        pipeline: Pipeline | None = None,
        where: str = "online.yaml",
    ) -> None:
        self.settings = settings
        self.secrets = secrets
        tools = resolve_tools(settings, where) if "shadow" in settings.modes() else None  # before anything starts
        self.owns_pipeline = pipeline is None
        self.pipeline = pipeline or Pipeline(
            settings, secrets, store=store, selection=selection, metrics=metrics, redact=redact, where=where
        )
        if self.owns_pipeline:
            self.pipeline.start()
        pl = self.pipeline
        self.metrics, self.store, self.selection, self.committer = pl.metrics, pl.store, pl.selection, pl.committer
        u = settings.upstream
        self.upstream = Upstream(u.url, secrets.upstream_key, timeout_s=u.timeout_s, max_connections=u.max_connections)
        p = settings.policy
        self.policy = (
            Upstream(p.url, secrets.policy_key, timeout_s=p.timeout_s, max_connections=p.max_connections)
            if p is not None
            else None
        )
        self.max_body = settings.limits.max_body_bytes
        lim = settings.limits
        self.limiter = (
            RateLimiter(lim.requests_per_s, lim.burst or max(1, math.ceil(lim.requests_per_s)))
            if lim.requests_per_s is not None
            else None
        )
        self.shadow = ShadowRunner(self, tools) if tools is not None else None

    async def aclose(self) -> None:
        """Stop the shadow runs, close the clients, then (when it owns it) the pipeline (never raises)."""
        loop = asyncio.get_running_loop()
        if self.shadow is not None:
            await self.shadow.aclose()
        for up in (self.upstream, self.policy):
            if up is not None:
                try:
                    await up.aclose()
                except Exception:  # noqa: BLE001 - shutting down is best effort
                    _log.exception("closing an upstream client failed")
        if self.owns_pipeline:
            await loop.run_in_executor(None, self.pipeline.close)

    # -- plumbing ------------------------------------------------------------------------------

    def _limit(self, request: Request) -> None:
        """A 429 when this client is over ``limits.requests_per_s``."""
        if self.limiter is not None:
            self.limiter.check(request.client.host if request.client else "unknown")

    async def _read(self, request: Request) -> bytes:
        too_big = ApiError(
            f"the request body is over the limit of {self.max_body} bytes", status=413, code="request_too_large"
        )
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            raise too_big
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    async def _pass_through(
        self, request: Request, raw: bytes, start: float, path: str = "upstream", method: str = "POST"
    ) -> Response:
        """``raw`` to the upstream unchanged; its response back as it comes."""
        scope = request.scope
        scope[_PATH_KEY] = path
        up = self.upstream
        before = time.perf_counter() - start
        query = scope.get("query_string", b"")
        try:
            resp = await up.send(
                method,
                up.target(scope["path"]),
                query=query.decode("latin-1") if query else None,
                content=raw if method == "POST" else None,
                headers=request_headers(request.headers.raw, up.key),
            )
        except UpstreamError as exc:
            raise self._unreachable(request, exc) from exc
        out = await _relayed(resp)
        self.metrics.added.labels(path).observe(before)
        return out

    # -- routes --------------------------------------------------------------------------------

    async def serve_chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /v1/chat/completions`` as a plain ASGI app, ahead of Starlette's middleware and router.

        Most of the gateway's traffic is this route's unsampled pass-through; the layers it skips
        (error and exception middleware, the request counter's send wrapper, routing,
        Starlette's per-endpoint wrapper) were about a fifth of its CPU time per request. What
        they did for this route is done here: the route's errors become the same JSON bodies,
        anything unexpected a 500 (logged), and the response is counted by route, path and status.
        """
        request = Request(scope, receive)
        try:
            response = await self.chat(request)
        except ApiError as exc:
            response = await _api_error(request, exc)
        except HTTPException as exc:
            response = await _http_error(request, exc)
        except Exception:
            _log.exception("POST %s failed", CHAT_ROUTE)
            response = JSONResponse(ApiError("internal error", status=500, kind="server_error").body(), 500)
        try:
            await response(scope, receive, send)
        finally:
            self.metrics.requests.labels(CHAT_ROUTE, scope.get(_PATH_KEY, "gateway"), str(response.status_code)).inc()

    async def chat(self, request: Request) -> Response:
        start = time.perf_counter()
        auth.check_traffic(request.headers.get("authorization"), self.secrets.traffic_key)
        self._limit(request)
        raw = await self._read(request)
        body = parse_json(raw)
        continued = self._continued(request)
        sampled, session = self.pipeline.select(request.headers, body, continued is not None)
        if not sampled:
            return await self._pass_through(request, raw, start)
        self.metrics.sampled.inc()
        mode = self.settings.mode_of(CHAT_ROUTE)
        trace_id = continued or uuid.uuid4().hex
        if mode == "shadow":
            assert self.shadow is not None
            response = await self._pass_through(request, raw, start, path="shadow")
            self.shadow.submit(body, session, trace_id)  # after the upstream answered; never delays it
            return response
        if mode == "record":
            return await self._sampled(request, body, session, start, self.upstream, mode, trace_id)
        assert self.policy is not None  # route mode needs policy: checked with the settings
        try:
            response = await self._sampled(request, body, session, start, self.policy, mode, trace_id)
        except _Fallback as fb:
            self.metrics.fallbacks.labels(fb.reason).inc()
            self.pipeline.policy_failed()
            return await self._pass_through(request, raw, start, path="fallback")
        self.pipeline.policy_ok()
        return response

    def _continued(self, request: Request) -> str | None:
        """The trace a request continues (``x-reinforge-trace-id`` with its feedback token), or None.

        An agent's episode of several calls becomes one trace this way; a wrong token is a 401.
        """
        trace_id = request.headers.get(feedback.TRACE_ID_HEADER)
        if trace_id is None:
            return None
        token = request.headers.get(feedback.FEEDBACK_TOKEN_HEADER)
        feedback.check_token(self.secrets.feedback_secret, trace_id, token)
        return trace_id

    async def _sampled(
        self,
        request: Request,
        body: dict[str, Any],
        session: str | None,
        start: float,
        up: Upstream,
        mode: str,
        trace_id: str,
    ) -> Response:
        """Ask ``up`` (the policy, or in record mode the upstream) with token ids and logprobs, and record it."""
        request.scope[_PATH_KEY] = "policy" if mode == "route" else "record"
        want_ids = body.get("return_token_ids") is True
        want_logprobs = body.get("logprobs") is True
        payload = dict(body, return_token_ids=True, logprobs=True)
        model = self.settings.policy.model if (mode == "route" and self.settings.policy) else None
        if model:
            payload["model"] = model
        stream = body.get("stream") is True
        if mode == "route":  # the policy gets the gateway's own request
            headers = up.own_headers()
        else:  # record: the upstream gets the client's headers, as unsampled requests do
            headers = {
                k.decode("latin-1"): v.decode("latin-1") for k, v in request_headers(request.headers.raw, up.key)
            }
        before = time.perf_counter() - start
        sent = time.perf_counter()
        try:
            resp = await up.send("POST", up.target(CHAT_ROUTE), content=json.dumps(payload).encode(), headers=headers)
        except UpstreamError as exc:
            if mode == "route":
                raise _Fallback("timeout" if exc.timeout else "unreachable") from exc
            raise self._unreachable(request, exc) from exc
        if resp.status_code != 200:
            if mode == "route":
                await resp.aclose()
                raise _Fallback("server_error" if resp.status_code >= 500 else "rejected")
            return await _relayed(resp)  # the upstream's own answer
        version = resp.header("x-policy-version")
        record = CallRecord(
            trace_id=trace_id,
            call_id=uuid.uuid4().hex,
            route=CHAT_ROUTE,
            mode=mode,
            request=body,
            response={},
            session_id=session,
            policy_version=version,
            task=task_of(body),
        )
        requested_model = body.get("model")
        if stream:
            self.metrics.added.labels(request.scope[_PATH_KEY]).observe(before)
            chunks = self._relay(resp, record, sent, want_ids, want_logprobs, requested_model if model else None)
            return _Stream(
                chunks,
                headers={
                    "content-type": "text/event-stream; charset=utf-8",
                    "cache-control": "no-cache",
                    **self.pipeline.trace_headers(trace_id),
                },
            )
        try:
            data = json.loads(await resp.read())
            choices = data["choices"]
            if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
                raise TypeError("choices must be a list of objects")
            first = choices[0] if choices else {}
            record.prompt_token_ids = data.get("prompt_token_ids")
            record.token_ids = first.get("token_ids")
            record.logprobs = _logprobs(first) or None
        except Exception as exc:  # noqa: BLE001 - not an OpenAI response (or its body broke off)
            if mode == "route":
                raise _Fallback("bad_response") from exc
            raise ApiError(
                "the upstream's response is not an OpenAI chat completion", status=502, code="bad_upstream_response"
            ) from exc
        finally:
            await resp.aclose()
        after = time.perf_counter()
        record.timing = {"received_at": time.time() - (after - start), "upstream_s": after - sent}
        client_data = _strip(data, want_ids, want_logprobs)
        if model and requested_model is not None:
            client_data["model"] = requested_model
        record.response = client_data
        recorded = self.pipeline.record(record)
        out_headers = self.pipeline.trace_headers(trace_id) if recorded else {}
        response = JSONResponse(client_data, headers=out_headers)
        self.metrics.added.labels(request.scope[_PATH_KEY]).observe(before + time.perf_counter() - after)
        return response

    def _unreachable(self, request: Request, exc: UpstreamError) -> ApiError:
        """The client's error when the upstream cannot be asked: 504 for a timeout, else 502."""
        request.scope[_PATH_KEY] = "gateway"
        if exc.timeout:
            return ApiError(
                f"the upstream API did not answer in time: {exc}",
                status=504,
                code="upstream_timeout",
                kind="server_error",
            )
        return ApiError(
            f"the upstream API is unreachable: {exc}",
            status=502,
            code="upstream_unreachable",
            kind="server_error",
        )

    async def _relay(
        self,
        resp: UpstreamResponse,
        record: CallRecord,
        sent: float,
        want_ids: bool,
        want_logprobs: bool,
        model: str | None,
    ) -> AsyncIterator[bytes]:
        """The policy's SSE stream to the client, extra fields stripped.

        The call is recorded when ``[DONE]`` arrives, before it is passed on, so a client that
        saw the end of the stream knows its call was handed to the store (a stream that broke
        off or carried an error event is not recorded).
        """
        choices: dict[int, _Choice] = {}
        meta: dict[str, Any] = {}
        done = failed = False
        first_at: float | None = None
        buffer = b""
        try:
            async for piece in resp.chunks():
                buffer += piece.replace(b"\r\n", b"\n")
                out_events: list[bytes] = []  # what this read completed goes out in one send, at once
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    data = b"\n".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))
                    if not data:
                        continue
                    if data == b"[DONE]":
                        if not (done or failed) and choices:  # queued before the client can see the end
                            self.pipeline.record(self._streamed(record, choices, meta, sent, first_at, model))
                        done = True
                        out_events.append(b"data: [DONE]\n\n")
                        continue
                    try:
                        chunk = json.loads(data)
                    except json.JSONDecodeError:
                        chunk = None
                    if not isinstance(chunk, dict):  # not ours to understand: passed on as it came
                        out_events.append(event + b"\n\n")
                        continue
                    if first_at is None:
                        first_at = time.perf_counter()
                    if "prompt_token_ids" in chunk and record.prompt_token_ids is None:
                        record.prompt_token_ids = chunk["prompt_token_ids"]
                    for key in ("id", "created", "model", "usage", "system_fingerprint"):
                        if chunk.get(key) is not None:
                            meta[key] = chunk[key]
                    if "error" in chunk:
                        failed = True  # the policy failed mid-stream: relayed, not recorded
                    for c in chunk.get("choices") or ():
                        if isinstance(c, dict):
                            index = c.get("index")
                            choices.setdefault(index if isinstance(index, int) else 0, _Choice()).add(c)
                    out = _strip(chunk, want_ids, want_logprobs)
                    if model is not None and "model" in out:
                        out["model"] = model
                    out_events.append(b"data: " + json.dumps(out).encode() + b"\n\n")
                if out_events:
                    yield b"".join(out_events)
        except UpstreamError:
            _log.warning("the policy's stream broke off; the call is not recorded")
            return
        finally:
            await resp.aclose()

    def _streamed(
        self,
        record: CallRecord,
        choices: dict[int, _Choice],
        meta: dict[str, Any],
        sent: float,
        first_at: float | None,
        model: str | None,
    ) -> CallRecord:
        """``record`` completed from a whole stream: the choices put back together, token ids, timing."""
        end = time.perf_counter()
        first = choices.get(0) or next(iter(choices.values()))
        record.token_ids = first.token_ids or None
        record.logprobs = first.logprobs or None
        record.timing = {
            "received_at": time.time() - (end - sent),
            "upstream_s": end - sent,
            "ttft_s": (first_at or end) - sent,
        }
        record.response = {
            "id": meta.get("id"),
            "object": "chat.completion",
            "created": meta.get("created"),
            "model": model or meta.get("model"),
            "choices": [
                {"index": i, "message": c.message(), "finish_reason": c.finish_reason}
                for i, c in sorted(choices.items())
            ],
            "usage": meta.get("usage"),
        }
        return record

    async def models(self, request: Request) -> Response:
        auth.check_traffic(request.headers.get("authorization"), self.secrets.traffic_key)
        self._limit(request)
        return await self._pass_through(request, b"", time.perf_counter(), method="GET")

    async def healthz(self, request: Request) -> Response:
        healthy = self.store.healthy
        return JSONResponse({"status": "ok", "store": "ok" if healthy else "unhealthy", "sampling": healthy})

    async def metrics_text(self, request: Request) -> Response:
        auth.check_admin(request.headers.get("authorization"), self.secrets.admin_key)
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    async def post_feedback(self, request: Request) -> Response:
        """``POST /online/v1/feedback {trace_id, reward, idempotency_key}`` with the trace's feedback token."""
        try:
            outcome = await self._feedback(request)
        except ApiError as exc:
            self.metrics.feedback.labels(str(exc.status)).inc()
            raise
        self.metrics.feedback.labels(str(outcome.status)).inc()
        return JSONResponse(outcome.body, status_code=outcome.status)

    async def _feedback(self, request: Request) -> feedback.FeedbackOutcome:
        self._limit(request)
        body = parse_json(await self._read(request))
        req = feedback.parse(body)
        self._authorise(request, req.trace_id, body)
        try:
            outcome: feedback.FeedbackOutcome = await asyncio.wrap_future(self.pipeline.feedback(req))
        except StoreUnavailable as exc:
            raise ApiError(f"feedback cannot be stored right now: {exc}", status=503, code="store_unavailable") from exc
        return outcome

    def _authorise(self, request: Request, trace_id: str, body: dict[str, Any]) -> None:
        """A 401 unless the request carries ``trace_id``'s feedback token (header, else the body's ``feedback_token``).

        Feedback and close are authorised alike, before the store is asked anything.
        """
        token = request.headers.get(feedback.FEEDBACK_TOKEN_HEADER) or body.get("feedback_token")
        feedback.check_token(self.secrets.feedback_secret, trace_id, token if isinstance(token, str) else None)

    async def close_trace(self, request: Request) -> Response:
        """``POST /online/v1/traces/{trace_id}/close``: the episode ended, score the trace now (see the README).

        Authorised by the trace's feedback token like feedback. 200 ``{trace_id, state, scoring}`` for a
        stored trace that is open (``scoring``: the reward calculator scores it now), rewarded or unrewarded
        (already closed: nothing changes); 401 for a missing or wrong token, 404 for an unknown trace,
        409 for a trace in a batch (``committing``/``committed``).
        """
        self._limit(request)
        trace_id = request.path_params["trace_id"]
        raw = await self._read(request)
        body = parse_json(raw) if raw.strip() else {}
        unknown = sorted(set(body) - {"feedback_token"})
        if unknown:
            raise ApiError(f"unknown field(s) {unknown}", param=unknown[0], code="unknown_field")
        self._authorise(request, trace_id, body)
        try:
            state = await asyncio.wrap_future(self.pipeline.close_stored_trace(trace_id))
        except StoreUnavailable as exc:
            raise ApiError(
                f"the trace store cannot be asked right now: {exc}", status=503, code="store_unavailable"
            ) from exc
        if state is None:
            raise ApiError(
                f"no trace {trace_id!r} is stored here",
                status=404,
                param="trace_id",
                code="trace_not_found",
                kind="not_found_error",
            )
        if state in ("committing", "committed"):
            raise ApiError(
                f"trace {trace_id!r} was already committed for training ({state}); it cannot be closed",
                status=409,
                param="trace_id",
                code="trace_committed",
                kind="conflict_error",
            )
        scoring = state == "open" and self.pipeline.rewards is not None
        return JSONResponse({"trace_id": trace_id, "state": state, "scoring": scoring})


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers or None)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    error = ApiError(f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code, kind=kind)
    return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)


def build_app(
    settings: OnlineSettings,
    secrets: Secrets,
    *,
    store: TraceStore | None = None,
    selection: Selection | None = None,
    metrics: Metrics | None = None,
    redact: Redactor | None = None,
    pipeline: Pipeline | None = None,
    where: str = "online.yaml",
) -> Starlette:
    """The gateway's ASGI app; its lifespan closes the clients and drains the store at shutdown.

    ``app.state.gateway`` is the :class:`Gateway` (its ``store`` and ``metrics`` included); ``where``
    (the settings' file) starts the messages of components that fail to build.
    """
    gw = Gateway(
        settings,
        secrets,
        store=store,
        selection=selection,
        metrics=metrics,
        redact=redact,
        pipeline=pipeline,
        where=where,
    )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await gw.aclose()

    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        ApiError: _api_error,
        HTTPException: _http_error,
    }
    app = _GatewayApp(
        routes=[
            Route(CHAT_ROUTE, gw.chat, methods=["POST"]),  # POST goes to serve_chat first: here for the 405s
            Route("/v1/models", gw.models, methods=["GET"]),
            Route("/healthz", gw.healthz, methods=["GET"]),
            Route("/metrics", gw.metrics_text, methods=["GET"]),
            Route(FEEDBACK_ROUTE, gw.post_feedback, methods=["POST"]),
            Route(CLOSE_ROUTE, gw.close_trace, methods=["POST"]),
        ],
        exception_handlers=handlers,
        lifespan=lifespan,
    )
    app.state.gateway = gw
    app.add_middleware(_CountRequests, metrics=gw.metrics)
    return app
