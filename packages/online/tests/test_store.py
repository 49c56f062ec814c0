"""The trace store on its own: group commit, acknowledgement, crash safety, full queue and locks, JSON only."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from reinforge_online.store import SCHEMA_VERSION, CallRecord, StoreUnavailable, TraceStore


def call(i: int) -> CallRecord:
    return CallRecord(
        trace_id=f"t{i}",
        call_id=f"c{i}",
        route="/v1/chat/completions",
        mode="route",
        request={"messages": [{"role": "user", "content": f"q{i}"}]},
        response={"choices": [{"message": {"content": f"a{i}"}}]},
        prompt_token_ids=[1, 2],
        token_ids=[i],
        logprobs=[-0.5],
        policy_version="3",
    )


def test_written_calls_read_back_as_json(tmp_path):
    store = TraceStore(tmp_path / "t.sqlite")
    try:
        store.record(call(1)).result(10)
        trace = store.trace("t1")
        assert trace["calls"][0]["token_ids"] == [1]
        assert trace["calls"][0]["request"]["messages"][0]["content"] == "q1"
        assert store.trace("nope") is None
    finally:
        assert store.close()
    db = sqlite3.connect(tmp_path / "t.sqlite")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    row = db.execute("SELECT request, response, prompt_token_ids, token_ids, logprobs, timing FROM calls").fetchone()
    assert all(isinstance(v, str) for v in row) and [json.loads(v) for v in row]  # JSON text, never pickle


def test_group_commit_writes_many_per_transaction(make_store):
    gate = threading.Event()
    store = make_store()
    try:
        blocked = store.submit(lambda db: gate.wait(10))  # holds the writer while the queue fills
        futures = [store.record(call(i)) for i in range(50)]
        gate.set()
        blocked.result(10)
        for f in futures:
            f.result(10)
        assert store.count("calls") == 50 and store.count("traces") == 50
        assert store.commits <= 3  # the blocked write's group, then the 50 queued behind it in one or two
    finally:
        store.close()


def test_a_failing_write_does_not_undo_its_group(make_store):
    store = make_store()
    try:
        gate = threading.Event()
        store.submit(lambda db: gate.wait(10))
        good = store.record(call(1))
        bad = store.record(call(1))  # same call id: an integrity error of its own
        gate.set()
        good.result(10)
        error = bad.exception(10)  # the driver's IntegrityError (sqlite3's, or psycopg's UniqueViolation)
        assert "IntegrityError" in [c.__name__ for c in type(error).__mro__], repr(error)
        assert store.count("calls") == 1 and store.healthy
    finally:
        store.close()


def test_full_queue_drops_counts_and_pauses_until_a_probe_succeeds(make_store):
    errors: list[str] = []
    store = make_store(queue_size=2, probe_interval_s=0.01, on_error=errors.append)
    try:
        gate = threading.Event()
        store.submit(lambda db: gate.wait(10))
        store.record(call(1))  # waits in the queue (the first write may or may not have been taken yet)
        with pytest.raises(StoreUnavailable):
            for i in range(2, 5):
                store.record(call(i))
        assert errors == ["queue_full"] and not store.healthy
        with pytest.raises(StoreUnavailable, match="unhealthy"):
            store.record(call(9))
        gate.set()
        assert store.wait_healthy(True, timeout=10)
        store.record(call(10)).result(10)
    finally:
        store.close()


def test_a_locked_database_fails_the_group_then_recovers(tmp_path):
    errors: list[str] = []
    health: list[bool] = []
    path = tmp_path / "t.sqlite"
    store = TraceStore(path, busy_timeout_ms=20, probe_interval_s=0.01, on_error=errors.append, on_health=health.append)
    try:
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        with pytest.raises(StoreUnavailable, match="could not commit"):
            store.record(call(1)).result(10)
        assert errors == ["write_failed"] and store.wait_healthy(False, timeout=10)
        blocker.execute("ROLLBACK")
        blocker.close()
        assert store.wait_healthy(True, timeout=10)
        assert health == [False, True]
        store.record(call(2)).result(10)
        assert store.trace_ids() == ["t2"]
    finally:
        store.close()


CRASH = textwrap.dedent(
    """
    import os, sys, threading
    sys.path.insert(0, {tests!r})
    from test_store import call
    from online_testlib import open_store_at

    store = open_store_at({spec!r})
    acked = []
    for i in range(40):
        store.record(call(i)).result(10)   # acknowledged: committed
        acked.append(i)
    gate = threading.Event()
    store.submit(lambda db: gate.wait(60))  # the writer is busy: what follows is queued, never acknowledged
    for i in range(40, 60):
        store.record(call(i))
    print(",".join(map(str, acked)), flush=True)
    os.kill(os.getpid(), 9)
    """
)


def test_reopening_after_a_kill_keeps_every_acknowledged_trace(store_spec, make_store):
    script = CRASH.format(tests=str(Path(__file__).parent), spec=store_spec)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=os.environ)
    assert proc.returncode == -9, proc.stderr
    acked = [int(x) for x in proc.stdout.strip().split(",")]
    assert len(acked) == 40
    store = make_store()
    try:
        stored = set(store.trace_ids())
        assert {f"t{i}" for i in acked} <= stored
        assert all(store.trace(f"t{i}")["calls"][0]["token_ids"] == [i] for i in acked)
        store.record(call(100)).result(10)  # and it takes writes again
    finally:
        store.close()


def test_close_drains_the_queue_and_never_raises(make_store):
    store = make_store()
    futures = [store.record(call(i)) for i in range(20)]
    assert store.close() is True
    assert all(f.done() and f.exception() is None for f in futures)
    assert store.close() is True  # twice is fine
    with pytest.raises(StoreUnavailable, match="closed"):
        store.record(call(99))
    again = make_store()
    try:
        assert again.count("calls") == 20
    finally:
        again.close()


def old_call(i: int, age_s: float) -> CallRecord:
    c = call(i)
    c.created_at -= age_s
    return c


def test_ttl_sweeps_delete_old_open_and_committed_traces_only(make_store):
    from reinforge_online.feedback import FeedbackRequest, apply_feedback

    store = make_store(ttl_s=3600, sweep_interval_s=3600)
    try:
        for i in range(4):
            store.record(old_call(i, 7200)).result(10)
        store.record(call(9)).result(10)  # young: kept
        req = FeedbackRequest("t1", 1.0, None)
        store.submit(lambda db: apply_feedback(db, req, 1.0, "first-wins")).result(10)  # rewarded: kept
        store.submit(lambda db: db.execute("UPDATE traces SET status = 'committed' WHERE trace_id = 't2'")).result(10)
        store.submit(lambda db: db.execute("UPDATE traces SET status = 'committing' WHERE trace_id = 't3'")).result(10)
        assert store.sweep(3600).result(10) == 2  # t0 (open, old) and t2 (committed, old)
        assert set(store.trace_ids()) == {"t1", "t3", "t9"}
        assert store.count("calls") == 3 and store.count("rewards") == 1
    finally:
        store.close()


def test_the_writer_sweeps_on_its_own(make_store):
    first = make_store()
    first.record(old_call(0, 7200)).result(10)
    first.close()
    store = make_store(ttl_s=3600, sweep_interval_s=3600)  # a sweep right after start
    try:
        assert store.wait_swept(1, timeout=10)
        assert store.trace_ids() == []
    finally:
        store.close()


def test_a_trace_takes_at_most_max_calls_per_trace(make_store):
    from reinforge_online.store import TraceClosed

    store = make_store(max_calls_per_trace=2)
    try:
        for i in range(2):
            c = call(i)
            c.trace_id = "one"
            store.record(c).result(10)
        extra = call(5)
        extra.trace_id = "one"
        with pytest.raises(TraceClosed, match="the most a trace may have"):
            store.record(extra).result(10)
        assert store.count("calls") == 2 and store.healthy
    finally:
        store.close()


def test_a_transaction_of_lazy_writes_does_not_wait_for_the_disk_and_durable_ones_do(store_spec, make_store):
    """A stream's completion (durable=False) is committed without a sync of its own; every other write with one."""
    store = make_store()
    try:
        if store_spec["kind"] == "sqlite":
            setting = lambda db: int(db.execute("PRAGMA synchronous").fetchone()[0])  # noqa: E731
            lazy, durable = 1, 2  # NORMAL, FULL
        else:
            setting = lambda db: db.execute("SHOW synchronous_commit").fetchone()[0]  # noqa: E731
            lazy, durable = "off", "on"
        assert store.submit(setting, durable=False).result(10) == lazy
        assert store.submit(setting).result(10) == durable
        assert store.submit(setting, durable=False).result(10) == lazy
    finally:
        store.close()
