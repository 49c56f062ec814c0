"""The serve-mode client against a small starlette fake of Trinity's proxy routes (``/feedback``, ``/commit``, ...).

The fake answers as Trinity 0.6.0's ``explorer/proxy/app.py`` does (status codes, error bodies) and records what
it received, so the tests check the requests the client sends and how it reads the answers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("httpx")
starlette = pytest.importorskip("starlette")

import httpx  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse, Response  # noqa: E402
from starlette.routing import Route  # noqa: E402

from reinforge.plugin import ConfigurationError  # noqa: E402
from reinforge_backend_trinity.serve_client import ServeClient, ServeError  # noqa: E402


def fake_trinity_serve() -> tuple[Starlette, dict[str, Any]]:
    state: dict[str, Any] = {"feedback": [], "commits": 0, "step": 0}

    async def feedback(request: Request) -> Response:
        body = await request.json()
        if body.get("msg_ids") is None or body.get("reward") is None:
            return JSONResponse({"error": "msg_ids and reward are required"}, status_code=400)
        state["feedback"].append(body)
        return JSONResponse({"status": "success"})

    async def commit(request: Request) -> Response:
        state["commits"] += 1
        state["step"] += 1
        return JSONResponse({"status": "success"})

    async def metrics(request: Request) -> Response:
        return JSONResponse({"rollout/reward/mean": 0.5, "explore_step_num": state["step"]})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    routes = [
        Route("/feedback", feedback, methods=["POST"]),
        Route("/commit", commit, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes), state


def client_for(app: Starlette, url: str = "http://10.1.2.3:8010") -> ServeClient:
    return ServeClient(url, transport=httpx.ASGITransport(app=app))


def test_feedback_then_commit_advances_the_step_and_metrics_report_it() -> None:
    app, state = fake_trinity_serve()

    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        async with client_for(app) as client:
            before = await client.metrics()
            await client.feedback(1, ["chatcmpl-a", "chatcmpl-b"], task_id="t7", run_id=2)
            await client.feedback(0.25, ["chatcmpl-c"])
            await client.commit()
            return before, await client.metrics()

    before, after = asyncio.run(go())
    assert state["feedback"] == [
        {"reward": 1.0, "msg_ids": ["chatcmpl-a", "chatcmpl-b"], "task_id": "t7", "run_id": 2},
        {"reward": 0.25, "msg_ids": ["chatcmpl-c"], "task_id": None, "run_id": 0},
    ]
    assert state["commits"] == 1
    assert (before["explore_step_num"], after["explore_step_num"]) == (0, 1)


def test_a_refused_request_raises_with_the_servers_message() -> None:
    app, state = fake_trinity_serve()
    client = client_for(app)

    async def go() -> None:
        try:
            await client._call("POST", "/feedback", {"msg_ids": ["x"]})  # what an old client without reward sent
        finally:
            await client.aclose()

    with pytest.raises(ServeError, match=r"Trinity serve /feedback: HTTP 400: msg_ids and reward are required") as info:
        asyncio.run(go())
    assert info.value.status == 400 and state["feedback"] == []


def test_bad_arguments_are_refused_before_sending() -> None:
    app, state = fake_trinity_serve()
    client = client_for(app)
    with pytest.raises(ValueError, match="msg_ids must be a non-empty list"):
        asyncio.run(client.feedback(1.0, "chatcmpl-a"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reward must be a number, got 'good'"):
        asyncio.run(client.feedback("good", ["chatcmpl-a"]))  # type: ignore[arg-type]
    asyncio.run(client.aclose())
    assert state["feedback"] == []


def test_the_url_comes_from_the_job_folder(tmp_path: Path) -> None:
    app, _ = fake_trinity_serve()
    with pytest.raises(ConfigurationError, match=r"explorer_server_url.txt does not exist: Trinity writes it"):
        ServeClient.from_job_dir(tmp_path)
    (tmp_path / "explorer_server_url.txt").write_text("http://10.1.2.3:8010\n")
    client = ServeClient.from_job_dir(tmp_path, transport=httpx.ASGITransport(app=app))
    assert client.url == "http://10.1.2.3:8010" and client.base_url == "http://10.1.2.3:8010/v1"
    assert asyncio.run(client.healthy())
    asyncio.run(client.aclose())


def test_a_server_that_does_not_answer_is_not_healthy() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client = ServeClient("http://127.0.0.1:9/v1", transport=httpx.MockTransport(refuse))
    assert client.url == "http://127.0.0.1:9"
    assert asyncio.run(client.healthy()) is False
    asyncio.run(client.aclose())
