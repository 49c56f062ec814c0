"""The outbox and the sink committer: rewarded traces to JSONL batches, resent with the same id."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest
from online_testlib import TRAFFIC_KEY
from test_store import call

from reinforge_online.feedback import FeedbackRequest, apply_feedback
from reinforge_online.outbox import Outbox
from reinforge_online.sink import JsonlCommitter
from reinforge_online.store import TraceStore


def reward(store: TraceStore, trace_id: str, value: float) -> Any:
    req = FeedbackRequest(trace_id, value, None)
    return store.submit(lambda db: apply_feedback(db, req, value, "first-wins")).result(10)


def filled(make_store, n: int) -> TraceStore:
    store = make_store()
    for i in range(n):
        store.record(call(i)).result(10)
    return store


def lines(path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rewarded_traces_go_out_in_one_batch_and_are_marked_committed(tmp_path, make_store):
    store = filled(make_store, 5)
    sink = JsonlCommitter(tmp_path / "out")
    try:
        for i in range(3):
            reward(store, f"t{i}", float(i))
        outbox = Outbox(store, sink)
        (batch_id,) = outbox.run_once()
        rows = lines(sink.path_of(batch_id))
        assert [r["trace_id"] for r in rows] == ["t0", "t1", "t2"]
        assert [r["reward"] for r in rows] == [0.0, 1.0, 2.0]
        assert all(r["batch_id"] == batch_id and r["calls"][0]["token_ids"] for r in rows)
        assert store.batch_state(batch_id) == "committed"
        assert {store.trace(f"t{i}")["status"] for i in range(3)} == {"committed"}
        assert store.trace("t3")["status"] == "open"  # no reward: not sent
        assert outbox.run_once() == []  # nothing new
        late = reward(store, "t0", 5.0)
        assert late.status == 409 and late.body["error"]["code"] == "trace_committed"  # feedback after commit
    finally:
        store.close()


class FlakyCommitter:
    """Fails the first ``fail`` sends, then writes JSONL; keeps every batch id it was handed."""

    def __init__(self, directory, fail: int) -> None:
        self.inner = JsonlCommitter(directory)
        self.fail = fail
        self.seen: list[str] = []

    def send(self, batch_id: str, rows: list[dict[str, Any]]) -> None:
        self.seen.append(batch_id)
        if self.fail > 0:
            self.fail -= 1
            raise OSError("the committer is down")
        self.inner.send(batch_id, rows)


def test_a_failed_send_is_retried_with_the_same_batch_id(tmp_path, make_store):
    store = filled(make_store, 2)
    try:
        reward(store, "t0", 1.0)
        sink = FlakyCommitter(tmp_path / "out", fail=1)
        outbox = Outbox(store, sink)
        with pytest.raises(OSError, match="the committer is down"):
            outbox.run_once()
        (stuck,) = sink.seen
        assert store.batch_state(stuck) == "committing"
        assert reward(store, "t0", 2.0).status == 409  # claimed into a batch: no more changes
        reward(store, "t1", 1.0)
        assert outbox.run_once()[0] == stuck  # the stuck batch first, same id, then the new one
        assert sink.seen[1] == stuck and len(sink.seen) == 3
        assert store.batch_state(stuck) == "committed"
        assert [r["trace_id"] for r in lines(sink.inner.path_of(stuck))] == ["t0"]
    finally:
        store.close()


def test_a_batch_left_committing_by_a_crash_is_resent_after_a_restart(tmp_path, make_store):
    store = filled(make_store, 3)
    for i in range(3):
        reward(store, f"t{i}", 1.0)
    sink = FlakyCommitter(tmp_path / "out", fail=1)
    with pytest.raises(OSError):
        Outbox(store, sink).run_once()
    (stuck,) = sink.seen
    store.close()
    reopened = make_store()
    try:
        again = FlakyCommitter(tmp_path / "out", fail=0)
        outbox = Outbox(reopened, again, interval_s=3600).start()  # its first pass sends what is pending
        assert outbox.wait_committed(1, timeout=10)
        assert outbox.stop()
        assert again.seen == [stuck]  # once, with the same id
        assert len(lines(again.inner.path_of(stuck))) == 3
        assert reopened.batch_state(stuck) == "committed"
    finally:
        reopened.close()


def test_the_thread_commits_after_min_traces_and_on_its_interval(tmp_path, make_store):
    store = filled(make_store, 4)
    sink = JsonlCommitter(tmp_path / "out")
    try:
        outbox = Outbox(store, sink, interval_s=3600, min_traces=2).start()
        for i in range(2):
            reward(store, f"t{i}", 1.0)
            outbox.rewarded()
        assert outbox.wait_committed(1, timeout=10)
        assert outbox.stop()
        timed = Outbox(store, sink, interval_s=0.01, min_traces=1000).start()
        reward(store, "t2", 1.0)
        assert timed.wait_committed(1, timeout=10)
        assert timed.stop()
        assert store.count("batches") == 2
    finally:
        store.close()


def test_the_gateway_commits_rewarded_traces_to_jsonl(gateway, tmp_path):
    out = tmp_path / "batches"
    server = gateway(
        selection={"sampling_rate": 1.0}, committer={"kind": "sink", "args": {"path": str(out)}, "min_traces": 2}
    )
    gw = server.server.config.app.state.gateway
    with httpx.Client(headers={"authorization": f"Bearer {TRAFFIC_KEY}"}, verify=False) as client:
        for _ in range(2):
            r = client.post(f"{server.v1}/chat/completions", json={"model": "m", "messages": []})
            fb = client.post(
                f"{server.base}/online/v1/feedback",
                json={"trace_id": r.headers["x-reinforge-trace-id"], "reward": 1.0},
                headers={"x-reinforge-feedback-token": r.headers["x-reinforge-feedback-token"]},
            )
            assert fb.status_code == 200
    assert gw.pipeline.outbox.wait_committed(1, timeout=10)
    (batch,) = list(out.glob("batch-*.jsonl"))
    assert len(lines(batch)) == 2
    assert gw.metrics.committed_traces._value.get() == 2


def test_stop_never_raises_and_a_stopped_committer_is_quiet(tmp_path, make_store):
    store = filled(make_store, 1)
    try:
        outbox = Outbox(store, JsonlCommitter(tmp_path / "out"), interval_s=3600)
        assert outbox.stop()  # never started
        started = Outbox(store, JsonlCommitter(tmp_path / "out"), interval_s=3600).start()
        assert started.stop(timeout=5)
        assert threading.active_count() >= 1
    finally:
        store.close()


@pytest.mark.parametrize(("min_traces", "batches"), [(5, 1), (2, 2)])
def test_traces_rewarded_during_a_send_wait_for_a_full_batch(tmp_path, make_store, min_traces, batches):
    """A pass sends what waits, then more only while a full batch (min_traces) waits: no stream of tiny batches."""
    store = filled(make_store, 5)
    for i in range(3):
        reward(store, f"t{i}", 1.0)

    class ArrivalsDuringSend:
        def __init__(self) -> None:
            self.sizes: list[int] = []

        def send(self, batch_id: str, rows: list[dict[str, Any]]) -> None:
            if not self.sizes:  # while the first batch is being sent, two more traces get their rewards
                for i in (3, 4):
                    reward(store, f"t{i}", 0.5)
            self.sizes.append(len(rows))

    sink = ArrivalsDuringSend()
    try:
        done = Outbox(store, sink, min_traces=min_traces).run_once()
        assert len(done) == batches and sink.sizes == [3, 2][:batches]
        if batches == 1:  # the two wait, rewarded, for the next pass
            assert [store.trace(f"t{i}")["status"] for i in (3, 4)] == ["rewarded", "rewarded"]
    finally:
        store.close()
