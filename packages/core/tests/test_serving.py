"""reinforge.serving: the errors, keys and response counter the family's servers share."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from reinforge.plugin import ApiError, CountResponses, bearer, bearer_matches, check_bearer


def test_an_api_error_has_openais_shape():
    err = ApiError("temperature: must be a number", param="temperature", code="invalid_type")
    assert err.status == 400 and err.body() == {
        "error": {
            "message": "temperature: must be a number",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "invalid_type",
        }
    }
    assert ApiError("down", status=503).kind == "server_error"


@pytest.mark.parametrize(
    ("header", "ok"),
    [("Bearer k1", True), ("bearer  k1 ", True), ("Bearer k2", False), ("Basic k1", False), (None, False), ("", False)],
)
def test_bearer_keys(header, ok):
    assert bearer_matches(header, "k1") is ok
    if ok:
        check_bearer(header, "k1")
    else:
        with pytest.raises(ApiError) as caught:
            check_bearer(header, "k1", admin=True)
        assert caught.value.status == 401 and caught.value.code == "invalid_admin_key"
    check_bearer(header, None)  # no key: open
    assert bearer("Bearer abc") == "abc" and bearer("Token abc") == ""


def test_every_response_is_counted_with_its_status_even_when_the_app_raises():
    counted: list[tuple[str, int]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/boom":
            raise RuntimeError("boom")
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    counter = CountResponses(app, lambda scope, status: counted.append((scope["path"], status)))

    async def send(message: Any) -> None:
        pass

    async def receive() -> Any:
        return {"type": "http.request", "body": b""}

    asyncio.run(counter({"type": "http", "path": "/ok"}, receive, send))
    with pytest.raises(RuntimeError):
        asyncio.run(counter({"type": "http", "path": "/boom"}, receive, send))
    asyncio.run(counter({"type": "lifespan", "path": ""}, receive, send))  # not HTTP: not counted
    assert counted == [("/ok", 201), ("/boom", 500)]
