"""The trinity committer: batches to a Trinity serve-mode explorer through reinforge-backend-trinity's client.

The explorer is a starlette fake of Trinity 0.6.0's proxy routes (``/feedback``, ``/commit``) on real uvicorn
at 127.0.0.1; the client is the real ``ServeClient``; the outbox is the real committer over SQLite.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from online_testlib import BackgroundServer, settings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from test_committer import reward
from test_store import call

from reinforge.plugin import ConfigError
from reinforge_online.committer import Committer
from reinforge_online.store import TraceStore
from reinforge_online.trinity import TrinitySink, feedback_of

pytest.importorskip("reinforge_backend_trinity.serve_client")


class FakeTrinity:
    """``/feedback`` and ``/commit`` as Trinity's serve proxy answers them; ``fail_commits`` answers 500."""

    def __init__(self) -> None:
        self.feedback: list[dict[str, Any]] = []
        self.commits = 0
        self.fail_commits = 0
        self.lock = threading.Lock()

    def app(self) -> Starlette:
        async def feedback(request: Request) -> Response:
            body = await request.json()
            with self.lock:
                self.feedback.append(body)
            return JSONResponse({"status": "success"})

        async def commit(request: Request) -> Response:
            with self.lock:
                if self.fail_commits > 0:
                    self.fail_commits -= 1
                    return JSONResponse({"error": "the buffer is not reachable"}, status_code=500)
                self.commits += 1
            return JSONResponse({"status": "success"})

        return Starlette(
            routes=[Route("/feedback", feedback, methods=["POST"]), Route("/commit", commit, methods=["POST"])]
        )


@pytest.fixture
def trinity() -> Iterator[tuple[FakeTrinity, BackgroundServer]]:
    fake = FakeTrinity()
    with BackgroundServer(fake.app()) as server:
        yield fake, server


def with_id(i: int, response_id: str | None) -> Any:
    record = call(i)
    response = dict(record.response, **({"id": response_id} if response_id else {}))
    return dataclasses.replace(record, response=response)


def stored(tmp_path: Any, ids: list[str | None]) -> TraceStore:
    store = TraceStore(tmp_path / "t.sqlite")
    for i, response_id in enumerate(ids):
        store.record(with_id(i, response_id)).result(10)
        reward(store, f"t{i}", [1.0, 0.25, 0.5][i % 3])
    return store


def test_rows_become_feedback_with_response_ids_and_traces_without_them_are_skipped():
    rows = [
        {"trace_id": "a", "reward": 1.0, "calls": [{"response": {"id": "r1"}}, {"response": {"id": "r2"}}]},
        {"trace_id": "b", "reward": 0.0, "calls": [{"response": {}}]},  # answered by a fallback: no id
        {"trace_id": "c", "reward": None, "calls": [{"response": {"id": "r3"}}]},
    ]
    bodies, skipped = feedback_of(rows)
    assert bodies == [{"reward": 1.0, "msg_ids": ["r1", "r2"], "task_id": "a"}] and skipped == 2


def test_a_batch_becomes_feedback_per_trace_then_one_commit(tmp_path, trinity):
    fake, server = trinity
    store = stored(tmp_path, ["chatcmpl-0", "chatcmpl-1", None])
    sink = TrinitySink(server.v1)
    try:
        (batch_id,) = Committer(store, sink).run_once()
        assert store.batch_state(batch_id) == "committed"
        by_task = {f["task_id"]: f for f in fake.feedback}
        assert by_task == {
            "t0": {"reward": 1.0, "msg_ids": ["chatcmpl-0"], "task_id": "t0", "run_id": 0},
            "t1": {"reward": 0.25, "msg_ids": ["chatcmpl-1"], "task_id": "t1", "run_id": 0},
        }
        assert fake.commits == 1 and sink.skipped_traces == 1
    finally:
        store.close()


def test_a_failed_commit_keeps_the_batch_committing_and_the_resend_commits_it(tmp_path, trinity):
    fake, server = trinity
    fake.fail_commits = 1
    store = stored(tmp_path, ["chatcmpl-0", "chatcmpl-1"])
    committer = Committer(store, TrinitySink(server.base))
    try:
        with pytest.raises(Exception, match="HTTP 500"):
            committer.run_once()
        (batch_id,) = store.submit(lambda db: [r[0] for r in db.execute("SELECT batch_id FROM batches")]).result(10)
        assert store.batch_state(batch_id) == "committing" and fake.commits == 0
        assert committer.run_once() == [batch_id]  # the same id, the same feedback again, then the commit
        assert store.batch_state(batch_id) == "committed" and fake.commits == 1
        assert len(fake.feedback) == 4 and fake.feedback[:2] == fake.feedback[2:]
    finally:
        store.close()


def test_the_explorer_url_is_read_from_trinitys_job_folder_at_each_send(tmp_path, trinity):
    fake, server = trinity
    job = tmp_path / "job"
    job.mkdir()
    store = stored(tmp_path, ["chatcmpl-0"])
    committer = Committer(store, TrinitySink(job_dir=job))
    try:
        with pytest.raises(Exception, match="explorer_server_url.txt does not exist"):
            committer.run_once()  # the explorer has not started yet: the batch waits
        (job / "explorer_server_url.txt").write_text(server.base + "\n")
        assert len(committer.run_once()) == 1 and fake.commits == 1
    finally:
        store.close()


def test_trinity_committer_settings_are_checked_and_build_the_sink(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"test.yaml: committer.trinity.url: .*exactly one of"):
        settings("http://up", None, tmp_path / "t.sqlite", mode="record", committer={"kind": "trinity"})
    s = settings(
        "http://up",
        None,
        tmp_path / "t.sqlite",
        mode="record",
        committer={"kind": "trinity", "trinity": {"url": "http://127.0.0.1:9/v1"}},
    )
    from online_testlib import SECRETS

    from reinforge_online.pipeline import Pipeline

    pipeline = Pipeline(s, SECRETS)
    try:
        assert pipeline.committer is not None and isinstance(pipeline.committer.sink, TrinitySink)
    finally:
        pipeline.close()
    monkeypatch.setitem(sys.modules, "reinforge_backend_trinity.serve_client", None)
    with pytest.raises(ConfigError, match=r"pip install 'reinforge-online\[trinity\]'"):
        TrinitySink("http://127.0.0.1:9")
