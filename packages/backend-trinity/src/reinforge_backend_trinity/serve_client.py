"""A client of Trinity-RFT's serve mode (``mode: serve``): rewards for recorded replies, commits, metrics.

In serve mode Trinity's explorer runs an HTTP proxy (``trinity/explorer/proxy/app.py``) in front of its engines:
``POST /v1/chat/completions`` records every reply under its response id; ``POST /feedback`` gives recorded replies
a reward; ``POST /commit`` pushes the rewarded ones into the experience buffer (the trainer's input) and advances
the explore step; ``GET /metrics`` and ``GET /health`` report. The explorer writes its URL to
``<checkpoint_job_dir>/explorer_server_url.txt`` (``<explorer name>_server_url.txt``). This is what reinforge's
online gateway needs to commit rewarded production traffic to Trinity; it needs ``httpx`` (Trinity's own
dependency, so the ``trinity`` extra has it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reinforge.plugin import ConfigurationError, require

__all__ = ["SERVER_URL_FILE", "ServeClient", "ServeError"]

SERVER_URL_FILE = "explorer_server_url.txt"  # Trinity's StateManager: <explorer name>_server_url.txt, name "explorer"


class ServeError(RuntimeError):
    """Trinity's serve-mode server refused a request (its status and message are kept)."""

    def __init__(self, route: str, status: int, message: str) -> None:
        super().__init__(f"Trinity serve {route}: HTTP {status}: {message}")
        self.route, self.status, self.message = route, status, message


class ServeClient:
    """Async client of one Trinity serve-mode explorer; ``base_url`` is what an OpenAI client points at."""

    def __init__(self, url: str, *, timeout: float = 60.0, transport: Any = None) -> None:
        httpx = require("httpx", "trinity", package="reinforge-backend-trinity")
        self.url = url.rstrip("/").removesuffix("/v1")
        self._client = httpx.AsyncClient(base_url=self.url, timeout=timeout, transport=transport)

    @classmethod
    def from_job_dir(cls, job_dir: str | Path, *, explorer_name: str = "explorer", **options: Any) -> ServeClient:
        """The client of the explorer whose URL Trinity wrote into the job folder (``config.get_checkpoint_job_dir()``)."""
        name = SERVER_URL_FILE if explorer_name == "explorer" else f"{explorer_name}_server_url.txt"
        path = Path(job_dir) / name
        if not path.is_file():
            raise ConfigurationError(
                f"{path} does not exist: Trinity writes it when a serve-mode explorer starts (mode: serve); "
                "is it running, and is this its checkpoint job folder?"
            )
        url = path.read_text(encoding="utf-8").strip()
        if not url:
            raise ConfigurationError(f"{path} is empty: the explorer has not written its URL yet")
        return cls(url, **options)

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible root (``.../v1``) whose replies Trinity records."""
        return f"{self.url}/v1"

    async def _call(self, method: str, route: str, body: dict[str, Any] | None = None) -> Any:
        response = await self._client.request(method, route, json=body)
        if response.status_code >= 400:
            try:
                message = str(response.json().get("error", response.text))
            except ValueError:
                message = response.text
            raise ServeError(route, response.status_code, message)
        return response.json() if response.content else None

    async def feedback(self, reward: float, msg_ids: list[str], *, task_id: str | None = None, run_id: int = 0) -> None:
        """Reward the recorded replies ``msg_ids`` (the chat completions' response ids) of one task's run."""
        if isinstance(msg_ids, str) or not msg_ids:
            raise ValueError("feedback: msg_ids must be a non-empty list of response ids")
        if isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise ValueError(f"feedback: reward must be a number, got {reward!r}")
        body = {"reward": float(reward), "msg_ids": list(msg_ids), "task_id": task_id, "run_id": run_id}
        await self._call("POST", "/feedback", body)

    async def commit(self) -> None:
        """Push the rewarded replies into Trinity's experience buffer (the explore step advances)."""
        await self._call("POST", "/commit")

    async def metrics(self) -> dict[str, Any]:
        """The explorer's metrics (``explore_step_num`` among them)."""
        data = await self._call("GET", "/metrics")
        return dict(data or {})

    async def healthy(self) -> bool:
        """True when the server answers ``/health`` with 200."""
        try:
            response = await self._client.get("/health")
        except Exception:
            return False
        return response.status_code == 200

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> ServeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
