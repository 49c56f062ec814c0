"""reinforge-online's trinity committer: batches to a Trinity serve-mode explorer through this package's client.

The explorer is a starlette fake of Trinity 0.6.0's proxy routes (``/feedback``, ``/commit``) on real uvicorn
at 127.0.0.1; the client is the real ``ServeClient``; the outbox, store and committer registry are
reinforge-online's own, over SQLite.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("reinforge_online")
pytest.importorskip("uvicorn")

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import reinforge_backend_trinity.plugin as trinity_plugin
from reinforge.plugin import ConfigError
from reinforge.testing import BackgroundServer
from reinforge_backend_trinity.online_committer import TrinityCommitter, feedback_of
from reinforge_online import CommitterContext, build_committer
from reinforge_online.feedback import FeedbackRequest, apply_feedback
from reinforge_online.outbox import Outbox
from reinforge_online.store import CallRecord, TraceStore


def call(i: int, response_id: str | None) -> CallRecord:
    """One recorded policy call of trace ``t<i>``, with the response id Trinity's proxy gave it (or none)."""
    response: dict[str, Any] = {"choices": [{"message": {"content": f"a{i}"}}]}
    if response_id:
        response["id"] = response_id
    return CallRecord(
        trace_id=f"t{i}",
        call_id=f"c{i}",
        route="/v1/chat/completions",
        mode="record",
        request={"messages": [{"role": "user", "content": f"q{i}"}]},
        response=response,
    )


def reward(store: TraceStore, trace_id: str, value: float) -> Any:
    req = FeedbackRequest(trace_id, value, None)
    return store.submit(lambda db: apply_feedback(db, req, value, "first-wins")).result(10)


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


def stored(tmp_path: Any, ids: list[str | None]) -> TraceStore:
    store = TraceStore(tmp_path / "t.sqlite")
    for i, response_id in enumerate(ids):
        store.record(call(i, response_id)).result(10)
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
    committer = TrinityCommitter(server.v1)
    try:
        (batch_id,) = Outbox(store, committer).run_once()
        assert store.batch_state(batch_id) == "committed"
        by_task = {f["task_id"]: f for f in fake.feedback}
        assert by_task == {
            "t0": {"reward": 1.0, "msg_ids": ["chatcmpl-0"], "task_id": "t0", "run_id": 0},
            "t1": {"reward": 0.25, "msg_ids": ["chatcmpl-1"], "task_id": "t1", "run_id": 0},
        }
        assert fake.commits == 1 and committer.skipped_traces == 1
    finally:
        store.close()


def test_a_failed_commit_keeps_the_batch_committing_and_the_resend_commits_it(tmp_path, trinity):
    fake, server = trinity
    fake.fail_commits = 1
    store = stored(tmp_path, ["chatcmpl-0", "chatcmpl-1"])
    outbox = Outbox(store, TrinityCommitter(server.base))
    try:
        with pytest.raises(Exception, match="HTTP 500"):
            outbox.run_once()
        (batch_id,) = store.submit(lambda db: [r[0] for r in db.execute("SELECT batch_id FROM batches")]).result(10)
        assert store.batch_state(batch_id) == "committing" and fake.commits == 0
        assert outbox.run_once() == [batch_id]  # the same id, the same feedback again, then the commit
        assert store.batch_state(batch_id) == "committed" and fake.commits == 1
        assert len(fake.feedback) == 4 and fake.feedback[:2] == fake.feedback[2:]
    finally:
        store.close()


def test_the_explorer_url_is_read_from_trinitys_job_folder_at_each_send(tmp_path, trinity):
    fake, server = trinity
    job = tmp_path / "job"
    job.mkdir()
    store = stored(tmp_path, ["chatcmpl-0"])
    outbox = Outbox(store, TrinityCommitter(job_dir=job))
    try:
        with pytest.raises(Exception, match="explorer_server_url.txt does not exist"):
            outbox.run_once()  # the explorer has not started yet: the batch waits
        (job / "explorer_server_url.txt").write_text(server.base + "\n")
        assert len(outbox.run_once()) == 1 and fake.commits == 1
    finally:
        store.close()


@pytest.fixture
def pm(reinforge_pm):
    """A fresh plugin manager with reinforge-online's plugin and this package's, as their entry points load them."""
    import reinforge_online.plugin as online_plugin

    reinforge_pm.register(online_plugin, name="reinforge-online")
    reinforge_pm.register(trinity_plugin, name="reinforge-backend-trinity")
    return reinforge_pm


def test_the_committer_comes_through_onlines_hook_and_job_dir_is_relative_to_the_file(tmp_path, pm):
    context = CommitterContext(where="online.yaml", base_dir=tmp_path)
    by_url = build_committer("trinity", {"url": "http://127.0.0.1:9/v1", "timeout_s": 5}, context, pm=pm)
    assert isinstance(by_url, TrinityCommitter) and by_url.url == "http://127.0.0.1:9/v1" and by_url.timeout_s == 5
    by_job = build_committer("trinity", {"job_dir": "trinity/job"}, context, pm=pm)
    assert isinstance(by_job, TrinityCommitter) and by_job.job_dir == tmp_path / "trinity" / "job"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, r"online.yaml: committer.args.url: set exactly one of url and job_dir"),
        ({"url": "http://x", "job_dir": "j"}, r"online.yaml: committer.args.url: set exactly one of url and job_dir"),
        ({"url": "127.0.0.1:9"}, r"online.yaml: committer.args.url: expected an http"),
        ({"url": "http://x", "timeout_s": 0}, r"online.yaml: committer.args.timeout_s: must be greater than 0"),
        ({"url": "http://x", "timeout": 5}, r"unknown key 'committer.args.timeout'.*timeout_s"),
    ],
)
def test_bad_args_name_the_file_and_the_key(tmp_path, pm, args, message):
    with pytest.raises(ConfigError, match=message):
        build_committer("trinity", args, CommitterContext(where="online.yaml", base_dir=tmp_path), pm=pm)


def test_the_plugin_loads_without_reinforge_online(reinforge_pm):
    """Without online's hookspec the hookimpl is optional: the plugin registers and nothing is broken."""
    from reinforge.testing import check_hookimpls

    reinforge_pm.register(trinity_plugin, name="reinforge-backend-trinity")
    assert not reinforge_pm.hook.register_committers.has_spec()
    assert check_hookimpls(reinforge_pm) == []


def test_the_installed_entry_point_registers_the_committer():
    from reinforge_backend_trinity.online_committer import TrinityCommitterSettings
    from reinforge_online import committer_registry

    entry = committer_registry().get("committers", "trinity")
    assert entry is not None and entry.owner == "reinforge-backend-trinity"
    assert entry.settings is TrinityCommitterSettings
