"""What every OpenAI-compatible server of the family shares: its errors, its bearer keys, its request counter.

``reinforge serve`` (reinforge-backend-local) and the online gateway (reinforge-online) answer in
OpenAI's error shape, check ``Authorization: Bearer <key>`` in constant time and count every response
by route and status; they take these pieces from here, so the three behave the same in both. Plain
Python and ASGI only: core imports no web framework.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["ApiError", "CountResponses", "bearer", "bearer_matches", "check_bearer"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ApiError(Exception):
    """An error a server answers itself: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status.

    ``kind`` is OpenAI's error ``type`` (default ``invalid_request_error`` below 500, ``server_error``
    from 500); ``headers`` go out with it (``Retry-After`` of a 429).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        kind: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def encoded(self) -> bytes:
        return json.dumps(self.body()).encode()


def bearer(header: str | None) -> str:
    """The token of ``Authorization: Bearer <token>`` ('' when absent or of another scheme)."""
    scheme, _, token = (header or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def bearer_matches(header: str | None, key: str) -> bool:
    """Whether ``header`` carries ``key`` (compared in constant time)."""
    return hmac.compare_digest(bearer(header).encode(), key.encode())


def check_bearer(header: str | None, key: str | None, *, admin: bool = False) -> None:
    """A 401 :class:`ApiError` unless ``header`` carries ``key``; ``None``: no key, anyone passes.

    ``admin`` names the admin key in the message (and its ``code``: ``invalid_admin_key``).
    """
    if key is None or bearer_matches(header, key):
        return
    which = "admin key" if admin else "API key"
    raise ApiError(
        f"missing or incorrect {which}: send Authorization: Bearer <{'admin key' if admin else 'key'}>",
        status=401,
        code="invalid_admin_key" if admin else "invalid_api_key",
    )


class CountResponses:
    """ASGI middleware: every HTTP response, errors included, handed to ``count(scope, status)`` once sent
    (500 when the app raised before it started one)."""

    def __init__(self, app: ASGIApp, count: Callable[[Scope, int], None]) -> None:
        self.app = app
        self.count = count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.count(scope, status[0])
