"""Turning a request's token events into what a client reads: text deltas, merged choices."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from ..inference.engine import GenResult
from ..inference.scheduler import Stream, TokenEvent


class TextDeltas:
    """One choice's text as its tokens arrive; the deltas join to exactly the final text.

    A token may end inside a multi-byte character (the text ends in U+FFFD until the rest
    comes) and the end of the text may be the start of a stop string: both are held back
    until the next token (or the end) settles them, so nothing sent is ever taken back.
    """

    def __init__(self, tokenizer: Any, stops: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.tokens: list[int] = []
        self.sent = ""

    def push(self, token: int) -> str:
        """The text that ``token`` makes safe to send (often ``""``)."""
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
        if text.endswith("\ufffd") or not text.startswith(self.sent):
            return ""
        safe = len(text)
        for stop in self.stops:
            cut = text.find(stop)
            if cut >= 0:
                safe = min(safe, cut)
            for k in range(min(len(stop) - 1, len(text)), 0, -1):  # a stop string may be beginning
                if text.endswith(stop[:k]):
                    safe = min(safe, len(text) - k)
                    break
        if safe <= len(self.sent):
            return ""
        delta = text[len(self.sent) : safe]
        self.sent += delta
        return delta

    def finish(self, text: str) -> str:
        """What is left of the final ``text`` (stop strings already cut off)."""
        rest = text[len(self.sent) :] if text.startswith(self.sent) else ""
        self.sent += rest
        return rest


async def merged(streams: list[Stream]) -> AsyncIterator[tuple[int, TokenEvent | GenResult]]:
    """The events of several streams (a request's ``n`` choices) as they come, tagged with the choice index.

    Each stream ends with its :class:`GenResult`. A failure in any stream is raised; leaving early
    (the client went away) cancels every stream still decoding, so its rows leave the batch.
    """
    queue: asyncio.Queue[tuple[int, TokenEvent | GenResult | BaseException]] = asyncio.Queue()

    async def pump(i: int, stream: Stream) -> None:
        try:
            async for event in stream.events():
                queue.put_nowait((i, event))
            assert stream.result is not None
            queue.put_nowait((i, stream.result))
        except Exception as exc:
            queue.put_nowait((i, exc))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        left = len(streams)
        while left:
            i, event = await queue.get()
            if isinstance(event, BaseException):
                raise event
            if isinstance(event, GenResult):
                left -= 1
            yield i, event
    finally:
        for task in tasks:
            task.cancel()
        for stream in streams:
            if stream.result is None:
                stream.cancel()
