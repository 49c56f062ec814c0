"""The outbox: rewarded traces leave in batches, handed to the committer through a transactional outbox.

Every ``interval_s`` seconds, or as soon as ``min_traces`` traces got a reward, one store
transaction *claims* the rewarded traces not yet in a batch: it writes the batch row
(state ``committing``, a new batch id) and points the traces at it. Only then is the batch
handed to the committer (:class:`reinforge_online.committers.Committer`), built from what the
store holds for that id, so a resend is identical; a second transaction marks the batch and its
traces ``committed``. A crash or a failed send leaves the batch ``committing``: it is sent again,
with the same id, before anything new (after a restart too). A committer must therefore accept the
same batch id twice; the ``sink`` committer writes ``batch-<id>.jsonl`` atomically, so a resend
replaces the file with the same bytes.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .store import TraceStore

if TYPE_CHECKING:
    from .committers import Committer

__all__ = ["Outbox", "batch_rows"]

_log = logging.getLogger("reinforge_online.outbox")


def _claim(db: Any, store: TraceStore, max_traces: int, at_least: int = 1, target: str = "committer") -> str | None:
    """In the writer's transaction: a new batch of rewarded traces, or None when fewer than ``at_least`` wait.

    Replicas on one PostgreSQL database skip the rows another one's claim holds (``store.for_update``).
    """
    rows = db.execute(
        "SELECT trace_id FROM traces WHERE status = 'rewarded' AND batch_id IS NULL ORDER BY created_at, rowid LIMIT ?"
        + store.for_update,
        (max_traces,),
    ).fetchall()
    if not rows or len(rows) < at_least:
        return None
    batch_id = uuid.uuid4().hex
    store.lock_batch(db, batch_id)  # new: nobody else can hold it
    db.execute(
        "INSERT INTO batches (batch_id, state, created_at, traces, target) VALUES (?, 'committing', ?, ?, ?)",
        (batch_id, time.time(), len(rows), target),
    )
    db.executemany(
        "UPDATE traces SET batch_id = ?, status = 'committing' WHERE trace_id = ?", [(batch_id, r[0]) for r in rows]
    )
    return batch_id


def _done(db: Any, batch_id: str) -> None:
    db.execute("UPDATE batches SET state = 'committed' WHERE batch_id = ?", (batch_id,))
    db.execute("UPDATE traces SET status = 'committed' WHERE batch_id = ?", (batch_id,))


def _waiting(db: Any) -> int:
    row = db.execute("SELECT COUNT(*) FROM traces WHERE status = 'rewarded' AND batch_id IS NULL").fetchone()
    return int(row[0])


def _pending(db: Any, store: TraceStore) -> list[str]:
    """The batches left ``committing`` that no other replica is sending (locked first, then checked again)."""
    found = [r[0] for r in db.execute("SELECT batch_id FROM batches WHERE state = 'committing' ORDER BY created_at")]
    mine = []
    for batch_id in found:
        if store.lock_batch(db, batch_id):
            row = db.execute("SELECT state FROM batches WHERE batch_id = ?", (batch_id,)).fetchone()
            if row is not None and row[0] == "committing":  # not committed by its sender meanwhile
                mine.append(batch_id)
            else:
                store.release_batch(batch_id)
    return mine


def batch_rows(store: TraceStore, batch_id: str) -> list[dict[str, Any]]:
    """What a batch holds, one dict per trace (its calls, reward, session), in a stable order."""
    rows = []
    for trace_id in store.batch_trace_ids(batch_id):
        trace = store.trace(trace_id)
        if trace is not None:
            rows.append({"batch_id": batch_id, **trace})
    return rows


class Outbox:
    """A thread handing rewarded traces to ``committer`` in batches (see the module docstring).

    :param target: what the batches table records as the batches' destination (the committer's kind).
    :param on_commit: called with the batch id and its size once a batch is committed.
    :param on_failure: called with the batch id when sending it failed (it is retried).
    :param on_start: called on the outbox's thread before anything is sent (and again before the next pass
        while it raises): the promotion gate's start.
    :param on_sent: called with the batch id and what ``send`` returned once a batch is committed, when that is
        not None (a :class:`~reinforge_online.versions.Version`: the gate decides whether it is served).
    :param after_pass: called after every pass (the rollback watch).
    """

    def __init__(
        self,
        store: TraceStore,
        committer: Committer,
        *,
        interval_s: float = 300.0,
        min_traces: int = 100,
        max_traces: int = 1000,
        retry_s: float = 1.0,
        on_commit: Callable[[str, int], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
        target: str = "committer",
        on_start: Callable[[], None] | None = None,
        on_sent: Callable[[str, Any], object] | None = None,
        after_pass: Callable[[], Any] | None = None,
    ) -> None:
        self.store = store
        self.committer = committer
        self.target = target
        self.interval_s = interval_s
        self.min_traces = min_traces
        self.max_traces = max_traces
        self.retry_s = retry_s
        self._on_commit = on_commit or (lambda batch_id, n: None)
        self._on_failure = on_failure or (lambda batch_id: None)
        self._on_start = on_start
        self._on_sent = on_sent
        self._after_pass = after_pass
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._flush = True
        self.last_pass_ok = True  # whether the last pass sent everything it claimed
        self._rewarded = 0
        self._failures = 0
        self._lock = threading.Condition()
        self.committed: list[str] = []  # batch ids committed through this outbox, in order
        self._thread = threading.Thread(target=self._run, name="reinforge-online-outbox", daemon=True)

    def start(self) -> Outbox:
        self._thread.start()
        return self

    def rewarded(self, n: int = 1) -> None:
        """``n`` more traces got a reward: commit now once ``min_traces`` are waiting."""
        with self._lock:
            self._rewarded += n
            due = self._rewarded >= self.min_traces
        if due:
            self._wake.set()

    def wait_committed(self, n: int, timeout: float | None = None) -> bool:
        """Wait until ``n`` batches went out through this outbox and were committed; whether they did."""
        with self._lock:
            return self._lock.wait_for(lambda: len(self.committed) >= n, timeout)

    def run_once(self) -> list[str]:
        """Send the batches left ``committing``, then claim and send what waits; the ids committed.

        The first new batch takes whatever waits (the interval is up, or ``min_traces`` arrived); more
        batches follow in the same pass only while a full one waits (``min_traces``, at most
        ``max_traces``), so traces that arrive while a slow committer works wait for the next pass instead of
        going out in a stream of tiny batches.

        :raises Exception: what the store or the committer raised (the batch stays ``committing``).
        """
        self._begin()
        done = []
        for batch_id in self.store.submit(lambda db: _pending(db, self.store)).result():
            self._send(batch_id)
            done.append(batch_id)
        at_least = 1
        while True:
            claim = functools.partial(
                _claim, store=self.store, max_traces=self.max_traces, at_least=at_least, target=self.target
            )
            batch_id = self.store.submit(claim).result()
            at_least = min(self.min_traces, self.max_traces)
            if batch_id is None:
                return done
            with self._lock:
                self._rewarded = 0
            self._send(batch_id)
            done.append(batch_id)

    def _begin(self) -> None:
        """``on_start`` once, before the first send (again at the next pass while it raises)."""
        if self._on_start is not None:
            self._on_start()
            self._on_start = None

    def _send(self, batch_id: str) -> None:
        rows = batch_rows(self.store, batch_id)
        try:
            made = self.committer.send(batch_id, rows)
        except Exception:
            self._on_failure(batch_id)
            raise
        self.store.submit(lambda db: _done(db, batch_id)).result()
        self.store.release_batch(batch_id)  # after the commit: another replica never sees it unlocked yet committing
        with self._lock:
            self.committed.append(batch_id)
            self._lock.notify_all()
        self._on_commit(batch_id, len(rows))
        if made is not None and self._on_sent is not None:
            self._on_sent(batch_id, made)

    def _resume(self) -> None:
        """At start: resend the batches a crash left ``committing``; count the rewarded traces waiting."""
        self._begin()
        for batch_id in self.store.submit(lambda db: _pending(db, self.store)).result():
            self._send(batch_id)
        self.rewarded(self.store.submit(_waiting).result())

    def _attempt(self, work: Callable[[], Any]) -> float:
        """Run ``work``; the wait before the next pass (the interval, or a growing backoff after failures)."""
        try:
            work()
        except Exception:
            self.last_pass_ok = False
            self._failures += 1
            wait = min(self.interval_s, self.retry_s * 2 ** min(self._failures - 1, 16))
            if self._stop.is_set():
                _log.exception("committing a batch failed while stopping; it is resent at the next start")
            else:
                _log.exception("committing a batch failed; retrying in %.2f s", wait)
            return wait
        self.last_pass_ok = True
        self._failures = 0
        return self.interval_s

    def _run(self) -> None:
        wait = self._attempt(self._resume)
        while True:
            self._wake.wait(wait)  # the interval, or woken by rewards (or stop)
            if self._stop.is_set():
                if self._flush:
                    self._attempt(self.run_once)  # a last pass; a failure leaves the batch for the next start
                return
            self._wake.clear()
            wait = self._attempt(self._pass)

    def _pass(self) -> None:
        self.run_once()
        if self._after_pass is not None:
            self._after_pass()

    def stop(self, timeout: float = 10.0, *, flush: bool = True) -> bool:
        """Stop the thread, after a last pass when ``flush`` (within ``timeout``); whether it stopped with
        nothing left unsent.

        Never raises: a batch the committer does not take stays ``committing`` and is resent at the next start.
        """
        self._flush = flush
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive() and self.last_pass_ok
