"""The in-process reward calculator: core's judges and composition on closed traces, through the real gateway."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from online_testlib import ADMIN_KEY, TRAFFIC_KEY, settings

from reinforge.plugin import ConfigError, ReinforgeError
from reinforge_online.config import load_config
from reinforge_online.pipeline import Pipeline
from reinforge_online.rewards import build_composer
from reinforge_online.store import CallRecord, TraceStore

BODY = {"model": "gpt-up", "messages": [{"role": "user", "content": "say policy"}], "metadata": {"answer": "policy"}}


def gw(server: Any) -> Any:
    return server.server.config.app.state.gateway


def ask(server: Any, body: dict[str, Any] = BODY) -> httpx.Response:
    r = httpx.post(f"{server.v1}/chat/completions", json=body, headers={"authorization": f"Bearer {TRAFFIC_KEY}"})
    assert r.status_code == 200
    return r


def judged(server: Any, n: int) -> dict[str, int]:
    """Wait until the calculator looked at ``n`` traces; what became of them."""
    rewards = gw(server).pipeline.rewards
    assert rewards.wait_results(n, timeout=10), rewards.results
    gw(server).store.submit(lambda db: None).result(10)  # the reward's own write committed
    return dict(rewards.results)


def sampled(**overrides: Any) -> dict[str, Any]:
    return {"selection": {"sampling_rate": 1.0}, **overrides}


def test_a_closed_trace_gets_the_composed_reward_of_core_judges(gateway):
    judges = [
        {"name": "exact_match", "metric": "correct", "weight": 0.75},  # core's built-in: task["answer"], from metadata
        {"name": "length_penalty", "metric": "short", "weight": 0.25, "args": {"target": 3, "limit": 7}},
    ]
    server = gateway(**sampled(reward={"judges": judges}))
    r = ask(server)
    assert judged(server, 1) == {"rewarded": 1}
    trace = gw(server).store.trace(r.headers["x-reinforge-trace-id"])
    assert trace["status"] == "rewarded" and trace["reward_source"] == "judge"
    m = trace["reward_metrics"]
    assert m["reward/correct"] == 1.0 and 0.0 < m["reward/short"] < 1.0  # "policy" is 6 characters
    assert trace["reward"] == pytest.approx(0.75 * 1.0 + 0.25 * m["reward/short"])
    assert trace["task"] == {"answer": "policy"}
    assert gw(server).metrics.judged.labels("rewarded")._value.get() == 1


def test_a_failed_judge_is_retried_then_rewards(gateway):
    server = gateway(**sampled(reward={"judges": ["online_testlib:FailsFirst"], "max_retries": 2}))
    r = ask(server)
    assert judged(server, 1) == {"rewarded": 1}
    assert gw(server).store.trace(r.headers["x-reinforge-trace-id"])["reward"] == 0.75
    (slot,) = gw(server).pipeline.rewards.composer.judges
    assert slot.fn.func.calls == 2  # FAILED once, then answered


def test_a_judge_that_keeps_failing_leaves_the_trace_unrewarded_never_zero(gateway, tmp_path):
    server = gateway(
        **sampled(
            reward={"judges": [{"ref": "online_testlib:FailsFirst", "args": {"failures": 99}}], "max_retries": 2},
            committer={"kind": "sink", "args": {"path": str(tmp_path / "out")}, "min_traces": 1, "interval_s": 3600},
        )
    )
    r = ask(server)
    assert judged(server, 1) == {"unrewarded/failed": 1}
    trace = gw(server).store.trace(r.headers["x-reinforge-trace-id"])
    assert trace["status"] == "unrewarded" and trace["reward"] is None
    assert "503" in trace["unrewarded"]["error"]
    assert gw(server).store.count("rewards") == 0 and gw(server).store.count("batches") == 0
    assert gw(server).pipeline.rewards.composer.judges[0].fn.func.calls == 3  # 1 + max_retries
    text = httpx.get(f"{server.base}/metrics", headers={"authorization": f"Bearer {ADMIN_KEY}"}).text
    assert 'reinforge_online_unrewarded_traces_total{reason="failed"} 1.0' in text
    # a person may still rate it later: feedback is not blocked by the judges' failure
    fb = httpx.post(
        f"{server.base}/online/v1/feedback",
        json={"trace_id": r.headers["x-reinforge-trace-id"], "reward": 0.5},
        headers={"x-reinforge-feedback-token": r.headers["x-reinforge-feedback-token"]},
    )
    assert fb.status_code == 200 and fb.json()["status"] == "recorded"


def test_a_judge_that_times_out_is_retried_then_unrewarded(gateway):
    server = gateway(**sampled(reward={"judges": ["online_testlib:Hangs"], "timeout_s": 0.05, "max_retries": 1}))
    r = ask(server)
    assert judged(server, 1) == {"unrewarded/failed": 1}
    trace = gw(server).store.trace(r.headers["x-reinforge-trace-id"])
    assert "timed out" in trace["unrewarded"]["error"] and trace["reward"] is None
    assert gw(server).pipeline.rewards.composer.judges[0].fn.func.calls == 2


def test_a_non_finite_reward_is_unrewarded_and_rewards_are_clamped(gateway):
    nan = gateway(**sampled(reward={"judges": ["online_testlib:nan_judge"]}))
    r = ask(nan)
    assert judged(nan, 1) == {"unrewarded/error": 1}
    assert "finite" in gw(nan).store.trace(r.headers["x-reinforge-trace-id"])["unrewarded"]["error"]
    assert gw(nan).store.count("rewards") == 0
    high = gateway(
        **sampled(reward={"judges": [{"ref": "online_testlib:const_judge", "args": {"value": 5.0}}], "reward_max": 1.0})
    )
    r = ask(high)
    assert judged(high, 1) == {"rewarded": 1}
    assert gw(high).store.trace(r.headers["x-reinforge-trace-id"])["reward"] == 1.0


def test_feedback_first_wins_over_the_judges_and_judges_first_make_feedback_a_conflict(gateway):
    server = gateway(**sampled(reward={"judges": ["online_testlib:const_judge"], "close_after_s": 3600}))
    r = ask(server)
    trace_id, token = r.headers["x-reinforge-trace-id"], r.headers["x-reinforge-feedback-token"]
    fb = httpx.post(
        f"{server.base}/online/v1/feedback",
        json={"trace_id": trace_id, "reward": 0.25},
        headers={"x-reinforge-feedback-token": token},
    )
    assert fb.status_code == 200
    gw(server).pipeline.close_trace(trace_id)  # the episode ends after its feedback: nothing left to judge
    assert judged(server, 1) == {"skipped": 1}
    assert gw(server).store.trace(trace_id)["reward"] == 0.25

    other = gateway(**sampled(reward={"judges": ["online_testlib:const_judge"]}))
    r = ask(other)
    assert judged(other, 1) == {"rewarded": 1}
    fb = httpx.post(
        f"{other.base}/online/v1/feedback",
        json={"trace_id": r.headers["x-reinforge-trace-id"], "reward": 0.25},
        headers={"x-reinforge-feedback-token": r.headers["x-reinforge-feedback-token"]},
    )
    assert fb.status_code == 409 and fb.json()["error"]["code"] == "reward_conflict"


def test_an_episode_closes_after_its_last_call(gateway):
    server = gateway(**sampled(reward={"judges": ["online_testlib:const_judge"], "close_after_s": 3600}))
    r = ask(server)
    headers = {k: r.headers[k] for k in ("x-reinforge-trace-id", "x-reinforge-feedback-token")}
    again = httpx.post(
        f"{server.v1}/chat/completions",
        json=BODY,
        headers={"authorization": f"Bearer {TRAFFIC_KEY}", **headers},
    )
    assert again.status_code == 200
    gw(server).store.submit(lambda db: None).result(10)
    assert gw(server).pipeline.rewards.results == {}  # still open: its close is an hour away
    gw(server).pipeline.close_trace(headers["x-reinforge-trace-id"])
    assert judged(server, 1) == {"rewarded": 1}
    trace = gw(server).store.trace(headers["x-reinforge-trace-id"])
    assert len(trace["calls"]) == 2 and trace["reward"] == 1.0


def test_judge_rewards_are_committed_like_feedback(gateway, tmp_path):
    out = tmp_path / "batches"
    server = gateway(
        **sampled(
            reward={"judges": ["exact_match"]},
            committer={"kind": "sink", "args": {"path": str(out)}, "min_traces": 2, "interval_s": 3600},
        )
    )
    ids = {ask(server).headers["x-reinforge-trace-id"] for _ in range(2)}
    assert gw(server).pipeline.outbox.wait_committed(1, timeout=10)
    (batch,) = out.glob("batch-*.jsonl")
    rows = [json.loads(line) for line in batch.read_text().splitlines()]
    assert {row["trace_id"] for row in rows} == ids
    assert all(row["reward"] == 1.0 and row["reward_metrics"]["reward/exact_match"] == 1.0 for row in rows)


def test_a_run_files_judges_are_used(tmp_path):
    (tmp_path / "run.yaml").write_text(
        "workflow: online_testlib:echo_workflow\n"
        "judges:\n"
        "  - {name: exact_match, metric: correct, weight: 0.5}\n"
        "  - {name: online_testlib:const_judge, metric: one, weight: 0.5, args: {value: 0.5}}\n"
    )
    (tmp_path / "online.yaml").write_text(
        "upstream: {url: 'http://127.0.0.1:9/v1'}\ndev: true\nmode: record\nreward: {run: run.yaml, timeout_s: 5}\n"
    )
    s = load_config(tmp_path / "online.yaml")
    assert s.reward is not None and s.reward.run == str(tmp_path / "run.yaml")
    composer = build_composer(s.reward)
    assert [j.name for j in composer.judges] == ["correct", "one"]
    assert composer.judge_timeout_s == 5 and composer.weights == {"correct": 0.5, "one": 0.5}


def test_bad_judges_are_errors_naming_the_key(tmp_path):
    with pytest.raises(ReinforgeError, match=r"test.yaml: reward.judges\[0\]: no judge named 'no_such_judge'"):
        build_composer(reward_settings(["no_such_judge"]), where="test.yaml")
    with pytest.raises(ReinforgeError, match=r"test.yaml: reward.judges\[0\]: .* no parameter 'valeu'"):
        build_composer(
            reward_settings([{"ref": "online_testlib:const_judge", "args": {"valeu": 1}}]), where="test.yaml"
        )
    (tmp_path / "run.yaml").write_text(
        "workflow: online_testlib:echo_workflow\njudges: [exact_match]\ngroup_reward: online_testlib:const_group\n"
    )
    with pytest.raises(ConfigError, match="reward.run: .* has a group_reward"):
        build_composer(reward_settings(None, run=str(tmp_path / "run.yaml")))


def reward_settings(judges: Any, run: str | None = None) -> Any:
    from reinforge.plugin import load_settings
    from reinforge_online.config import RewardSettings

    data = {"run": run} if run else {"judges": judges}
    return load_settings(RewardSettings, data, where="test.yaml", prefix="reward")


def test_traces_left_open_by_a_stop_are_judged_at_the_next_start(tmp_path):
    from online_testlib import SECRETS

    store = TraceStore(tmp_path / "t.sqlite")
    store.record(
        CallRecord(
            trace_id="left-open",
            call_id="c1",
            route="/v1/chat/completions",
            mode="route",
            request=BODY,
            response={"choices": [{"message": {"role": "assistant", "content": "policy"}, "finish_reason": "stop"}]},
            task={"answer": "policy"},
        )
    ).result(10)
    later = CallRecord(
        trace_id="also-open", call_id="c2", route="/v1/chat/completions", mode="route", request=BODY, response={}
    )
    store.record(later).result(10)
    store.close()
    s = settings(
        "http://127.0.0.1:1/v1",
        None,
        tmp_path / "t.sqlite",
        mode="record",
        reward={"judges": ["exact_match"], "queue_size": 1},
    )
    pipeline = Pipeline(s, SECRETS).start()
    try:
        assert pipeline.rewards is not None and pipeline.rewards.wait_results(1, timeout=10)
        pipeline.store.submit(lambda db: None).result(10)
        assert pipeline.store.trace("left-open")["reward"] == 1.0  # the oldest first
        assert pipeline.store.trace("also-open")["status"] == "open"  # beyond queue_size: left for a later start
        assert pipeline.rewards.results == {"rewarded": 1}
    finally:
        assert pipeline.close(timeout=10)


def test_the_math_examples_judges_score_a_gateway_trace():
    """The end-to-end benchmark's rewards: examples/math/run.yaml's gate, correctness, format and brevity."""
    import asyncio

    from reinforge_online.rewards import judge_inputs

    run = Path(__file__).resolve().parents[3] / "examples" / "math" / "run.yaml"
    composer = build_composer(reward_settings(None, run=str(run)))

    def trace(answer: str) -> dict[str, Any]:
        message = {"role": "assistant", "content": answer}
        call = {"request": BODY, "response": {"choices": [{"message": message, "finish_reason": "stop"}]}}
        return {"trace_id": "t", "task": {"question": "2+2?", "answer": "4"}, "calls": [call]}

    right = asyncio.run(composer.score(*judge_inputs(trace("4"))))
    wrong = asyncio.run(composer.score(*judge_inputs(trace("5"))))
    assert right.reward == pytest.approx(1.0) and right.rewards["reward/correct"] == 1.0
    assert wrong.reward == 0.0 and wrong.rewards["gate/correct_gate"] == 0.0  # a wrong answer: 0, a real score
