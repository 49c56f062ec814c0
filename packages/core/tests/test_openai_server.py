"""The test OpenAI server speaks the real wire protocol, including injected faults."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from reinforge.testing import OpenAIServer, Reply

TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}


def post(url: str, body: Any, headers: dict[str, str] | None = None, timeout: float = 5.0) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def chat(srv: OpenAIServer, content: str = "hello there", **extra: Any) -> tuple[int, Any]:
    body = {"model": "m", "messages": [{"role": "user", "content": content}], **extra}
    status, raw = post(srv.base_url + "/chat/completions", body)
    return status, raw


def test_base_url_is_loopback_and_models_lists_the_model_name() -> None:
    with OpenAIServer(lambda body: "hi", model_name="policy") as srv:
        assert srv.base_url.startswith("http://127.0.0.1:") and srv.base_url.endswith("/v1")
        with urllib.request.urlopen(srv.base_url + "/models", timeout=5) as resp:
            models = json.loads(resp.read())
    assert [m["id"] for m in models["data"]] == ["policy"]


def test_non_streaming_completion_has_message_finish_reason_and_usage() -> None:
    with OpenAIServer(lambda body: "four score and seven") as srv:
        status, raw = chat(srv, "how many years ago")
        assert srv.call_count == 1
        assert srv.requests[0]["messages"] == [{"role": "user", "content": "how many years ago"}]
    payload = json.loads(raw)
    assert status == 200
    assert payload["object"] == "chat.completion"
    assert payload["model"] == "m"
    choice = payload["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "four score and seven"}
    assert choice["finish_reason"] == "stop"
    assert payload["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8}


def test_dict_reply_gets_tool_calls_with_string_arguments() -> None:
    with OpenAIServer(lambda body: {"content": None, "tool_calls": [TOOL_CALL]}) as srv:
        status, raw = chat(srv)
    choice = json.loads(raw)["choices"][0]
    assert status == 200
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["id"] == "call_1" and call["type"] == "function"
    assert json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}


def test_streaming_sends_sse_chunks_then_done() -> None:
    with OpenAIServer(lambda body: "one two three") as srv:
        status, raw = chat(srv, stream=True, stream_options={"include_usage": True})
    lines = [line for line in raw.decode().split("\n") if line]
    assert status == 200
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: ") :]) for line in lines[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "one two three"
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1]["usage"]["completion_tokens"] == 3


def test_streaming_tool_calls() -> None:
    with OpenAIServer(lambda body: {"tool_calls": [TOOL_CALL]}) as srv:
        _, raw = chat(srv, stream=True)
    chunks = [json.loads(line[6:]) for line in raw.decode().split("\n") if line and line != "data: [DONE]"]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert calls[0]["index"] == 0 and calls[0]["function"]["name"] == "add"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("status", [429, 500, 503])
def test_error_status_sends_openai_error_json(status: int) -> None:
    with OpenAIServer(lambda body: Reply(status=status, content="overloaded")) as srv:
        got, raw = chat(srv)
    assert got == status
    assert json.loads(raw)["error"]["message"] == "overloaded"


def test_responder_exception_becomes_500_with_its_message() -> None:
    def boom(body: dict) -> str:
        raise ValueError("script bug")

    with OpenAIServer(boom) as srv:
        status, raw = chat(srv)
    assert status == 500
    assert "script bug" in json.loads(raw)["error"]["message"]


def test_raw_body_is_sent_as_is() -> None:
    with OpenAIServer(lambda body: Reply(raw_body=b"{not json")) as srv:
        status, raw = chat(srv)
    assert (status, raw) == (200, b"{not json")


def test_bad_requests_are_rejected() -> None:
    with OpenAIServer(lambda body: "x", max_body_bytes=100) as srv:
        assert post(srv.base_url + "/chat/completions", b"{oops")[0] == 400
        assert post(srv.base_url + "/chat/completions", {"no": "messages"})[0] == 400
        big = {"messages": [{"role": "user", "content": "x" * 200}]}
        assert post(srv.base_url + "/chat/completions", big)[0] == 413
        assert post(srv.base_url + "/completions", {"messages": []})[0] == 404
        assert srv.call_count == 0


def test_api_key_is_checked() -> None:
    with OpenAIServer(lambda body: "ok", api_key="secret") as srv:
        body = {"messages": [{"role": "user", "content": "hi"}]}
        url = srv.base_url + "/chat/completions"
        assert post(url, body, {"Authorization": "Bearer wrong"})[0] == 401
        assert post(url, body)[0] == 401
        assert post(url, body, {"Authorization": "Bearer secret"})[0] == 200


def test_delay_causes_client_timeout_and_stop_interrupts_it() -> None:
    srv = OpenAIServer(lambda body: Reply(content="late", delay=60)).start()
    host, port = "127.0.0.1", srv.port
    conn = http.client.HTTPConnection(host, port, timeout=0.2)
    conn.request("POST", "/v1/chat/completions", json.dumps({"messages": []}), {"Content-Type": "application/json"})
    with pytest.raises(TimeoutError):
        conn.getresponse()
    conn.close()
    start = time.monotonic()
    srv.stop()
    assert time.monotonic() - start < 5  # the 60 s delay did not hold up stop()
    assert srv.call_count == 1


def test_concurrent_requests_are_all_recorded() -> None:
    with OpenAIServer(lambda body: body["messages"][0]["content"].upper()) as srv:
        results: list[bytes] = []
        threads = [threading.Thread(target=lambda i=i: results.append(chat(srv, f"msg{i}")[1])) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert srv.call_count == 8
    contents = sorted(json.loads(r)["choices"][0]["message"]["content"] for r in results)
    assert contents == sorted(f"MSG{i}" for i in range(8))


def test_stop_is_idempotent_and_port_is_released() -> None:
    srv = OpenAIServer(lambda body: "x").start()
    port = srv.port
    srv.stop()
    srv.stop()
    with pytest.raises(RuntimeError, match="not running"):
        _ = srv.base_url
    with pytest.raises(OSError):
        http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("GET", "/v1/models")


def test_openai_sdk_can_talk_to_it() -> None:
    openai = pytest.importorskip("openai")
    with OpenAIServer(lambda body: "sdk ok") as srv:
        client = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=5)
        resp = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        assert resp.choices[0].message.content == "sdk ok"
        stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "sdk ok"
