"""The gateway's streamed response: pieces sent as they come, no content-length, stopped by a disconnect."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from reinforge_online.asgi import StreamResponse


def test_pieces_go_out_in_order_and_the_body_ends():
    sent: list[dict[str, Any]] = []

    async def pieces() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        yield b"data: [DONE]\n\n"

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # the client stays
        return {}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    response = StreamResponse(pieces(), headers={"content-type": "text/event-stream", "x-reinforge-trace-id": "t1"})
    asyncio.run(response({"type": "http"}, receive, send))
    start, *bodies = sent
    assert start["status"] == 200 and (b"x-reinforge-trace-id", b"t1") in start["headers"]
    assert not any(name == b"content-length" for name, _ in start["headers"])
    assert [m["body"] for m in bodies] == [b"data: 1\n\n", b"data: [DONE]\n\n", b""]
    assert [m["more_body"] for m in bodies] == [True, True, False]


def test_a_client_that_went_away_ends_the_stream_and_closes_the_pieces():
    sent: list[bytes] = []
    closed = asyncio.Event()
    gone = asyncio.Event()

    async def pieces() -> AsyncIterator[bytes]:
        try:
            yield b"first"
            gone.set()  # the client disconnects while the next piece is being made
            await asyncio.sleep(0)
            yield b"second"
            yield b"third"
        finally:
            closed.set()  # the upstream's response is released here in the real relay

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    asyncio.run(StreamResponse(pieces())({"type": "http"}, receive, send))
    assert sent == [b"first"] and closed.is_set()
