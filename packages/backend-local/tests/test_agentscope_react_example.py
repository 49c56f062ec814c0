"""examples/react-agentscope: an AgentScope ReActAgent with a calculator Toolkit, through real parts.

The example's run file, loaded and built as ``reinforge tune`` does; its judges and the gated
reward on hand-written replies (tool used correctly, wrongly, not at all); the agent's loop
against a scripted AgentScope model (a tool call read out of text, run, and its result shown back);
and the workflow on the real local policy, whose every call through the endpoint is recorded.

Needs ``reinforge[agentscope]``: skipped elsewhere, run by ``nox -s agentscope``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agentscope", reason="needs reinforge[agentscope]; `nox -s agentscope` runs this module")

from agentscope.message import Msg, TextBlock
from agentscope.model import ChatModelBase, ChatResponse

from reinforge.plugin import ModelConfig, build_job, load_run
from reinforge_backend_local.rollouts.runtime import PolicyRuntime

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "react-agentscope"
RUN_FILE = EXAMPLE / "run.yaml"
PRODUCT = {"question": "What is 616 * 28?", "answer": "17248", "kind": "product", "needs_tool": True}
SMALL = {"question": "What is 2 + 6?", "answer": "8", "kind": "small_sum", "needs_tool": False}


MODULES = ("workflow", "judges")  # the run file's `module:attr` refs, imported by these plain names


@pytest.fixture(scope="module")
def example():
    """The run file built as ``reinforge tune`` builds it, and the example's workflow module.

    Other examples have a ``workflow.py`` and a ``judges.py`` too: whatever another test imported
    under those names is set aside while this module runs, and put back after.
    """
    import sys

    saved = {name: sys.modules.pop(name) for name in MODULES if name in sys.modules}
    try:
        job = build_job(load_run(RUN_FILE), need_backend=False)
        module = sys.modules["workflow"]
        assert Path(module.__file__).parent == EXAMPLE
        yield job, module
        job.close()
    finally:
        for name in MODULES:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


@pytest.fixture(scope="module")
def job(example):
    return example[0]


@pytest.fixture(scope="module")
def workflow(example):
    return example[1]


def reply(text: str, calls: list[dict[str, Any]] | None = None) -> Msg:
    msg = Msg("calculator_agent", text, "assistant")
    if calls is not None:
        msg.metadata = {"calculator_calls": calls}
    return msg


def score(job, task: dict, response: Any) -> Any:
    return asyncio.run(job.composer.score(task, response))


RIGHT_CALL = {"expression": "616 * 28", "output": "17248", "ok": True}
WRONG_CALL = {"expression": "616 + 28", "output": "644", "ok": True}
FAILED_CALL = {"expression": "616 x 28", "output": "Error: bad expression", "ok": False}
BARE_ANSWER = {"expression": "17248", "output": "17248", "ok": True}  # computes nothing


@pytest.mark.parametrize(
    ("response", "correct", "tool_use", "reward"),
    [
        pytest.param(reply("The answer is 17248.", [RIGHT_CALL]), 1.0, 1.0, 1.0, id="tool-used-correctly"),
        pytest.param(reply("The answer is 17248.", []), 1.0, 0.0, 0.7, id="right-without-the-tool"),
        pytest.param(reply("The answer is 644.", [WRONG_CALL]), 0.0, 0.0, 0.0, id="wrong-call-wrong-answer"),
        pytest.param(reply("The answer is 17248.", [WRONG_CALL]), 1.0, 0.0, 0.7, id="call-not-producing-answer"),
        pytest.param(reply("The answer is 17248.", [FAILED_CALL]), 1.0, 0.0, 0.7, id="failed-call"),
        pytest.param(reply("The answer is 17248.", [BARE_ANSWER]), 1.0, 0.0, 0.7, id="answer-passed-as-expression"),
        pytest.param(reply("The answer is 9.", [RIGHT_CALL]), 0.0, 1.0, 0.0, id="right-call-then-wrong-answer"),
        pytest.param("The answer is 17248.", 1.0, 0.0, 0.7, id="plain-string-used-no-tool"),
    ],
)
def test_the_judges_and_the_gate_on_hand_written_replies(job, response, correct, tool_use, reward):
    s = score(job, PRODUCT, response)
    assert s.rewards["reward/correct"] == correct
    assert s.rewards["reward/tool_use"] == tool_use
    assert s.reward == pytest.approx(reward)  # the gate: no tool-use credit without the right answer


def test_a_question_that_needs_no_tool_scores_full_without_it(job):
    assert score(job, SMALL, reply("The answer is 8.", [])).reward == pytest.approx(1.0)
    assert score(job, SMALL, reply("The answer is 9.", [])).reward == 0.0


class Scripted(ChatModelBase):
    """An AgentScope model that answers from a script and keeps the messages it was sent."""

    def __init__(self, replies: list[str]) -> None:
        super().__init__("scripted", stream=False)
        self.replies = list(replies)
        self.seen: list[tuple[list[dict], Any]] = []

    async def __call__(self, messages: list[dict], tools: Any = None, **kwargs: Any) -> ChatResponse:
        self.seen.append((messages, tools))
        return ChatResponse(content=[TextBlock(type="text", text=self.replies.pop(0))])


def test_the_agent_calls_its_calculator_from_a_text_tool_call_and_reads_the_observation(workflow):
    model = Scripted(
        [
            '<tool_call>{"name": "calculator", "arguments": {"expression": "616 * 28"}}</tool_call>',
            "The answer is 17248.",
        ]
    )
    out = asyncio.run(workflow.calculator_agent(PRODUCT, model))

    assert out.response.get_text_content() == "The answer is 17248."
    assert out.response.metadata["calculator_calls"] == [RIGHT_CALL]
    assert out.metrics["used_tool"] == 1.0 and out.metrics["tool_calls"] == 1.0 and out.metrics["model_calls"] == 2.0
    (first, tools1), (second, tools2) = model.seen
    assert tools1 is None and tools2 is None  # the tools travel as text, never as `tools`
    system = first[0]["content"]
    assert (
        first[0]["role"] == "system" and workflow.SYS_PROMPT in system and "- calculator(expression: string)" in system
    )
    # the demonstration (a direct answer, then a calculator call) comes before the question, as real turns
    texts = [(m["role"], m["content"]) for m in first[1:]]
    assert texts == [
        ("user", "What is 3 + 4?"),
        ("assistant", "The answer is 7."),
        ("user", "What is 347 * 28?"),
        ("assistant", '<tool_call>{"name": "calculator", "arguments": {"expression": "347 * 28"}}</tool_call>'),
        ("user", "Observation: 9716"),
        ("assistant", "The answer is 9716."),
        ("user", "What is 616 * 28?"),
    ]
    assert second[-2]["role"] == "assistant" and '"616 * 28"' in second[-2]["content"]
    assert second[-1] == {"role": "user", "content": "Observation: 17248"}


def test_the_calculator_is_arithmetic_only(workflow):
    assert workflow.evaluate("141 + 365 + 623") == "1129" and workflow.evaluate("(2 + 3) * 4 / 2") == "10"
    for bad in ("os.system(1)", "2 ** 999999", "1 / 0", "abc", "9" * 300, "True + 1"):
        with pytest.raises(ValueError):
            workflow.evaluate(bad)
    assert workflow.computes("616 * 28") and not workflow.computes("17248") and not workflow.computes("-3")


def test_a_reply_without_a_tool_call_ends_the_episode_and_a_bad_expression_is_an_observation(workflow):
    direct = asyncio.run(workflow.calculator_agent(PRODUCT, Scripted(["The answer is 17000."])))
    assert direct.metrics["used_tool"] == 0.0 and direct.metrics["model_calls"] == 1.0
    assert direct.response.metadata["calculator_calls"] == []

    bad = Scripted(['<tool_call>{"name": "calculator", "arguments": {"expression": "os.system(1)"}}</tool_call>', "9"])
    out = asyncio.run(workflow.calculator_agent(PRODUCT, bad))
    (call,) = out.response.metadata["calculator_calls"]
    assert call["ok"] is False and call["output"].startswith("Error")
    assert out.metrics["used_tool"] == 0.0 and out.metrics["tool_errors"] == 1.0
    assert bad.seen[1][0][-1]["content"].startswith("Observation: Error")


def test_the_workflow_on_the_local_policy_records_every_agent_call(job, model_folder):
    policy = PolicyRuntime(
        ModelConfig(model_path=str(model_folder), max_tokens=48), max_batch=16, window_s=0.05, lora=True
    )
    try:
        sampling = {"max_tokens": 48, "temperature": 0.0}
        runner = job.make_runner(
            model_provider=policy.provider(("test",), 0, sampling), group_size=1, sampling=sampling
        )
        result = asyncio.run(runner.run_batch([PRODUCT, SMALL]))
    finally:
        policy.close()

    assert len(result.trajectories) == 2 and all(t.ok for t in result.trajectories), [
        t.error for t in result.trajectories
    ]
    tok = policy.tokenizer
    for t in result.trajectories:
        assert isinstance(t.response, Msg)  # the ReActAgent's reply, judged by the example's judges
        assert {"reward/correct", "reward/tool_use", "gate/correct_gate"} <= set(t.rewards)
        assert t.calls and len(t.calls) == t.metrics["model_calls"]
        for call in t.calls:
            assert call.prompt_token_ids and call.completion_token_ids and call.policy_version == 0
            assert len(call.logprobs) == len(call.completion_token_ids)
            assert call.sampling["max_tokens"] == 48 and call.tools is None
            prompt = tok.decode(call.prompt_token_ids)
            assert "- calculator(expression: string)" in prompt and t.task["question"] in prompt
            assert "What is 347 * 28?" in prompt  # the demonstration in the agent's memory
        assert t.calls[-1].response.content == t.response.get_text_content()
        calls = t.response.metadata["calculator_calls"]
        assert t.metrics["used_tool"] == float(any(c["ok"] for c in calls))
        if calls:  # the agent acted: the next prompt shows the calculator's output
            assert f"Observation: {calls[0]['output']}" in tok.decode(t.calls[1].prompt_token_ids)
    json.dumps([t.to_dict() for t in result.trajectories], default=str)  # what `--output` and the run log write
