"""The PostgreSQL store on a real server: replicas sharing one database, JSON columns, lost connections, online.yaml.

The store's own conformance tests (test_store.py, test_committer.py) run on it too, through ``make_store``.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from online_testlib import SECRETS, TRAFFIC_KEY
from test_committer import reward
from test_store import call

from reinforge.plugin import ConfigError
from reinforge.testing import BackgroundServer
from reinforge_online.config import load_config
from reinforge_online.outbox import Outbox
from reinforge_online.store import TraceStore

pytestmark = pytest.mark.postgres


def pg_store(pg_server: Any, url: str, **options: Any) -> TraceStore:
    from reinforge_online.pgstore import PostgresTraceStore

    return PostgresTraceStore(url, password=pg_server.password, **options)


class RecordingSink:
    """Keeps every (batch id, trace ids) it is sent; ``hold`` makes a send wait (``entered`` says it began)."""

    def __init__(self, seen: list[tuple[str, list[str]]], lock: threading.Lock) -> None:
        self.seen, self.lock = seen, lock
        self.hold: threading.Event | None = None
        self.entered = threading.Event()
        self.fail = False

    def send(self, batch_id: str, rows: list[dict[str, Any]]) -> None:
        self.entered.set()
        if self.hold is not None:
            assert self.hold.wait(30)
        if self.fail:
            raise OSError("the backend is down")
        with self.lock:
            self.seen.append((batch_id, [r["trace_id"] for r in rows]))


def wait_gone(pg_server: Any, pid: int, timeout: float = 30.0) -> bool:
    """Wait until the server's backend ``pid`` has exited (a closed session ends on the server a little later)."""
    deadline = time.monotonic() + timeout
    with pg_server.connect() as admin:
        while time.monotonic() < deadline:
            if admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] == 0:
                return True
            time.sleep(0.01)  # polling the condition, not waiting for a guessed time
    return False


def test_two_replicas_never_claim_or_send_the_same_trace(pg_server, pg_url):
    with ThreadPoolExecutor(2) as pool:  # started together: the schema is created once, the other waits
        a, b = pool.map(lambda _: pg_store(pg_server, pg_url), range(2))
    seen: list[tuple[str, list[str]]] = []
    lock = threading.Lock()
    try:
        for i in range(120):
            a.record(call(i)).result(10)
        for i in range(120):
            reward(b if i % 2 else a, f"t{i}", 1.0)
        outboxes = [Outbox(s, RecordingSink(seen, lock), max_traces=7) for s in (a, b)]
        start = threading.Barrier(2)

        def drain(outbox: Outbox) -> list[str]:
            start.wait(10)
            done: list[str] = []
            while True:
                sent = outbox.run_once()
                if not sent:
                    return done
                done += sent

        with ThreadPoolExecutor(2) as pool:
            sent_a, sent_b = pool.map(drain, outboxes)
        batches = [batch for batch, _ in seen]
        traces = [t for _, ids in seen for t in ids]
        assert len(batches) == len(set(batches)) == len(sent_a) + len(sent_b)  # every batch sent once
        assert sorted(traces) == sorted(f"t{i}" for i in range(120))  # every trace in exactly one batch
        assert set(sent_a).isdisjoint(sent_b)
        assert {a.batch_state(batch) for batch in batches} == {"committed"}
        assert {b.trace(f"t{i}")["status"] for i in range(120)} == {"committed"}
    finally:
        a.close()
        b.close()


def test_a_batch_being_sent_is_left_alone_and_resent_once_its_replica_is_gone(pg_server, pg_url):
    a, b = pg_store(pg_server, pg_url), pg_store(pg_server, pg_url)
    seen: list[tuple[str, list[str]]] = []
    lock = threading.Lock()
    try:
        for i in range(3):
            a.record(call(i)).result(10)
            reward(a, f"t{i}", 1.0)
        sink_a, sink_b = RecordingSink(seen, lock), RecordingSink(seen, lock)
        sink_a.hold = threading.Event()
        with ThreadPoolExecutor(1) as pool:
            sending = pool.submit(Outbox(a, sink_a).run_once)
            assert sink_a.entered.wait(10)  # replica a is sending its batch
            assert Outbox(b, sink_b).run_once() == []  # ... so b neither resends nor claims it
            sink_a.hold.set()
            (batch,) = sending.result(10)
        assert Outbox(b, sink_b).run_once() == [] and seen == [(batch, ["t0", "t1", "t2"])]

        a.record(call(5)).result(10)
        reward(a, "t5", 1.0)
        sink_a.fail = True
        with pytest.raises(OSError):
            Outbox(a, sink_a).run_once()  # claimed, not sent: left committing, a still holds it
        (stuck,) = [bid for bid in [b.trace("t5")["batch_id"]] if bid]
        assert b.batch_state(stuck) == "committing"
        assert Outbox(b, sink_b).run_once() == []  # a is alive and will retry it itself
        (writer_pid,) = a._db.execute("SELECT pg_backend_pid()").fetchone()
        assert a.close()  # a replica gone: its session, and its locks, with it ...
        assert wait_gone(pg_server, writer_pid)  # ... once the server has ended that session
        assert Outbox(b, sink_b).run_once() == [stuck]  # resent with the same id, once
        assert seen[-1] == (stuck, ["t5"]) and len(seen) == 2
        assert b.batch_state(stuck) == "committed"
    finally:
        a.close()
        b.close()


def test_columns_hold_json_text_and_commits_are_synchronous(pg_server, pg_url):
    from reinforge_online.store import SCHEMA_VERSION

    store = pg_store(pg_server, pg_url)
    try:
        store.record(call(1)).result(10)
        assert store.trace("t1")["calls"][0]["logprobs"] == [-0.5]
        assert store._db.execute("SHOW synchronous_commit").fetchone()[0] == "on"
    finally:
        store.close()
    with pg_server.connect(pg_url.rsplit("/", 1)[1]) as conn:
        types = dict(
            conn.execute(
                "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'calls'"
            ).fetchall()
        )
        assert types["request"] == types["token_ids"] == "text" and types["created_at"] == "double precision"
        row = conn.execute(
            "SELECT request, response, prompt_token_ids, token_ids, logprobs, timing FROM calls"
        ).fetchone()
        assert all(isinstance(v, str) for v in row) and [json.loads(v) for v in row]  # JSON text, never pickle
        (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        assert version == str(SCHEMA_VERSION)


def test_a_lost_connection_fails_the_group_then_the_probe_reconnects(pg_server, pg_url):
    errors: list[str] = []
    store = pg_store(pg_server, pg_url, probe_interval_s=0.01, on_error=errors.append)
    try:
        store.record(call(1)).result(10)
        (pid,) = store._db.execute("SELECT pg_backend_pid()").fetchone()
        with pg_server.connect() as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
        from reinforge_online.store import StoreUnavailable

        with pytest.raises(StoreUnavailable, match="could not commit"):
            store.record(call(2)).result(10)
        assert errors == ["write_failed"]
        assert store.wait_healthy(True, timeout=10)  # a new session
        store.record(call(3)).result(10)
        assert store.trace_ids() == ["t1", "t3"]
    finally:
        store.close()


def test_acknowledged_traces_survive_a_crash_of_the_server(pg_server, pg_url):
    from reinforge_online.store import StoreUnavailable

    store = pg_store(pg_server, pg_url, probe_interval_s=0.05)
    try:
        for i in range(30):
            store.record(call(i)).result(10)  # acknowledged: committed
        pg_server.crash_and_restart()
        with pytest.raises(StoreUnavailable, match="could not commit"):
            store.record(call(30)).result(10)  # the session died with the server: this group is lost, counted
        assert store.wait_healthy(True, timeout=30)  # the probe's new session
        assert store.trace_ids() == [f"t{i}" for i in range(30)]  # the reader reconnects too
        assert store.trace("t29")["calls"][0]["token_ids"] == [29]
        store.record(call(31)).result(10)
    finally:
        store.close()


def test_a_password_in_the_url_is_refused(pg_server):
    from reinforge_online.pgstore import PostgresTraceStore

    with pytest.raises(ConfigError, match=r"store.url: postgresql://reinforge:\*\*\*@.*environment variable"):
        PostgresTraceStore(f"postgresql://reinforge:{pg_server.password}@127.0.0.1:{pg_server.port}/postgres")


def test_a_gateway_records_into_postgres_from_store_url(pg_server, pg_url, tmp_path, monkeypatch, upstream, policy):
    from reinforge_online.app import build_app
    from reinforge_online.pgstore import PostgresTraceStore

    monkeypatch.setenv("PG_PW", pg_server.password)
    config = tmp_path / "online.yaml"
    config.write_text(
        f"upstream: {{url: {upstream[1].v1!r}}}\n"
        f"policy: {{url: {policy[1].v1!r}, model: pol}}\n"
        "auth: {traffic_key_env: T, admin_key_env: A, feedback_secret_env: F}\n"
        f"store: {{url: {pg_url!r}, password_env: PG_PW}}\n"
        "selection: {sampling_rate: 1.0}\n"
    )
    s = load_config(config)
    with BackgroundServer(build_app(s, SECRETS)) as server:
        store = server.server.config.app.state.gateway.store
        assert isinstance(store, PostgresTraceStore)
        body = {"model": "gpt-up", "messages": [{"role": "user", "content": "hi"}]}
        reply = httpx.post(
            f"{server.v1}/chat/completions", json=body, headers={"authorization": f"Bearer {TRAFFIC_KEY}"}, timeout=10
        )
        assert reply.status_code == 200
        trace_id = reply.headers["x-reinforge-trace-id"]
        store.submit(lambda db: None).result(10)  # behind the call's write: it committed
        assert store.trace(trace_id)["calls"][0]["token_ids"]
    assert not (tmp_path / "traces.sqlite").exists()  # store.path's default: not used
    monkeypatch.delenv("PG_PW")
    from reinforge_online.pipeline import Pipeline

    with pytest.raises(ConfigError, match="online.yaml: store.password_env: the environment variable PG_PW is not set"):
        Pipeline(s, SECRETS, where=str(config))


def test_the_python_api_takes_a_postgres_url(pg_server, pg_url, tmp_path, monkeypatch):
    from reinforge_online import OnlineTrainer
    from reinforge_online.pgstore import PostgresTraceStore

    monkeypatch.setenv("PGPASSWORD", pg_server.password)  # libpq's own variable
    trainer = OnlineTrainer("none", store=pg_url).start()
    try:
        assert isinstance(trainer.store, PostgresTraceStore)
        trainer.store.record(call(1)).result(10)
        assert trainer.store.trace_ids() == ["t1"]
    finally:
        assert trainer.stop()
