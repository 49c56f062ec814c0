"""The trace store on PostgreSQL (psycopg 3), for several gateway replicas sharing one database.

Same schema, same writes and the same writer thread with group commit as the SQLite store
(:class:`~reinforge_online.store.TraceStore`, which this subclasses): only connecting,
beginning a transaction and locking batches differ. The writes are the package's own SQL,
written once with ``?`` placeholders; :class:`_Connection` hands them to psycopg with its
``%s``. Every session runs with ``synchronous_commit = on``, so an acknowledged write
(its transaction committed) is on the server's disk.

Replicas: a committer claims rewarded traces with ``FOR UPDATE SKIP LOCKED`` (two claims never
take the same trace) and holds a session advisory lock on each batch it is sending; a batch
left ``committing`` is resent only by a replica that gets that lock, which happens once its
sender is gone (its connection closed) or released it after committing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from reinforge.plugin import ConfigError

from .store import TraceStore, migrate, schema

__all__ = ["PASSWORD_ENV", "PostgresTraceStore", "masked", "password_from_env"]

PASSWORD_ENV = "REINFORGE_ONLINE_PG_PASSWORD"
_LOCK_SQL = "SELECT pg_try_advisory_lock(hashtextextended(?, 0))"
_UNLOCK_SQL = "SELECT pg_advisory_unlock(hashtextextended(?, 0))"
# replicas starting together: one creates the tables, the others wait for it (a lock for this transaction only)
_MIGRATE_BEGIN = "BEGIN; SELECT pg_advisory_xact_lock(hashtextextended('reinforge_online.schema', 0))"


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise ConfigError(
            "store.url: a PostgreSQL store needs psycopg: pip install 'reinforge-online[postgres]'"
        ) from None
    return psycopg


def masked(url: str) -> str:
    """``url`` without a password (what messages and ``store.path`` show)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def _placeholders(sql: str) -> str:
    """The package's ``?`` placeholders as psycopg's ``%s`` (a literal ``%`` doubled)."""
    return sql.replace("%", "%%").replace("?", "%s")


class _Connection:
    """A psycopg connection in autocommit mode that takes the writes' SQLite-style SQL."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(_placeholders(sql), tuple(params))

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any:
        cursor = self.conn.cursor()
        cursor.executemany(_placeholders(sql), [tuple(r) for r in rows])
        return cursor

    @property
    def in_transaction(self) -> bool:
        if self.conn.broken or self.conn.closed:
            return False
        return bool(self.conn.info.transaction_status != _psycopg().pq.TransactionStatus.IDLE)

    @property
    def usable(self) -> bool:
        return not (self.conn.broken or self.conn.closed)

    def close(self) -> None:
        self.conn.close()


class PostgresTraceStore(TraceStore):
    """Durable traces in a PostgreSQL database several gateways may share (see the module docstring).

    :param url: ``postgresql://user@host:port/dbname`` (libpq's URL; no password in it).
    :param password: the password, read by the caller from an environment variable (``store.password_env``).
    The other parameters are the SQLite store's; ``busy_timeout_ms`` is the session's ``lock_timeout``.
    """

    begin = "BEGIN"

    def _durability(self, db: Any, lazy: bool) -> None:
        """Every session commits with ``synchronous_commit = on``; a transaction of lazy writes says otherwise."""

    def _lazy_transaction(self, db: Any) -> None:
        db.execute("SET LOCAL synchronous_commit = off")

    for_update = " FOR UPDATE SKIP LOCKED"

    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        connect_timeout_s: int = 10,
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
        psycopg = _psycopg()
        if urlsplit(url).password is not None:
            raise ConfigError(f"store.url: {masked(url)}: put the password in an environment variable, not the URL")
        self.url = url
        self.path = url
        self._password = password
        self._connect_timeout_s = connect_timeout_s
        self.database_errors = (psycopg.OperationalError, psycopg.InterfaceError)
        self._held: set[str] = set()  # batches this store's writer session holds the advisory lock of
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

    def _open(self) -> _Connection:
        psycopg = _psycopg()
        kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": self._connect_timeout_s}
        if self._password is not None:
            kwargs["password"] = self._password
        conn = psycopg.connect(self.url, **kwargs)
        conn.execute("SET synchronous_commit = on")  # acknowledged means on the server's disk
        conn.execute(f"SET lock_timeout = {int(self.busy_timeout_ms)}")  # a number, formatted here
        return _Connection(conn)

    def _connect(self) -> tuple[Any, Any]:
        db = self._open()
        try:
            migrate(db, masked(self.url), schema(real="DOUBLE PRECISION", rowid=_ROWID), begin=_MIGRATE_BEGIN)
        except BaseException:
            with contextlib.suppress(Exception):
                if db.in_transaction:
                    db.execute("ROLLBACK")
                db.close()
            raise
        return db, self._open()

    def _reconnect(self) -> None:
        if not self._db.usable:
            self._held.clear()  # the server let go of the old session's locks
            with contextlib.suppress(Exception):
                self._db.close()
            self._db = self._open()

    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """A read, once more on a new session when the old one was lost (a read is safe to repeat)."""
        with self._read_lock:
            try:
                return self._fetch(sql, args)
            except self.database_errors:
                if self._reader.usable:
                    raise  # the query's problem, not the session's
            return self._fetch(sql, args)

    def _fetch(self, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        if not self._reader.usable:
            self._reader = self._open()
        return list(self._reader.execute(sql, args).fetchall())

    def lock_batch(self, db: Any, batch_id: str) -> bool:
        if batch_id in self._held:
            return True  # a session advisory lock counts; take it once
        got = bool(db.execute(_LOCK_SQL, (batch_id,)).fetchone()[0])
        if got:
            self._held.add(batch_id)
        return got

    def release_batch(self, batch_id: str) -> None:
        def unlock(db: Any) -> None:
            if batch_id in self._held:
                self._held.discard(batch_id)
                db.execute(_UNLOCK_SQL, (batch_id,))

        with contextlib.suppress(Exception):  # not released: the lock goes when the session ends
            self.submit(unlock)


_ROWID = "rowid BIGINT GENERATED ALWAYS AS IDENTITY,\n    "


def password_from_env(name: str | None, where: str) -> str | None:
    """The store's password from the environment variable ``name`` (None when no name is given)."""
    if not name:
        return None
    value = os.environ.get(name)
    if not value:
        raise ConfigError(f"{where}: store.password_env: the environment variable {name} is not set or empty")
    return value
