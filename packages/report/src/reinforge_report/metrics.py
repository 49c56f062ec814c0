"""Step metrics of a run: parsed from records (live, or the lines of ``metrics.jsonl``) into a :class:`RunMetrics`.

Parsing a record and reading the file are separate, so the live sentinels build the same
:class:`RunMetrics` in memory, one ``on_step_end`` record at a time, that the report reads from disk.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reinforge.plugin import ConfigError
from reinforge.plugin import metric_names as mn

__all__ = ["METRICS_FILE", "RunMetrics", "load_metrics", "metrics_file", "metrics_from_records", "read_records"]

METRICS_FILE = "metrics.jsonl"


@dataclass
class RunMetrics:
    """The metrics of one run: per kind, per step, the numeric values of the last record for it."""

    path: Path  # the metrics file (live: where it would be); its parent is the run folder
    train: dict[int, dict[str, float]] = field(default_factory=dict)
    eval: dict[int, dict[str, float]] = field(default_factory=dict)
    first_time: float | None = None
    last_time: float | None = None
    skipped: int = 0  # records without a usable step

    def add(self, record: dict[str, Any]) -> bool:
        """Take one record (``{"kind": ..., "step": ..., metric: value, ...}``); False when it is not used.

        A record without ``kind`` counts as ``train``; other kinds (checkpoints, notes...) are ignored;
        a record without a numeric ``step`` is counted in :attr:`skipped`; values that are not finite
        numbers are dropped; a later record for a step replaces the earlier one (a resumed run).
        """
        kind = record.get(mn.KIND, mn.KIND_TRAIN)
        if kind not in (mn.KIND_TRAIN, mn.KIND_EVAL):
            return False
        step = record.get(mn.STEP)
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step):
            self.skipped += 1
            return False
        stamp = _number(record.get(mn.TIME))
        if stamp is not None:
            self.first_time = stamp if self.first_time is None else min(self.first_time, stamp)
            self.last_time = stamp if self.last_time is None else max(self.last_time, stamp)
        row = {k: _number(v) for k, v in record.items() if k not in mn.RECORD_FIELDS}
        rows = self.train if kind == mn.KIND_TRAIN else self.eval
        rows[int(step)] = {k: v for k, v in row.items() if v is not None}
        return True

    def series(self, kind: str, key: str) -> tuple[list[int], list[float]]:
        """Steps and values of one metric, in step order; steps where it is missing or not finite are left out."""
        rows = self.train if kind == mn.KIND_TRAIN else self.eval
        steps, values = [], []
        for step in sorted(rows):
            value = rows[step].get(key)
            if value is not None:
                steps.append(step)
                values.append(value)
        return steps, values

    def keys(self, kind: str) -> list[str]:
        rows = self.train if kind == mn.KIND_TRAIN else self.eval
        seen: dict[str, None] = {}
        for step in sorted(rows):
            seen.update(dict.fromkeys(rows[step]))
        return list(seen)

    def dimensions(self) -> list[str]:
        """Reward dimensions (``reward/<dim>/mean``) seen in train or eval records, in first-seen order.

        A judge's own metrics are left out (see :meth:`judge_metrics`): they are not rewards.
        """
        found = self._named_dimensions()
        return [d for d in found if _parent_dimension(d, found) is None]

    def judge_metrics(self) -> list[str]:
        """``<judge>/<metric>`` for each judge metric, in first-seen order: ``concise/length`` for ``length_penalty``'s.

        Core logs a judge's metrics beside its reward, as ``reward/<judge>/<metric>/mean`` next to
        ``reward/<judge>/mean``; they hold what the judge measured (a length in characters), not a
        reward, so they are told apart by that neighbour. A name under no logged dimension
        (``reward/judge/d1/mean`` alone) is a dimension whose name holds a ``/``.
        """
        found = self._named_dimensions()
        return [d for d in found if _parent_dimension(d, found) is not None]

    def is_reward(self, key: str) -> bool:
        """True for ``reward/mean`` and the statistics of a reward dimension; False for a judge's metrics."""
        if not key.startswith(mn.REWARD_PREFIX):
            return False
        rest = key[len(mn.REWARD_PREFIX) :]
        found = self._named_dimensions()
        return not any(rest.startswith(f"{m}/") for m in found if _parent_dimension(m, found) is not None)

    def _named_dimensions(self) -> list[str]:
        """Every ``<name>`` of a ``reward/<name>/mean`` in train or eval records, in first-seen order."""
        dims: dict[str, None] = {}
        for kind in (mn.KIND_TRAIN, mn.KIND_EVAL):
            for key in self.keys(kind):
                dim = mn.dimension_of(key)
                if dim is not None:
                    dims[dim] = None
        return list(dims)

    @property
    def steps(self) -> list[int]:
        return sorted(set(self.train) | set(self.eval))


def _parent_dimension(name: str, names: list[str]) -> str | None:
    """The logged dimension ``name`` sits under (``concise`` for ``concise/length``), or None."""
    parents = [p for p in names if name.startswith(f"{p}/")]
    return max(parents, key=len) if parents else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def metrics_from_records(records: Iterable[dict[str, Any]], path: str | Path = METRICS_FILE) -> RunMetrics:
    """A :class:`RunMetrics` from records already in memory (``path``: where they would be written)."""
    data = RunMetrics(path=Path(path))
    for record in records:
        data.add(record)
    return data


def metrics_file(run_dir: str | Path) -> Path:
    """``RUN_DIR/metrics.jsonl`` (or a metrics file given directly), checked to exist.

    Raises :class:`~reinforge.errors.ConfigError` naming the path when the folder or file is missing.
    """
    path = Path(run_dir)
    if not path.exists():
        raise ConfigError(f"run folder {str(path)!r} does not exist")
    if path.is_dir():
        path = path / METRICS_FILE
        if not path.is_file():
            raise ConfigError(f"{str(path)!r} not found: is {str(path.parent)!r} a reinforge run folder?")
    return path


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The JSON objects of a metrics file, one per non-blank line.

    Raises :class:`~reinforge.errors.ConfigError` naming the file and line number when a line is
    not a JSON object.
    """
    path = Path(path)
    records = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise ConfigError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            records.append(obj)
    return records


def load_metrics(run_dir: str | Path) -> RunMetrics:
    """Read ``RUN_DIR/metrics.jsonl`` (or a metrics file given directly).

    Raises :class:`~reinforge.errors.ConfigError` naming the path when the folder or file is missing,
    naming the file and line number when a line is not a JSON object, and when no line has a step.
    """
    path = metrics_file(run_dir)
    data = metrics_from_records(read_records(path), path)
    if not data.train and not data.eval:
        raise ConfigError(f"{path}: no train or eval lines with a step yet")
    return data
