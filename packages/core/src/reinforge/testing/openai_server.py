"""An OpenAI-compatible chat server on 127.0.0.1 (stdlib only): a test double.

Tests use it as a real peer for anything that talks HTTP (LiteLLM, the OpenAI
SDK, an agent framework bound to ``model.base_url``): a ``responder`` function
scripts the answers and can inject faults (error status, delay, malformed
body) through :class:`Reply`. Production servers run on starlette + uvicorn
(backend-local's policy endpoint and ``reinforge serve``), never on this one.
"""

from __future__ import annotations

import inspect
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ..models import openai_message

__all__ = ["OpenAIServer", "Reply", "Responder"]


@dataclass
class Reply:
    """A scripted answer, with knobs for fault injection.

    ``content`` or ``message`` is the assistant turn. ``status`` other than 200
    sends an OpenAI-style error JSON (``content`` becomes its message).
    ``delay`` waits before answering (interrupted by ``stop()``). ``raw_body``
    is sent as-is, to test malformed responses. ``finish_reason=None`` means
    "tool_calls" when the message has tool calls, else "stop".
    """

    content: str | None = None
    message: dict[str, Any] | None = None
    status: int = 200
    delay: float = 0.0
    finish_reason: str | None = None
    raw_body: bytes | None = None
    usage: dict[str, int] | None = None
    logprobs: list[dict[str, Any]] | None = None


Responder = Callable[..., str | dict[str, Any] | Reply]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


def _words(value: Any) -> int:
    """Whitespace words in a message content (a string or a list of parts)."""
    if isinstance(value, str):
        return len(value.split())
    if isinstance(value, list):
        return sum(_words(p.get("text") if isinstance(p, dict) else p) for p in value)
    return 0


def _prompt_tokens(body: dict[str, Any]) -> int:
    return sum(_words(m.get("content")) for m in body.get("messages") or [] if isinstance(m, dict))


def _completion_tokens(message: dict[str, Any]) -> int:
    args = sum(
        _words(c["function"].get("name", "")) + _words(c["function"]["arguments"])
        for c in message.get("tool_calls", [])
    )
    return _words(message.get("content")) + args


def _route(path: str, endpoint: str) -> str | None:
    """The prefix before ``endpoint`` (``""`` for the plain route), or None when it does not match.

    Prefixes let one server give every rollout its own base URL
    (``/rollouts/<id>/v1``); a responder taking two arguments receives it.
    """
    path = path.split("?", 1)[0].rstrip("/")
    if not path.endswith(endpoint):
        return None
    return path[: -len(endpoint)]


def _positional_count(func: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return 1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in kinds for p in params)


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: one request per connection, so no keep-alive thread outlives stop().
    protocol_version = "HTTP/1.0"
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""

    # -- plumbing ---------------------------------------------------------
    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        self._send(status, json.dumps(payload).encode())

    def _error(self, status: int, message: str) -> None:
        err_type = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self._json(status, {"error": {"message": message, "type": err_type, "param": None, "code": status}})

    def _authorized(self) -> bool:
        key = self.server.owner.api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._error(401, "Incorrect API key provided")
        return False

    # -- endpoints --------------------------------------------------------
    def do_GET(self) -> None:
        if not self._authorized():
            return
        if _route(self.path, "/v1/models") is not None:
            name = self.server.owner.model_name
            self._json(
                200,
                {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "reinforge"}]},
            )
        else:
            self._error(404, f"no route for GET {self.path}")

    def do_POST(self) -> None:
        owner = self.server.owner
        prefix = _route(self.path, "/v1/chat/completions")
        if prefix is None:
            self._error(404, f"no route for POST {self.path}")
            return
        if not self._authorized():
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > owner.max_body_bytes:
            self._error(413, f"request body must be at most {owner.max_body_bytes} bytes")
            return
        try:
            body = json.loads(self.rfile.read(length) or b"null")
        except ValueError as exc:
            self._error(400, f"request body is not valid JSON: {exc}")
            return
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            self._error(400, "request body must be a JSON object with a 'messages' list")
            return
        owner._record(body)
        try:
            reply = owner._reply_for(body, prefix)
        except Exception as exc:  # the responder's bug becomes a 500, like a crashing server
            self._error(500, f"responder raised {type(exc).__name__}: {exc}")
            return
        if reply.delay > 0 and owner._stopping.wait(reply.delay):
            return  # server is stopping: drop the connection instead of answering late
        if reply.raw_body is not None:
            self._send(reply.status, reply.raw_body, "application/octet-stream")
        elif reply.status != 200:
            self._error(reply.status, reply.content or f"scripted error {reply.status}")
        elif body.get("stream"):
            self._stream(body, reply)
        else:
            self._json(200, self._completion(body, reply))

    # -- payloads ---------------------------------------------------------
    def _message(self, reply: Reply) -> dict[str, Any]:
        return openai_message(reply.message if reply.message is not None else {"content": reply.content or ""})

    def _completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        message = self._message(reply)
        finish = reply.finish_reason or ("tool_calls" if message.get("tool_calls") else "stop")
        prompt, completion = _prompt_tokens(body), _completion_tokens(message)
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        if body.get("logprobs") and reply.logprobs is not None:
            choice["logprobs"] = {"content": reply.logprobs}
        elif body.get("logprobs"):
            tokens = (message.get("content") or "").split()
            choice["logprobs"] = {
                "content": [{"token": t, "logprob": 0.0, "bytes": list(t.encode()), "top_logprobs": []} for t in tokens]
            }
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.server.owner.model_name,
            "choices": [choice],
            "usage": reply.usage
            or {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
        }

    def _stream(self, body: dict[str, Any], reply: Reply) -> None:
        full = self._completion(body, reply)
        message, finish = full["choices"][0]["message"], full["choices"][0]["finish_reason"]
        base = {k: full[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}

        events = [chunk({"role": "assistant", "content": ""})]
        text = message.get("content") or ""
        events += [
            chunk({"content": piece}) for piece in text.split(" ")[:1] + [" " + w for w in text.split(" ")[1:]] if piece
        ]
        for i, call in enumerate(message.get("tool_calls", [])):
            events.append(chunk({"tool_calls": [{"index": i, **call}]}))
        events.append(chunk({}, finish))
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({**base, "choices": [], "usage": full["usage"]})
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        for event in events:
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # stop() must not wait for a handler stuck on a slow client
    owner: OpenAIServer


class OpenAIServer:
    """OpenAI-compatible chat server on ``127.0.0.1:<free port>``, in a background thread.

    ``with OpenAIServer(lambda body: "hi") as srv: srv.base_url`` gives
    ``http://127.0.0.1:PORT/v1``. Received request bodies are in ``.requests``.
    """

    def __init__(
        self,
        responder: Responder,
        *,
        model_name: str = "scripted",
        api_key: str | None = None,
        max_body_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.responder = responder
        self._wants_prefix = _positional_count(responder) >= 2
        self.model_name = model_name
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self._lock = threading.Lock()
        self._requests: list[dict[str, Any]] = []
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------
    def start(self) -> OpenAIServer:
        """Bind a free port and serve in a daemon thread; returns self."""
        if self._httpd is not None:
            return self
        self._stopping.clear()
        httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        httpd.owner = self
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.name = f"OpenAIServer:{self.port}"
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, wake delayed replies and close the socket; safe to call twice."""
        httpd, self._httpd = self._httpd, None
        self._stopping.set()
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> OpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- addresses and records ---------------------------------------------
    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("OpenAIServer is not running; call start() or use it as a context manager")
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """A copy of every chat completion request body received so far."""
        with self._lock:
            return list(self._requests)

    @property
    def call_count(self) -> int:
        with self._lock:
            return len(self._requests)

    def _record(self, body: dict[str, Any]) -> None:
        with self._lock:
            self._requests.append(body)

    def _reply_for(self, body: dict[str, Any], prefix: str) -> Reply:
        result = self.responder(body, prefix) if self._wants_prefix else self.responder(body)
        if isinstance(result, Reply):
            return result
        if isinstance(result, str):
            return Reply(content=result)
        if isinstance(result, dict):
            return Reply(message=result)
        raise TypeError(f"responder must return str, dict or Reply, got {type(result).__name__}")
