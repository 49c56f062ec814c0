"""Retries with backoff, then FAILED (never reward 0); the cache; the concurrency limit; usage and cost."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest
from judges_llm_testlib import JudgeScript, quality, verdict

from reinforge import RunnerConfig, TaskStatus, WorkflowOutput
from reinforge.plugin import ComponentSpec, RunConfig
from reinforge.testing import Reply, ScriptedChatModel, runner_for
from reinforge_judges_llm import JudgeConfigError, PointwiseJudge
from reinforge_judges_llm.client import backoff_delay, classify_error

TASK = {"question": "What is the capital of France?"}


def run(coro):
    return asyncio.run(coro)


def test_flaky_server_is_retried_until_a_valid_verdict(openai_server) -> None:
    faults = iter(
        [
            Reply(status=500, content="upstream exploded"),
            Reply(status=429, content="slow down"),
            Reply(content=verdict(4), delay=30),  # no reply within timeout_s
            Reply(raw_body=b"{not json at all"),  # a malformed HTTP body
            Reply(content="I think it deserves a four."),  # a malformed verdict: no JSON
            Reply(content=verdict(9)),  # a verdict outside the scale
            Reply(content="```json\n" + verdict(4) + "\n```"),
        ]
    )
    srv = openai_server(lambda body: next(faults))
    judge = PointwiseJudge(model="judge", api_base=srv.base_url, max_retries=6, backoff_s=0.001, timeout_s=0.5)
    out = run(judge(TASK, "Paris"))
    assert out.status is TaskStatus.SUCCESS and out.reward == 0.75
    assert srv.call_count == 7
    assert out.metrics["usage/calls"] == 7.0 and out.metrics["usage/retries"] == 6.0


def test_a_server_that_keeps_failing_gives_failed_not_zero(openai_server) -> None:
    for fault in (
        Reply(status=503, content="overloaded"),
        Reply(raw_body=b"<html>bad gateway</html>"),
        Reply(content="no json here"),
    ):
        srv = openai_server(lambda body, fault=fault: fault)
        judge = PointwiseJudge(model="judge", api_base=srv.base_url, max_retries=2, backoff_s=0.001, cache=False)
        out = run(judge(TASK, "Paris"))
        assert out.status is TaskStatus.FAILED
        assert out.reward is None  # never a reward of 0 for a failure
        assert "after 3 attempt(s)" in out.error and "'llm-pointwise'" in out.error
        assert srv.call_count == 3


def test_timeouts_are_retried_then_failed(openai_server) -> None:
    srv = openai_server(lambda body: Reply(content=verdict(5), delay=30))
    judge = PointwiseJudge(model="judge", api_base=srv.base_url, max_retries=1, backoff_s=0, timeout_s=0.3)
    out = run(judge(TASK, "Paris"))
    assert out.status is TaskStatus.FAILED and out.reward is None
    assert "timeout_s=0.3" in out.error and srv.call_count == 2


def test_a_request_the_model_rejects_fails_without_retrying(openai_server) -> None:
    srv = openai_server(lambda body: Reply(status=400, content="this input is not acceptable"))
    out = run(PointwiseJudge(model="judge", api_base=srv.base_url, backoff_s=0)(TASK, "Paris"))
    assert out.status is TaskStatus.FAILED and srv.call_count == 1
    assert "rejected this input" in out.error


def test_a_refused_key_stops_the_run_naming_what_to_fix(openai_server, monkeypatch) -> None:
    srv = openai_server(JudgeScript(pointwise=lambda t, r, ref: 3), api_key="secret")
    with pytest.raises(JudgeConfigError, match=r"'llm-pointwise'.*judge@http://127\.0\.0\.1.*api_key_env"):
        run(PointwiseJudge(model="judge", api_base=srv.base_url)(TASK, "Paris"))
    assert srv.call_count == 0  # refused before the responder: no retries either
    monkeypatch.setenv("JUDGE_KEY", "secret")
    out = run(PointwiseJudge(model="judge", api_base=srv.base_url, api_key_env="JUDGE_KEY")(TASK, "Paris"))
    assert out.reward == 0.5


def test_zero_rewards_from_failures_none_through_the_runner(openai_server, reinforge_pm) -> None:
    """Through core's runner: flaky judgments are retried, then the sample is discarded, never scored 0."""

    def responder(body):
        text = body["messages"][-1]["content"]
        if "always-flaky" in text:
            return Reply(status=500, content="flaky")
        return verdict(quality(text) + 1)

    srv = openai_server(responder)
    answers = ["always-flaky quality=0", "good quality=4", "bad quality=0", "ok quality=2"] * 2
    model = ScriptedChatModel(answers)

    async def workflow(task, model):
        return WorkflowOutput(response=(await model.chat([{"role": "user", "content": task["question"]}])).content)

    judge = PointwiseJudge(model="judge", api_base=srv.base_url, max_retries=1, backoff_s=0)
    run_config = RunConfig(
        workflow=ComponentSpec(ref=workflow),
        judges=[ComponentSpec(ref=judge, name="quality", kind="model")],
        runner=RunnerConfig(max_concurrency=1, max_retries=1),
    )
    with runner_for(run_config, model, plugin_manager=reinforge_pm, group_size=8) as runner:
        result = runner.run([{"question": "q1"}])
    kept = result.trajectories
    discarded = [t for g in result.groups for t in g.discarded]
    assert {t.response for t in discarded} == {"always-flaky quality=0"}
    assert all(t.status is TaskStatus.FAILED and t.reward is None for t in discarded)
    assert len(kept) == 6 and len(discarded) == 2
    # every kept reward is a real verdict (score q+1 on 1-5 -> q/4); none comes from a failure
    assert sorted(t.reward for t in kept) == [0.0, 0.0, 0.5, 0.5, 1.0, 1.0]
    assert all(t.reward == quality(t.response) / 4 for t in kept)
    assert result.counters["failed/judge"] >= 1


def test_concurrency_limit_bounds_requests_in_flight(openai_server) -> None:
    limit = 2
    lock = threading.Condition()
    state = {"active": 0, "peak": 0}

    def responder(body):
        with lock:
            state["active"] += 1
            state["peak"] = max(state["peak"], state["active"])
            lock.notify_all()
            lock.wait_for(lambda: state["active"] >= limit, timeout=5)  # wait for a partner, never a fixed sleep
            state["active"] -= 1
        return verdict(3)

    srv = openai_server(responder)
    judge = PointwiseJudge(model="judge", api_base=srv.base_url, max_concurrency=limit)

    async def many():
        return await asyncio.gather(*(judge(TASK, f"answer {i}") for i in range(8)))

    outs = run(many())
    assert all(o.reward == 0.5 for o in outs) and srv.call_count == 8
    assert state["peak"] == limit


def test_identical_judgments_in_flight_share_one_call(openai_server) -> None:
    srv = openai_server(JudgeScript(pointwise=lambda t, r, ref: 5))
    judge = PointwiseJudge(model="judge", api_base=srv.base_url)

    async def twice():
        return await asyncio.gather(judge(TASK, "Paris"), judge(TASK, "Paris"), judge(TASK, "Lyon"))

    a, b, c = run(twice())
    assert a.reward == b.reward == c.reward == 1.0
    assert srv.call_count == 2
    assert a.metrics["usage/calls"] + b.metrics["usage/calls"] == 1.0


def test_sqlite_cache_survives_a_fresh_judge_and_keys_on_model_and_settings(openai_server, tmp_path) -> None:
    srv = openai_server(JudgeScript(pointwise=lambda t, r, ref: 2 + len(r) % 3))
    cache = tmp_path / "cache" / "verdicts.sqlite"
    settings = {"model": "judge", "api_base": srv.base_url, "cache_path": str(cache)}
    answers = [f"answer number {i}" for i in range(5)]
    with PointwiseJudge(**settings) as judge:
        first = [run(judge(TASK, a)).reward for a in answers]
    assert srv.call_count == 5 and cache.is_file()

    with PointwiseJudge(**settings) as judge:  # a judge of the next run opens the same file
        second = [run(judge(TASK, a)).reward for a in answers]
    assert second == first and srv.call_count == 5  # a rerun makes zero HTTP calls

    run(PointwiseJudge(**settings, rubric="Is it polite?")(TASK, answers[0]))
    run(PointwiseJudge(**{**settings, "model": "other-judge"})(TASK, answers[0]))
    run(PointwiseJudge(**settings, seed=7)(TASK, answers[0]))
    assert srv.call_count == 8  # rubric, model and sampling are part of the key
    no_cache = PointwiseJudge(**{**settings, "cache": False})
    run(no_cache(TASK, answers[0]))
    run(no_cache(TASK, answers[0]))
    assert srv.call_count == 10


def test_requests_are_deterministic_where_the_provider_allows(openai_server) -> None:
    srv = openai_server(JudgeScript(pointwise=lambda t, r, ref: 3))
    run(PointwiseJudge(model="judge", api_base=srv.base_url)(TASK, "a"))
    run(PointwiseJudge(model="judge", api_base=srv.base_url, seed=42, json_mode=True, max_tokens=200)(TASK, "a"))
    first, second = srv.requests
    assert first["temperature"] == 0.0 and first["seed"] == 0 and "response_format" not in first
    assert second["seed"] == 42 and second["response_format"] == {"type": "json_object"}
    assert second["max_tokens"] == 200


def test_usage_tokens_and_cost_are_reported(openai_server) -> None:
    import litellm

    srv = openai_server(JudgeScript(pointwise=lambda t, r, ref: 4), model_name="gpt-4o-mini")
    judge = PointwiseJudge(model="gpt-4o-mini", api_base=srv.base_url)
    out = run(judge(TASK, "Paris is the capital."))
    prompt, completion = out.metrics["usage/prompt_tokens"], out.metrics["usage/completion_tokens"]
    assert prompt > 100 and completion == len(verdict(4).split())  # the test server counts words
    price = litellm.model_cost["gpt-4o-mini"]
    expected = prompt * price["input_cost_per_token"] + completion * price["output_cost_per_token"]
    assert out.metrics["usage/cost_usd"] == pytest.approx(expected)
    assert out.metrics["usage/cost_usd"] > 0
    cached = run(judge(TASK, "Paris is the capital."))
    assert cached.metrics["usage/cost_usd"] == 0.0 and cached.metrics["usage/cache_hits"] == 1.0
    assert judge.usage.calls == 1 and judge.usage.cache_hits == 1 and judge.usage.prompt_tokens == prompt


def test_backoff_grows_exponentially_with_jitter_and_a_cap() -> None:
    rng = random.Random(0)
    delays = [backoff_delay(a, 1.0, 8.0, rng) for a in range(1, 7)]
    ceilings = [1, 2, 4, 8, 8, 8]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings))
    assert backoff_delay(0, 1.0, 8.0) == 0.0 and backoff_delay(3, 0.0, 8.0) == 0.0


def test_error_classes() -> None:
    class Status(Exception):
        def __init__(self, code):
            self.status_code = code

    assert classify_error(asyncio.TimeoutError()) == "transient"
    assert [classify_error(Status(c)) for c in (429, 500, 503, 408)] == ["transient"] * 4
    assert [classify_error(Status(c)) for c in (401, 403, 404)] == ["config"] * 3
    assert classify_error(Status(400)) == "input" and classify_error(Status(422)) == "input"
    assert classify_error(ConnectionResetError()) == "transient"
