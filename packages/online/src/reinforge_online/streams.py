"""Server-sent events from the policy: split into events, relayed without our extra fields, put back together.

A sampled streamed request asks the policy for token ids and logprobs the client did not ask for;
:class:`PolicyStream` strips them from each chunk on its way to the client and keeps them for the
trace, reassembling the choices into the chat completion that is stored when the stream ends.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from .store import CallRecord

__all__ = ["EventReader", "PolicyStream", "logprobs_of", "strip_extras"]

Event = tuple[bytes, bytes]  # (the event as sent, without its blank line; its data lines joined)
_decode = json.JSONDecoder().decode  # json.loads/dumps without their per-call argument handling: a stream's
_encode = json.JSONEncoder().encode  # every chunk goes through both (the same output as json.dumps)


def logprobs_of(choice: dict[str, Any]) -> list[float]:
    """The per-token logprobs of one OpenAI choice (or chunk choice)."""
    content = (choice.get("logprobs") or {}).get("content") or ()
    return [float(e["logprob"]) for e in content if isinstance(e, dict) and "logprob" in e]


def strip_extras(data: dict[str, Any], token_ids: bool, logprobs: bool) -> dict[str, Any]:
    """The policy's response (or chunk) without the token ids and logprobs the client did not ask for."""
    if not token_ids:
        data.pop("prompt_token_ids", None)
    for choice in data.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if not token_ids:
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
        if not logprobs and "logprobs" in choice:
            choice["logprobs"] = None
    return data


class EventReader:
    """The complete events of an SSE body, a list per read (what one read completed goes out in one send)."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    async def next_events(self) -> list[Event]:
        """The events the next read(s) complete, at least one with data; ``[]`` once the body ended.

        :raises UpstreamError: the body broke off.
        """
        async for piece in self._chunks:
            self._buffer += piece.replace(b"\r\n", b"\n") if b"\r" in piece else piece
            if b"\n\n" not in self._buffer:
                continue
            *complete, self._buffer = self._buffer.split(b"\n\n")
            events: list[Event] = []
            for event in complete:
                if event.startswith(b"data:") and b"\n" not in event:  # the usual one-line event
                    data = event[5:].lstrip()
                else:
                    data = b"\n".join(line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:"))
                if data:
                    events.append((event, data))
            if events:
                return events
        return []


@dataclass
class _Choice:
    """One choice of a streamed completion, put back together for the trace."""

    content: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    role: str = "assistant"

    def add(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta") or {}
        if isinstance(delta.get("content"), str):
            self.content.append(delta["content"])
        if isinstance(delta.get("role"), str):
            self.role = delta["role"]
        for call in delta.get("tool_calls") or ():
            k = call.get("index", len(self.tool_calls))
            have = self.tool_calls.get(k)
            if have is None:
                self.tool_calls[k] = json.loads(json.dumps(call))
            else:
                args = (call.get("function") or {}).get("arguments")
                if args:
                    fn = have.setdefault("function", {})
                    fn["arguments"] = fn.get("arguments", "") + args
        self.token_ids.extend(choice.get("token_ids") or ())
        self.logprobs.extend(logprobs_of(choice))
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": "".join(self.content)}
        if self.tool_calls:
            message["tool_calls"] = [
                {k: v for k, v in c.items() if k != "index"} for _, c in sorted(self.tool_calls.items())
            ]
        return message


class PolicyStream:
    """One sampled stream on its way to the client: each chunk stripped, the completion reassembled.

    ``on_end(record, state)`` is called once, with the completed call and ``complete`` (``[DONE]``
    arrived: called before ``[DONE]`` is handed on), ``failed`` (the policy sent an error event) or
    ``aborted`` (:meth:`end`: the stream broke off, ended without ``[DONE]`` or was cut). An end seen
    before :meth:`arm` (the call's first row is being written) is held until then, so the end is always
    written after the start.
    """

    def __init__(
        self,
        record: CallRecord,
        *,
        sent: float,
        want_ids: bool,
        want_logprobs: bool,
        model: str | None,
        on_end: Callable[[CallRecord, str], None],
    ) -> None:
        self.record = record
        self.sent = sent
        self.want_ids = want_ids
        self.want_logprobs = want_logprobs
        self.model = model  # the client's model name, put back into each chunk (None: keep the policy's)
        self.on_end = on_end
        self.choices: dict[int, _Choice] = {}
        self.meta: dict[str, Any] = {}
        self.first_at: float | None = None
        self.failed = False
        self.ended = False
        self.armed = False
        self._held: tuple[CallRecord, str] | None = None

    def feed(self, events: list[Event]) -> bytes:
        """The bytes to send the client for ``events``."""
        out: list[bytes] = []
        choices, meta, record = self.choices, self.meta, self.record
        for event, data in events:
            if data == b"[DONE]":
                self.end("failed" if self.failed or not choices else "complete")
                out.append(b"data: [DONE]\n\n")
                continue
            try:
                chunk = _decode(data.decode())
            except (ValueError, UnicodeDecodeError):
                chunk = None
            if not isinstance(chunk, dict):  # not ours to understand: passed on as it came
                out.append(event + b"\n\n")
                continue
            if self.first_at is None:
                self.first_at = time.perf_counter()
                for key in ("id", "created", "model", "system_fingerprint"):  # the same in every chunk
                    if chunk.get(key) is not None:
                        meta[key] = chunk[key]
            prompt_ids = chunk.pop("prompt_token_ids", None) if not self.want_ids else chunk.get("prompt_token_ids")
            if prompt_ids is not None and record.prompt_token_ids is None:
                record.prompt_token_ids = prompt_ids
            usage = chunk.get("usage")
            if usage is not None:
                meta["usage"] = usage
            if "error" in chunk:
                self.failed = True  # relayed; the call is stored as failed
            for c in chunk.get("choices") or ():
                if isinstance(c, dict):
                    index = c.get("index")
                    got = choices.get(index if isinstance(index, int) else 0)
                    if got is None:
                        got = choices[index if isinstance(index, int) else 0] = _Choice()
                    got.add(c)
                    if not self.want_ids:
                        c.pop("token_ids", None)
                        c.pop("prompt_token_ids", None)
                    if not self.want_logprobs and "logprobs" in c:
                        c["logprobs"] = None
            if self.model is not None and "model" in chunk:
                chunk["model"] = self.model
            out.append(b"data: " + _encode(chunk).encode() + b"\n\n")
        return b"".join(out)

    @property
    def opened_with_error(self) -> bool:
        """The policy's first event was an error (a fallback, before the client saw anything)."""
        return self.failed and not self.choices

    def end(self, state: str) -> None:
        """The stream ended (see the class docstring); only the first call counts."""
        if self.ended:
            return
        self.ended = True
        if self.armed:
            self.on_end(self.completed(), state)
        else:
            self._held = (self.completed(), state)

    def arm(self) -> None:
        """The call's first row is written (or given up): ends are passed on from now (a held one at once)."""
        self.armed = True
        held, self._held = self._held, None
        if held is not None:
            self.on_end(*held)

    def completed(self) -> CallRecord:
        """The call as it stands: the choices put back together, token ids, timing (a copy of the record)."""
        end = time.perf_counter()
        first = self.choices.get(0) or next(iter(self.choices.values()), _Choice())
        return dataclasses.replace(
            self.record,
            token_ids=first.token_ids or None,
            logprobs=first.logprobs or None,
            timing={
                "received_at": time.time() - (end - self.sent),
                "upstream_s": end - self.sent,
                "ttft_s": (self.first_at or end) - self.sent,
            },
            response={
                "id": self.meta.get("id"),
                "object": "chat.completion",
                "created": self.meta.get("created"),
                "model": self.model or self.meta.get("model"),
                "choices": [
                    {"index": i, "message": c.message(), "finish_reason": c.finish_reason}
                    for i, c in sorted(self.choices.items())
                ],
                "usage": self.meta.get("usage"),
            },
        )
