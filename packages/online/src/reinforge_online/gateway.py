"""The gateway's request path: ``/v1/chat/completions``, ``/v1/models``, feedback, close, health and metrics.

Fail-open throughout: an unsampled request is a byte-for-byte pass-through; a sampled one that the
policy cannot answer goes to the upstream instead; a trace the store cannot commit in a short bounded
wait is answered without trace headers (counted). Only the upstream being unreachable is the client's
problem (a 502), since the gateway has no one else to ask.

"Acknowledged" means durable: a client gets ``x-reinforge-trace-id`` only once its call's row is
committed (:meth:`Pipeline.acknowledge`); a stream's row is committed before its first byte goes out
and completed when it ends (``aborted`` or ``failed`` when it did not end well).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from . import auth, feedback
from .asgi import PATH_KEY, StreamResponse, api_error, http_error, relayed
from .config import CHAT_ROUTE, OnlineSettings, Secrets
from .errors import ApiError
from .pipeline import Pipeline, task_of
from .promotion import PromotionError
from .proxy import Upstream, UpstreamError, UpstreamResponse, request_headers
from .ratelimit import RateLimiter
from .shadow import ShadowRunner, resolve_tools
from .store import CallRecord, StoreUnavailable
from .streams import EventReader, PolicyStream, logprobs_of, strip_extras
from .validation import check_chat_body, parse_json

__all__ = ["Gateway"]

_log = logging.getLogger("reinforge_online")
SMALL_BODY = 64 * 1024  # feedback and close bodies: a few hundred bytes; more is not theirs
_SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}


class _Fallback(Exception):
    """The policy could not answer: serve the request from the upstream instead."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _refusal(status: int) -> str:
    """Why a policy's non-200 answer falls back: ``rejected`` (a 4xx about the request) or ``server_error``."""
    return "rejected" if 400 <= status < 500 and status not in (408, 429) else "server_error"


class Gateway:
    """The routes' state: settings, keys, the upstream and policy clients, and the shared :class:`Pipeline`.

    The pipeline (selection, store, redaction, rewards, committer, metrics) is built from the settings,
    with any of its parts given as ``parts`` (:class:`Pipeline`'s keywords: ``store=``, ``selection=``,
    ``metrics=``, ``redact=``, ``committer=``), unless a whole ``pipeline`` is given; that one belongs to its
    caller (started and closed there).
    """

    def __init__(
        self,
        settings: OnlineSettings,
        secrets: Secrets,
        *,
        pipeline: Pipeline | None = None,
        where: str = "online.yaml",
        **parts: Any,
    ) -> None:
        self.settings = settings
        self.secrets = secrets
        tools = resolve_tools(settings, where) if "shadow" in settings.modes() else None  # before anything starts
        self.owns_pipeline = pipeline is None
        self.pipeline = pipeline or Pipeline(settings, secrets, where=where, **parts)
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
        lim = settings.limits
        self.max_body = lim.max_body_bytes
        self.body_timeout_s = lim.body_timeout_s
        self.limiter = (
            RateLimiter(lim.requests_per_s, lim.burst or max(1, math.ceil(lim.requests_per_s)))
            if lim.requests_per_s is not None
            else None
        )
        self.shadow = None
        if tools is not None:
            assert self.policy is not None and p is not None  # shadow mode needs policy: checked with the settings
            self.shadow = ShadowRunner(self.policy, p.model, self.pipeline, settings.shadow, tools)

    async def aclose(self, timeout: float | None = None) -> bool:
        """Stop the shadow runs, close the clients, then (when it owns it) the pipeline within ``timeout``
        (default ``shutdown_timeout_s``); whether everything finished. Never raises."""
        loop = asyncio.get_running_loop()
        if self.shadow is not None:
            await self.shadow.aclose()
        for up in (self.upstream, self.policy):
            if up is not None:
                try:
                    await up.aclose()
                except Exception:
                    _log.exception("closing an upstream client failed")
        if not self.owns_pipeline:
            return True
        budget = self.settings.shutdown_timeout_s if timeout is None else timeout
        return await loop.run_in_executor(None, self.pipeline.close, budget)

    # -- plumbing ------------------------------------------------------------------------------

    def _limit(self, request: Request) -> None:
        """A 429 when this client is over ``limits.requests_per_s``."""
        if self.limiter is not None:
            self.limiter.check(request.client.host if request.client else "unknown")

    async def _read(self, request: Request, limit: int | None = None) -> bytes:
        """The body: a 413 beyond ``limit`` (``limits.max_body_bytes``), a 408 when it has not all arrived
        within ``limits.body_timeout_s``."""
        limit = self.max_body if limit is None else limit
        too_big = ApiError(f"the request body is over the limit of {limit} bytes", status=413, code="request_too_large")
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise too_big

        async def whole() -> bytes:
            chunks, size = [], 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_big
                chunks.append(chunk)
            return b"".join(chunks)

        try:
            return await asyncio.wait_for(whole(), self.body_timeout_s)
        except asyncio.TimeoutError:
            raise ApiError(
                f"the request body did not arrive within {self.body_timeout_s:g} s",
                status=408,
                code="request_timeout",
            ) from None

    def _broken(self, path: str) -> Any:
        def note(exc: UpstreamError) -> None:
            self.metrics.broken_streams.labels(path).inc()
            who = "the policy" if path == "policy" else "the upstream"
            _log.warning("%s broke off mid-response (%s); the client's response is cut off", who, exc)

        return note

    async def _pass_through(
        self, request: Request, raw: bytes, start: float, path: str = "upstream", method: str = "POST"
    ) -> Response:
        """``raw`` to the upstream unchanged; its response back as it comes."""
        scope = request.scope
        scope[PATH_KEY] = path
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
        out = await relayed(resp, self._broken(path))
        self.metrics.added.labels(path).observe(before)
        return out

    def _unreachable(self, request: Request, exc: UpstreamError) -> ApiError:
        """The client's error when the upstream cannot be asked: 504 for a timeout, else 502."""
        request.scope[PATH_KEY] = "gateway"
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

    # -- the chat route ------------------------------------------------------------------------

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
            response = await api_error(request, exc)
        except HTTPException as exc:
            response = await http_error(request, exc)
        except Exception:
            _log.exception("POST %s failed", CHAT_ROUTE)
            response = JSONResponse(ApiError("internal error", status=500, kind="server_error").body(), 500)
        try:
            await response(scope, receive, send)
        finally:
            self.metrics.requests.labels(CHAT_ROUTE, scope.get(PATH_KEY, "gateway"), str(response.status_code)).inc()

    async def chat(self, request: Request) -> Response:
        start = time.perf_counter()
        auth.check_traffic(request.headers.get("authorization"), self.secrets.traffic_key)
        self._limit(request)
        continued = self._continued(request)  # its token checked before the body is read
        raw = await self._read(request)
        body = parse_json(raw)
        check_chat_body(body)  # a client's type error is the client's, whichever route it takes
        sampled, session = self.pipeline.select(request.headers, body, continued is not None)
        if not sampled:
            return await self._pass_through(request, raw, start)
        self.metrics.sampled.inc()
        mode = self.settings.mode_of(CHAT_ROUTE)
        trace_id = continued or uuid.uuid4().hex
        if mode == "shadow":
            assert self.shadow is not None
            response = await self._pass_through(request, raw, start, path="shadow")
            if response.status_code < 400:  # a request the upstream refused is not worth the policy's time
                self.shadow.submit(body, session, trace_id)  # after the upstream answered; never delays it
            return response
        if mode == "record":
            return await self._sampled(request, body, session, start, self.upstream, mode, trace_id)
        assert self.policy is not None  # route mode needs policy: checked with the settings
        try:
            response = await self._sampled(request, body, session, start, self.policy, mode, trace_id)
        except _Fallback as fb:
            self.metrics.fallbacks.labels(fb.reason).inc()
            if fb.reason != "rejected":
                self.pipeline.policy_failed()
            out = await self._pass_through(request, raw, start, path="fallback")
            if fb.reason == "rejected" and out.status_code < 400:
                self.pipeline.policy_failed()  # the policy refused what the upstream answers: the policy's fault
            return out  # a request both refuse is the client's: the breaker is not told
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
        """Ask ``up`` (the policy, or in record mode the upstream) with token ids and logprobs, and record it.

        A stream's first row (the trace, the request) is queued before ``up`` is asked, so its commit
        overlaps the answer's first byte; it is taken back when no stream of ours comes of it.
        """
        request.scope[PATH_KEY] = "policy" if mode == "route" else "record"
        payload = dict(body, return_token_ids=True, logprobs=True)
        model = self.settings.policy.model if (mode == "route" and self.settings.policy) else None
        if model:
            payload["model"] = model
        if mode == "route":  # the policy gets the gateway's own request
            headers = up.own_headers()
        else:  # record: the upstream gets the client's headers, as unsampled requests do
            headers = {
                k.decode("latin-1"): v.decode("latin-1") for k, v in request_headers(request.headers.raw, up.key)
            }
        record = CallRecord(
            trace_id=trace_id,
            call_id=uuid.uuid4().hex,
            route=CHAT_ROUTE,
            mode=mode,
            request=body,
            response={},
            session_id=session,
            task=task_of(body),
        )
        stream = body.get("stream") is True
        first_row = None
        if stream:
            record.state = "streaming"
            first_row = self.pipeline.record_future(record)
        before = time.perf_counter() - start
        sent = time.perf_counter()
        try:
            try:
                resp = await up.send(
                    "POST", up.target(CHAT_ROUTE), content=json.dumps(payload).encode(), headers=headers
                )
            except UpstreamError as exc:
                if mode == "route":
                    raise _Fallback("timeout" if exc.timeout else "unreachable") from exc
                raise self._unreachable(request, exc) from exc
            if resp.status_code != 200:
                if mode == "route":
                    await resp.aclose()
                    raise _Fallback(_refusal(resp.status_code))
                if first_row is not None:
                    self.pipeline.forget(record)
                    first_row = None
                return await relayed(resp, self._broken("record"))  # the upstream's own answer
            record.policy_version = resp.header("x-policy-version")
            requested = body.get("model") if model else None  # the client's name goes back in place of the policy's
            if stream:
                out = await self._sampled_stream(request, resp, record, first_row, mode, sent, before, requested)
                first_row = None  # it is the stream's now
                return out
        except BaseException:
            if first_row is not None:
                self.pipeline.forget(record)
            raise
        want_ids, want_logprobs = body.get("return_token_ids") is True, body.get("logprobs") is True
        try:
            data = json.loads(await resp.read())
            choices = data["choices"]
            if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
                raise TypeError("choices must be a list of objects")
            first = choices[0] if choices else {}
            record.prompt_token_ids = data.get("prompt_token_ids")
            record.token_ids = first.get("token_ids")
            record.logprobs = logprobs_of(first) or None
        except Exception as exc:
            if mode == "route":
                raise _Fallback("bad_response") from exc
            raise ApiError(
                "the upstream's response is not an OpenAI chat completion", status=502, code="bad_upstream_response"
            ) from exc
        finally:
            await resp.aclose()
        after = time.perf_counter()
        record.timing = {"received_at": time.time() - (after - start), "upstream_s": after - sent}
        client_data = strip_extras(data, want_ids, want_logprobs)
        if requested is not None:
            client_data["model"] = requested
        record.response = client_data
        acknowledged = await self.pipeline.acknowledge(record)  # committed, or answered without trace headers
        out_headers = self.pipeline.trace_headers(trace_id) if acknowledged else {}
        response = JSONResponse(client_data, headers=out_headers)
        self.metrics.added.labels(request.scope[PATH_KEY]).observe(before + time.perf_counter() - after)
        return response

    async def _sampled_stream(
        self,
        request: Request,
        resp: UpstreamResponse,
        record: CallRecord,
        first_row: Any,
        mode: str,
        sent: float,
        before: float,
        model: str | None,
    ) -> Response:
        """A sampled stream: checked to be a stream with content (else it falls back, in route mode), its
        first row's commit waited for, then relayed; its end written when it ends (see :class:`PolicyStream`).

        :raises _Fallback, ApiError: no stream of ours comes of it (the caller takes the first row back).
        """
        route = mode == "route"
        path = request.scope[PATH_KEY]
        if "text/event-stream" not in (resp.header("content-type") or ""):
            if route:
                await resp.aclose()
                raise _Fallback("bad_response")
            self.pipeline.forget(record)
            return await relayed(resp, self._broken(path))  # record: the upstream's own answer, not recorded
        reader = EventReader(resp.chunks())
        try:
            first = await reader.next_events()
        except UpstreamError as exc:
            await resp.aclose()
            if route:
                raise _Fallback("timeout" if exc.timeout else "unreachable") from exc
            raise self._unreachable(request, exc) from exc
        body = record.request
        stream = PolicyStream(
            record,
            sent=sent,
            want_ids=body.get("return_token_ids") is True,
            want_logprobs=body.get("logprobs") is True,
            model=model,
            on_end=self.pipeline.finish_stream,
        )
        head = stream.feed(first)
        if not first or stream.opened_with_error:
            await resp.aclose()
            if route:
                raise _Fallback("empty_stream" if not first else "bad_response")
            raise ApiError(
                "the upstream's stream is empty or opened with an error",
                status=502,
                code="bad_upstream_response",
                kind="server_error",
            )
        after = time.perf_counter()
        acknowledged = await self.pipeline.acknowledged(first_row, record.trace_id)  # before the first byte
        stream.arm()
        headers = dict(_SSE_HEADERS)
        if acknowledged:
            headers.update(self.pipeline.trace_headers(record.trace_id))
        self.metrics.added.labels(path).observe(before + time.perf_counter() - after)
        return StreamResponse(self._relay(stream, head, reader, resp), headers=headers, on_broken=self._broken(path))

    async def _relay(self, stream: PolicyStream, head: bytes, reader: EventReader, resp: UpstreamResponse) -> Any:
        """The rest of a sampled stream, as :meth:`PolicyStream.feed` makes it; a stream that breaks off
        (or is cut: a client gone, a shutdown) is stored ``aborted`` and the client's response cut too."""
        try:
            if head:
                yield head
            while True:
                events = await reader.next_events()
                if not events:
                    break
                out = stream.feed(events)
                if out:
                    yield out
            stream.end("aborted")  # no [DONE]: a no-op when it came
        except BaseException:
            stream.end("aborted")
            raise
        finally:
            await resp.aclose()

    # -- the other routes ----------------------------------------------------------------------

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
        named = request.headers.get(feedback.TRACE_ID_HEADER)
        if named is not None:  # both headers: the token is checked before the body is read
            feedback.check_token(
                self.secrets.feedback_secret, named, request.headers.get(feedback.FEEDBACK_TOKEN_HEADER)
            )
        body = parse_json(await self._read(request, SMALL_BODY))
        f = self.settings.feedback
        req = feedback.parse(body, f.reward_min, f.reward_max)
        if named is not None and named != req.trace_id:
            raise ApiError(
                f"trace_id {req.trace_id!r} is not the trace of the {feedback.TRACE_ID_HEADER} header ({named!r})",
                param="trace_id",
                code="invalid_value",
            )
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

        Authorised by the trace's feedback token like feedback (a header token is checked before the
        body is read). 200 ``{trace_id, state, scoring}`` for a stored trace that is open (``scoring``:
        the reward calculator scores it now), rewarded or unrewarded (already closed: nothing changes);
        401 for a missing or wrong token, 404 for an unknown trace, 409 for a trace in a batch
        (``committing``/``committed``).
        """
        self._limit(request)
        trace_id = request.path_params["trace_id"]
        header = request.headers.get(feedback.FEEDBACK_TOKEN_HEADER)
        if header is not None:
            feedback.check_token(self.secrets.feedback_secret, trace_id, header)
        raw = await self._read(request, SMALL_BODY)
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

    # -- versions (admin) ----------------------------------------------------------------------

    def _promoter(self, request: Request) -> Any:
        auth.check_admin(request.headers.get("authorization"), self.secrets.admin_key)
        promoter = self.pipeline.promoter
        if promoter is None:
            raise ApiError(
                "this gateway's committer makes no policy versions (committer.kind: local does)",
                status=404,
                code="no_versions",
                kind="not_found_error",
            )
        return promoter

    async def versions(self, request: Request) -> Response:
        """``GET /online/v1/versions`` (admin key): every version, the live one, the latest decisions."""
        promoter = self._promoter(request)
        loop = asyncio.get_running_loop()
        records, decisions = await loop.run_in_executor(None, lambda: (promoter.versions(), promoter.decisions()))
        live = next((v.seq for v in records if v.state == "live"), None)
        return JSONResponse(
            {"live": live, "versions": [v.public() for v in records], "decisions": decisions},
        )

    async def rollback(self, request: Request) -> Response:
        """``POST /online/v1/rollback {"version": N}`` (admin key; no version: the live one's predecessor).

        Waits for a gate check in progress (it holds the same lock); 409 when the version cannot be served again.
        """
        promoter = self._promoter(request)
        raw = await self._read(request, SMALL_BODY)
        body = parse_json(raw) if raw.strip() else {}
        unknown = sorted(set(body) - {"version"})
        if unknown:
            raise ApiError(f"unknown field(s) {unknown}", param=unknown[0], code="unknown_field")
        to = body.get("version")
        if to is not None and (isinstance(to, bool) or not isinstance(to, int)):
            raise ApiError("version: must be a version number (an integer)", param="version", code="invalid_type")
        loop = asyncio.get_running_loop()
        try:
            now = await loop.run_in_executor(
                None, lambda: promoter.rollback(to, reason="an operator asked (admin route)")
            )
        except PromotionError as exc:
            raise ApiError(
                str(exc), status=409, param="version", code="cannot_roll_back", kind="conflict_error"
            ) from exc
        except Exception as exc:
            raise ApiError(
                f"the rollback failed: {type(exc).__name__}: {exc}", status=502, code="rollback_failed"
            ) from exc
        return JSONResponse({"live": now.seq, "name": now.name})
