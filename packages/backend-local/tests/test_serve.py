"""``reinforge serve`` on the real uvicorn server with the real SmolLM2, through real clients."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from reinforge.plugin import ConfigError
from reinforge.testing import BackgroundServer

KEY = "s3cret-key"
MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def server(served: Any) -> Iterator[BackgroundServer]:
    from reinforge_backend_local.serve.app import build_app

    model, metrics = served
    with BackgroundServer(build_app(model, api_key=KEY, max_body_bytes=MAX_BODY, metrics=metrics)) as s:
        yield s


@pytest.fixture(scope="module")
def name(served: Any) -> str:
    return served[0].name


@pytest.fixture(scope="module")
def tokenizer(served: Any) -> Any:
    return served[0].tokenizer


@pytest.fixture()
def client(server: BackgroundServer) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{server.base}/v1", api_key=KEY, max_retries=0)


@pytest.fixture()
def http(server: BackgroundServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
        yield c


HELLO = [{"role": "user", "content": "Say hello in three words."}]


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(?:\{{(.*)\}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


# -- openai ---------------------------------------------------------------------------------------


def test_openai_chat_with_token_ids_and_logprobs(client: Any, name: str, tokenizer: Any) -> None:
    out = client.chat.completions.create(
        model=name, messages=HELLO, max_tokens=12, temperature=0, logprobs=True, extra_body={"return_token_ids": True}
    )
    choice = out.choices[0]
    assert out.model == name and out.object == "chat.completion"
    assert choice.finish_reason in ("stop", "length") and choice.message.role == "assistant"
    data = out.model_dump()
    ids, prompt_ids = data["choices"][0]["token_ids"], data["prompt_token_ids"]
    assert 0 < len(ids) <= 12
    assert tokenizer.decode(ids, skip_special_tokens=True) == choice.message.content
    rendered = tokenizer.apply_chat_template(HELLO, add_generation_prompt=True, tokenize=False)
    assert prompt_ids == tokenizer(rendered, add_special_tokens=False).input_ids
    assert out.usage.prompt_tokens == len(prompt_ids) and out.usage.completion_tokens == len(ids)
    assert out.usage.total_tokens == len(prompt_ids) + len(ids)
    lps = choice.logprobs.content
    assert len(lps) == len(ids) and all(lp.logprob <= 0 for lp in lps)
    assert [lp.token for lp in lps] == [tokenizer.decode([i]) for i in ids]
    # greedy is deterministic
    again = client.chat.completions.create(model=name, messages=HELLO, max_tokens=12, temperature=0)
    assert again.choices[0].message.content == choice.message.content


def test_openai_length_and_stop(client: Any, name: str) -> None:
    out = client.chat.completions.create(model=name, messages=HELLO, max_tokens=3, temperature=0)
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 3
    full = client.chat.completions.create(model=name, messages=HELLO, max_tokens=12, temperature=0)
    text = full.choices[0].message.content
    word = text.split()[1] if len(text.split()) > 1 else text[-2:]
    cut = client.chat.completions.create(model=name, messages=HELLO, max_tokens=12, temperature=0, stop=[word])
    assert cut.choices[0].finish_reason == "stop" and word not in cut.choices[0].message.content
    assert text.startswith(cut.choices[0].message.content)


def test_openai_stream(client: Any, name: str, tokenizer: Any) -> None:
    whole = client.chat.completions.create(model=name, messages=HELLO, max_tokens=10, temperature=0)
    stream = client.chat.completions.create(
        model=name,
        messages=HELLO,
        max_tokens=10,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    )
    text, ids, finish, usage, n_chunks = "", [], None, None, 0
    for chunk in stream:
        n_chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            ids += (c.model_extra or {}).get("token_ids") or []
            finish = c.finish_reason or finish
    assert text == whole.choices[0].message.content
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == len(ids) == whole.usage.completion_tokens
    assert n_chunks >= len(ids) + 2  # the role chunk, one per token, the finish chunk


def test_stream_raw_sse_ends_with_done(http: httpx.Client, name: str) -> None:
    body = {"model": name, "messages": HELLO, "max_tokens": 4, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_openai_n2_with_seed(client: Any, name: str, tokenizer: Any) -> None:
    def ask() -> Any:
        return client.chat.completions.create(
            model=name,
            messages=HELLO,
            max_tokens=8,
            temperature=1.0,
            n=2,
            seed=7,
            extra_body={"return_token_ids": True},
        )

    out = ask()
    assert [c.index for c in out.choices] == [0, 1]
    ids = [c.model_dump()["token_ids"] for c in out.choices]
    assert out.usage.completion_tokens == sum(map(len, ids))
    assert out.usage.prompt_tokens == len(out.model_dump()["prompt_token_ids"])  # counted once
    for c, t in zip(out.choices, ids):
        assert tokenizer.decode(t, skip_special_tokens=True) == c.message.content
    again = ask()  # the same seed: the same samples
    assert [c.message.content for c in again.choices] == [c.message.content for c in out.choices]


def test_openai_completions(client: Any, name: str, tokenizer: Any) -> None:
    out = client.completions.create(
        model=name,
        prompt="The capital of France is",
        max_tokens=6,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    data = out.model_dump()["choices"][0]
    assert out.object == "text_completion" and out.choices[0].finish_reason in ("stop", "length")
    assert tokenizer.decode(data["token_ids"], skip_special_tokens=True) == out.choices[0].text
    assert data["prompt_token_ids"] == tokenizer("The capital of France is").input_ids
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=name, prompt="The capital of France is", max_tokens=6, temperature=0, stream=True
        )
        if c.choices
    )
    assert streamed == out.choices[0].text
    # token ids in, the same greedy text out
    by_ids = client.completions.create(model=name, prompt=data["prompt_token_ids"], max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == out.choices[0].text


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def test_tools_reach_the_chat_template(http: httpx.Client, name: str, served: Any, tokenizer: Any) -> None:
    body = {"model": name, "messages": HELLO, "max_tokens": 2, "tools": TOOLS, "return_token_ids": True}
    plain = http.post("/v1/chat/completions", json={**body, "tools": None}).json()["prompt_token_ids"]
    r = http.post("/v1/chat/completions", json=body)
    # SmolLM2's template has no tools section: the fallback describes them in a system message
    assert r.status_code == 200 and r.headers["x-reinforge-tools"] == "system-prompt"
    prompt = tokenizer.decode(r.json()["prompt_token_ids"])
    assert r.json()["prompt_token_ids"] != plain and "get_weather" in prompt and "<tool_call>" in prompt
    original = tokenizer.chat_template
    tokenizer.chat_template = (
        "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}" + original
    )
    try:
        r = http.post("/v1/chat/completions", json=body)
        assert r.headers["x-reinforge-tools"] == "rendered"
        assert "get_weather" in tokenizer.decode(r.json()["prompt_token_ids"])
        r = http.post("/v1/chat/completions", json={**body, "tool_choice": "none"})
        assert "get_weather" not in tokenizer.decode(r.json()["prompt_token_ids"])
    finally:
        tokenizer.chat_template = original


def test_concurrent_requests_are_batched(server: BackgroundServer, http: httpx.Client, name: str) -> None:
    import openai

    before = http.get("/metrics").text

    async def go() -> list[Any]:
        c = openai.AsyncOpenAI(base_url=f"{server.base}/v1", api_key=KEY, max_retries=0)
        try:
            return await asyncio.gather(
                *(c.chat.completions.create(model=name, messages=HELLO, max_tokens=4, temperature=0) for _ in range(6))
            )
        finally:
            await c.close()

    outs = asyncio.run(go())
    assert len({o.choices[0].message.content for o in outs}) == 1  # greedy rows do not depend on the batch
    after = http.get("/metrics").text
    rows = _metric(after, "reinforge_serve_batch_size_sum") - _metric(before, "reinforge_serve_batch_size_sum")
    steps = _metric(after, "reinforge_serve_batch_size_count") - _metric(before, "reinforge_serve_batch_size_count")
    tokens = sum(o.usage.completion_tokens for o in outs)
    assert rows == tokens  # every row of a decode step is one completion token
    assert steps < tokens  # and steps decoded several requests together


def test_a_request_arriving_mid_decode_joins_the_running_batch(
    server: BackgroundServer, http: httpx.Client, name: str
) -> None:
    """The second request is sent after the first streamed tokens: it is admitted into the running batch."""
    import openai

    before = _metric(http.get("/metrics").text, "reinforge_serve_joined_running_batch_total")

    async def go() -> tuple[str | None, Any]:
        c = openai.AsyncOpenAI(base_url=f"{server.base}/v1", api_key=KEY, max_retries=0)
        try:
            first = await c.completions.create(
                model=name, prompt="1, 2, 3, 4, 5, 6, 7,", max_tokens=40, temperature=0, stream=True
            )
            finish, second, seen = None, None, 0
            async for chunk in first:
                seen += bool(chunk.choices and chunk.choices[0].text)
                if seen == 2 and second is None:  # the first is decoding now
                    second = asyncio.ensure_future(
                        c.completions.create(model=name, prompt="Hello", max_tokens=4, temperature=0)
                    )
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            assert second is not None
            return finish, await second
        finally:
            await c.close()

    finish, second = asyncio.run(go())
    assert finish == "length"  # the first ran its 40 tokens, so the second arrived while it decoded
    assert second.choices[0].text
    after = _metric(http.get("/metrics").text, "reinforge_serve_joined_running_batch_total")
    assert after - before == 1


def test_top_logprobs_chat_and_completions(client: Any, name: str, tokenizer: Any) -> None:
    out = client.chat.completions.create(
        model=name, messages=HELLO, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = out.choices[0].logprobs.content
    assert content
    for entry in content:
        alternatives = entry.top_logprobs
        assert len(alternatives) == 3
        assert alternatives[0].token == entry.token  # greedy: the chosen token is the likeliest
        assert alternatives[0].logprob == pytest.approx(entry.logprob, abs=1e-5)
        assert [a.logprob for a in alternatives] == sorted((a.logprob for a in alternatives), reverse=True)
    legacy = client.completions.create(model=name, prompt="1, 2, 3,", max_tokens=4, temperature=0, logprobs=2)
    lp = legacy.choices[0].logprobs
    assert len(lp.top_logprobs) == len(lp.tokens) == 4
    for token, top in zip(lp.tokens, lp.top_logprobs):
        assert len(top) <= 2 and token in top  # two distinct texts (a dict), the chosen one among them


def test_streamed_tokens_are_the_non_streamed_ones(client: Any, name: str, tokenizer: Any) -> None:
    body = {"model": name, "messages": HELLO, "max_tokens": 10, "temperature": 0}
    whole = client.chat.completions.create(**body, extra_body={"return_token_ids": True}).model_dump()
    ids: list[int] = []
    text = ""
    for chunk in client.chat.completions.create(**body, stream=True, extra_body={"return_token_ids": True}):
        data = chunk.model_dump()
        for c in data["choices"]:
            ids += c.get("token_ids") or []
            text += c["delta"].get("content") or ""
    assert ids == whole["choices"][0]["token_ids"]
    assert text == whole["choices"][0]["message"]["content"] == tokenizer.decode(ids, skip_special_tokens=True)


# -- litellm --------------------------------------------------------------------------------------


def test_litellm(server: BackgroundServer, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    out = litellm.completion(
        model=f"openai/{name}", api_base=f"{server.base}/v1", api_key=KEY, messages=HELLO, max_tokens=6, temperature=0
    )
    assert out.choices[0].message.content
    assert out.usage.completion_tokens <= 6


# -- bad input ------------------------------------------------------------------------------------


def _ok(http: httpx.Client, name: str) -> None:
    r = http.post("/v1/chat/completions", json={"model": name, "messages": HELLO, "max_tokens": 2})
    assert r.status_code == 200, r.text


def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"messages": "hi"}, 400, "messages"),
        ({}, 400, "messages"),
        ({"messages": HELLO, "max_tokens": "x"}, 400, "max_tokens"),
        ({"messages": HELLO, "max_tokens": 0}, 400, "max_tokens"),
        ({"messages": HELLO, "temperature": "hot"}, 400, "temperature"),
        ({"messages": HELLO, "temperature": 3}, 400, "temperature"),
        ({"messages": HELLO, "top_p": 0}, 400, "top_p"),
        ({"messages": HELLO, "n": 0}, 400, "n"),
        ({"messages": HELLO, "stop": 5}, 400, "stop"),
        ({"messages": HELLO, "top_logprobs": 3}, 400, "top_logprobs"),
        ({"messages": HELLO, "top_logprobs": 21, "logprobs": True}, 400, "top_logprobs"),
        ({"messages": HELLO, "presence_penalty": 0.5}, 400, "presence_penalty"),
        ({"messages": HELLO, "tool_choice": "required"}, 400, "tool_choice"),
        ({"messages": HELLO, "frobnicate": 1}, 400, "frobnicate"),
        ({"messages": HELLO, "stream": "yes"}, 400, "stream"),
        ({"messages": HELLO, "model": "gpt-4"}, 404, "model"),
        ({"messages": [{"role": "user", "content": "word " * 600}]}, 400, "messages"),
    ],
)
def test_bad_chat_request_is_a_4xx_and_the_server_goes_on(
    http: httpx.Client, name: str, body: dict[str, Any], status: int, param: str
) -> None:
    err = _error(http.post("/v1/chat/completions", json=body), status)
    assert err["param"] == param
    _ok(http, name)


def test_prompt_over_max_model_len_says_so(http: httpx.Client, name: str) -> None:
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "word " * 600}]})
    assert _error(r, 400)["code"] == "context_length_exceeded"
    r = http.post("/v1/completions", json={"prompt": "word " * 600, "max_tokens": 2})
    err = _error(r, 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt" and "512" in err["message"]
    _ok(http, name)


def test_malformed_json_and_oversized_body(http: httpx.Client, name: str) -> None:
    headers = {"Content-Type": "application/json"}
    assert (
        _error(http.post("/v1/chat/completions", content=b"{not json", headers=headers), 400)["code"] == "invalid_json"
    )
    assert _error(http.post("/v1/chat/completions", content=b"[1, 2]", headers=headers), 400)["code"] == "invalid_json"
    _ok(http, name)
    big = json.dumps({"messages": [{"role": "user", "content": "x" * (MAX_BODY + 10)}]}).encode()
    assert _error(http.post("/v1/chat/completions", content=big, headers=headers), 413)["code"] == "request_too_large"

    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit holds while reading
        for _ in range(MAX_BODY // 1024 + 2):
            yield b" " * 1024

    assert _error(http.post("/v1/completions", content=chunked(), headers=headers), 413)["code"] == "request_too_large"
    _ok(http, name)


def test_bad_completion_requests(http: httpx.Client, name: str) -> None:
    for body, param in [
        ({}, "prompt"),
        ({"prompt": {"a": 1}}, "prompt"),
        ({"prompt": "hi", "logprobs": 21}, "logprobs"),
        ({"prompt": "hi", "logprobs": True}, "logprobs"),
        ({"prompt": "hi", "echo": True}, "echo"),
        ({"prompt": [10**9]}, "prompt"),
    ]:
        assert _error(http.post("/v1/completions", json=body), 400)["param"] == param
    assert _error(http.get("/v1/nowhere"), 404)["type"] == "not_found_error"
    assert http.get("/v1/chat/completions").status_code == 405
    _ok(http, name)


def test_api_key(server: BackgroundServer, name: str) -> None:
    import openai

    body = {"model": name, "messages": HELLO, "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}):
        r = httpx.post(f"{server.base}/v1/chat/completions", json=body, headers=headers)
        assert _error(r, 401)["code"] == "invalid_api_key"
        assert httpx.get(f"{server.base}/v1/models", headers=headers).status_code == 401
    bad = openai.OpenAI(base_url=f"{server.base}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=name, messages=HELLO, max_tokens=2)
    assert httpx.get(f"{server.base}/healthz").json() == {"status": "ok", "model": name}


# -- models, metrics ------------------------------------------------------------------------------


def test_models(client: Any, http: httpx.Client, name: str) -> None:
    assert [m.id for m in client.models.list()] == [name]
    assert http.get(f"/v1/models/{name}").json()["id"] == name
    assert _error(http.get("/v1/models/other"), 404)["code"] == "model_not_found"


def test_metrics_move(http: httpx.Client, name: str) -> None:
    before = http.get("/metrics").text
    _ok(http, name)
    http.post("/v1/chat/completions", json={"messages": "bad"})
    after = http.get("/metrics")
    assert after.headers["content-type"].startswith("text/plain")
    text = after.text
    route = "/v1/chat/completions"
    for metric, labels in [
        ("reinforge_serve_requests_total", {"route": route, "status": "200"}),
        ("reinforge_serve_requests_total", {"route": route, "status": "400"}),
        ("reinforge_serve_prompt_tokens_total", {}),
        ("reinforge_serve_completion_tokens_total", {}),
        ("reinforge_serve_batch_size_count", {}),
        ("reinforge_serve_queue_wait_seconds_count", {}),
        ("reinforge_serve_time_to_first_token_seconds_count", {}),
    ]:
        assert _metric(text, metric, **labels) > _metric(before, metric, **labels), metric


# -- what is served -------------------------------------------------------------------------------


def test_resolve_source(tmp_path: Any, model_folder: Any) -> None:
    from reinforge_backend_local.serve.model import resolve_source

    assert resolve_source("smollm2-135m-instruct").name == "smollm2-135m-instruct"
    assert resolve_source(str(model_folder), name="mine").name == "mine"
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    with pytest.raises(ConfigError, match="without checkpoints"):
        resolve_source(str(run))
    for step in (1, 2):
        ckpt = run / "checkpoints" / f"step-{step}"
        (ckpt / "adapter").mkdir(parents=True)
        (ckpt / "state.json").write_text("{}")
    (run / "config.json").write_text(json.dumps({"model": {"model_path": str(model_folder), "max_model_len": 256}}))
    src = resolve_source(str(run))
    assert src.adapter == run / "checkpoints" / "step-2" / "adapter" and src.model_path == str(model_folder)
    assert src.max_model_len == 256 and src.name == "run/step-2"
    assert resolve_source(str(run / "checkpoints" / "step-1")).adapter == run / "checkpoints" / "step-1" / "adapter"
    with pytest.raises(ConfigError, match="not a PEFT adapter"):
        resolve_source(str(model_folder), str(tmp_path))
    with pytest.raises(ConfigError, match="neither"):
        resolve_source(str(tmp_path / "nothing"))


def test_checkpoint_adapter_is_merged(tmp_path: Any, model_folder: Any) -> None:
    """A run's checkpoint serves base + adapter: a non-zero LoRA changes the greedy logits, merged in."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from reinforge_backend_local.serve.model import load, resolve_source

    base = AutoModelForCausalLM.from_pretrained(str(model_folder))
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    ckpt = tmp_path / "run" / "checkpoints" / "step-3"
    peft_model.save_pretrained(str(ckpt / "adapter"))
    (ckpt / "state.json").write_text("{}")
    (tmp_path / "run" / "config.json").write_text(json.dumps({"model": {"model_path": str(model_folder)}}))
    served = load(resolve_source(str(tmp_path / "run")), max_batch=2)
    assert served.adapter == ckpt / "adapter" and not hasattr(served.engine.model, "peft_config")
    ids = torch.tensor([[1, 2, 3, 4]])
    plain = AutoModelForCausalLM.from_pretrained(str(model_folder))
    with torch.no_grad():
        expected = peft_model(input_ids=ids).logits[0, -1]
        moved = (plain(input_ids=ids).logits[0, -1] - expected).abs().max().item()
    with torch.inference_mode():  # what the server decodes with (its projections run stacked)
        got = served.engine.decoder.session().prefill([ids[0].tolist()], [0], 1)[0]
    off = (got - expected).abs().max().item()
    assert off < 0.01 < 0.1 < moved, (off, moved)  # merged (and prepacked) equals base + adapter, which moved


def test_command_line(monkeypatch: pytest.MonkeyPatch, model_folder: Any) -> None:
    from reinforge.testing import cli_main

    with pytest.raises(SystemExit) as exc:
        cli_main(["serve", "--help"])
    assert exc.value.code == 0
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    assert cli_main(["serve", str(model_folder), "--api-key-env", "NO_SUCH_KEY_VAR"]) == 1
    assert cli_main(["serve", str(model_folder), "--port", "70000"]) == 1


def test_reinforge_serve_command_serves_a_run(tmp_path: Any, model_folder: Any) -> None:
    """The real command: ``reinforge serve RUN_DIR --port 0 --api-key-env``, a request, then SIGTERM."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    run = tmp_path / "my-run"
    ckpt = run / "checkpoints" / "step-1"
    peft_model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(str(model_folder)), LoraConfig(r=2, target_modules=["q_proj"])
    )
    peft_model.save_pretrained(str(ckpt / "adapter"))
    (ckpt / "state.json").write_text("{}")
    (run / "config.json").write_text(json.dumps({"model": {"model_path": str(model_folder), "max_model_len": 512}}))
    exe = Path(sys.executable).with_name("reinforge")
    env = {**os.environ, "SERVE_TEST_KEY": KEY}
    cmd = [str(exe), "serve", str(run), "--port", "0", "--api-key-env", "SERVE_TEST_KEY", "--threads", "2"]
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        seen = []
        port = None
        for line in proc.stderr:  # ends if the server dies
            seen.append(line)
            m = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        assert port is not None, "".join(seen)
        assert any("serving 'my-run/step-1'" in s for s in seen), "".join(seen)
        base = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {KEY}"}
        assert httpx.get(f"{base}/healthz").json()["model"] == "my-run/step-1"
        assert httpx.get(f"{base}/v1/models", headers=headers).json()["data"][0]["id"] == "my-run/step-1"
        body = {"model": "my-run/step-1", "messages": HELLO, "max_tokens": 4, "temperature": 0}
        r = httpx.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 4
        assert httpx.post(f"{base}/v1/chat/completions", json=body).status_code == 401
    finally:
        proc.terminate()
        _, rest = proc.communicate(timeout=60)
    # uvicorn shuts down cleanly, then re-raises the SIGTERM it caught
    assert proc.returncode in (0, -15) and "Finished server process" in rest, rest


def test_stream_n2_matches_non_stream(http: httpx.Client, name: str) -> None:
    body = {"model": name, "messages": HELLO, "max_tokens": 6, "n": 2, "seed": 3, "temperature": 1.0}
    whole = http.post("/v1/chat/completions", json=body).json()
    texts: dict[int, str] = {0: "", 1: ""}
    finish: dict[int, str] = {}
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if not line or line == "data: [DONE]":
                continue
            for c in json.loads(line[6:])["choices"]:
                texts[c["index"]] += c["delta"].get("content") or ""
                if c["finish_reason"]:
                    finish[c["index"]] = c["finish_reason"]
    assert [texts[0], texts[1]] == [c["message"]["content"] for c in whole["choices"]]
    assert [finish[0], finish[1]] == [c["finish_reason"] for c in whole["choices"]]


def test_completion_logprobs_zero(http: httpx.Client, name: str, tokenizer: Any) -> None:
    body = {"model": name, "prompt": ["One, two,", "Red, green,"], "max_tokens": 4, "temperature": 0, "logprobs": 0}
    out = http.post("/v1/completions", json={**body, "return_token_ids": True}).json()
    assert [c["index"] for c in out["choices"]] == [0, 1]
    for c, prompt in zip(out["choices"], body["prompt"]):
        lp = c["logprobs"]
        assert lp["tokens"] == [tokenizer.decode([i]) for i in c["token_ids"]]
        assert len(lp["token_logprobs"]) == len(c["token_ids"]) and all(x <= 0 for x in lp["token_logprobs"])
        assert c["prompt_token_ids"] == tokenizer(prompt).input_ids
    assert out["usage"]["prompt_tokens"] == sum(len(c["prompt_token_ids"]) for c in out["choices"])


def test_engine_failure_is_a_500_and_the_server_goes_on(
    http: httpx.Client, name: str, served: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken() -> Any:
        raise RuntimeError("out of cache")

    with monkeypatch.context() as m:
        m.setattr(served[0].engine, "_session", broken)  # every new decode batch fails
        r = http.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2})
        assert r.status_code == 500
        assert r.json()["error"]["type"] == "server_error" and "out of cache" in r.json()["error"]["message"]
        with http.stream("POST", "/v1/chat/completions", json={"messages": HELLO, "stream": True}) as s:
            events = [line for line in s.iter_lines() if line]
        assert "out of cache" in events[-2] and events[-1] == "data: [DONE]"
    _ok(http, name)
