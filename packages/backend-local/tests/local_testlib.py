"""A scripted trainer for the local committer's worker process, a fake ``/admin/adapter`` server, store helpers.

The worker imports this module by name (``local_testlib:scripted_trainer``): the spawned child
gets the parent's ``sys.path``, which pytest extended with this folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reinforge_backend_local.model.run_versions import INITIAL, RunVersions, step_name, write_json

SCRIPTED = "local_testlib:scripted_trainer"
SWAP_KEY = "swap-key"


class ScriptedTrainer:
    """The ``AdapterTrainer`` interface without a model: checkpoints are folders with only their ``state.json``.

    The versions' bookkeeping is the real one (``run_versions``: step numbers, the batch each checkpoint
    trained, ``served.json``, ``head.json``, pruning); ``train`` also appends its samples to ``trained.jsonl``.
    ``options["die_on"]``: the first time that batch id (``*``: any) is trained the process exits (a crash mid-batch);
    ``options["hang_on"]``: that batch trains for ever (until the worker is stopped).
    """

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        self.run_dir = Path(options["run_dir"])
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.versions = RunVersions(self.run_dir)
        self.keep = int(options.get("keep_checkpoints") or 3)
        self.head = self.versions.start()
        self.state: dict[str, Any] = self._state_of(self.head)
        with open(self.run_dir / "starts.txt", "a") as f:
            f.write(f"{os.getpid()}\n")
        (self.run_dir / "nice.txt").write_text(str(os.nice(0)))

    def _state_of(self, name: str) -> dict[str, Any]:
        if name == INITIAL:
            return {"step": 0, "batches": [], "extra": {}}
        return dict(self.versions.state(self.versions.existing(name)))

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def extra(self) -> dict[str, Any]:
        return dict(self.state.get("extra") or {})

    def latest(self) -> Path | None:
        return self.versions.latest()

    def recorded(self, batch_id: str) -> Path | None:
        return self.versions.recorded(batch_id)

    def answer(self, folder: Path, *, trained: bool) -> dict[str, Any]:
        return self.versions.answer(folder, trained=trained)

    def train(self, batch_id: str, samples: list[Any], *, extra: dict[str, Any]) -> dict[str, Any]:
        if self.options.get("hang_on") == batch_id:
            (self.run_dir / "hanging").write_text(str(os.getpid()))
            threading.Event().wait()
        marker = self.run_dir / f"died-{batch_id}"
        if self.options.get("die_on") in (batch_id, "*") and not marker.exists():
            marker.touch()
            os._exit(3)
        found = self.recorded(batch_id)
        if found is not None:
            return self.answer(found, trained=False)
        step = self.versions.highest() + 1
        folder = self.versions.folder(step_name(step))
        folder.mkdir(parents=True)
        with open(self.run_dir / "trained.jsonl", "a") as f:
            rows = [dataclasses.asdict(s) for s in samples]  # the worker hands over backend-local Sample objects
            f.write(
                json.dumps(
                    {
                        "batch_id": batch_id,
                        "step": step,
                        "parent": self.head,
                        "samples": rows,
                        "types": sorted({type(s).__name__ for s in samples}),
                    }
                )
                + "\n"
            )
        self.state = {
            "step": step,
            "batch_id": batch_id,
            "parent": self.head,
            "batches": [*self.state["batches"], batch_id],
            "extra": extra,
            "metrics": {"train/samples": float(len(samples))},
        }
        write_json(folder / "state.json", self.state)
        self.head = folder.name
        for old in self.versions.prunable(self.keep, self.head):
            shutil.rmtree(old)
        return self.answer(folder, trained=True)

    def restore(self, name: str) -> bool:
        if name == self.head:
            return False
        self.state = self._state_of(name)
        self.head = name
        self.versions.record_head(name, self.versions.highest())
        with open(self.run_dir / "restored.txt", "a") as f:
            f.write(f"{name}\n")
        return True


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
