"""A run folder's policy versions: its checkpoints, the batch each one trained, which were served, where training stands.

The online ``local`` committer makes one version per batch (``step-N``, a checkpoint) and online's
promotion gate decides which is served and which training goes on from. What that needs to survive
a restart is in the run folder, as JSON next to the checkpoints (no torch here: the gateway's side
reads and writes it too):

- ``checkpoints/step-N/state.json`` (written by the trainer with each checkpoint): ``step``,
  ``batch_id`` (the batch it trained), ``batches`` (every batch id in its weights), ``parent`` (the
  version it was trained from), ``extra`` (the caller's state: baselines) and ``metrics``.
- ``served.json`` (written by the committer before each swap): the versions the server was asked to
  serve. A served version is never pruned: online may serve it again (a rollback) or train from it.
- ``head.json`` (written by the trainer when training goes back to an older version): that version
  and the highest step written then. A trainer that starts resumes there, unless a newer checkpoint
  was written since (trained on top of it, so that one is where training stands).

``step-0`` is the version before any batch: the adapter the server started with, or a fresh LoRA
(the base model's outputs); it has no checkpoint. Step numbers are never reused: a checkpoint trained
after going back to ``step-2`` of five is ``step-6``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

__all__ = ["INITIAL", "RunVersions", "UnknownVersion", "step_name", "step_of", "steps", "write_json"]

INITIAL = "step-0"
_NAME = re.compile(r"step-(\d+)")


class UnknownVersion(LookupError):
    """A version name this run folder has no checkpoint for (never written, or pruned)."""


def step_name(step: int) -> str:
    """``step-N``: the version a checkpoint of step ``N`` is."""
    return f"step-{int(step)}"


def step_of(name: str) -> int | None:
    """The step of a version name (``step-12`` -> 12), None for anything else."""
    found = _NAME.fullmatch(name)
    return int(found.group(1)) if found else None


def steps(run_dir: Path) -> list[Path]:
    """The run's complete checkpoint folders ``step-N``, oldest first (a ``step-N.tmp`` a crash left is not one)."""
    found = [p for p in (Path(run_dir) / "checkpoints").glob("step-*") if step_of(p.name) is not None]
    return [p for p in sorted(found, key=lambda p: int(p.name[5:])) if (p / "state.json").exists()]


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` beside ``path`` and rename it into place: a reader sees the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


class RunVersions:
    """The versions of one run folder (see the module docstring); state files are read again on each call.

    A checkpoint's ``state.json`` is written once, so what was read of it is kept (a scan for a batch id
    reads each checkpoint once per process).
    """

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self._states: dict[str, dict[str, Any]] = {}

    # -- checkpoints ----------------------------------------------------------------------------

    def folder(self, name: str) -> Path:
        """The checkpoint folder of version ``name`` (``step-N``; it may not exist)."""
        if step_of(name) is None or name == INITIAL:
            raise UnknownVersion(f"{name!r} is not a checkpoint of a run folder (step-N, N >= 1)")
        return self.run_dir / "checkpoints" / name

    def existing(self, name: str) -> Path:
        """The checkpoint folder of version ``name``.

        :raises UnknownVersion: it has none (never written, or pruned).
        """
        folder = self.folder(name)
        if not (folder / "state.json").exists():
            raise UnknownVersion(
                f"{folder}: version {name} has no checkpoint in this run folder (pruned or never written)"
            )
        return folder

    def checkpoints(self) -> list[Path]:
        return steps(self.run_dir)

    def latest(self) -> Path | None:
        found = self.checkpoints()
        return found[-1] if found else None

    def state(self, folder: Path) -> dict[str, Any]:
        """A checkpoint's ``state.json`` (``{}`` when it is unreadable)."""
        known = self._states.get(folder.name)
        if known is None:
            try:
                known = json.loads((folder / "state.json").read_text())
            except (OSError, ValueError):
                return {}
            self._states[folder.name] = known
        return known

    def highest(self) -> int:
        """The highest step written in this folder (0 before the first checkpoint); the next one is this + 1."""
        recorded = self.head()
        top = recorded[1] if recorded is not None else 0
        for folder in self.checkpoints():
            top = max(top, int(folder.name[5:]))
        return top

    def recorded(self, batch_id: str) -> Path | None:
        """The checkpoint that trained ``batch_id``: the one whose ``batch_id`` it is, else (that one pruned) the
        oldest whose weights hold it; None when no checkpoint has it."""
        holder = None
        for folder in self.checkpoints():
            state = self.state(folder)
            if state.get("batch_id") == batch_id:
                return folder
            if holder is None and batch_id in (state.get("batches") or ()):
                holder = folder
        return holder

    def answer(self, folder: Path, *, trained: bool) -> dict[str, Any]:
        """What a trainer says about the checkpoint ``folder`` it made (or found): the same for a batch and its
        resend (``checkpoint``, ``trained``, ``step``, ``parent``, ``metrics``)."""
        state = self.state(folder)
        return {
            "checkpoint": str(folder),
            "trained": trained,
            "step": int(state.get("step", step_of(folder.name) or 0)),
            "parent": state.get("parent"),
            "metrics": dict(state.get("metrics") or {}),
        }

    # -- served versions and pruning ------------------------------------------------------------

    def served(self) -> list[str]:
        """The versions the server was asked to serve, oldest first."""
        data = _read_json(self.run_dir / "served.json")
        return [str(n) for n in (data or {}).get("served", [])]

    def mark_served(self, name: str) -> None:
        """Record that ``name`` is (about to be) served: it is never pruned from now on."""
        served = self.served()
        if name in served:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_json(self.run_dir / "served.json", {"served": [*served, name]})

    def prunable(self, keep: int, head: str) -> list[Path]:
        """Checkpoints to delete so that at most ``keep`` never-served ones remain (the oldest go first);
        served versions and ``head`` (what training stands on) are always kept."""
        served = set(self.served())
        unserved = [p for p in self.checkpoints() if p.name not in served]
        return [p for p in unserved[: max(0, len(unserved) - max(1, keep))] if p.name != head]

    # -- where training stands ------------------------------------------------------------------

    def head(self) -> tuple[str, int] | None:
        """``head.json``: the version training last went back to, and the highest step written then."""
        data = _read_json(self.run_dir / "head.json")
        if not isinstance(data, dict) or step_of(str(data.get("head"))) is None:
            return None
        return str(data["head"]), int(data.get("highest") or 0)

    def record_head(self, name: str, highest: int) -> None:
        """Training went back to ``name`` (a restarted trainer resumes there while nothing newer is written)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_json(self.run_dir / "head.json", {"head": name, "highest": int(highest)})

    def start(self) -> str:
        """The version a trainer starting on this folder resumes from: ``head.json``'s while no checkpoint
        was written after it (and it still exists), else the latest checkpoint, else ``step-0``."""
        latest = self.latest()
        recorded = self.head()
        if recorded is not None:
            name, highest = recorded
            newer = latest is not None and int(latest.name[5:]) > highest
            there = name == INITIAL or (self.run_dir / "checkpoints" / name / "state.json").exists()
            if not newer and there:
                return name
        return latest.name if latest is not None else INITIAL
