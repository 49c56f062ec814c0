"""Real parts for the gateway's tests: a fake upstream, a fake policy, uvicorn servers in threads."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from reinforge.plugin import load_settings
from reinforge_online.config import OnlineSettings, Secrets

# One client for every test: making an httpx client loads CA certificates (a third of a second here).
HTTP = httpx.Client(verify=False, timeout=10)

TRAFFIC_KEY = "traffic-key"
ADMIN_KEY = "admin-key"
UPSTREAM_KEY = "upstream-key"
SECRET = b"feedback-secret"

# odd spacing on purpose: a re-serialised body would not be byte-identical
UPSTREAM_BODY = (
    b'{"id":"chatcmpl-up1",  "object":"chat.completion","created":1700000000,"model":"gpt-up",'
    b'"choices":[{"index":0,"message":{"role":"assistant","content":"from the upstream \\u00e9"},'
    b'"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":4,"total_tokens":9}}'
)
UPSTREAM_CHUNKS = [
    b'data: {"id":"chatcmpl-up2","object":"chat.completion.chunk","created":1700000000,"model":"gpt-up",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n',
    b'data: {"id":"chatcmpl-up2","object":"chat.completion.chunk","created":1700000000,"model":"gpt-up",'
    b'"choices":[{"index":0,"delta":{"content":"up "},"finish_reason":null}]}\n\n',
    b'data: {"id":"chatcmpl-up2","object":"chat.completion.chunk","created":1700000000,"model":"gpt-up",'
    b'"choices":[{"index":0,"delta":{"content":"stream"},"finish_reason":null}]}\n\n',
    b'data: {"id":"chatcmpl-up2","object":"chat.completion.chunk","created":1700000000,"model":"gpt-up",'
    b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
]
MODELS_BODY = b'{"object":"list","data":[{"id":"gpt-up","object":"model","created":1,"owned_by":"up"}]}'

POLICY_TOKENS = [101, 102, 103]
POLICY_PIECES = ["po", "li", "cy"]
POLICY_LOGPROBS = [-0.5, -0.25, -0.125]
POLICY_PROMPT_IDS = [1, 2, 3, 4]
POLICY_VERSION = "7"


class Fake:
    """A fake OpenAI API on starlette: it keeps every request it got; ``fail`` makes it answer 500."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.fail = False
        # "garbage" (200, not JSON), "error_event" (a stream that fails), "reject" (400), "json_stream" (a stream
        # request answered with a JSON 200), "empty_stream" (an SSE 200 without events), "break" (a stream, or a
        # body, that stops mid-way: the connection closes), "stall" (a stream that waits for ``hold`` after its
        # first chunk), "hang" (answers once ``hold`` is set)
        self.behaviour = "ok"
        self.hold = threading.Event()  # with behaviour "hang": answers once it is set
        self.arrived = threading.Condition()

    async def _record(self, request: Request) -> bytes:
        raw = await request.body()
        with self.arrived:
            self.requests.append(({k.lower(): v for k, v in request.headers.items()}, raw))
            self.arrived.notify_all()
        return raw

    def wait_requests(self, n: int, timeout: float = 10) -> bool:
        """Wait until ``n`` requests arrived (shadow runs reach the policy in the background)."""
        with self.arrived:
            return self.arrived.wait_for(lambda: len(self.requests) >= n, timeout)

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(raw) for _, raw in self.requests if raw]


class BrokeOff(Exception):
    """Raised by a fake's body mid-way: uvicorn closes the connection without the final chunk."""


def _cut(chunks: list[bytes], behaviour: str, hold: threading.Event) -> AsyncIterator[bytes]:
    """``chunks`` as a body: cut after the second with ``break``; waiting after the first with ``stall``."""

    async def body() -> AsyncIterator[bytes]:
        for i, c in enumerate(chunks):
            if behaviour == "break" and i == 2:
                raise BrokeOff("the fake breaks off here")
            if behaviour == "stall" and i == 1:
                await asyncio.to_thread(hold.wait, 60)
            yield c

    return body()


class FakeUpstream(Fake):
    def app(self) -> Starlette:
        async def chat(request: Request) -> Response:
            raw = await self._record(request)
            if self.fail:
                return JSONResponse({"error": {"message": "upstream broke"}}, status_code=500)
            if self.behaviour == "reject":
                return JSONResponse({"error": {"message": "upstream refuses it"}}, status_code=400)
            if self.behaviour == "hang":
                await asyncio.to_thread(self.hold.wait, 30)
            if json.loads(raw).get("stream"):

                def chunks() -> AsyncIterator[bytes]:
                    return _cut(UPSTREAM_CHUNKS, self.behaviour, self.hold)

                return StreamingResponse(
                    chunks(), media_type="text/event-stream", headers={"x-upstream": "yes", "x-request-id": "r1"}
                )
            return Response(
                UPSTREAM_BODY, media_type="application/json", headers={"x-upstream": "yes", "x-request-id": "r1"}
            )

        async def models(request: Request) -> Response:
            await self._record(request)
            return Response(MODELS_BODY, media_type="application/json")

        return Starlette(
            routes=[
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/v1/models", models, methods=["GET"]),
            ]
        )


def _logprobs(i: int) -> dict[str, Any]:
    return {"content": [{"token": POLICY_PIECES[i], "logprob": POLICY_LOGPROBS[i], "bytes": None, "top_logprobs": []}]}


class FakePolicy(Fake):
    """Answers like ``reinforge serve``: ``prompt_token_ids``, per-choice ``token_ids`` and logprobs on request."""

    def app(self) -> Starlette:
        async def chat(request: Request) -> Response:
            raw = await self._record(request)
            if self.fail:
                return JSONResponse({"error": {"message": "policy broke"}}, status_code=503)
            if self.behaviour == "garbage":
                return Response(b"<html>oops</html>", media_type="application/json")
            if self.behaviour == "reject":
                return JSONResponse({"error": {"message": "the policy refuses it"}}, status_code=400)
            if self.behaviour == "hang":
                await asyncio.to_thread(self.hold.wait, 30)
            body = json.loads(raw)
            ids, lp = body.get("return_token_ids"), body.get("logprobs")
            headers = {"x-policy-version": POLICY_VERSION}
            if body.get("stream") and self.behaviour == "json_stream":
                return JSONResponse({"id": "x", "object": "chat.completion", "choices": []}, headers=headers)
            if body.get("stream") and self.behaviour == "empty_stream":
                return Response(b"", media_type="text/event-stream", headers=headers)
            if body.get("stream"):

                async def events() -> AsyncIterator[bytes]:
                    def env(choices: list[dict[str, Any]], **extra: Any) -> bytes:
                        c = {"id": "chatcmpl-pol", "object": "chat.completion.chunk", "created": 1, "model": "pol"}
                        return b"data: " + json.dumps({**c, "choices": choices, **extra}).encode() + b"\n\n"

                    first = {"prompt_token_ids": POLICY_PROMPT_IDS} if ids else {}
                    yield env([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}], **first)
                    for i, t in enumerate(POLICY_TOKENS):
                        c: dict[str, Any] = {"index": 0, "delta": {"content": POLICY_PIECES[i]}, "logprobs": None}
                        if lp:
                            c["logprobs"] = _logprobs(i)
                        if ids:
                            c["token_ids"] = [t]
                        yield env([c])
                    if self.behaviour == "error_event":
                        yield b'data: {"error": {"message": "generation failed", "type": "server_error"}}\n\n'
                    else:
                        yield env([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}])
                    yield b"data: [DONE]\n\n"

                async def chunks() -> AsyncIterator[bytes]:
                    pieces = [e async for e in events()]
                    async for piece in _cut(pieces, self.behaviour, self.hold):
                        yield piece

                return StreamingResponse(chunks(), media_type="text/event-stream", headers=headers)
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(POLICY_PIECES)},
                "logprobs": None,
                "finish_reason": "stop",
            }
            last = (body.get("messages") or [{}])[-1]
            if self.behaviour.startswith("tool:") and last.get("role") != "tool":  # "tool:<name>": asks for it once
                call = {
                    "id": "call-1",
                    "type": "function",
                    "function": {"name": self.behaviour[5:], "arguments": '{"query": "q"}'},
                }
                choice["message"] = {"role": "assistant", "content": None, "tool_calls": [call]}
                choice["finish_reason"] = "tool_calls"
            if lp:
                choice["logprobs"] = {"content": [_logprobs(i)["content"][0] for i in range(len(POLICY_TOKENS))]}
            if ids:
                choice["token_ids"] = POLICY_TOKENS
            out: dict[str, Any] = {
                "id": "chatcmpl-pol",
                "object": "chat.completion",
                "created": 1,
                "model": "pol",
                "choices": [choice],
                "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
            }
            if ids:
                out["prompt_token_ids"] = POLICY_PROMPT_IDS
            return JSONResponse(out, headers=headers)

        return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def recorded_policy_call(store: Any, messages: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The store's one trace and its one call, checked to be the fake policy's answer to ``messages``
    (asked as model ``gpt-up``) with the policy's prompt and completion token ids and logprobs."""
    store.submit(lambda db: None).result(10)  # every earlier write committed
    (trace_id,) = store.trace_ids()
    (recorded,) = store.trace(trace_id)["calls"]
    assert recorded["prompt_token_ids"] == POLICY_PROMPT_IDS
    assert recorded["token_ids"] == POLICY_TOKENS and recorded["logprobs"] == POLICY_LOGPROBS
    assert recorded["request"]["messages"] == messages and recorded["request"]["model"] == "gpt-up"
    assert recorded["response"]["choices"][0]["message"]["content"] == "policy"
    return trace_id, recorded


def free_port() -> int:
    """A port nothing listens on (bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def settings(upstream_url: str, policy_url: str | None, store_path: Path, /, **overrides: Any) -> OnlineSettings:
    """A gateway's settings for the tests (rate limits off unless ``limits`` names them)."""
    data: dict[str, Any] = {
        "upstream": {"url": upstream_url},
        "auth": {"traffic_key_env": "T", "admin_key_env": "A", "feedback_secret_env": "F"},
        "store": {"path": str(store_path), "probe_interval_s": 0.05, "busy_timeout_ms": 50},
        "selection": {"sampling_rate": 0.0},
        "limits": {"requests_per_s": None},
    }
    if policy_url is not None:
        data["policy"] = {"url": policy_url, "model": "pol"}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return load_settings(OnlineSettings, data, where="test.yaml")


SECRETS = Secrets(
    traffic_key=TRAFFIC_KEY,
    admin_key=ADMIN_KEY,
    feedback_secret=SECRET,
    upstream_key=UPSTREAM_KEY,
    policy_key=None,
)


def redact_contents(call: Any) -> Any:
    """A redactor for the tests: every message content masked, in the request and the response."""
    for m in call.request.get("messages") or ():
        m["content"] = "[redacted]"
    for c in call.response.get("choices") or ():
        c["message"]["content"] = "[redacted]"
    return call


def redact_everything(call: Any) -> None:
    return None


def redact_raises(call: Any) -> Any:
    raise RuntimeError("redactor bug")


# -- judges and a workflow for the reward calculator's tests (referenced as online_testlib:<name>) ----------------


def const_judge(task: dict, response: Any, value: float = 1.0) -> float:
    """``value`` whatever the answer (to test clamping)."""
    return value


def nan_judge(task: dict, response: Any) -> float:
    return float("nan")


class FailsFirst:
    """FAILED (transient) for its first ``failures`` calls, then 0.75; built once per gateway, so it counts."""

    def __init__(self, failures: int = 1) -> None:
        self.failures = failures
        self.calls = 0

    async def __call__(self, task: dict, response: Any) -> Any:
        from reinforge import JudgeOutput, TaskStatus

        self.calls += 1
        if self.calls <= self.failures:
            return JudgeOutput(status=TaskStatus.FAILED, error="the judge's service answered 503")
        return JudgeOutput(reward=0.75)


class Hangs:
    """Never answers (until the test ends): every attempt runs into the judge timeout."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, task: dict, response: Any) -> Any:
        self.calls += 1
        await asyncio.Event().wait()


class Gated:
    """0.5 once the test opens ``gate``; ``started`` is set when a call began (a judge caught mid-scoring)."""

    def __init__(self) -> None:
        self.calls = 0
        self.started = threading.Event()
        self.gate = threading.Event()

    async def __call__(self, task: dict, response: Any) -> float:
        self.calls += 1
        self.started.set()
        assert await asyncio.to_thread(self.gate.wait, 10), "the test never opened the gate"
        return 0.5


async def echo_workflow(task: dict, model: Any) -> Any:
    """A workflow for run files the tests write (online never runs it)."""
    from reinforge import WorkflowOutput

    return WorkflowOutput(response=await model.chat(task["messages"]))


def const_group(task: dict, responses: list[Any]) -> list[float]:
    """A group reward for a run file online refuses (it scores traces one at a time)."""
    return [1.0] * len(responses)


TOOL_CALLS: list[dict[str, Any]] = []  # what the allowlisted test tool was called with


def lookup(query: str) -> str:
    """A read-only tool for shadow runs: it answers and remembers that it ran."""
    TOOL_CALLS.append({"query": query})
    return f"found {query}"


def open_store_at(spec: dict[str, Any], **options: Any) -> Any:
    """A trace store at ``spec`` (``{"kind": "sqlite", "path"}`` or ``{"kind": "postgres", "url", "password"}``)."""
    from reinforge_online.store import TraceStore

    if spec["kind"] == "sqlite":
        return TraceStore(spec["path"], **options)
    from reinforge_online.pgstore import PostgresTraceStore

    return PostgresTraceStore(spec["url"], password=spec["password"], **options)


REINFORGE = [sys.executable, "-c", "import sys; from reinforge.cli import main; sys.exit(main())"]


class GatewayProcess:
    """``reinforge online serve CONFIG`` in a process of its own, as a user runs it; its stderr kept.

    ``with GatewayProcess(path, env) as gw:`` waits until uvicorn listens; leaving kills it if it still runs.
    """

    def __init__(self, config: Path, env: dict[str, str] | None = None, *args: str) -> None:
        self.config = config
        self.env = {**os.environ, "REINFORGE_LOAD_PLUGINS": "reinforge-online", **(env or {})}
        self.args = args
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> GatewayProcess:
        self.proc = subprocess.Popen(
            [*REINFORGE, "online", "serve", str(self.config), "--log-level", "info", *self.args],
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )

        def watch() -> None:
            assert self.proc is not None and self.proc.stderr is not None
            for line in self.proc.stderr:
                self.lines.append(line)
                if "Uvicorn running on" in line:  # bound and listening
                    self.ready.set()
            self.ready.set()  # it exited

        self.watcher = threading.Thread(target=watch, daemon=True)
        self.watcher.start()
        assert self.ready.wait(60) and self.proc.poll() is None, "".join(self.lines)
        return self

    @property
    def output(self) -> str:
        self.watcher.join(10)  # everything it wrote, once it exited
        return "".join(self.lines)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)


def write_config(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(json.dumps(data))
    return path
