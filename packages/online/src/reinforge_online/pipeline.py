"""The training path shared by the HTTP gateway and the in-process Python API: one code path, not two.

A :class:`Pipeline` owns the selection strategy, the trace store, the redactor, the policy's
circuit breaker, the reward calculator, the committer and the metrics. The gateway and
:class:`reinforge_online.OnlineChatModel` both ask it whether to sample and hand it the calls
to record, so rewards, feedback and commits behave the same whichever way a call came in.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from reinforge.plugin import ConfigError

from . import feedback
from .committers import Committer, CommitterContext, build_committer
from .config import CHAT_ROUTE, OnlineSettings, Secrets
from .metrics import Metrics
from .outbox import Outbox
from .promotion import Promoter
from .redact import Redactor, resolve_redactor
from .rewards import RewardCalculator, build_composer
from .selection import Selection, SelectionRequest, build_selection, selection_secret, session_of
from .store import CallRecord, StoreUnavailable, TraceClosed, TraceStore, open_store, trace_state
from .versions import VersionedCommitter

__all__ = ["Pipeline", "task_of"]

_log = logging.getLogger("reinforge_online")


def task_of(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the reward calculator's judges get as ``task`` for a request: its ``metadata`` object, if any."""
    meta = body.get("metadata")
    return dict(meta) if isinstance(meta, dict) else None


class Pipeline:
    """Selection, store, redaction, circuit breaker, rewards and committer of one gateway or trainer.

    Everything not given is built from ``settings``: the committer ``committer.kind`` names (a
    plugin's, :mod:`reinforge_online.committers`) with ``committer_context`` (default: from the
    settings, ``where`` and ``policy.url``), unless ``committer`` is given (the caller's, not closed
    here). Nothing starts threads but the store's writer; :meth:`start` starts the reward calculator
    and the outbox, :meth:`close` stops them all.
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
        composer: Any = None,
        committer: Committer | None = None,
        committer_context: CommitterContext | None = None,
        where: str = "online.yaml",
    ) -> None:
        self.settings = settings
        self.secrets = secrets
        self.metrics = metrics or Metrics()
        self.redact = redact or resolve_redactor(settings, where)
        self.selection = selection or build_selection(
            settings.selection, where=where, secret=selection_secret(secrets.feedback_secret)
        )
        self._judges: list[Any] = []
        if composer is None and settings.reward is not None:  # judges first: a bad one fails before any thread starts
            composer = build_composer(settings.reward, where=where, base_dir=settings.base_dir)
            self._judges = [slot.fn for slot in composer.judges]  # built here: closed in close()
        self._owns_committer = committer is None  # built here: closed in close()
        self.committer = committer if committer is not None else self._own_committer(settings, committer_context, where)
        try:
            self.store = store or open_store(
                settings.store, where, on_error=self._store_error, on_health=self._store_health
            )
        except BaseException:
            self._close_committer()
            raise
        self._policy_failures = 0
        self._policy_paused_until = 0.0
        self._drop_lock = threading.Lock()
        self._drop_log: dict[str, tuple[float, int]] = {}  # reason -> (last logged, lines suppressed since)
        self.rewards = self._rewards(settings, composer)
        self.promoter = self._promoter(settings, where)
        self.outbox = self._outbox(settings)
        self._started = False

    def _rewards(self, settings: OnlineSettings, composer: Any) -> RewardCalculator | None:
        r = settings.reward
        if composer is None:
            return None
        low, high = (r.reward_min, r.reward_max) if r is not None else (None, None)  # judges: their own range only
        return RewardCalculator(
            self.store,
            composer,
            close_after_s=r.close_after_s if r is not None else 0.0,
            concurrency=r.concurrency if r is not None else 4,
            queue_size=r.queue_size if r is not None else 1000,
            reward_min=low,
            reward_max=high,
            on_result=self._reward_result,
            on_rewarded=lambda trace_id, reward: self.rewarded(),
        )

    def _own_committer(
        self, settings: OnlineSettings, context: CommitterContext | None, where: str
    ) -> Committer | None:
        """The committer ``committer.kind`` names, its ``committer.args`` checked (None for ``none``)."""
        c = settings.committer
        if context is None:
            context = CommitterContext(
                where=where,
                base_dir=Path(settings.base_dir or Path.cwd()),
                policy_url=settings.policy.url if settings.policy is not None else None,
            )
        return build_committer(c.kind, c.args, context)

    def _promoter(self, settings: OnlineSettings, where: str) -> Promoter | None:
        """The promotion gate and rollback, for a committer that trains the served policy (else None)."""
        if not isinstance(self.committer, VersionedCommitter):
            if settings.gate is not None:
                self._close_committer()
                raise ConfigError(
                    f"{where}: gate: the promotion gate needs a committer that trains the served policy"
                    f" (kind: local); {settings.committer.kind!r} makes no versions"
                )
            return None
        return Promoter(self.store, self.committer, self.metrics, gate=settings.gate, rollback=settings.rollback)

    def _outbox(self, settings: OnlineSettings) -> Outbox | None:
        c = settings.committer
        if self.committer is None:
            return None
        promoter = self.promoter
        return Outbox(
            self.store,
            self.committer,
            interval_s=c.interval_s,
            min_traces=c.min_traces,
            max_traces=c.max_traces,
            retry_s=c.retry_s,
            on_commit=self._batch_committed,
            on_failure=lambda batch_id: self.metrics.batches.labels("failed").inc(),
            target=c.kind if self._owns_committer else type(self.committer).__name__,
            on_start=promoter.start if promoter is not None else None,
            on_sent=(lambda batch_id, version: promoter.on_version(version)) if promoter is not None else None,
            after_pass=promoter.watch if promoter is not None else None,
        )

    def start(self) -> Pipeline:
        """Start the reward calculator and the outbox (once); without a committer, say so in the log."""
        if not self._started:
            self._started = True
            if self.rewards is not None:
                self.rewards.start()
            if self.outbox is not None:
                if self.promoter is not None and self.promoter.gate is None:
                    _log.warning("no promotion gate (gate:): every version the committer trains is served at once")
                self.outbox.start()
            else:
                _log.warning(
                    "no committer configured (committer.kind: none): rewarded traces stay in the store; nothing trains"
                )
        return self

    # -- callbacks -----------------------------------------------------------------------------

    def _reward_result(self, result: str, reason: str | None) -> None:
        if result == "unrewarded":
            self.metrics.unrewarded.labels(reason or "unknown").inc()
        else:
            self.metrics.judged.labels(result).inc()

    def _batch_committed(self, batch_id: str, n: int) -> None:
        self.metrics.batches.labels("committed").inc()
        self.metrics.committed_traces.inc(n)

    def _store_error(self, kind: str) -> None:
        self.metrics.store_errors.labels(kind).inc()

    def _store_health(self, ok: bool) -> None:
        self.metrics.store_healthy.set(1 if ok else 0)

    def rewarded(self, n: int = 1) -> None:
        """``n`` traces got a reward (feedback or judges): the outbox may commit sooner."""
        if self.outbox is not None:
            self.outbox.rewarded(n)

    # -- selection and the policy's circuit breaker ---------------------------------------------

    def select(
        self, headers: Mapping[str, str], body: dict[str, Any], continued: bool = False, session: str | None = None
    ) -> tuple[bool, str | None]:
        """Whether to sample (never while the store or policy is unhealthy) and the request's session.

        A request that continues a trace is sampled whenever sampling is not paused.
        """
        if session is None:
            session = session_of(headers, body, self.settings.selection.session_header)
        if not self.store.healthy:
            self.metrics.paused.labels("store").inc()
            return False, session
        if self._policy_paused_until and time.monotonic() < self._policy_paused_until:
            self.metrics.paused.labels("policy").inc()
            return False, session
        if continued:
            return True, session
        try:
            chosen = bool(self.selection.select(SelectionRequest(CHAT_ROUTE, headers, body, session)))
        except Exception:
            _log.exception("the selection strategy raised; the request is not sampled")
            return False, session
        return chosen, session

    def policy_failed(self) -> None:
        """A circuit breaker: after ``failures_before_pause`` failures in a row sampling pauses for ``pause_s``.

        The first sampled request after the pause tries the policy again; a failure pauses it again.
        """
        p = self.settings.policy
        self._policy_failures += 1
        if p is not None and self._policy_failures >= p.failures_before_pause:
            self._policy_paused_until = time.monotonic() + p.pause_s
            self.metrics.policy_healthy.set(0)

    def policy_ok(self) -> None:
        self._policy_failures, self._policy_paused_until = 0, 0.0
        self.metrics.policy_healthy.set(1)

    # -- recording -----------------------------------------------------------------------------

    def trace_headers(self, trace_id: str) -> dict[str, str]:
        """The headers that let a caller continue the trace and send its feedback."""
        return {
            feedback.TRACE_ID_HEADER: trace_id,
            feedback.FEEDBACK_TOKEN_HEADER: self.feedback_token(trace_id),
        }

    def feedback_token(self, trace_id: str) -> str:
        return feedback.feedback_token(self.secrets.feedback_secret, trace_id)

    async def acknowledge(self, call: CallRecord) -> bool:
        """Record ``call`` and wait until its transaction committed, at most ``store.ack_timeout_ms``.

        True means the call is durable: only then may its caller be given the trace id. False means it
        is not (redacted away, the trace takes no more calls, or dropped: counted in
        ``reinforge_online_traces_dropped_total{reason}`` and logged); the caller answers without trace
        headers. A write still queued when the wait ends is cancelled; one already running may still
        commit, unacknowledged (nobody was told its trace id).
        """
        return await self.acknowledged(self.record_future(call), call.trace_id)

    async def acknowledged(self, future: Future[Any] | None, trace_id: str) -> bool:
        """:meth:`acknowledge` for a call already handed to :meth:`record_future` (its future, or None).

        A stream's first row is queued before the policy is asked, so its commit overlaps the policy's
        answer; this waits for it once the answer is there.
        """
        if future is None:
            return False
        wrapped = asyncio.wrap_future(future)
        try:
            await asyncio.wait_for(asyncio.shield(wrapped), self.settings.store.ack_timeout_ms / 1000)
        except asyncio.TimeoutError:
            future.cancel()
            wrapped.cancel()
            self.dropped("timeout", trace_id, f"not committed within {self.settings.store.ack_timeout_ms} ms")
            return False
        except TraceClosed:
            return False  # counted as a closed trace's call where the write failed
        except StoreUnavailable as exc:
            self.dropped(exc.reason, trace_id, str(exc))
            return False
        except Exception as exc:
            self.dropped("invalid", trace_id, f"{type(exc).__name__}: {exc}")
            return False
        return True

    def forget(self, call: CallRecord) -> None:
        """Take back a call queued before the policy answered, which it then did not (a fallback): its row,
        and its trace's when the call was the trace's only one. Queued after the call's own write."""
        with contextlib.suppress(StoreUnavailable):  # then the call's own write was not taken either
            self.store.submit(call.forget)

    def dropped(self, reason: str, trace_id: str, detail: str) -> None:
        """A sampled call the store did not take: counted, and logged (once a second per reason, with a count)."""
        self.metrics.traces_dropped.labels(reason).inc()
        now = time.monotonic()
        with self._drop_lock:
            last, suppressed = self._drop_log.get(reason, (0.0, 0))
            if now - last < 1.0:
                self._drop_log[reason] = (last, suppressed + 1)
                return
            self._drop_log[reason] = (now, 0)
        more = f" ({suppressed} more since the last line)" if suppressed else ""
        _log.warning(
            "trace %s not acknowledged (%s: %s): answered without trace headers%s", trace_id, reason, detail, more
        )

    def finish_stream(self, call: CallRecord, state: str) -> None:
        """A streamed call ended (``complete``, ``aborted`` or ``failed``): its response appended to its row.

        Queued, not waited for: the stream's end goes to the client right after, and a feedback or close
        sent then is ordered after this write on the writer thread. Once it commits, the trace's close
        clock (re)starts.
        """
        if self.redact is not None:
            try:
                redacted = self.redact(copy.deepcopy(call))
            except Exception:
                _log.exception("the redactor raised; the stream's response is not stored")
                self.metrics.redacted.labels("error").inc()
                redacted = None
            if redacted is None:  # the call's row keeps no response: marked ended, without it
                redacted = CallRecord(call.trace_id, call.call_id, call.route, call.mode, call.request, {})
            call = redacted
        trace_id = call.trace_id
        try:
            future = self.store.submit(lambda db: call.finish(db, state), durable=False)  # the ack was the first row's
        except StoreUnavailable as exc:
            _log.warning("the end of trace %s's stream is not stored (%s): its call stays 'streaming'", trace_id, exc)
            return
        self.metrics.streams.labels(state).inc()

        def done(f: Future[Any]) -> None:
            if f.exception() is None and f.result() and self.rewards is not None:
                self.rewards.touched(trace_id)

        future.add_done_callback(done)

    def record_future(self, call: CallRecord) -> Future[Any] | None:
        """Redact ``call`` and queue it for the store; the store's future (resolved once the call is
        acknowledged), or None when the call is not stored (redacted away, or the store refused it: counted).

        A redactor that raises keeps the call out of the store (fail closed for privacy). Once the
        call is acknowledged the reward calculator's clock for its trace (re)starts (a streamed call's
        once its end is written).
        """
        if self.redact is not None:
            try:  # on a copy: the client's response may still be on its way
                redacted = self.redact(copy.deepcopy(call))
            except Exception:
                _log.exception("the redactor raised; the call is not stored")
                self.metrics.redacted.labels("error").inc()
                return None
            if redacted is None:
                self.metrics.redacted.labels("dropped").inc()
                return None
            call = redacted
        try:
            future = self.store.record(call)
        except StoreUnavailable as exc:
            self.dropped(exc.reason, call.trace_id, str(exc))
            return None
        trace_id, streaming = call.trace_id, call.state == "streaming"

        def done(f: Any) -> None:
            if f.cancelled():
                return
            exc = f.exception()
            if exc is None:
                self.metrics.recorded.inc()
                if self.rewards is not None and not streaming:
                    self.rewards.touched(trace_id)
            elif isinstance(exc, TraceClosed):
                self.metrics.closed_trace_calls.inc()

        future.add_done_callback(done)
        return future

    def feedback(self, req: feedback.FeedbackRequest) -> Future[feedback.FeedbackOutcome]:
        """Apply one (already authorised, range-checked) feedback on the writer thread: conflict policy, idempotency.

        :raises StoreUnavailable: the store does not take writes now.
        """
        conflict = self.settings.feedback.conflict
        future = self.store.submit(lambda db: feedback.apply_feedback(db, req, req.reward, conflict))

        def done(fut: Future[feedback.FeedbackOutcome]) -> None:
            if fut.exception() is None and fut.result().body.get("status") == "recorded":
                self.rewarded()

        future.add_done_callback(done)
        return future

    def close_trace(self, trace_id: str) -> None:
        """The episode of ``trace_id`` ended: score it now (when a reward calculator is configured)."""
        if self.rewards is not None:
            self.rewards.close_trace(trace_id)

    def close_stored_trace(self, trace_id: str) -> Future[str | None]:
        """:meth:`close_trace` for a trace the store is asked about first (the gateway's close endpoint).

        The future resolves to the trace's status, read on the writer thread after every write queued
        before it (so a close sent right after the response finds its trace), or None when it is not
        stored. Only an ``open`` trace is handed to the reward calculator; any other is left as it is.

        :raises StoreUnavailable: the store does not take writes now.
        """
        future: Future[str | None] = self.store.submit(lambda db: trace_state(db, trace_id))

        def done(f: Future[str | None]) -> None:
            if f.exception() is None and f.result() == "open":
                self.close_trace(trace_id)

        future.add_done_callback(done)
        return future

    # -- shutdown ------------------------------------------------------------------------------

    def _close_committer(self) -> None:
        """``close()`` the committer built here, once (a given one belongs to its caller)."""
        closer = getattr(self.committer, "close", None) if self._owns_committer else None
        self._owns_committer = False
        if closer is None:
            return
        try:
            closer()
        except Exception:
            _log.exception("closing the committer %s failed", type(self.committer).__name__)

    def close(self, timeout: float = 10.0) -> bool:
        """Finish scoring, a last commit, drain the store, all within ``timeout``; whether it all finished.

        Never raises: a committer that is down leaves its batch ``committing`` for the next start.
        """
        deadline = time.monotonic() + timeout
        ok = True

        def left() -> float:
            return max(0.1, deadline - time.monotonic())

        for part in (self.rewards, self.outbox):
            if part is None:
                continue
            try:
                ok = part.stop(timeout=left()) and ok
            except Exception:
                _log.exception("stopping %s failed", type(part).__name__)
                ok = False
        self._close_committer()
        for judge in self._judges:
            try:
                judge.close()
            except Exception:
                _log.exception("closing the judge %s failed", judge.name)
        self._judges = []
        try:
            ok = self.store.close(timeout=left()) and ok
        except Exception:
            _log.exception("closing the trace store failed")
            ok = False
        return ok
