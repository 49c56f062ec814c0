"""Where step metrics go: ``metrics.jsonl`` (what ``reinforge report`` reads) and TensorBoard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reinforge.plugin import metric_names as mn


class MetricsLog:
    def __init__(self, run_dir: Path, *, tensorboard: bool = True) -> None:
        self.path = run_dir / "metrics.jsonl"
        self._fh = open(self.path, "a")  # noqa: SIM115 - kept open for the run
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is an optional extra
                SummaryWriter = None
            if SummaryWriter is not None:
                self._tb = SummaryWriter(str(run_dir / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record, default=float) + "\n")
        self._fh.flush()
        if self._tb is not None:
            prefix = "eval/" if record.get(mn.KIND) == mn.KIND_EVAL else ""
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in mn.RECORD_FIELDS:
                    self._tb.add_scalar(prefix + key, value, record[mn.STEP])

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()
