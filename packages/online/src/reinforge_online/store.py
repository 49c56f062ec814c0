"""The trace store: SQLite in WAL mode, written by one thread with group commit.

Requests never wait on the disk: they hand a write to :meth:`TraceStore.submit` (a
bounded queue) and go on. The writer thread takes every queued write it can (up to
``batch_max``), runs them in one transaction and commits; a write is *acknowledged*
(its future resolves) only once that transaction committed, so an acknowledged trace
survives a crash of the process. Each write runs inside its own savepoint, so one
failing write does not undo the others of its group.

A full queue or a failed commit (locked or broken database) marks the store unhealthy:
the write is dropped and counted, the gateway stops sampling, and the writer probes with
a small write every ``probe_interval_s`` until one commits. Everything is JSON text
(``json.dumps``), never pickle.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .config import StoreSettings

__all__ = ["SCHEMA_VERSION", "CallRecord", "StoreUnavailable", "TraceClosed", "TraceStore", "open_store"]

_log = logging.getLogger("reinforge_online.store")
SCHEMA_VERSION = 2  # 2: calls.state (a stream's call is stored when it starts, completed when it ends); the
# versions and decisions tables (policy versions and the promotion gate's decisions: created with the others)
T = TypeVar("T")
Write = Callable[[sqlite3.Connection], Any]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS traces (
    {rowid}trace_id TEXT PRIMARY KEY,
    session_id TEXT,
    route TEXT NOT NULL,
    mode TEXT NOT NULL,
    created_at {real} NOT NULL,
    status TEXT NOT NULL DEFAULT 'open',
    batch_id TEXT,
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS calls (
    {rowid}call_id TEXT PRIMARY KEY,
    trace_id TEXT NOT NULL REFERENCES traces(trace_id),
    created_at {real} NOT NULL,
    policy_version TEXT,
    request TEXT NOT NULL,
    response TEXT NOT NULL,
    prompt_token_ids TEXT,
    token_ids TEXT,
    logprobs TEXT,
    timing TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'complete'
);
CREATE INDEX IF NOT EXISTS calls_by_trace ON calls(trace_id);
CREATE TABLE IF NOT EXISTS rewards (
    trace_id TEXT PRIMARY KEY REFERENCES traces(trace_id),
    reward {real} NOT NULL,
    source TEXT NOT NULL,
    created_at {real} NOT NULL
);
CREATE TABLE IF NOT EXISTS feedback (
    trace_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    status INTEGER NOT NULL,
    body TEXT NOT NULL,
    created_at {real} NOT NULL,
    PRIMARY KEY (trace_id, idempotency_key)
);
CREATE TABLE IF NOT EXISTS versions (
    seq INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at {real} NOT NULL,
    parent INTEGER,
    score {real},
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS decisions (
    at {real} NOT NULL,
    version INTEGER,
    decision TEXT NOT NULL,
    reason TEXT NOT NULL,
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS batches (
    batch_id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    created_at {real} NOT NULL,
    traces INTEGER NOT NULL,
    target TEXT
);
"""


def schema(*, real: str = "REAL", rowid: str = "") -> list[str]:
    """The schema's statements for one database: ``real`` is its 64-bit float type, ``rowid`` the column
    definition (with its comma) that numbers traces and calls in insertion order where it has no ``rowid``.
    """
    text = _SCHEMA.replace("{real}", real).replace("{rowid}", rowid)  # not format(): the SQL has braces
    return [statement.strip() for statement in text.split(";") if statement.strip()]


# what each schema version adds to the one before (run in the migration's transaction)
UPGRADES: dict[int, list[str]] = {2: ["ALTER TABLE calls ADD COLUMN state TEXT NOT NULL DEFAULT 'complete'"]}
CALL_STATES = ("complete", "streaming", "aborted", "failed")

PROBE_SQL = (
    "INSERT INTO meta (key, value) VALUES ('last_probe', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)


class TraceClosed(Exception):
    """A call continues a trace that has its reward, is in a batch or is full: it is not recorded."""


class StoreUnavailable(Exception):
    """The write was not accepted (queue full, store closed or unhealthy) or did not commit.

    ``reason`` says which: ``queue_full``, ``closed``, ``unhealthy`` or ``write_failed``.
    """

    def __init__(self, message: str, reason: str = "write_failed") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class CallRecord:
    """One model call of a sampled request, as it is stored (all plain JSON data)."""

    trace_id: str
    call_id: str
    route: str
    mode: str
    request: dict[str, Any]
    response: dict[str, Any]
    session_id: str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    policy_version: str | None = None
    timing: dict[str, float] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    task: dict[str, Any] | None = None  # what the reward calculator's judges get as ``task`` (kept with the trace)
    state: str = "complete"  # ``streaming`` until a stream's end is written (:func:`finish_call`)

    def write(self, db: sqlite3.Connection, max_calls: int | None = None) -> None:
        """Insert the call, and its trace unless the call continues one (which must still be open).

        :raises TraceClosed: the trace already has a reward, is in a batch, or has ``max_calls`` calls.
        """
        created = db.execute(
            "INSERT INTO traces (trace_id, session_id, route, mode, created_at, data) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (trace_id) DO NOTHING",
            (
                self.trace_id,
                self.session_id,
                self.route,
                self.mode,
                self.created_at,
                _dumps({"task": self.task} if self.task is not None else {}),
            ),
        )
        if created.rowcount == 0:  # the call continues a trace: it must still take calls
            (status,) = db.execute("SELECT status FROM traces WHERE trace_id = ?", (self.trace_id,)).fetchone()
            if status != "open":
                raise TraceClosed(f"trace {self.trace_id!r} is {status}: it takes no more calls")
            if max_calls is not None:
                (n,) = db.execute("SELECT COUNT(*) FROM calls WHERE trace_id = ?", (self.trace_id,)).fetchone()
                if n >= max_calls:
                    raise TraceClosed(f"trace {self.trace_id!r} has {n} calls, the most a trace may have")
        db.execute(
            "INSERT INTO calls (call_id, trace_id, created_at, policy_version, request, response, prompt_token_ids,"
            " token_ids, logprobs, timing, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                self.call_id,
                self.trace_id,
                self.created_at,
                self.policy_version,
                _dumps(self.request),
                _dumps(self.response),
                _dumps_opt(self.prompt_token_ids),
                _dumps_opt(self.token_ids),
                _dumps_opt(self.logprobs),
                _dumps(self.timing),
                self.state,
            ),
        )

    def finish(self, db: sqlite3.Connection, state: str) -> bool:
        """A streamed call's end: its response, token ids and timing, and ``state`` (see :data:`CALL_STATES`).

        Only a call still ``streaming`` is changed, and not once its trace is in a batch (what a batch
        holds never changes under a resend); whether the call was changed.
        """
        row = db.execute(
            "SELECT c.state, t.status FROM calls c JOIN traces t ON t.trace_id = c.trace_id WHERE c.call_id = ?",
            (self.call_id,),
        ).fetchone()
        if row is None or row[0] != "streaming" or row[1] in ("committing", "committed"):
            return False
        db.execute(
            "UPDATE calls SET response = ?, prompt_token_ids = ?, token_ids = ?, logprobs = ?, timing = ?, state = ?,"
            " policy_version = ? WHERE call_id = ?",
            (
                _dumps(self.response),
                _dumps_opt(self.prompt_token_ids),
                _dumps_opt(self.token_ids),
                _dumps_opt(self.logprobs),
                _dumps(self.timing),
                state,
                self.policy_version,
                self.call_id,
            ),
        )
        return True

    def forget(self, db: sqlite3.Connection) -> None:
        """Delete this call, and its trace when nothing else is in it (a call that never got an answer)."""
        db.execute("DELETE FROM calls WHERE call_id = ? AND state = 'streaming'", (self.call_id,))
        (left,) = db.execute("SELECT COUNT(*) FROM calls WHERE trace_id = ?", (self.trace_id,)).fetchone()
        if not left:
            for table in ("feedback", "rewards", "traces"):
                db.execute(f"DELETE FROM {table} WHERE trace_id = ?", (self.trace_id,))  # a fixed table name


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def _dumps_opt(value: Any) -> str | None:
    return None if value is None else _dumps(value)


def _loads_opt(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _sweep(db: sqlite3.Connection, before: float) -> int:
    """Delete traces created before ``before`` that are open, unrewarded (never rewarded) or committed; how many.

    Rewarded traces waiting for the committer and batches being sent are kept.
    """
    ids = [
        r[0]
        for r in db.execute(
            "SELECT trace_id FROM traces WHERE created_at < ? AND status IN ('open', 'unrewarded', 'committed')",
            (before,),
        )
    ]
    for table in ("calls", "rewards", "feedback", "traces"):
        db.executemany(f"DELETE FROM {table} WHERE trace_id = ?", [(t,) for t in ids])  # a fixed table name
    return len(ids)


def trace_state(db: sqlite3.Connection, trace_id: str) -> str | None:
    """In the writer's transaction: the trace's status (``open``, ``rewarded``, ``unrewarded``, ``committing``,
    ``committed``), or None when it is not stored.
    """
    row = db.execute("SELECT status FROM traces WHERE trace_id = ?", (trace_id,)).fetchone()
    return None if row is None else str(row[0])


def connect(path: str, busy_timeout_ms: int = 1000) -> sqlite3.Connection:
    """A connection in WAL mode with the schema in place (autocommit: transactions are explicit)."""
    db = sqlite3.connect(path, timeout=busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False)
    db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        db.close()
        raise sqlite3.OperationalError(f"{path}: cannot switch the database to WAL mode (got {mode})")
    db.execute("PRAGMA synchronous = FULL")  # acknowledged means on disk, power loss included
    db.execute("PRAGMA foreign_keys = ON")
    return db


def migrate(db: Any, where: str, statements: list[str], begin: str = "BEGIN IMMEDIATE") -> None:
    """Create the tables if missing, upgrade an older schema (:data:`UPGRADES`) and record (or check) the
    schema version, in one transaction.

    ``begin`` starts it (statements separated by ``;``: it may take a lock, so that replicas starting
    together do not race).
    """
    for sql in begin.split(";"):
        if sql.strip():
            db.execute(sql)
    try:
        for statement in statements:
            db.execute(statement)
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            db.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) > SCHEMA_VERSION:
            raise sqlite3.DatabaseError(
                f"{where}: schema version {row[0]} is newer than this reinforge-online's ({SCHEMA_VERSION})"
            )
        elif int(row[0]) < SCHEMA_VERSION:
            for version in range(int(row[0]) + 1, SCHEMA_VERSION + 1):
                for statement in UPGRADES.get(version, ()):
                    db.execute(statement)
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


@dataclass
class _Item:
    write: Write
    future: Future[Any]
    durable: bool = True  # False: may wait for the next durable commit to reach the disk (see ``submit``)


_STOP = object()


class TraceStore:
    """Durable traces in one SQLite file; writes go through :meth:`submit` (see the module docstring).

    The writer and the reads are the same for every database; a subclass for another one
    (:class:`~reinforge_online.pgstore.PostgresTraceStore`) changes only how it connects, how a
    transaction begins, which errors are the database's own, and how batches are locked.

    :param on_error: called with ``"queue_full"`` or ``"write_failed"`` whenever a write is dropped
        (the gateway counts them in its metrics).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        queue_size: int = 10000,
        batch_max: int = 512,
        busy_timeout_ms: int = 1000,
        probe_interval_s: float = 1.0,
        ttl_s: float | None = None,
        sweep_interval_s: float = 60.0,
        max_calls_per_trace: int = 256,
        on_error: Callable[[str], None] | None = None,
        on_health: Callable[[bool], None] | None = None,
    ) -> None:
        self.path = str(path)
        self._init(
            queue_size=queue_size,
            batch_max=batch_max,
            busy_timeout_ms=busy_timeout_ms,
            probe_interval_s=probe_interval_s,
            ttl_s=ttl_s,
            sweep_interval_s=sweep_interval_s,
            max_calls_per_trace=max_calls_per_trace,
            on_error=on_error,
            on_health=on_health,
        )

    # what differs between databases ----------------------------------------------------------------
    begin = "BEGIN IMMEDIATE"  # takes the write lock up front: no deadlock between two writers
    database_errors: tuple[type[BaseException], ...] = (sqlite3.OperationalError,)  # the group fails, not the write
    for_update = ""  # appended to the committer's claim: SQLite's writer lock already serializes claims

    def _connect(self) -> tuple[Any, Any]:
        """The writer's connection (schema in place) and the readers'."""
        db = connect(self.path, self.busy_timeout_ms)
        migrate(db, self.path, schema())
        return db, connect(self.path, self.busy_timeout_ms)

    def _in_transaction(self, db: Any) -> bool:
        return bool(db.in_transaction)

    _synchronous = "FULL"

    def _durability(self, db: Any, lazy: bool) -> None:
        """Before a transaction: SQLite's ``synchronous`` for it (FULL: on disk at commit; NORMAL: WAL frames
        written, fsynced with the next FULL commit or checkpoint)."""
        wanted = "NORMAL" if lazy else "FULL"
        if wanted != self._synchronous:
            db.execute(f"PRAGMA synchronous = {wanted}")  # one of two constants
            self._synchronous = wanted

    def _lazy_transaction(self, db: Any) -> None:
        """Inside a transaction of non-durable writes only (PostgreSQL sets it here; SQLite before it)."""

    def _reconnect(self) -> None:
        """Before a probe: a connection the database dropped is opened again (SQLite's never drops)."""

    def lock_batch(self, db: Any, batch_id: str) -> bool:
        """In the writer's transaction: whether this store may send ``batch_id`` (no other replica is sending it)."""
        return True

    def release_batch(self, batch_id: str) -> None:
        """After a batch is committed: let other replicas see it is nobody's (a no-op for one SQLite file)."""

    def _init(
        self,
        *,
        queue_size: int,
        batch_max: int,
        busy_timeout_ms: int,
        probe_interval_s: float,
        ttl_s: float | None,
        sweep_interval_s: float,
        max_calls_per_trace: int,
        on_error: Callable[[str], None] | None,
        on_health: Callable[[bool], None] | None,
    ) -> None:
        self.batch_max = batch_max
        self.probe_interval_s = probe_interval_s
        self.ttl_s = ttl_s
        self.sweep_interval_s = sweep_interval_s
        self.max_calls_per_trace = max_calls_per_trace
        self._next_sweep = time.monotonic()  # the first sweep right after start
        self.swept = 0  # traces deleted by TTL sweeps
        self.busy_timeout_ms = busy_timeout_ms
        self._on_error = on_error or (lambda kind: None)
        self._on_health = on_health or (lambda ok: None)
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._healthy = True
        self._health = threading.Condition()
        self._closed = False
        self.commits = 0  # transactions committed (group commit: many writes each)
        self._db, self._reader = self._connect()
        self._read_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="reinforge-online-store", daemon=True)
        self._thread.start()

    # -- health --------------------------------------------------------------------------------

    @property
    def healthy(self) -> bool:
        """Whether writes are accepted (the gateway samples only while this holds)."""
        return self._healthy and not self._closed

    def _set_healthy(self, ok: bool) -> None:
        with self._health:
            changed = ok != self._healthy
            self._healthy = ok
            self._health.notify_all()
        if changed:
            self._on_health(ok)

    def wait_healthy(self, healthy: bool = True, timeout: float | None = None) -> bool:
        """Wait until the store's health is ``healthy``; whether it is."""
        with self._health:
            return self._health.wait_for(lambda: self._healthy == healthy, timeout)

    # -- writes --------------------------------------------------------------------------------

    def submit(self, write: Write, *, durable: bool = True) -> Future[Any]:
        """Queue ``write(db)`` for the writer thread; its future resolves once its transaction committed.

        ``durable=False`` (a stream's completion, appended after its call was acknowledged): a transaction of
        such writes only is committed without waiting for the disk (SQLite's ``synchronous=NORMAL`` in WAL
        mode, PostgreSQL's ``synchronous_commit = off``): it survives a crash of the process at once and a
        power loss with the next durable commit, and does not hold up the acknowledgements queued behind it.

        :raises StoreUnavailable: the store is closed, unhealthy or its queue is full (the write is dropped).
        """
        if self._closed:
            raise StoreUnavailable("the trace store is closed", "closed")
        if not self._healthy:
            raise StoreUnavailable(
                "the trace store is unhealthy (writes paused until a probe write succeeds)", "unhealthy"
            )
        future: Future[Any] = Future()
        try:
            self._queue.put_nowait(_Item(write, future, durable))
        except queue.Full:
            self._on_error("queue_full")
            self._set_healthy(False)
            _log.warning("the trace store's write queue is full (%d writes): writes pause", self._queue.maxsize)
            raise StoreUnavailable("the trace store's write queue is full", "queue_full") from None
        return future

    def record(self, call: CallRecord) -> Future[Any]:
        """Queue one call (and its trace row) for writing; see :meth:`submit`.

        A call beyond ``max_calls_per_trace`` of its trace fails with :class:`TraceClosed`.
        """
        cap = self.max_calls_per_trace
        return self.submit(lambda db: call.write(db, max_calls=cap))

    def _timeout(self) -> float | None:
        """How long the writer may wait for work: until the next probe or sweep."""
        waits = [] if self._healthy else [self.probe_interval_s]
        if self.ttl_s is not None:
            waits.append(max(0.0, self._next_sweep - time.monotonic()))
        return min(waits) if waits else None

    def _maybe_sweep(self) -> None:
        if self.ttl_s is None or not self._healthy or time.monotonic() < self._next_sweep:
            return
        self._next_sweep = time.monotonic() + self.sweep_interval_s
        item = _Item(lambda db: _sweep(db, time.time() - (self.ttl_s or 0.0)), Future())
        self._commit([item])
        if item.future.exception() is None:
            with self._health:
                self.swept += int(item.future.result())
                self._health.notify_all()

    def sweep(self, ttl_s: float) -> Future[Any]:
        """Queue a sweep of traces older than ``ttl_s`` (see ``ttl_s``); its future holds how many went."""
        return self.submit(lambda db: _sweep(db, time.time() - ttl_s))

    def wait_swept(self, n: int, timeout: float | None = None) -> bool:
        """Wait until the periodic sweeps deleted ``n`` traces in all; whether they did."""
        with self._health:
            return self._health.wait_for(lambda: self.swept >= n, timeout)

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=self._timeout())
            except queue.Empty:
                if not self._healthy:
                    self._probe()
                self._maybe_sweep()
                continue
            if first is _STOP:
                return
            items = [first]
            stop = False
            while len(items) < self.batch_max:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                items.append(nxt)
            self._commit(items)
            if not self._healthy:
                self._probe()
            if stop:
                return
            self._maybe_sweep()

    def _commit(self, items: list[_Item]) -> None:
        items = [item for item in items if item.future.set_running_or_notify_cancel()]  # not given up by its caller
        if not items:
            return
        db = self._db
        results: list[tuple[bool, Any]] = []
        alone = len(items) == 1  # the usual case at low load: no savepoint needed (fewer statements, less waiting)
        lazy = not any(item.durable for item in items)
        try:
            self._durability(db, lazy)
            db.execute(self.begin)
            if lazy:
                self._lazy_transaction(db)
            try:
                for item in items:
                    if not alone:
                        db.execute("SAVEPOINT one")
                    try:
                        results.append((True, item.write(db)))
                        if not alone:
                            db.execute("RELEASE one")
                    except self.database_errors:
                        raise  # the database's problem, not this write's: the group fails
                    except Exception as exc:
                        if alone:
                            db.execute("ROLLBACK")  # nothing else was in it
                        else:
                            db.execute("ROLLBACK TO one")
                            db.execute("RELEASE one")
                        results.append((False, exc))
                if self._in_transaction(db):
                    db.execute("COMMIT")
            except BaseException:
                if self._in_transaction(db):
                    db.execute("ROLLBACK")
                raise
            self.commits += 1
        except Exception as exc:
            self._on_error("write_failed")
            if self._healthy:
                _log.warning(
                    "the trace store could not commit %d writes (%s: %s); writes pause until a probe write commits",
                    len(items),
                    type(exc).__name__,
                    exc,
                )
            self._set_healthy(False)
            for item in items:
                item.future.set_exception(StoreUnavailable(f"the trace store could not commit: {exc}"))
            return
        for item, (ok, value) in zip(items, results):
            if ok:
                item.future.set_result(value)
            else:
                item.future.set_exception(value)

    def _probe(self) -> None:
        """A small write; when it commits the store is healthy again."""
        if self._closed:
            return
        try:
            self._reconnect()
            self._db.execute(self.begin)
            try:
                self._db.execute(PROBE_SQL, (str(time.time()),))
                self._db.execute("COMMIT")
            except BaseException:
                if self._in_transaction(self._db):
                    self._db.execute("ROLLBACK")
                raise
        except Exception:
            return
        _log.warning("the trace store commits again: writes resume")
        self._set_healthy(True)

    def close(self, timeout: float = 10.0) -> bool:
        """Write what is queued (within ``timeout``), stop the writer, close the files; whether it drained.

        Never raises: a gateway's shutdown must not fail because its store did.
        """
        if self._closed:
            return True
        self._closed = True
        drained = True
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            drained = False
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False  # the writer is stuck in the database; leave its connection to it
        for db in (self._db, self._reader):
            with contextlib.suppress(Exception):  # closing is best effort
                db.close()
        return drained

    # -- reads ---------------------------------------------------------------------------------

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._read_lock:
            return list(self._reader.execute(sql, args).fetchall())

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """A trace with its calls and reward, as plain data; None when it is not stored."""
        rows = self._read(
            "SELECT trace_id, session_id, route, mode, created_at, status, batch_id, data FROM traces"
            " WHERE trace_id = ?",
            (trace_id,),
        )
        if not rows:
            return None
        tid, session, route, mode, created, status, batch, data = rows[0]
        extra = json.loads(data or "{}")
        calls = [
            {
                "call_id": c[0],
                "created_at": c[1],
                "policy_version": c[2],
                "request": json.loads(c[3]),
                "response": json.loads(c[4]),
                "prompt_token_ids": _loads_opt(c[5]),
                "token_ids": _loads_opt(c[6]),
                "logprobs": _loads_opt(c[7]),
                "timing": json.loads(c[8]),
                "state": c[9],
            }
            for c in self._read(
                "SELECT call_id, created_at, policy_version, request, response, prompt_token_ids, token_ids, logprobs,"
                " timing, state FROM calls WHERE trace_id = ? ORDER BY created_at, rowid",
                (trace_id,),
            )
        ]
        reward = self._read("SELECT reward, source FROM rewards WHERE trace_id = ?", (trace_id,))
        return {
            "trace_id": tid,
            "session_id": session,
            "route": route,
            "mode": mode,
            "created_at": created,
            "status": status,
            "batch_id": batch,
            "calls": calls,
            "reward": reward[0][0] if reward else None,
            "reward_source": reward[0][1] if reward else None,
            "task": extra.get("task"),
            "reward_metrics": extra.get("reward_metrics"),
            "unrewarded": extra.get("unrewarded"),
        }

    def trace_ids(self) -> list[str]:
        """Every stored trace id, oldest first."""
        return [r[0] for r in self._read("SELECT trace_id FROM traces ORDER BY created_at, rowid")]

    def batch_trace_ids(self, batch_id: str) -> list[str]:
        """The traces of one batch, oldest first."""
        rows = self._read("SELECT trace_id FROM traces WHERE batch_id = ? ORDER BY created_at, rowid", (batch_id,))
        return [r[0] for r in rows]

    def batch_state(self, batch_id: str) -> str | None:
        """``committing`` or ``committed``; None for an unknown batch."""
        rows = self._read("SELECT state FROM batches WHERE batch_id = ?", (batch_id,))
        return str(rows[0][0]) if rows else None

    def count(self, table: str) -> int:
        """Rows of one of the store's tables."""
        if table not in ("traces", "calls", "rewards", "feedback", "batches", "versions", "decisions"):
            raise ValueError(f"not a table of the trace store: {table!r}")
        return int(self._read(f"SELECT COUNT(*) FROM {table}")[0][0])  # a checked table name


def open_store(
    s: StoreSettings,
    where: str,
    *,
    on_error: Callable[[str], None] | None = None,
    on_health: Callable[[bool], None] | None = None,
) -> TraceStore:
    """The store ``online.yaml``'s ``store`` section names: PostgreSQL when ``url`` is set, else the SQLite file."""
    common: dict[str, Any] = {
        "queue_size": s.queue_size,
        "batch_max": s.batch_max,
        "busy_timeout_ms": s.busy_timeout_ms,
        "probe_interval_s": s.probe_interval_s,
        "ttl_s": s.ttl_s,
        "sweep_interval_s": s.sweep_interval_s,
        "max_calls_per_trace": s.max_calls_per_trace,
        "on_error": on_error,
        "on_health": on_health,
    }
    if s.url is None:
        return TraceStore(s.path, **common)
    from .pgstore import PostgresTraceStore, password_from_env

    password = password_from_env(s.password_env, where)
    return PostgresTraceStore(s.url, password=password, **common)
