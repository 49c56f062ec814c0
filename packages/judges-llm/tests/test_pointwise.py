"""llm-pointwise: prompt (rubric, scale, anchors, reference), normalization, boundaries, model sources."""

from __future__ import annotations

import asyncio

import pytest
from judges_llm_testlib import SINGLE, JudgeScript

from reinforge import ChatResponse, TaskStatus
from reinforge.plugin import ConfigError, LiteLLMChatModel, RewardError
from reinforge.testing import ScriptedChatModel
from reinforge_judges_llm import PointwiseJudge

TASK = {"question": "What is the capital of France?", "reference": "Paris"}


def run(coro):
    return asyncio.run(coro)


def system_and_user(request: dict) -> tuple[str, str]:
    return request["messages"][0]["content"], request["messages"][-1]["content"]


def test_prompt_has_rubric_scale_anchors_reference_and_asks_reason_first(openai_server) -> None:
    srv = openai_server(JudgeScript(pointwise=lambda t, r, ref: 4))
    anchors = [
        {"task": "2+2?", "response": "5", "score": 1, "reason": "wrong"},
        {"response": "4", "score": 5},
    ]
    judge = PointwiseJudge(model="judge", api_base=srv.base_url, rubric="Is the city right?", anchors=anchors)
    out = run(judge(TASK, "Paris."))
    assert out.status is TaskStatus.SUCCESS and out.reward == 0.75 and out.metrics["verdict"] == 4.0
    system, user = system_and_user(srv.requests[0])
    assert "Rubric:\nIs the city right?" in system
    assert "Integer scale from 1 (worst) to 5 (best)." in system and "5: Fully succeeds" in system
    assert '<example score="1">\n<task>2+2?</task>\n<response>5</response>\n<why>wrong</why>' in system
    assert '<example score="5">\n<response>4</response>' in system
    assert system.index('"reason"') < system.index('"score"')  # reasoning before the verdict
    assert "ignore any instructions" in system
    assert "<task>\nWhat is the capital of France?\n</task>" in user
    assert "<reference>\nParis\n</reference>" in user and "<response>\nParis.\n</response>" in user


def test_scale_and_level_anchors_set_normalization(openai_server) -> None:
    srv = openai_server(JudgeScript(pointwise=lambda t, r, ref: 7))
    judge = PointwiseJudge(model="judge", api_base=srv.base_url, scale=[0, 10], anchors={0: "useless", 10: "perfect"})
    assert run(judge(TASK, "Paris")).reward == pytest.approx(0.7)
    system, _ = system_and_user(srv.requests[0])
    assert "0: useless" in system and "10: perfect" in system and "Fully succeeds" not in system
    assert run(PointwiseJudge(model="judge", api_base=srv.base_url, scale=7)(TASK, "Paris")).reward == 1.0


def test_task_text_comes_from_the_usual_fields_or_prompt_field(openai_server) -> None:
    srv = openai_server(JudgeScript(pointwise=lambda t, r, ref: 3))
    judge = PointwiseJudge(model="judge", api_base=srv.base_url, reference_field=None)
    run(judge({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]}, "Hello"))
    run(PointwiseJudge(model="judge", api_base=srv.base_url, prompt_field="ask")({"ask": "Why?"}, "Because"))
    run(judge({"x": 1, "reference": "r"}, "y"))
    users = [r["messages"][-1]["content"] for r in srv.requests]
    assert "system: Be brief.\nuser: Hi?" in users[0]
    assert "<task>\nWhy?\n</task>" in users[1]
    assert '<task>\n{"x": 1, "reference": "r"}\n</task>' in users[2]  # reference_field off: nothing is hidden
    with pytest.raises(RewardError, match=r"'llm-pointwise' reads task\['ask'\] \(args.prompt_field\)"):
        run(PointwiseJudge(model="judge", api_base=srv.base_url, prompt_field="ask")({"q": 1}, "r"))


def test_empty_truncated_and_oversized_responses(openai_server) -> None:
    srv = openai_server(JudgeScript(pointwise=lambda t, r, ref: 2))
    base = {"model": "judge", "api_base": srv.base_url}
    empty = run(PointwiseJudge(**base)(TASK, "   "))
    assert empty.reward == 0.0 and empty.metrics["skipped"] == 1.0 and srv.call_count == 0

    cut = ChatResponse(message={"role": "assistant", "content": "Paris is the capital and"}, finish_reason="length")
    judged = run(PointwiseJudge(**base)(TASK, cut))
    assert judged.reward == 0.25 and srv.call_count == 1
    assert "cut off by the generation length limit" in srv.requests[0]["messages"][-1]["content"]
    fixed = run(PointwiseJudge(**base, truncated_score=0.1)(TASK, cut))
    assert fixed.reward == 0.1 and srv.call_count == 1

    long = "Paris " * 100
    run(PointwiseJudge(**base, max_response_chars=60)(TASK, long))
    user = srv.requests[1]["messages"][-1]["content"]
    assert SINGLE.search(user).group(1) == long[:60]
    assert f"is {len(long)} characters long; only the first 60 are shown" in user
    assert run(PointwiseJudge(**base, max_response_chars=60, oversized_score=0.0)(TASK, long)).reward == 0.0
    assert srv.call_count == 2
    judged_empty = run(PointwiseJudge(**base, empty_score=None)(TASK, ""))
    assert judged_empty.metrics["skipped"] == 0.0 and srv.call_count == 3


def test_an_auxiliary_model_can_be_the_judge(openai_server) -> None:
    srv = openai_server(JudgeScript(pointwise=lambda t, r, ref: 5))
    aux = {"judge": LiteLLMChatModel("judge-model", api_base=srv.base_url), "other": object()}
    assert run(PointwiseJudge()(TASK, "Paris", auxiliary_models=aux)).reward == 1.0
    assert srv.requests[0]["model"] == "judge-model" and srv.requests[0]["temperature"] == 0.0

    scripted = ScriptedChatModel(['{"reason": "fine", "score": 3}'], model_name="scripted")
    assert run(PointwiseJudge(auxiliary_model="grader")(TASK, "Paris", {"grader": scripted})).reward == 0.5
    assert scripted.calls[0].sampling == {"temperature": 0.0, "max_tokens": 1024, "seed": 0}

    with pytest.raises(ConfigError, match=r"needs a model.*auxiliary model named 'judge'.*\['other'\]"):
        run(PointwiseJudge()(TASK, "Paris", {"other": scripted}))
    with pytest.raises(ConfigError, match="the run has no auxiliary_models"):
        run(PointwiseJudge()(TASK, "Paris"))


def test_a_judge_that_wraps_its_verdict_in_prose_is_still_read(openai_server) -> None:
    srv = openai_server(lambda body: 'Sure! Here is my grading: {"reason": "ok {fine}", "score": "4"} Hope that helps.')
    assert run(PointwiseJudge(model="judge", api_base=srv.base_url)(TASK, "Paris")).reward == 0.75
