"""reinforge-online's local committer: batches to training samples, a worker process, the swap, resends, restarts.

The worker process and the HTTP swap are real (a spawned process, uvicorn on 127.0.0.1), and so are
reinforge-online's outbox, store and committer registry; the trainer in the worker is scripted here.
The same committer with the real SmolLM2 and a real ``reinforge serve`` is ``test_online_local.py``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
from typing import Any

import pytest
from local_testlib import SCRIPTED, SWAP_KEY, FakeAdmin, reward, trained

import reinforge_backend_local.plugin as local_plugin
from reinforge.plugin import ConfigError
from reinforge.testing import BackgroundServer
from reinforge_backend_local.online.committer import (
    LocalCommitter,
    LocalCommitterSettings,
    SwapError,
    UnknownVersion,
    options_of,
    traces_of,
)

pytest.importorskip("reinforge_online")

from reinforge_online import CommitterContext, build_committer
from reinforge_online.outbox import Outbox
from reinforge_online.store import CallRecord, TraceStore
from reinforge_online.versions import Version, VersionedCommitter


def row(trace: str, reward: float | None, calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"trace_id": trace, "reward": reward, "calls": calls}


def pcall(question: str, tokens: list[int], temperature: float | None = 0.7, **over: Any) -> dict[str, Any]:
    request: dict[str, Any] = {"messages": [{"role": "user", "content": question}]}
    if temperature is not None:
        request["temperature"] = temperature
    return {
        "request": request,
        "prompt_token_ids": [1, 2, 3],
        "token_ids": tokens,
        "logprobs": [-0.5] * len(tokens),
        **over,
    }


def test_rows_become_traces_with_their_calls_temperature_and_cluster():
    rows = [
        row("a", 1.0, [pcall("q", [5, 6]), pcall("q again", [7], temperature=None)]),
        row("b", 0.0, [pcall("q", [8], token_ids=None), pcall("q", [9], logprobs=[-1.0, -2.0])]),
        row("c", None, [pcall("q", [1])]),  # no reward: not trained
    ]
    a, b = traces_of(rows)
    assert [c.completion_ids for c in a.calls] == [[5, 6], [7]]
    assert [c.temperature for c in a.calls] == [0.7, 1.0]  # serve's default when the request sets none
    assert a.cluster == b.cluster  # the same first question
    assert b.calls == [] and b.skipped == 2  # no token ids; logprobs of another length


@pytest.fixture
def admin():
    fake = FakeAdmin()
    with BackgroundServer(fake.app()) as server:
        yield fake, server


def make_sink(tmp_path, server, **over: Any) -> LocalCommitter:
    options = {**options_of(LocalCommitterSettings(admin_key_env="SWAP")), "trainer": SCRIPTED, **over}
    return LocalCommitter(tmp_path / "run", admin_url=server.base, admin_key=over.pop("key", SWAP_KEY), options=options)


def two(question: str = "q") -> list[dict[str, Any]]:
    """A batch of two rewarded traces with trainable calls."""
    return [row("a", 1.0, [pcall(question, [5])]), row("b", 0.0, [pcall(question, [6])])]


def test_a_batch_trains_once_into_a_version_and_nothing_is_swapped(tmp_path, admin):
    fake, server = admin
    sink = make_sink(tmp_path, server)
    try:
        assert isinstance(sink, VersionedCommitter)
        rows = [
            row("a", 1.0, [pcall("q1", [5]), pcall("q1 more", [6])]),
            row("b", 0.0, [pcall("q1", [7])]),
            row("c", 0.5, [pcall("q2", [8], token_ids=None)]),  # nothing trainable: no samples
        ]
        version = sink.send("batch-1", rows)
        (done,) = trained(sink.run_dir)
        samples = done["samples"]
        assert done["types"] == ["Sample"]  # built in the worker as backend-local's own Sample objects
        assert [s["completion_ids"] for s in samples] == [[5], [6], [7]]
        assert [s["advantage"] for s in samples] == [1.0, 1.0, -1.0]  # leave-one-out within cluster q1
        assert [s["weight"] for s in samples] == [0.5, 0.5, 1.0]  # 1 / calls of the trace
        assert {s["temperature"] for s in samples} == {0.7}
        checkpoint = sink.run_dir / "checkpoints" / "step-1"
        assert version == Version(
            "step-1",
            {"checkpoint": str(checkpoint), "step": 1, "parent": "step-0", "metrics": {"train/samples": 3.0}},
        )
        json.dumps(version.detail, allow_nan=False)  # plain JSON, as online's store keeps it
        assert fake.paths == [] and sink.skipped_calls == 1  # a candidate: online's promoter decides what is served
        assert sink.send("batch-1", rows) == version  # the outbox resends after a lost acknowledgement
        assert len(trained(sink.run_dir)) == 1 and fake.paths == []
    finally:
        sink.close()


def test_a_batch_without_a_trainable_call_makes_no_version(tmp_path, admin):
    _, server = admin
    sink = make_sink(tmp_path, server)
    try:
        rows = [row("a", 1.0, [pcall("q", [5], token_ids=None)]), row("b", None, [pcall("q", [6])])]
        assert sink.send("b1", rows) is None and sink.skipped_calls == 1
        assert sink.send("b1", rows) is None  # resent: still nothing to train
        assert trained(sink.run_dir) == [] and not (sink.run_dir / "checkpoints").exists()
    finally:
        sink.close()


def test_training_goes_back_to_a_version_and_step_numbers_never_repeat(tmp_path, admin):
    fake, server = admin
    sink = make_sink(tmp_path, server)
    try:
        v1 = sink.send("b1", two())
        v2 = sink.send("b2", [row("c", 1.0, [pcall("q", [7])])])
        assert (v1.name, v2.name) == ("step-1", "step-2") and v2.detail["parent"] == "step-1"
        sink.train_from(v1)  # step-2 refused: training goes on from step-1
        assert sink.send("b2", [row("c", 1.0, [pcall("q", [7])])]) == v2  # a resend still names step-2
        v3 = sink.send("b3", [row("d", 1.0, [pcall("q", [8])])])
        assert v3.name == "step-3" and v3.detail["parent"] == "step-1"
        runs = trained(sink.run_dir)
        assert [(t["batch_id"], t["step"], t["parent"]) for t in runs] == [
            ("b1", 1, "step-0"),
            ("b2", 2, "step-1"),
            ("b3", 3, "step-1"),
        ]
        # b3's advantage comes from step-1's baselines (1.0 then 0.0 at decay 0.9: 0.9), not step-2's
        assert runs[2]["samples"][0]["advantage"] == pytest.approx(1.0 - 0.9)
        sink.train_from(sink.initial_version())  # back to before any batch: no baselines
        v4 = sink.send("b4", [row("e", 1.0, [pcall("p", [9])]), row("f", 0.0, [pcall("p", [10])])])
        assert v4.name == "step-4" and v4.detail["parent"] == "step-0"
        assert [s["advantage"] for s in trained(sink.run_dir)[3]["samples"]] == [1.0, -1.0]
        sink.train_from(v4)  # already where training stands: nothing happens
        assert (sink.run_dir / "restored.txt").read_text().split() == ["step-1", "step-0"]
        assert fake.paths == []
    finally:
        sink.close()


def test_a_restarted_worker_resumes_where_training_went_back_to(tmp_path, admin):
    _, server = admin
    sink = make_sink(tmp_path, server)
    try:
        v1 = sink.send("b1", two())
        sink.send("b2", two("p"))
        sink.train_from(v1)
        sink.close()  # the worker ends (a crash, a restart of the gateway)
        assert sink.status()["head"] == "step-1"
        assert sink.send("b3", two("r")).detail["parent"] == "step-1"
        assert len((sink.run_dir / "starts.txt").read_text().split()) == 2
    finally:
        sink.close()


def test_serve_swaps_the_versions_checkpoint_and_answers_the_policy_version(tmp_path, admin):
    fake, server = admin
    sink = make_sink(tmp_path, server)
    try:
        v1 = sink.send("b1", two())
        assert sink.serve(sink.initial_version()) == "1"  # step-0 without an adapter: the base model
        assert sink.serve(v1) == "2"
        assert fake.paths == [None, str(sink.run_dir / "checkpoints" / "step-1")]
        assert json.loads((sink.run_dir / "served.json").read_text()) == {"served": ["step-1"]}
        fake.fail = 1
        with pytest.raises(SwapError, match="HTTP 500"):
            sink.serve(v1)
        assert sink.serve(v1) == "3" and len(fake.paths) == 3
        with pytest.raises(UnknownVersion, match="step-7"):
            sink.serve(Version("step-7"))
        with pytest.raises(ValueError, match="'v3' is not a version of the local committer"):
            sink.serve(Version("v3"))
    finally:
        sink.close()


def test_step_0_is_the_adapter_the_server_started_with(tmp_path, admin):
    fake, server = admin
    sink = make_sink(tmp_path, server, adapter="/adapters/first")
    try:
        first = sink.initial_version()
        assert first == Version("step-0", {"checkpoint": None, "adapter": "/adapters/first"})
        assert sink.serve(first) == "1" and fake.paths == ["/adapters/first"]
    finally:
        sink.close()


def test_a_wrong_admin_key_is_a_swap_error_and_nothing_is_loaded(tmp_path, admin):
    fake, server = admin
    sink = make_sink(tmp_path, server, key="wrong")
    try:
        with pytest.raises(SwapError, match="401"):
            sink.serve(sink.send("b1", two()))
        assert fake.paths == []
    finally:
        sink.close()


def test_served_versions_are_never_pruned(tmp_path, admin):
    _, server = admin
    sink = make_sink(tmp_path, server, keep_checkpoints=1)

    def kept() -> list[str]:
        return sorted(p.name for p in (sink.run_dir / "checkpoints").iterdir())

    try:
        sink.send("b1", two("q1"))
        v2 = sink.send("b2", two("q2"))
        assert kept() == ["step-2"]  # step-1 was never served: one never-served checkpoint is kept
        sink.serve(v2)  # promoted
        sink.send("b3", two("q3"))
        assert kept() == ["step-2", "step-3"]
        sink.train_from(v2)  # step-3 refused
        v4 = sink.send("b4", two("q4"))
        assert kept() == ["step-2", "step-4"] and v4.detail["parent"] == "step-2"
        sink.serve(v4)
        sink.train_from(v2)  # rolled back to step-2: both served versions stay
        sink.send("b5", two("q5"))
        sink.send("b6", two("q6"))
        assert kept() == ["step-2", "step-4", "step-6"]
    finally:
        sink.close()


def test_a_worker_that_dies_is_replaced_and_resumes_from_the_run_folder(tmp_path, admin):
    fake, server = admin
    sink = make_sink(tmp_path, server, die_on="b2")
    try:
        sink.send("b1", two())
        rows = [row("c", 1.0, [pcall("q", [7])])]
        with pytest.raises(concurrent.futures.process.BrokenProcessPool):
            sink.send("b2", rows)
        assert sink.send("b2", rows).name == "step-2"
        assert [t["batch_id"] for t in trained(sink.run_dir)] == ["b1", "b2"]
        starts = (sink.run_dir / "starts.txt").read_text().split()
        assert len(starts) == 2 and str(os.getpid()) not in starts  # trained in two worker processes, not here
        # b2's advantage comes from b1's saved moving average (1.0, then 0.0 at decay 0.9: 0.9)
        assert trained(sink.run_dir)[1]["samples"][0]["advantage"] == pytest.approx(1.0 - 0.9)
        assert fake.paths == []
    finally:
        sink.close()


def test_the_outbox_resends_a_batch_the_worker_died_on_and_it_trains_once(tmp_path, admin):
    _, server = admin
    store = TraceStore(tmp_path / "t.sqlite")
    sink = make_sink(tmp_path, server, die_on="*")  # the first training of each batch dies
    try:
        for i, r in enumerate([1.0, 0.0]):
            store.record(
                CallRecord(
                    trace_id=f"t{i}",
                    call_id=f"c{i}",
                    route="/v1/chat/completions",
                    mode="route",
                    request={"messages": [{"role": "user", "content": "same"}], "temperature": 0.8},
                    response={},
                    prompt_token_ids=[1, 2],
                    token_ids=[10 + i],
                    logprobs=[-0.3],
                )
            ).result(10)
            reward(store, f"t{i}", r)
        outbox = Outbox(store, sink)
        with pytest.raises(concurrent.futures.process.BrokenProcessPool):
            outbox.run_once()
        (batch_id,) = store.submit(lambda db: [r[0] for r in db.execute("SELECT batch_id FROM batches")]).result(10)
        assert store.batch_state(batch_id) == "committing"
        assert outbox.run_once() == [batch_id]  # resent with the same id: trained once
        assert store.batch_state(batch_id) == "committed"
        (done,) = trained(sink.run_dir)
        assert done["batch_id"] == batch_id and [s["advantage"] for s in done["samples"]] == [1.0, -1.0]
    finally:
        sink.close()
        store.close()


@pytest.fixture
def pm(reinforge_pm):
    """A fresh plugin manager with reinforge-online's plugin and this package's, as their entry points load them."""
    import reinforge_online.plugin as online_plugin

    reinforge_pm.register(online_plugin, name="reinforge-online")
    reinforge_pm.register(local_plugin, name="reinforge-backend-local")
    return reinforge_pm


def context(tmp_path, policy_url: str | None = "http://127.0.0.1:9/v1") -> CommitterContext:
    return CommitterContext(where="online.yaml", base_dir=tmp_path, policy_url=policy_url)


def test_the_committer_comes_through_onlines_hook_with_its_args_checked(tmp_path, pm, monkeypatch):
    monkeypatch.setenv("SWAP", "s")
    args = {"admin_key_env": "SWAP", "learning_rate": 3e-4, "run_dir": "runs/a"}
    committer = build_committer("local", args, context(tmp_path), pm=pm)
    assert isinstance(committer, LocalCommitter)
    assert committer.admin_url == "http://127.0.0.1:9"  # policy.url without /v1
    assert committer.run_dir == tmp_path / "runs" / "a"  # relative to online.yaml's folder
    assert committer.options["learning_rate"] == 3e-4 and committer._headers == {"authorization": "Bearer s"}
    own = build_committer("local", {**args, "admin_url": "http://127.0.0.1:7/"}, context(tmp_path, None), pm=pm)
    assert isinstance(own, LocalCommitter) and own.admin_url == "http://127.0.0.1:7"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, r"online.yaml: committer.args.admin_key_env: is required: .*reinforge serve --admin-key-env"),
        ({"admin_key_env": "SWAP", "baseline": {"kind": "group"}}, r"online.yaml: committer.args.baseline.kind"),
        ({"admin_key_env": "SWAP", "learning_rate": 0}, r"online.yaml: committer.args.learning_rate: must be greater"),
        ({"admin_key_env": "SWAP", "path": "x"}, r"unknown key 'committer.args.path'"),
        (
            {"admin_key_env": "UNSET_SWAP"},
            r"committer.args.admin_key_env: the environment variable UNSET_SWAP is not set",
        ),
    ],
)
def test_bad_args_name_the_file_and_the_key(tmp_path, pm, monkeypatch, args, message):
    monkeypatch.setenv("SWAP", "s")
    monkeypatch.delenv("UNSET_SWAP", raising=False)
    with pytest.raises(ConfigError, match=message):
        build_committer("local", args, context(tmp_path), pm=pm)


def test_without_a_policy_url_the_admin_url_is_required(tmp_path, pm, monkeypatch):
    monkeypatch.setenv("SWAP", "s")
    with pytest.raises(ConfigError, match=r"online.yaml: committer.args.admin_url: the local committer needs this URL"):
        build_committer("local", {"admin_key_env": "SWAP"}, context(tmp_path, None), pm=pm)


def test_the_installed_entry_point_registers_the_committer():
    from reinforge_online import committer_registry

    registry = committer_registry()
    entry = registry.get("committers", "local")
    assert entry is not None and entry.owner == "reinforge-backend-local"
    assert entry.settings is LocalCommitterSettings


def test_the_plugin_loads_without_reinforge_online(reinforge_pm):
    """Without online's hookspec the hookimpl is optional: the plugin registers and nothing is broken."""
    from reinforge.testing import check_hookimpls

    reinforge_pm.register(local_plugin, name="reinforge-backend-local")
    assert not reinforge_pm.hook.register_committers.has_spec()
    assert check_hookimpls(reinforge_pm) == []


def test_the_worker_trains_at_a_lower_priority_than_the_gateway(tmp_path, admin):
    _, server = admin
    sink = make_sink(tmp_path, server, nice=7)
    try:
        sink.status()
        assert int((sink.run_dir / "nice.txt").read_text()) == min(19, os.nice(0) + 7)
    finally:
        sink.close()


def _gone(pid: int, timeout: float) -> bool:
    """Whether process ``pid`` has ended (reaped or a zombie) within ``timeout`` seconds."""

    def ended() -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(")")[-1].split()[0] == "Z"
        except FileNotFoundError:
            return True

    return _wait_for(ended, timeout)


def test_close_stops_a_worker_stuck_in_training_and_the_batch_stays_committing(tmp_path, admin):
    import threading

    _, server = admin
    sink = make_sink(tmp_path, server, hang_on="b1")
    errors: list[BaseException] = []

    def send() -> None:
        try:
            sink.send("b1", [row("a", 1.0, [pcall("q", [5])]), row("b", 0.0, [pcall("p", [6])])])
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=send)
    thread.start()
    hanging = sink.run_dir / "hanging"
    assert _wait_for(hanging.exists, 60), "the worker never started the batch"
    worker = int(hanging.read_text())
    sink.close(timeout=0.5)
    thread.join(30)
    assert not thread.is_alive() and errors  # the send failed: the committer keeps the batch committing
    assert _gone(worker, 10)
    assert trained(sink.run_dir) == []


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_the_worker_ends_with_a_gateway_that_is_killed(tmp_path, admin):
    import signal
    import subprocess
    import sys
    from pathlib import Path

    _, server = admin
    script = f"""
import sys, time
sys.path.insert(0, {str(Path(__file__).parent)!r})
from reinforge_backend_local.online.committer import LocalCommitter, LocalCommitterSettings, options_of
options = {{**options_of(LocalCommitterSettings(admin_key_env="K")), "trainer": "local_testlib:scripted_trainer"}}
sink = LocalCommitter({str(tmp_path / "run")!r}, admin_url={server.base!r}, admin_key="k", options=options)
sink.status()
print(open({str(tmp_path / "run" / "starts.txt")!r}).read().split()[-1], flush=True)
time.sleep(600)
"""
    gateway = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(gateway.stdout.readline())
        assert not _gone(worker, 0.2)
        gateway.send_signal(signal.SIGKILL)  # no shutdown code runs in the gateway
        gateway.wait(10)
        assert _gone(worker, 10), "the training worker outlived the gateway"
    finally:
        gateway.kill()


def _wait_for(check, timeout: float) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False
