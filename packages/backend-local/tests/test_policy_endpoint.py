"""Workflows reach the policy in-process, through the OpenAI SDK and through litellm; all are recorded."""

import asyncio
import json

import pytest

from reinforge import JudgeOutput, WorkflowOutput
from reinforge.plugin import ComponentSpec, ModelConfig, RunConfig, get_plugin_manager
from reinforge.testing import runner_for
from reinforge_backend_local.rollouts.runtime import PolicyRuntime

QUESTION = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def policy(model_folder):
    p = PolicyRuntime(ModelConfig(model_path=str(model_folder), max_tokens=6), max_batch=64, window_s=0.05, lora=True)
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
    from reinforge.plugin import LiteLLMChatModel

    reply = await LiteLLMChatModel("policy", api_base=model.base_url).chat(QUESTION, max_tokens=6)
    return WorkflowOutput(response=reply.content)


def judge(task, response):
    return JudgeOutput(reward=1.0)


def run(policy, workflow, tasks, group_size=2):
    run_config = RunConfig(workflow=ComponentSpec(ref=workflow), judges=[ComponentSpec(ref=judge, name="one")])
    provider = policy.provider(("test",), 0, {"max_tokens": 6, "temperature": 1.0})
    pm = get_plugin_manager(load_entrypoints=False)
    with runner_for(run_config, model_provider=provider, plugin_manager=pm, group_size=group_size) as runner:
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


def one_rollout(policy, workflow):
    """Runs ``workflow`` as a single rollout; returns its trajectory (the workflow must not fail)."""
    result = run(policy, workflow, [{}], group_size=1)
    (t,) = result.trajectories
    assert t.error is None, t.error
    return t


def test_the_openai_client_gets_text_token_ids_and_logprobs_streamed_or_not(policy):
    seen = {}

    async def workflow(task, model):
        from openai import AsyncOpenAI

        async with AsyncOpenAI(base_url=model.base_url, api_key="unused", max_retries=0) as client:
            raw = await client.chat.completions.with_raw_response.create(
                model="any-name", messages=QUESTION, max_tokens=6, logprobs=True, extra_body={"return_token_ids": True}
            )
            seen["version"] = raw.headers.get("x-policy-version")
            seen["reply"] = raw.parse()
            stream = await client.chat.completions.create(
                model="any-name",
                messages=QUESTION,
                max_tokens=6,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"return_token_ids": True},
            )
            seen["chunks"] = [c async for c in stream]
            seen["models"] = [m.id async for m in client.models.list()]
        return WorkflowOutput(response=seen["reply"].choices[0].message.content)

    t = one_rollout(policy, workflow)
    plain, streamed = t.calls
    reply = seen["reply"]
    (choice,) = reply.choices
    assert choice.message.content == plain.response.content and choice.finish_reason in ("stop", "length")
    assert reply.prompt_token_ids == plain.prompt_token_ids and choice.token_ids == plain.completion_token_ids
    assert [lp.logprob for lp in choice.logprobs.content] == plain.logprobs
    assert reply.usage.completion_tokens == len(plain.completion_token_ids)
    assert reply.model == policy.name and seen["version"] == "0" and seen["models"] == [policy.name]

    chunks = seen["chunks"]
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].prompt_token_ids == streamed.prompt_token_ids
    body = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in body) == streamed.response.content
    assert [i for c in body for i in (getattr(c.choices[0], "token_ids", None) or [])] == streamed.completion_token_ids
    assert body[-1].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].usage.completion_tokens == len(streamed.completion_token_ids)
    assert streamed.sampling["max_tokens"] == 6 and plain.prompt_token_ids == streamed.prompt_token_ids


def test_bad_requests_are_openai_errors_and_the_endpoint_keeps_answering(policy):
    seen = {}

    async def workflow(task, model):
        import httpx

        url = f"{model.base_url}/chat/completions"
        bad = {
            "malformed": b'{"messages": [',
            "not an object": b"[1, 2]",
            "no messages": json.dumps({"max_tokens": 6}).encode(),
            "unknown field": json.dumps({"messages": QUESTION, "temprature": 0.5}).encode(),
            "temperature": json.dumps({"messages": QUESTION, "temperature": 5}).encode(),
            "n": json.dumps({"messages": QUESTION, "n": 2}).encode(),
            "top_logprobs": json.dumps({"messages": QUESTION, "logprobs": True, "top_logprobs": 2}).encode(),
            "too long": json.dumps({"messages": [{"role": "user", "content": "hello " * 9000}]}).encode(),
        }
        async with httpx.AsyncClient(timeout=120) as http:
            for name, content in bad.items():
                r = await http.post(url, content=content, headers={"Content-Type": "application/json"})
                seen[name] = (r.status_code, r.json())
            r = await http.get(url)
            seen["GET"] = (r.status_code, r.json())
            r = await http.post(url, json={"messages": QUESTION, "max_tokens": 6})
            seen["good"] = (r.status_code, r.json())
        return WorkflowOutput(response=seen["good"][1]["choices"][0]["message"]["content"])

    t = one_rollout(policy, workflow)
    names = (
        "malformed",
        "not an object",
        "no messages",
        "unknown field",
        "temperature",
        "n",
        "top_logprobs",
        "too long",
    )
    for name in names:
        status, body = seen[name]
        assert status == 400, (name, body)
        assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"], name
    assert seen["malformed"][1]["error"]["code"] == "invalid_json"
    assert seen["unknown field"][1]["error"]["param"] == "temprature"
    assert seen["too long"][1]["error"]["code"] == "context_length_exceeded"
    assert seen["GET"][0] == 405 and "error" in seen["GET"][1]
    status, body = seen["good"]
    assert status == 200
    (call,) = t.calls  # only the answered call is recorded
    assert body["choices"][0]["message"]["content"] == call.response.content


def test_unknown_and_finished_rollouts_and_other_paths_are_openai_404s(policy):
    import httpx
    from openai import NotFoundError, OpenAI

    root = policy.endpoint.root_url
    client = OpenAI(base_url=f"{root}/rollouts/nope/v1", api_key="unused", max_retries=0)
    with pytest.raises(NotFoundError) as err:
        client.chat.completions.create(model="policy", messages=QUESTION, max_tokens=6)
    assert err.value.body["code"] == "rollout_not_found" and err.value.body["type"] == "not_found_error"
    client.close()

    urls = []

    async def workflow(task, model):
        urls.append(model.base_url)
        return await in_process(task, model)

    one_rollout(policy, workflow)
    (finished,) = urls
    with httpx.Client(timeout=30) as http:
        for method, url in (
            ("POST", f"{finished}/chat/completions"),
            ("GET", f"{finished}/models"),
            ("POST", f"{root}/v1/chat/completions"),
            ("GET", f"{root}/"),
            ("POST", f"{root}/rollouts/r0/v1/embeddings"),
        ):
            r = http.request(method, url, json={"messages": QUESTION})
            assert r.status_code == 404, url
            assert r.json()["error"]["type"] == "not_found_error", url


def test_the_endpoint_starts_on_a_free_port_and_stops():
    import httpx

    from reinforge_backend_local.rollouts.endpoint import PolicyEndpoint

    first, second = PolicyEndpoint("m").start(), PolicyEndpoint("m").start()
    try:
        assert first.root_url != second.root_url and first.start() is first  # start() twice: the same server
        root = first.root_url
        assert httpx.get(f"{root}/rollouts/r0/v1/models", timeout=10).status_code == 404
    finally:
        first.stop()
        second.stop()
    first.stop()  # twice: nothing to do
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{root}/rollouts/r0/v1/models", timeout=10)
    with pytest.raises(RuntimeError, match="not running"):
        _ = first.root_url
