"""The verdict cache: SQLite, keyed by judge config + model + inputs.

A rerun, a second judge with the same settings, or the second order of a
pairwise comparison that was already asked the other way round costs no model
call. Each judge owns its cache for the run it was built for: without
``cache_path`` it lives in memory and is gone when the judge is closed; with it,
in a SQLite file the judge opens (WAL mode, safe to share between runs and
processes). Only verdicts that parsed are stored, never errors.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from reinforge.plugin import ConfigError

__all__ = ["VerdictCache", "cache_key"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS verdicts (
    key TEXT PRIMARY KEY,
    content TEXT NOT NULL,
    model TEXT,
    created REAL NOT NULL
)
"""


def cache_key(*parts: Any) -> str:
    """SHA-256 of the parts as canonical JSON."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class VerdictCache:
    """A thread-safe key -> reply store over one SQLite connection."""

    def __init__(self, path: str | None = None) -> None:
        self.path = None if path is None else str(Path(path).expanduser().resolve())
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        with self._lock:
            self._connect()

    def _connect(self) -> sqlite3.Connection:
        """The open connection; reopened after :meth:`close` (a file cache keeps its rows)."""
        if self._db is not None:
            return self._db
        target = ":memory:" if self.path is None else self.path
        try:
            if self.path is not None:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(target, check_same_thread=False, timeout=30.0, isolation_level=None)
            if self.path is not None:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
            db.execute(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"cache_path {self.path!r}: cannot open the SQLite verdict cache: {exc}") from None
        self._db = db
        return db

    def get(self, key: str) -> str | None:
        """The judge's stored reply for ``key``, or None."""
        with self._lock:
            row = self._connect().execute("SELECT content FROM verdicts WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def put(self, key: str, content: str, model: str | None) -> None:
        with self._lock:
            self._connect().execute(
                "INSERT OR REPLACE INTO verdicts (key, content, model, created) VALUES (?, ?, ?, ?)",
                (key, content, model, time.time()),
            )

    def delete(self, key: str) -> None:
        with self._lock:
            self._connect().execute("DELETE FROM verdicts WHERE key = ?", (key,))

    def __len__(self) -> int:
        with self._lock:
            return int(self._connect().execute("SELECT COUNT(*) FROM verdicts").fetchone()[0])

    def close(self) -> None:
        """Close the connection; an in-memory cache forgets everything, a file cache reopens on next use."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
