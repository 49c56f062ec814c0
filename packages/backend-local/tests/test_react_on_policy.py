"""A ReAct episode (reinforge-rollouts-react) against the real local policy, through the text protocol."""

import asyncio

import pytest

from reinforge import JudgeOutput
from reinforge.config import ModelConfig
from reinforge.rewards import JudgeSlot, RewardComposer
from reinforge.runner import Runner, RunnerSettings
from reinforge.signatures import bind
from reinforge_backend_local.rollouts.runtime import PolicyRuntime
from reinforge_rollouts_react import react_workflow


@pytest.fixture(scope="module")
def policy(model_folder):
    p = PolicyRuntime(ModelConfig(model_path=str(model_folder), max_tokens=12), max_batch=64, window_s=0.05, lora=True)
    yield p
    p.close()


def test_one_episode_runs_end_to_end_and_every_turn_is_recorded_with_tokens(policy):
    workflow = bind(react_workflow, "workflow", {"tools": ["calculator"], "max_turns": 2, "action_format": "auto"})
    composer = RewardComposer([JudgeSlot("any", bind(lambda task, response: JudgeOutput(reward=0.0), "judge"))])
    runner = Runner(
        workflow,
        composer,
        settings=RunnerSettings(group_size=2),
        model_provider=policy.provider(("react",), 0, {"max_tokens": 12, "temperature": 1.0}),
    )
    result = asyncio.run(runner.run_batch([{"question": "What is 347 * 28?", "answer": "9716"}]))
    assert len(result.trajectories) == 2
    for t in result.trajectories:
        turns = t.metrics["turns"]
        assert 1 <= turns <= 2 and len(t.calls) == turns  # one recorded model call per turn
        assert t.metrics["finish_reason/answer"] + t.metrics["finish_reason/max_turns"] == 1.0
        assert "Action" in t.calls[0].messages[0]["content"]  # the text protocol: the policy has no native tools
        for call in t.calls:
            text = policy.tokenizer.decode(call.completion_token_ids, skip_special_tokens=True)
            assert call.response.content.startswith(text.split("\nObservation:")[0][:5])
            assert len(call.logprobs) == len(call.completion_token_ids) > 0
        if turns == 2:  # the observation of turn 1 is prompt of turn 2, never a completion
            assert len(t.calls[1].prompt_token_ids) > len(t.calls[0].prompt_token_ids)
