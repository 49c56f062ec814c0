"""ASGI plumbing of the gateway: streamed and relayed responses, the request counter, the app class.

A response that breaks off (the upstream or the policy stopped mid-body) must not look finished to
the client: :class:`StreamResponse` then returns without the final empty chunk, and uvicorn closes the
connection, so an HTTP client reports an incomplete body (curl exits 18, httpx raises
``RemoteProtocolError``, the openai SDK ``APIConnectionError``), exactly as if it had asked the
upstream itself.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from reinforge.plugin import CountResponses

from .config import CHAT_ROUTE
from .errors import ApiError
from .metrics import Metrics
from .proxy import UpstreamError, UpstreamResponse, raw_chunks, response_headers

__all__ = [
    "CLOSE_ROUTE",
    "FEEDBACK_ROUTE",
    "PATH_KEY",
    "ROLLBACK_ROUTE",
    "VERSIONS_ROUTE",
    "CountRequests",
    "GatewayApp",
    "StreamResponse",
    "api_error",
    "http_error",
    "quiet_aborts",
    "relayed",
    "route_label",
]

FEEDBACK_ROUTE = "/online/v1/feedback"
VERSIONS_ROUTE = "/online/v1/versions"
ROLLBACK_ROUTE = "/online/v1/rollback"
CLOSE_ROUTE = "/online/v1/traces/{trace_id}/close"
_CLOSE_PREFIX, _CLOSE_SUFFIX = CLOSE_ROUTE.split("{trace_id}")
PATH_KEY = "reinforge_online.path"  # the path a request took, for the request counter
_ROUTES = (CHAT_ROUTE, "/v1/models", "/healthz", "/metrics", FEEDBACK_ROUTE, VERSIONS_ROUTE, ROLLBACK_ROUTE)
_BUFFERED = 1 << 20  # bodies up to this size with a content-length go out in one piece
_log = logging.getLogger("reinforge_online")
_aborted: contextvars.ContextVar[bool] = contextvars.ContextVar("reinforge_online_aborted", default=False)


def route_label(path: str) -> str:
    """The route label of a request path: one of the gateway's routes (the close route as its template), or other."""
    if path in _ROUTES:
        return path
    if path.startswith(_CLOSE_PREFIX) and path.endswith(_CLOSE_SUFFIX):
        trace_id = path[len(_CLOSE_PREFIX) : len(path) - len(_CLOSE_SUFFIX)]
        if trace_id and "/" not in trace_id:
            return CLOSE_ROUTE
    return "other"


class _AbortFilter(logging.Filter):
    """Drops uvicorn's "returned without completing response" line for a response the gateway cut on purpose
    (it logged its own warning, naming why)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_aborted.get() and "without completing response" in record.getMessage())


def quiet_aborts() -> None:
    """Install the filter on uvicorn's error logger (once per process)."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _AbortFilter) for f in logger.filters):
        logger.addFilter(_AbortFilter())


class StreamResponse(Response):
    """A streamed response that sends each piece as it comes, with no task group per request.

    Starlette's ``StreamingResponse`` runs the body and a disconnect listener in an anyio task group
    (about a fifth of the gateway's CPU on a streamed sampled call here). This sends the pieces from
    the serving task itself; a watcher task only notes a client's disconnect, and the next piece ends
    the stream (the generator is closed, so the upstream's response is released). When the pieces
    raise :class:`UpstreamError` the response is cut (see the module docstring) and ``on_broken`` told.
    """

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        status_code: int = 200,
        headers: dict[str, str] | None = None,
        on_broken: Callable[[UpstreamError], None] | None = None,
    ) -> None:
        self.status_code = status_code
        self.background = None
        self.chunks = chunks
        self.on_broken = on_broken
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
            try:
                async for chunk in chunks:
                    if gone.is_set():
                        return
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except UpstreamError as exc:
                _aborted.set(True)  # no final chunk: the server closes the connection, the client sees it cut
                if self.on_broken is not None:
                    self.on_broken(exc)
                return
            if not gone.is_set():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            closer = getattr(chunks, "aclose", None)
            if closer is not None:
                await closer()


async def relayed(resp: UpstreamResponse, on_broken: Callable[[UpstreamError], None] | None = None) -> Response:
    """The upstream's response as the client gets it: status, headers, body bytes as sent.

    A small body of known length is read whole and sent in one message (cheaper than a
    streamed response); anything else, server-sent events included, streams through chunk by
    chunk, and is cut if the upstream breaks off.
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
        out: Response = Response(body, status_code=resp.status_code)
    else:
        out = StreamResponse(raw_chunks(resp), status_code=resp.status_code, on_broken=on_broken)
    out.raw_headers = headers
    return out


class CountRequests(CountResponses):
    """ASGI middleware: every response counted by route, the path it took and its status (core's counter)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        def count(scope: Any, status: int) -> None:
            metrics.requests.labels(route_label(scope["path"]), scope.get(PATH_KEY, "gateway"), str(status)).inc()

        super().__init__(app, count)


class GatewayApp(Starlette):
    """Starlette, with ``POST /v1/chat/completions`` sent straight to ``state.gateway.serve_chat``."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == CHAT_ROUTE and scope["method"] == "POST":
            scope["app"] = self
            await self.state.gateway.serve_chat(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


async def api_error(request: Request, exc: Exception) -> Response:
    """An :class:`ApiError` as its OpenAI-style JSON body."""
    assert isinstance(exc, ApiError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers or None)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (404, 405) in the same JSON form."""
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    error = ApiError(f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code, kind=kind)
    return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)


def error_handlers() -> dict[Any, Any]:
    return {ApiError: api_error, HTTPException: http_error}
