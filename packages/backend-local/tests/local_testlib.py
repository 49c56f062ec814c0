"""A scripted trainer for the local committer's worker process, a fake ``/admin/adapter`` server, store helpers.

The worker imports this module by name (``local_testlib:scripted_trainer``): the spawned child
gets the parent's ``sys.path``, which pytest extended with this folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

SCRIPTED = "local_testlib:scripted_trainer"
SWAP_KEY = "swap-key"


class ScriptedTrainer:
    """The ``AdapterTrainer`` interface on JSON files: ``train`` appends its samples to ``trained.jsonl``.

    ``options["die_on"]``: the first time that batch id is trained the process exits (a crash mid-batch).
    """

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        self.run_dir = Path(options["run_dir"])
        self.run_dir.mkdir(parents=True, exist_ok=True)
        state = self.run_dir / "state.json"
        self.state: dict[str, Any] = json.loads(state.read_text()) if state.exists() else {"step": 0, "batches": []}
        with open(self.run_dir / "starts.txt", "a") as f:
            f.write(f"{os.getpid()}\n")
        (self.run_dir / "nice.txt").write_text(str(os.nice(0)))

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def extra(self) -> dict[str, Any]:
        return dict(self.state.get("extra") or {})

    def trained(self, batch_id: str) -> bool:
        return batch_id in self.state["batches"]

    def latest(self) -> Path | None:
        return self.run_dir / "checkpoints" / f"step-{self.step}" if self.step else None

    def train(self, batch_id: str, samples: list[Any], *, extra: dict[str, Any]) -> dict[str, Any]:
        if self.options.get("hang_on") == batch_id:  # a batch that trains for ever (until the worker is stopped)
            (self.run_dir / "hanging").write_text(str(os.getpid()))
            threading.Event().wait()
        marker = self.run_dir / f"died-{batch_id}"
        if self.options.get("die_on") == batch_id and not marker.exists():
            marker.touch()
            os._exit(3)
        step = self.step + 1
        folder = self.run_dir / "checkpoints" / f"step-{step}"
        folder.mkdir(parents=True)
        with open(self.run_dir / "trained.jsonl", "a") as f:
            rows = [dataclasses.asdict(s) for s in samples]  # the worker hands over backend-local Sample objects
            f.write(
                json.dumps(
                    {"batch_id": batch_id, "samples": rows, "types": sorted({type(s).__name__ for s in samples})}
                )
                + "\n"
            )
        self.state = {"step": step, "batches": [*self.state["batches"], batch_id], "extra": extra}
        (self.run_dir / "state.json").write_text(json.dumps(self.state))
        return {"checkpoint": str(folder), "trained": True, "step": step, "metrics": {}}


def scripted_trainer(options: dict[str, Any]) -> ScriptedTrainer:
    return ScriptedTrainer(options)


def trained(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "trained.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class FakeAdmin:
    """``POST /admin/adapter`` as ``reinforge serve`` answers it; ``fail`` > 0 answers 500 that many times."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.fail = 0
        self.version = 0
        self.lock = threading.Lock()

    def app(self) -> Starlette:
        async def swap(request: Request) -> Response:
            if request.headers.get("authorization") != f"Bearer {SWAP_KEY}":
                return JSONResponse({"error": {"message": "missing or incorrect admin key"}}, status_code=401)
            body = await request.json()
            with self.lock:
                if self.fail > 0:
                    self.fail -= 1
                    return JSONResponse({"error": {"message": "the swap failed"}}, status_code=500)
                self.paths.append(body["path"])
                self.version += 1
                return JSONResponse({"policy_version": self.version, "adapter": body["path"]})

        return Starlette(routes=[Route("/admin/adapter", swap, methods=["POST"])])


def reward(store: Any, trace_id: str, value: float) -> Any:
    """Feedback for one stored trace, as the gateway applies it (on the store's writer thread)."""
    from reinforge_online.feedback import FeedbackRequest, apply_feedback

    req = FeedbackRequest(trace_id, value, None)
    return store.submit(lambda db: apply_feedback(db, req, value, "first-wins")).result(10)
