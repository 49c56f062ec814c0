"""The promotion gate and rollback: a scripted versioned committer behind the real outbox, store and gateway.

The committer's versions carry their quality in their detail, and its check returns it, so a test says
which candidates are better than the live one; what is served, trained from, refused and rolled back
is then read back from the committer's log, the store's ``versions`` and ``decisions`` and /metrics.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from online_testlib import ADMIN_KEY, HTTP, SECRETS, settings

from reinforge.plugin import ConfigError
from reinforge.testing import BackgroundServer
from reinforge_online import CheckResult, CheckSpec, Version, VersionedCommitter
from reinforge_online.app import build_app
from reinforge_online.config import load_config
from reinforge_online.pipeline import Pipeline
from reinforge_online.promotion import PromotionError
from reinforge_online.store import CallRecord

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


class Scripted:
    """A versioned committer: batch ``i`` makes ``step-i`` whose quality is ``qualities[i - 1]``."""

    def __init__(self, qualities: list[float], base: float = 0.5) -> None:
        self.qualities = list(qualities)
        self.base = base
        self.made: dict[str, Version] = {}
        self.log: list[tuple[str, str]] = []  # (what, version name)
        self.served = 0
        self.fail_check: set[str] = set()
        self.fail_serve: set[str] = set()
        self.changed = threading.Condition()

    def _note(self, what: str, name: str) -> None:
        with self.changed:
            self.log.append((what, name))
            self.changed.notify_all()

    def wait(self, what: str, n: int, timeout: float = 10) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: sum(1 for w, _ in self.log if w == what) >= n, timeout)

    def send(self, batch_id: str, rows: list[dict[str, Any]]) -> Version | None:
        if batch_id not in self.made:
            step = len(self.made) + 1
            self.made[batch_id] = Version(f"step-{step}", {"quality": self.qualities[step - 1], "rows": len(rows)})
        version = self.made[batch_id]
        self._note("send", version.name)
        return version

    def initial_version(self) -> Version:
        return Version("step-0", {"quality": self.base})

    def check(self, version: Version, spec: CheckSpec) -> CheckResult:
        self._note("check", version.name)
        if version.name in self.fail_check:
            raise RuntimeError("the check set could not be run")
        return CheckResult(score=float(version.detail["quality"]), tasks=spec.limit, seconds=0.01)

    def serve(self, version: Version) -> str | None:
        if version.name in self.fail_serve:
            raise ConnectionError("the policy server is down")
        self.served += 1
        self._note("serve", version.name)
        return str(self.served)

    def train_from(self, version: Version) -> None:
        self._note("train_from", version.name)


def test_the_scripted_committer_is_a_versioned_one():
    assert isinstance(Scripted([]), VersionedCommitter)


def online(tmp_path: Path, **overrides: Any) -> Any:
    (tmp_path / "check.yaml").write_text("# a run file (the scripted committer does not read it)\n")
    data = {"committer": {"kind": "none", "interval_s": 3600, "min_traces": 1}, **overrides}
    return settings("http://127.0.0.1:1/v1", "http://127.0.0.1:1/v1", tmp_path / "t.sqlite", **data)


def reward_one(pipeline: Pipeline, served_as: str | None = None, reward: float = 1.0, *, wake: bool = True) -> str:
    """A sampled trace answered by policy version ``served_as``, with its reward; ``wake``: the outbox is told
    (it makes a batch, hence a version), else the reward just waits in the store."""
    trace_id = uuid.uuid4().hex
    call = CallRecord(trace_id, uuid.uuid4().hex, "/v1/chat/completions", "route", {"messages": []}, {})
    call.policy_version = served_as
    pipeline.store.record(call).result(10)

    def rewarded(db: Any) -> None:
        db.execute(
            "INSERT INTO rewards (trace_id, reward, source, created_at) VALUES (?, ?, 'feedback', ?)",
            (trace_id, reward, time.time()),
        )
        db.execute("UPDATE traces SET status = 'rewarded' WHERE trace_id = ?", (trace_id,))

    pipeline.store.submit(rewarded).result(10)
    if wake:
        pipeline.rewarded()
    return trace_id


def started(tmp_path: Path, scripted: Scripted, /, **overrides: Any) -> Pipeline:
    committer = scripted
    pipeline = Pipeline(online(tmp_path, **overrides), SECRETS, committer=committer).start()
    assert committer.wait("serve", 1), committer.log  # v0 served at start
    return pipeline


def states(pipeline: Pipeline) -> list[tuple[int, str, str]]:
    assert pipeline.promoter is not None
    return [(v.seq, v.name, v.state) for v in pipeline.promoter.versions()]


def test_without_a_gate_every_candidate_is_served_at_once(tmp_path, caplog):
    committer = Scripted([0.1, 0.2])
    pipeline = started(tmp_path, committer)
    try:
        assert "no promotion gate" in caplog.text
        for n in (1, 2):
            reward_one(pipeline)
            assert pipeline.outbox is not None and pipeline.outbox.wait_committed(n, 10)
            assert pipeline.promoter is not None and pipeline.promoter.wait_decided(n + 1, 10)
        assert states(pipeline) == [(0, "step-0", "retired"), (1, "step-1", "retired"), (2, "step-2", "live")]
        assert [w for w, _ in committer.log if w == "check"] == []  # no gate, no check
    finally:
        pipeline.close()


def test_the_gate_promotes_at_least_as_good_and_refuses_worse(tmp_path):
    committer = Scripted([0.6, 0.4, 0.6], base=0.5)
    pipeline = started(tmp_path, committer, gate={"run": str(tmp_path / "check.yaml"), "limit": 16})
    promoter = pipeline.promoter
    assert promoter is not None
    try:
        for n in (1, 2, 3):
            reward_one(pipeline)
            assert pipeline.outbox is not None and pipeline.outbox.wait_committed(n, 10)
            assert promoter.wait_decided(n + 1, 10)  # v0 at start, then each candidate
        assert states(pipeline) == [
            (0, "step-0", "retired"),  # scored 0.5 at start
            (1, "step-1", "retired"),  # 0.6 >= 0.5: promoted
            (2, "step-2", "refused"),  # 0.4 < 0.6
            (3, "step-3", "live"),  # 0.6 >= 0.6: promoted
        ]
        served = [name for what, name in committer.log if what == "serve"]
        assert served == ["step-0", "step-1", "step-3"]  # the refused one never reached the server
        assert ("train_from", "step-1") in committer.log  # after the refusal: back to what is served
        decisions = {(d["version"], d["decision"]) for d in promoter.decisions()}
        assert {(2, "refused"), (3, "promoted"), (1, "promoted")} <= decisions
        m = pipeline.metrics
        assert m.version_decisions.labels("refused")._value.get() == 1
        assert m.version_decisions.labels("promoted")._value.get() == 3  # v0, v1, v3
        assert m.live_version._value.get() == 3 and m.check_score.labels("live")._value.get() == 0.6
    finally:
        pipeline.close()


def test_a_margin_lets_a_slightly_worse_candidate_through(tmp_path):
    committer = Scripted([0.45, 0.3], base=0.5)
    pipeline = started(tmp_path, committer, gate={"run": str(tmp_path / "check.yaml"), "margin": 0.1})
    try:
        for n in (1, 2):
            reward_one(pipeline)
            assert pipeline.outbox is not None and pipeline.outbox.wait_committed(n, 10)
            assert pipeline.promoter is not None and pipeline.promoter.wait_decided(n + 1, 10)
        assert [s for _, _, s in states(pipeline)] == ["retired", "live", "refused"]  # 0.45 >= 0.4; 0.3 < 0.35
    finally:
        pipeline.close()


@pytest.mark.parametrize("failing", ["check", "serve"])
def test_a_candidate_whose_check_or_serve_fails_is_refused_and_the_live_one_stays(tmp_path, failing):
    committer = Scripted([0.9], base=0.5)
    getattr(committer, f"fail_{failing}").add("step-1")
    pipeline = started(tmp_path, committer, gate={"run": str(tmp_path / "check.yaml")})
    try:
        reward_one(pipeline)
        assert pipeline.outbox is not None and pipeline.outbox.wait_committed(1, 10)
        assert pipeline.promoter is not None and pipeline.promoter.wait_decided(2, 10)
        assert committer.wait("train_from", 1)
        assert states(pipeline) == [(0, "step-0", "live"), (1, "step-1", "refused")]
        (last,) = [d for d in pipeline.promoter.decisions() if d["version"] == 1]  # type: ignore[union-attr]
        assert last["decision"] == "refused" and (
            "check failed" in last["reason"] or "serving it failed" in last["reason"]
        )
    finally:
        pipeline.close()


def test_a_live_version_whose_rolling_reward_falls_is_rolled_back(tmp_path, caplog):
    committer = Scripted([0.5], base=0.5)
    pipeline = started(
        tmp_path,
        committer,
        rollback={"window": 10, "min_traces": 5, "margin": 0.2},
        committer={"kind": "none", "interval_s": 3600, "min_traces": 6},  # v1's five rewards make no batch
    )
    promoter = pipeline.promoter
    assert promoter is not None and pipeline.outbox is not None
    try:
        for _ in range(6):  # v0 (served as "1") earns rewards of 1.0; one batch of them makes v1
            reward_one(pipeline, served_as="1", reward=1.0, wake=False)
        pipeline.rewarded(6)
        assert pipeline.outbox.wait_committed(1, 10) and promoter.wait_decided(2, 10)  # v1 promoted (no gate), as "2"
        for _ in range(4):
            reward_one(pipeline, served_as="2", reward=0.0, wake=False)  # v1 does far worse...
        assert promoter.watch() is None  # ... but with fewer than min_traces nothing is decided
        reward_one(pipeline, served_as="2", reward=0.0, wake=False)
        reason = promoter.watch()
        assert reason is not None and "fell below v0's 1.000" in reason, reason
        assert committer.wait("serve", 3)
        assert states(pipeline) == [(0, "step-0", "live"), (1, "step-1", "rolled_back")]
        assert ("train_from", "step-0") in committer.log
        assert pipeline.metrics.version_decisions.labels("rolled_back")._value.get() == 1
        assert "rolled_back" in caplog.text and "rolling reward" in caplog.text
    finally:
        pipeline.close()


def test_an_operator_rolls_back_and_lists_versions_over_http_and_the_command_line(tmp_path):
    committer = Scripted([0.7, 0.8], base=0.5)
    s = online(tmp_path, gate={"run": str(tmp_path / "check.yaml")})
    pipeline = Pipeline(s, SECRETS, committer=committer).start()
    with BackgroundServer(build_app(s, SECRETS, pipeline=pipeline)) as server:
        try:
            for n in (1, 2):
                reward_one(pipeline)
                assert pipeline.outbox is not None and pipeline.outbox.wait_committed(n, 10)
                assert pipeline.promoter is not None and pipeline.promoter.wait_decided(n + 1, 10)
            listed = HTTP.get(f"{server.base}/online/v1/versions", headers=ADMIN).json()
            assert listed["live"] == 2 and [v["state"] for v in listed["versions"]] == ["retired", "retired", "live"]
            assert HTTP.get(f"{server.base}/online/v1/versions").status_code == 401  # the admin key
            # the command line, as an operator runs it, against this gateway
            config = tmp_path / "online.yaml"
            config.write_text(
                json.dumps(
                    {
                        "upstream": {"url": "http://x/v1"},
                        "mode": "record",
                        "auth": {"admin_key_env": "ADM"},
                        "dev": True,
                    }
                )
            )
            env = {**os.environ, "ADM": ADMIN_KEY, "REINFORGE_LOAD_PLUGINS": "reinforge-online"}
            cli = [sys.executable, "-m", "reinforge", "online"]
            out = subprocess.run(
                [*cli, "rollback", "0", str(config), "--url", server.base],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 0 and "v0 (step-0) is served again" in out.stdout, out.stderr
            out = subprocess.run(
                [*cli, "versions", str(config), "--url", server.base],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert out.returncode == 0, out.stderr
            assert "*    v0  live" in out.stdout and "v2  rolled_back" in out.stdout and "manual_rollback" in out.stdout
            # a version that was never live, or an unknown one, cannot come back
            refused = HTTP.post(f"{server.base}/online/v1/rollback", json={"version": 9}, headers=ADMIN)
            assert refused.status_code == 409 and refused.json()["error"]["code"] == "cannot_roll_back"
            assert committer.log[-1] == ("train_from", "step-0")
        finally:
            pipeline.close()


def test_a_restart_serves_the_live_version_again_and_refuses_an_undecided_candidate(tmp_path):
    committer = Scripted([0.9], base=0.5)
    s = online(tmp_path, gate={"run": str(tmp_path / "check.yaml")})
    first = Pipeline(s, SECRETS, committer=committer).start()
    assert committer.wait("serve", 1)
    assert first.promoter is not None
    first.promoter.rollback_settings = None
    # a candidate the gateway recorded but never decided about (it was stopped mid-check)
    first.store.submit(
        lambda db: db.execute(
            "INSERT INTO versions (seq, name, state, created_at, parent, score, data) VALUES (1, 'step-1', 'candidate', 0, 0, NULL, '{}')"
        )
    ).result(10)
    first.close()
    again = Scripted([0.9], base=0.5)
    second = Pipeline(s, SECRETS, committer=again).start()
    try:
        assert again.wait("train_from", 1)
        assert again.log[:2] == [("serve", "step-0"), ("train_from", "step-0")]
        assert states(second) == [(0, "step-0", "live"), (1, "step-1", "refused")]
    finally:
        second.close()


def test_a_gate_needs_a_committer_that_makes_versions(tmp_path):
    s = online(tmp_path, gate={"run": str(tmp_path / "check.yaml")}, committer={"kind": "sink"})
    with pytest.raises(ConfigError, match="gate: the promotion gate needs a committer that trains the served policy"):
        Pipeline(s, SECRETS)


def test_the_gates_run_file_is_found_next_to_online_yaml(tmp_path):
    (tmp_path / "check.yaml").write_text("{}\n")
    config = tmp_path / "online.yaml"
    config.write_text(
        json.dumps({"upstream": {"url": "http://x/v1"}, "mode": "record", "dev": True, "gate": {"run": "check.yaml"}})
    )
    assert load_config(config).gate.run == str(tmp_path / "check.yaml")  # type: ignore[union-attr]
    config.write_text(
        json.dumps({"upstream": {"url": "http://x/v1"}, "mode": "record", "dev": True, "gate": {"run": "nope.yaml"}})
    )
    with pytest.raises(ConfigError, match=r"online.yaml: gate.run: 'nope.yaml' does not exist"):
        load_config(config)
    config.write_text(
        json.dumps({"upstream": {"url": "http://x/v1"}, "mode": "record", "dev": True, "gate": {"limit": 4}})
    )
    with pytest.raises(ConfigError, match="gate.run: name the run file"):
        load_config(config)


def test_manual_rollback_refuses_what_cannot_come_back(tmp_path):
    committer = Scripted([0.1], base=0.5)
    pipeline = started(tmp_path, committer, gate={"run": str(tmp_path / "check.yaml")})
    try:
        assert pipeline.promoter is not None
        with pytest.raises(PromotionError, match="v0 is the live version already"):
            pipeline.promoter.rollback(0)
        reward_one(pipeline)
        assert pipeline.outbox is not None and pipeline.outbox.wait_committed(1, 10)
        assert pipeline.promoter.wait_decided(2, 10)
        with pytest.raises(PromotionError, match="v1 was never live"):
            pipeline.promoter.rollback(1)
    finally:
        pipeline.close()


def test_versions_and_decisions_on_either_store(tmp_path, make_store):
    """The gate's and rollback's rows on SQLite and (in the online_postgres session) on PostgreSQL."""
    committer = Scripted([0.6, 0.4], base=0.5)
    s = online(tmp_path, gate={"run": str(tmp_path / "check.yaml")}, rollback={"window": 4, "min_traces": 2})
    pipeline = Pipeline(s, SECRETS, store=make_store(), committer=committer).start()
    try:
        assert pipeline.promoter is not None and pipeline.promoter.wait_decided(1, 10)
        assert pipeline.outbox is not None
        for _ in range(2):
            reward_one(pipeline, served_as="1", wake=False)  # v0, served as "1", does well
        pipeline.rewarded(2)
        assert pipeline.outbox.wait_committed(1, 10) and pipeline.promoter.wait_decided(2, 10)  # v1: 0.6 >= 0.5
        for _ in range(2):
            reward_one(pipeline, served_as="2", reward=-1.0, wake=False)  # v1, served as "2", does badly
        pipeline.rewarded(2)
        assert pipeline.outbox.wait_committed(2, 10) and pipeline.promoter.wait_decided(3, 10)  # v2: 0.4 < 0.6
        pipeline.promoter.watch()  # the outbox watches after each pass too: one of them rolls v1 back
        assert pipeline.promoter.wait_decided(4, 10)
        assert states(pipeline) == [(0, "step-0", "live"), (1, "step-1", "rolled_back"), (2, "step-2", "refused")]
        assert [d["decision"] for d in pipeline.promoter.decisions()][:3] == ["rolled_back", "refused", "promoted"]
    finally:
        pipeline.close()


def test_a_drop_the_windows_noise_explains_is_not_rolled_back(tmp_path):
    committer = Scripted([0.5], base=0.5)
    pipeline = started(
        tmp_path,
        committer,
        rollback={"window": 10, "min_traces": 5, "margin": 0.1, "z": 2.0},
        committer={"kind": "none", "interval_s": 3600, "min_traces": 12},  # v1's ten rewards make no batch
    )
    promoter = pipeline.promoter
    assert promoter is not None and pipeline.outbox is not None
    try:
        for i in range(12):  # v0 ("1"): 1, 0, 1, 0, ... (mean 0.5 and a wide spread)
            reward_one(pipeline, served_as="1", reward=float(i % 2 == 0), wake=False)
        pipeline.rewarded(12)
        assert pipeline.outbox.wait_committed(1, 10) and promoter.wait_decided(2, 10)  # v1 ("2") promoted
        for r in (0.0, 0.0, 1.0, 0.0, 0.0):  # mean 0.2: 0.3 below, past the margin, but within two standard errors
            reward_one(pipeline, served_as="2", reward=r, wake=False)
        assert promoter.watch() is None
        for _ in range(5):  # mean 0.1 over ten: now the drop is more than the noise
            reward_one(pipeline, served_as="2", reward=0.0, wake=False)
        reason = promoter.watch()
        assert reason is not None and "2 standard errors" in reason, reason
    finally:
        pipeline.close()
