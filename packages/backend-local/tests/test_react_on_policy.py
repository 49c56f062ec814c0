"""A ReAct episode (reinforge-rollouts-react) against the real local policy, through the text protocol."""

import asyncio

import pytest

from reinforge import JudgeOutput
from reinforge.plugin import ComponentSpec, ModelConfig, RunConfig, get_plugin_manager
from reinforge.testing import runner_for
from reinforge_backend_local.rollouts.runtime import PolicyRuntime
from reinforge_rollouts_react import react_workflow


@pytest.fixture(scope="module")
def policy(model_folder):
    p = PolicyRuntime(ModelConfig(model_path=str(model_folder), max_tokens=12), max_batch=64, window_s=0.05, lora=True)
    yield p
    p.close()


def test_one_episode_runs_end_to_end_and_every_turn_is_recorded_with_tokens(policy):
    run_config = RunConfig(
        workflow=ComponentSpec(
            ref=react_workflow, args={"tools": ["calculator"], "max_turns": 2, "action_format": "auto"}
        ),
        judges=[ComponentSpec(ref=lambda task, response: JudgeOutput(reward=0.0), name="any")],
    )
    provider = policy.provider(("react",), 0, {"max_tokens": 12, "temperature": 1.0})
    pm = get_plugin_manager(load_entrypoints=False)
    with runner_for(run_config, model_provider=provider, plugin_manager=pm, group_size=2) as runner:
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
