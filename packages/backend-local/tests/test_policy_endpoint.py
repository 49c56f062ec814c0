"""Workflows reach the policy in-process, through the OpenAI SDK and through litellm; all are recorded."""

import asyncio

import pytest

from reinforge import JudgeOutput, WorkflowOutput
from reinforge.config import ModelConfig
from reinforge.rewards import JudgeSlot, RewardComposer
from reinforge.runner import Runner, RunnerSettings
from reinforge.signatures import bind
from reinforge_backend_local.session import Policy

QUESTION = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def policy(model_folder):
    p = Policy(ModelConfig(model_path=str(model_folder), max_tokens=6), max_batch=64, window_s=0.05, lora=True)
    yield p
    p.close()


async def in_process(task, model):
    return WorkflowOutput(response=await model.chat(QUESTION))


async def openai_sdk(task, model):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=model.base_url, api_key="unused")
    if task.get("stream"):
        stream = await client.chat.completions.create(model="policy", messages=QUESTION, max_tokens=6, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    else:
        reply = await client.chat.completions.create(model="policy", messages=QUESTION, max_tokens=6)
        text = reply.choices[0].message.content
    await client.close()
    return WorkflowOutput(response=text)


async def through_litellm(task, model):
    from reinforge.litellm_model import LiteLLMChatModel

    reply = await LiteLLMChatModel("policy", api_base=model.base_url).chat(QUESTION, max_tokens=6)
    return WorkflowOutput(response=reply.content)


def judge(task, response):
    return JudgeOutput(reward=1.0)


def run(policy, workflow, tasks, group_size=2):
    composer = RewardComposer([JudgeSlot("one", bind(judge, "judge"))])
    runner = Runner(
        bind(workflow, "workflow"),
        composer,
        model_provider=policy.provider(("test",), 0, {"max_tokens": 6, "temperature": 1.0}),
        settings=RunnerSettings(group_size=group_size),
    )
    return asyncio.run(runner.run_batch(tasks))


@pytest.mark.parametrize("workflow", [in_process, openai_sdk, through_litellm])
def test_calls_are_recorded_with_tokens_that_retokenize_to_the_text(policy, workflow):
    result = run(policy, workflow, [{}, {"stream": True}])
    tok = policy.tokenizer
    assert len(result.trajectories) == 4
    for t in result.trajectories:
        (call,) = t.calls
        text = t.response if isinstance(t.response, str) else t.response.content
        assert call.response.content == text
        assert tok.decode(call.completion_token_ids, skip_special_tokens=True) == text
        assert tok.decode(call.prompt_token_ids).endswith("<|im_start|>assistant\n")
        assert len(call.logprobs) == len(call.completion_token_ids) and all(lp <= 0 for lp in call.logprobs)
        assert call.policy_version == 0 and call.sampling["max_tokens"] == 6
    assert policy.endpoint._routes == {}  # every rollout's route is closed when it ends


def test_a_group_is_batched_into_one_decode_and_sampling_does_not_depend_on_the_batch(policy):
    before = policy.engine.stats.batches
    first = run(policy, in_process, [{}, {}], group_size=4)
    assert policy.engine.stats.batches - before == 1  # 8 concurrent calls, one decode
    alone = run(policy, in_process, [{}], group_size=4)
    tokens = [[c.completion_token_ids for c in t.calls] for t in first.groups[0].kept]
    assert tokens == [[c.completion_token_ids for c in t.calls] for t in alone.groups[0].kept]


def test_unknown_routes_are_404(policy):
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        f"{policy.endpoint.root_url}/rollouts/nope/v1/chat/completions",
        data=b'{"messages": [{"role": "user", "content": "hi"}]}',
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 404
