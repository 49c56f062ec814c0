"""The ``sink`` committer: each batch as a JSONL file, for pipelines that train elsewhere (or for a look).

``<path>/batch-<batch_id>.jsonl``, one trace per line (its calls with token ids, reward, session,
``batch_id``), written to a temporary file, fsynced and renamed: a resend of the same batch id
replaces the file with the same bytes, so the outbox's retries are harmless.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reinforge.plugin import FieldError, Settings

from .committers import CommitterContext

__all__ = ["JsonlCommitter", "SinkSettings", "sink_committer"]


@dataclass
class SinkSettings(Settings):
    """``committer.args`` of ``kind: sink``."""

    path: str = "batches"  # the folder of the batch files (relative to online.yaml's folder)

    def check(self) -> None:
        if not self.path.strip():
            raise FieldError("path", "must not be empty")


class JsonlCommitter:
    """``<directory>/batch-<batch_id>.jsonl``, one trace per line, written to a temporary file then renamed."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def path_of(self, batch_id: str) -> Path:
        return self.directory / f"batch-{batch_id}.jsonl"

    def send(self, batch_id: str, rows: list[dict[str, Any]]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".batch-{batch_id}.", dir=self.directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, separators=(",", ":"), allow_nan=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path_of(batch_id))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def sink_committer(settings: SinkSettings, context: CommitterContext) -> JsonlCommitter:
    """The factory registered as ``sink``: the folder resolved against ``online.yaml``'s."""
    return JsonlCommitter(context.path(settings.path))
