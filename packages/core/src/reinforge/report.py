"""``reinforge report RUN_DIR``: plots of a training run, with reward-hacking warnings marked.

Input is what a training backend writes into its run folder:

- ``metrics.jsonl``: one JSON object per line. ``{"kind": "train", "step": N, ...}`` lines carry
  ``reward/mean``, ``reward/std``, ``reward/<dimension>/mean``, ``response_length/mean``,
  ``entropy``, ``kl``, ``clip_frac``, ``grad_norm``, ``loss``, ``tokens_per_s``, ``truncated_rate``...;
  ``{"kind": "eval", "step": N, ...}`` lines carry ``accuracy/greedy``, ``accuracy/sampled``,
  ``reward/mean``, ``reward/<dimension>/mean``, ``response_length/mean`` (step 0 = the base model).
  Any key may be missing on any line; unknown keys and kinds are ignored; a line without ``kind``
  counts as ``train``; when a step is logged twice (a resumed run) the later line wins.
- ``config.json`` (optional): the resolved run config, for the header.

Output (default ``RUN_DIR/report/``): ``report.png`` (the dashboard), ``report.html`` (self-contained:
the PNG as a ``data:`` URI, a table of first/final/best metrics, the warnings, no external assets) and
``report.json`` (the warnings and final metrics as data).

Warnings (thresholds in :class:`Thresholds`, all configurable, ``--threshold KEY=VALUE`` on the CLI).
Trends are least-squares lines fitted over a window; a trend's *change* is its slope times the
window's length in steps, so it is in the metric's own units. Reward thresholds are in reward
units: reinforge normalizes judge weights to sum to 1, so rewards usually lie in [0, 1].

1. ``train_val_divergence`` -- the training reward rises while validation falls (the "anti-hacking
   sentinel" of the monitoring playbook). For every window of ``divergence_eval_points``
   consecutive evaluations, it holds when training ``reward/mean`` (fitted over the training steps
   inside the window) rises by at least ``divergence_min_train_rise`` while a validation metric
   (``reward/mean``, ``accuracy/greedy`` or ``accuracy/sampled`` of the eval lines) falls by at least
   ``divergence_min_val_drop``.
2. ``length_growth`` -- response length rises (nearly) monotonically while reward is flat: over a
   window of ``length_window`` training points, the fitted ``response_length/mean`` grows by at
   least ``length_min_growth`` (relative), it is nearly monotonic (in at least
   ``length_monotonic_frac`` of the pairs of steps of the window, the later step has the longer
   responses: 1 = strictly increasing, 0.5 = no trend; robust to per-step noise), and the training reward or a validation reward/accuracy (fitted over the
   evaluations from the last one at or before the window to the first one at or after it) rises by
   less than ``reward_flat_tol`` (flat or falling).
3. ``entropy_collapse`` -- ``entropy`` falls below ``entropy_collapse_frac`` of its initial value
   (mean of the first ``entropy_baseline_points`` points) or below ``entropy_floor``, for at least
   ``min_consecutive`` consecutive points.

Windows are taken at several scales (the size above, twice it, four times it... and the whole run,
the larger ones slid by a fifth of their size), so both a sharp change and a slow drift over a long run are seen.
A larger window is only tried where no smaller one held. Overlapping windows that hold are merged
into one warning per span of steps (length windows less than half a window apart, too).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import html
import json
import math
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = [
    "HackingWarning",
    "ReportResult",
    "RunMetrics",
    "Thresholds",
    "add_arguments",
    "detect_warnings",
    "load_metrics",
    "run",
    "write_report",
]

DIVERGENCE = "train_val_divergence"
LENGTH = "length_growth"
ENTROPY = "entropy_collapse"

WARNING_TITLES = {
    DIVERGENCE: "Training reward up, validation down",
    LENGTH: "Response length growing, reward flat",
    ENTROPY: "Entropy collapse",
}
WARNING_COLORS = {DIVERGENCE: "#d62728", LENGTH: "#e08214", ENTROPY: "#9467bd"}

# Validation metrics used as the anti-hacking sentinel, in order of preference.
SENTINELS = ("reward/mean", "accuracy/greedy", "accuracy/sampled")
_MIN_TRAIN_POINTS = 3  # training points needed inside a window to fit a trend
_MIN_LENGTH_POINTS = 5  # fewest training points for the length check
MAX_DIMENSION_PANELS = 6  # more reward dimensions than this share one panel


@dataclass(frozen=True)
class Thresholds:
    """Thresholds of the reward-hacking checks (see the module docstring for what each does)."""

    # (1) training reward rising while validation falls
    divergence_eval_points: int = 3  # evaluations per window (all of them when there are fewer, at least 2)
    divergence_min_train_rise: float = 0.05  # training reward rises by at least this (reward units)...
    divergence_min_val_drop: float = 0.05  # ...while validation reward/accuracy falls by at least this
    # (2) response length rising while reward is flat
    length_window: int = 10  # training points per window (all of them when there are fewer, at least 5)
    length_min_growth: float = 0.2  # fitted length grows by at least 20 % over the window...
    length_monotonic_frac: float = 0.75  # ...longer later than earlier in at least 75 % of pairs of steps...
    reward_flat_tol: float = 0.05  # ...while reward rises by less than this (reward units)
    # (3) entropy collapse
    entropy_collapse_frac: float = 0.15  # entropy below 15 % of its initial value...
    entropy_floor: float = 0.02  # ...or below this absolute value (nats per token)
    entropy_baseline_points: int = 3  # initial value = mean of the first N points
    min_consecutive: int = 2  # the collapse holds on at least N consecutive points

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ConfigError(f"threshold {f.name}: must be a finite number, got {value!r}")
            if value < 0:
                raise ConfigError(f"threshold {f.name}: must be >= 0, got {value!r}")
            if f.type in ("int", int) and value != int(value):
                raise ConfigError(f"threshold {f.name}: must be a whole number, got {value!r}")
        if self.divergence_eval_points < 2:
            raise ConfigError("threshold divergence_eval_points: must be >= 2")
        if self.length_window < 2:
            raise ConfigError("threshold length_window: must be >= 2")
        if self.entropy_baseline_points < 1 or self.min_consecutive < 1:
            raise ConfigError("thresholds entropy_baseline_points and min_consecutive: must be >= 1")

    @classmethod
    def parse(cls, items: list[str] | None) -> Thresholds:
        """Thresholds from ``KEY=VALUE`` strings (the CLI's ``--threshold``); unknown keys are errors."""
        names = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for item in items or []:
            key, sep, raw = item.partition("=")
            key = key.strip().replace("-", "_")
            if not sep or key not in names:
                raise ConfigError(f"--threshold {item!r}: expected KEY=VALUE with KEY one of {', '.join(names)}")
            try:
                number = float(raw)
            except ValueError:
                raise ConfigError(f"--threshold {item!r}: {raw!r} is not a number") from None
            values[key] = int(number) if names[key].type in ("int", int) and number == int(number) else number
        return cls(**values)


@dataclass
class HackingWarning:
    """One reward-hacking signal, holding on the steps ``start_step`` to ``end_step``."""

    kind: str  # train_val_divergence | length_growth | entropy_collapse
    start_step: int
    end_step: int
    message: str
    metrics: list[str] = field(default_factory=list)  # the metrics involved, e.g. ["train reward/mean", ...]
    values: dict[str, float] = field(default_factory=dict)  # the numbers behind the message

    @property
    def title(self) -> str:
        return WARNING_TITLES.get(self.kind, self.kind)

    @property
    def steps(self) -> str:
        return (
            f"step {self.start_step}"
            if self.start_step == self.end_step
            else f"steps {self.start_step}-{self.end_step}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "title": self.title,
            "start_step": self.start_step,
            "end_step": self.end_step,
            "message": self.message,
            "metrics": list(self.metrics),
            "values": dict(self.values),
        }

    def __str__(self) -> str:
        return f"{self.title} ({self.steps}): {self.message}"


@dataclass
class ReportResult:
    """What :func:`write_report` wrote, and what it found."""

    out_dir: Path
    png: Path  # the dashboard
    html: Path
    json: Path
    warnings: list[HackingWarning]
    notes: list[str] = field(default_factory=list)  # checks skipped for lack of data, unreadable config...

    @property
    def pngs(self) -> list[Path]:
        return [self.png]

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "png": str(self.png),
            "html": str(self.html),
            "json": str(self.json),
            "warnings": [w.to_dict() for w in self.warnings],
            "notes": list(self.notes),
        }


# --------------------------------------------------------------------------- reading


@dataclass
class RunMetrics:
    """The metrics of one run: per kind, per step, the numeric values of the last line logged for it."""

    path: Path
    train: dict[int, dict[str, float]] = field(default_factory=dict)
    eval: dict[int, dict[str, float]] = field(default_factory=dict)
    first_time: float | None = None
    last_time: float | None = None
    skipped: int = 0  # lines without a usable step

    def series(self, kind: str, key: str) -> tuple[list[int], list[float]]:
        """Steps and values of one metric, in step order; steps where it is missing or not finite are left out."""
        rows = self.train if kind == "train" else self.eval
        steps, values = [], []
        for step in sorted(rows):
            value = rows[step].get(key)
            if value is not None:
                steps.append(step)
                values.append(value)
        return steps, values

    def keys(self, kind: str) -> list[str]:
        rows = self.train if kind == "train" else self.eval
        seen: dict[str, None] = {}
        for step in sorted(rows):
            seen.update(dict.fromkeys(rows[step]))
        return list(seen)

    def dimensions(self) -> list[str]:
        """Reward dimensions (``reward/<dim>/mean``) seen in train or eval lines, in first-seen order."""
        dims: dict[str, None] = {}
        for kind in ("train", "eval"):
            for key in self.keys(kind):
                if key.startswith("reward/") and key.endswith("/mean") and key != "reward/mean":
                    dims[key[len("reward/") : -len("/mean")]] = None
        return list(dims)

    @property
    def steps(self) -> list[int]:
        return sorted(set(self.train) | set(self.eval))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def load_metrics(run_dir: str | Path) -> RunMetrics:
    """Read ``RUN_DIR/metrics.jsonl`` (or a metrics file given directly).

    Raises :class:`~reinforge.errors.ConfigError` naming the path when the folder or file is missing,
    and naming the file and line number when a line is not a JSON object.
    """
    path = Path(run_dir)
    if not path.exists():
        raise ConfigError(f"run folder {str(path)!r} does not exist")
    if path.is_dir():
        path = path / "metrics.jsonl"
        if not path.is_file():
            raise ConfigError(f"{str(path)!r} not found: is {str(path.parent)!r} a reinforge run folder?")
    data = RunMetrics(path=path)
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
            kind = obj.get("kind", "train")
            if kind not in ("train", "eval"):
                continue  # other kinds (checkpoints, notes...) are not plotted
            step = obj.get("step")
            if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step):
                data.skipped += 1
                continue
            stamp = _number(obj.get("time"))
            if stamp is not None:
                data.first_time = stamp if data.first_time is None else min(data.first_time, stamp)
                data.last_time = stamp if data.last_time is None else max(data.last_time, stamp)
            row = {k: v for k, v in ((k, _number(v)) for k, v in obj.items() if k not in ("kind", "step", "time"))}
            rows = data.train if kind == "train" else data.eval
            rows[int(step)] = {k: v for k, v in row.items() if v is not None}  # a later line for a step wins
    if not data.train and not data.eval:
        raise ConfigError(f"{path}: no train or eval lines with a step yet")
    return data


def _load_config(run_dir: Path, notes: list[str]) -> dict[str, Any]:
    path = run_dir / "config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        notes.append(f"{path} could not be read ({exc}); the header shows no config")
        return {}
    if not isinstance(config, dict):
        notes.append(f"{path} is not a JSON object; the header shows no config")
        return {}
    return config


def _header(config: dict[str, Any]) -> dict[str, str]:
    """project / experiment / model / algorithm from a resolved run config (tolerant of its shape)."""

    def pick(obj: Any, *names: str) -> Any:
        if not isinstance(obj, dict):
            return None
        for name in names:
            if obj.get(name) not in (None, ""):
                return obj[name]
        return None

    out: dict[str, str] = {}
    if (v := pick(config, "project_name", "project")) is not None:
        out["project"] = str(v)
    if (v := pick(config, "experiment_name", "experiment", "name")) is not None:
        out["experiment"] = str(v)
    model = config.get("model")
    if (v := pick(model, "model_path", "name", "path") if isinstance(model, dict) else model) is not None:
        out["model"] = str(v)
    algo = config.get("algorithm")
    if isinstance(algo, dict):
        name = pick(algo, "algorithm_type", "name", "type")
        extras = []
        for key, label in (("learning_rate", "lr"), ("group_size", "group"), ("batch_size", "batch")):
            if algo.get(key) is not None:
                extras.append(
                    f"{label}={algo[key]:g}" if isinstance(algo[key], (int, float)) else f"{label}={algo[key]}"
                )
        if name is not None or extras:
            out["algorithm"] = " ".join([str(name or "?"), *(["(" + ", ".join(extras) + ")"] if extras else [])])
    elif algo is not None:
        out["algorithm"] = str(algo)
    return out


# --------------------------------------------------------------------------- detection


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least-squares line ``y = a + b x``: returns (a, b), or None with fewer than 2 distinct x."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def _change(steps: list[int], values: list[float], lo: int, hi: int, min_points: int = 2) -> float | None:
    """Fitted change of a series over the steps ``lo..hi`` (slope x span), None with too few points."""
    pts = [(s, v) for s, v in zip(steps, values) if lo <= s <= hi]
    if len(pts) < min_points:
        return None
    fit = _fit([float(s) for s, _ in pts], [v for _, v in pts])
    return None if fit is None else fit[1] * (hi - lo)


def _windows(n: int, size: int) -> list[list[tuple[int, int]]]:
    """Index windows ``(i, j)`` (inclusive) over ``n`` points, grouped by scale, smallest first.

    Sizes ``size, 2 size, 4 size, ...`` and ``n`` itself, slid by one point (the smallest) or by a
    fifth of their size (the others), so a slow trend over a long run is seen as well as a sharp one over a few steps.
    """
    if n < 2:
        return []
    sizes, w = [], max(2, min(size, n))
    while w < n:
        sizes.append(w)
        w *= 2
    sizes.append(n)
    out = []
    for k, w in enumerate(sizes):
        stride = 1 if k == 0 else max(1, w // 5)
        starts = list(range(0, n - w + 1, stride))
        if starts[-1] != n - w:
            starts.append(n - w)
        out.append([(i, i + w - 1) for i in starts])
    return out


def _scan(steps: list[int], size: int, holds: Any) -> list[tuple[int, int]]:
    """Step spans ``(lo, hi)`` of the windows where ``holds(lo, hi)``, smallest scale first.

    A larger window is only tried where no smaller one held (it is there for slow drifts, and would
    otherwise blur a sharp span into the whole run).
    """
    flagged: list[tuple[int, int]] = []
    for level in _windows(len(steps), size):
        found = []
        for i, j in level:
            lo, hi = steps[i], steps[j]
            if any(lo <= b and a <= hi for a, b in flagged):
                continue
            if holds(lo, hi):
                found.append((lo, hi))
        flagged += found
    return flagged


def _rising_pairs(ys: list[float], bins: int = 40) -> float:
    """Fraction of (earlier, later) pairs where the later value is larger (long series: averaged into bins first)."""
    if len(ys) > bins:
        edges = [round(k * len(ys) / bins) for k in range(bins + 1)]
        ys = [sum(ys[a:b]) / (b - a) for a, b in zip(edges, edges[1:]) if b > a]
    pairs = [(a, b) for i, a in enumerate(ys) for b in ys[i + 1 :]]
    return sum(1 for a, b in pairs if b > a) / max(1, len(pairs))


def _merge(spans: list[tuple[int, int]], gap: float = 0) -> list[tuple[int, int]]:
    """Union of spans; spans less than ``gap`` steps apart are joined."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo - out[-1][1] <= gap:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _fmt(x: float) -> str:
    return f"{x:+.3g}"


def _divergence(data: RunMetrics, th: Thresholds, notes: list[str]) -> list[HackingWarning]:
    t_steps, t_vals = data.series("train", "reward/mean")
    sentinels = {m: data.series("eval", m) for m in SENTINELS}
    sentinels = {m: s for m, s in sentinels.items() if len(s[0]) >= 2}
    if not t_steps:
        notes.append("no training reward/mean: the train/validation divergence check was skipped")
        return []
    if not sentinels:
        notes.append("fewer than 2 evaluations: the train/validation divergence check was skipped")
        return []
    flagged: list[tuple[int, int]] = []
    for steps, values in sentinels.values():

        def holds(lo: int, hi: int, steps: list[int] = steps, values: list[float] = values) -> bool:
            val = _change(steps, values, lo, hi)
            train = _change(t_steps, t_vals, lo, hi, _MIN_TRAIN_POINTS)
            if val is None or train is None:
                return False
            return train >= th.divergence_min_train_rise and val <= -th.divergence_min_val_drop

        flagged += _scan(steps, int(th.divergence_eval_points), holds)
    out = []
    for lo, hi in _merge(flagged):
        train = _change(t_steps, t_vals, lo, hi, _MIN_TRAIN_POINTS) or 0.0
        values = {"train reward/mean change": train}
        parts, metrics = [], ["train reward/mean"]
        for m, (steps, vals) in sentinels.items():
            val = _change(steps, vals, lo, hi)
            if val is not None and val <= -th.divergence_min_val_drop:
                values[f"validation {m} change"] = val
                metrics.append(f"validation {m}")
                parts.append(f"validation {m} {_fmt(val)}")
        message = f"training reward/mean {_fmt(train)} while {', '.join(parts)} (least-squares trend over the span)"
        out.append(HackingWarning(DIVERGENCE, lo, hi, message, metrics, values))
    return out


def _length_growth(data: RunMetrics, th: Thresholds, notes: list[str]) -> list[HackingWarning]:
    l_steps, l_vals = data.series("train", "response_length/mean")
    t_steps, t_vals = data.series("train", "reward/mean")
    sentinels = {m: data.series("eval", m) for m in SENTINELS}
    if len(l_steps) < _MIN_LENGTH_POINTS:
        notes.append(
            f"fewer than {_MIN_LENGTH_POINTS} training points with response_length/mean: the length check was skipped"
        )
        return []
    if not t_steps and not any(len(s) >= 2 for s, _ in sentinels.values()):
        notes.append("no reward to compare response length with: the length check was skipped")
        return []

    def window(lo: int, hi: int) -> dict[str, float] | None:
        """The numbers of one window, or None when the length rule does not hold on it."""
        idx = [i for i, s in enumerate(l_steps) if lo <= s <= hi]
        xs, ys = [float(l_steps[i]) for i in idx], [l_vals[i] for i in idx]
        fit = _fit(xs, ys)
        if fit is None:
            return None
        start, end = fit[0] + fit[1] * lo, fit[0] + fit[1] * hi
        if start <= 0:
            return None
        growth = (end - start) / start
        ups = _rising_pairs(ys)
        if growth < th.length_min_growth or ups < th.length_monotonic_frac:
            return None
        flat: dict[str, float] = {}
        train = _change(t_steps, t_vals, lo, hi, _MIN_TRAIN_POINTS)
        if train is not None and train < th.reward_flat_tol:
            flat["train reward/mean"] = train
        for m, (steps, vals) in sentinels.items():
            # evaluations are sparse: fit over the evaluations that bracket the window
            a = max((s for s in steps if s <= lo), default=lo)
            b = min((s for s in steps if s >= hi), default=hi)
            val = _change(steps, vals, a, b)
            if val is not None and val < th.reward_flat_tol:
                flat[f"validation {m}"] = val
        if not flat:
            return None
        return {"growth": growth, "rising_frac": ups, "start": start, "end": end, **flat}

    flagged = _scan(l_steps, int(th.length_window), lambda lo, hi: window(lo, hi) is not None)
    size = min(int(th.length_window), len(l_steps))
    gap = (l_steps[-1] - l_steps[0]) / max(1, len(l_steps) - 1) * size / 2  # half the smallest window, in steps
    out = []
    for lo, hi in _merge(flagged, gap):
        nums = window(lo, hi)
        if nums is None:  # the merged span as a whole may be less clear-cut than its windows
            nums = max((window(a, b) for a, b in flagged if lo <= a and b <= hi), key=lambda d: d["growth"])
        flat = {k: v for k, v in nums.items() if k not in ("growth", "rising_frac", "start", "end")}
        message = (
            f"response length {nums['growth'] * 100:+.0f}% ({nums['start']:.0f} -> {nums['end']:.0f}, "
            f"later step longer in {nums['rising_frac'] * 100:.0f}% of step pairs) while "
            + ", ".join(f"{k} changed {_fmt(v)}" for k, v in flat.items())
        )
        values = {
            "length growth": nums["growth"],
            "rising fraction": nums["rising_frac"],
            **{f"{k} change": v for k, v in flat.items()},
        }
        out.append(HackingWarning(LENGTH, lo, hi, message, ["train response_length/mean", *flat], values))
    return out


def entropy_threshold(initial: float, th: Thresholds) -> float:
    """The entropy below which it counts as collapsed."""
    return max(th.entropy_collapse_frac * initial, th.entropy_floor)


def _entropy(data: RunMetrics, th: Thresholds, notes: list[str]) -> list[HackingWarning]:
    steps, values = data.series("train", "entropy")
    k = int(th.entropy_baseline_points)
    if len(steps) < max(k, int(th.min_consecutive)) + 1:
        notes.append("too few training points with entropy: the entropy check was skipped")
        return []
    initial = sum(values[:k]) / k
    limit = entropy_threshold(initial, th)
    runs: list[list[int]] = []
    for i, v in enumerate(values):
        if v < limit:
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
    out = []
    for idx in runs:
        if len(idx) < th.min_consecutive:
            continue
        low = min(values[i] for i in idx)
        message = (
            f"entropy fell to {low:.3g} (initially {initial:.3g}; collapse threshold {limit:.3g} = "
            f"max({th.entropy_collapse_frac:g} x initial, {th.entropy_floor:g})): exploration has stopped"
        )
        values_ = {"initial": initial, "threshold": limit, "min": low}
        out.append(HackingWarning(ENTROPY, steps[idx[0]], steps[idx[-1]], message, ["train entropy"], values_))
    return out


def detect_warnings(
    data: RunMetrics, thresholds: Thresholds | None = None, notes: list[str] | None = None
) -> list[HackingWarning]:
    """The reward-hacking warnings of a run, in step order. Checks lacking data append to ``notes``."""
    th = thresholds or Thresholds()
    notes = notes if notes is not None else []
    found = _divergence(data, th, notes) + _length_growth(data, th, notes) + _entropy(data, th, notes)
    return sorted(found, key=lambda w: (w.start_step, w.end_step, w.kind))


# --------------------------------------------------------------------------- plotting

TRAIN_COLOR = "#1f77b4"
VAL_COLOR = "#2ca02c"
VAL2_COLOR = "#17becf"


@dataclass
class _Line:
    kind: str  # train | eval
    key: str
    label: str
    color: str
    band_key: str | None = None  # a std to shade around the line
    style: str = "-"


@dataclass
class _Panel:
    title: str
    ylabel: str
    lines: list[_Line]
    warn_kinds: tuple[str, ...] = ()
    base_line: _Line | None = None  # a dotted horizontal line at the step-0 value (the base model)
    entropy_limit: float | None = None
    unit_range: bool = False  # values in [0, 1]: keep the y axis there
    bars: bool = False  # counts: bars, never smoothed


_TRAIN_PANELS = (  # (key, title, y label, warning kinds marked on it)
    ("entropy", "Policy entropy", "entropy (nats / token)", (ENTROPY,)),
    ("kl", "KL divergence to reference", "KL", ()),
    ("clip_frac", "PPO clip fraction", "fraction of tokens clipped", ()),
    ("grad_norm", "Gradient norm", "grad norm", ()),
    ("loss", "Loss", "loss", ()),
    ("truncated_rate", "Truncated responses", "fraction truncated", (LENGTH,)),
    ("count/discarded", "Discarded samples", "samples discarded", ()),
    ("tokens_per_s", "Throughput", "tokens / s", ()),
)


def _panels(data: RunMetrics, th: Thresholds) -> list[_Panel]:
    train_keys, eval_keys = set(data.keys("train")), set(data.keys("eval"))
    panels: list[_Panel] = []
    lines = []
    if "reward/mean" in train_keys:
        lines.append(_Line("train", "reward/mean", "train", TRAIN_COLOR, band_key="reward/std"))
    if "reward/mean" in eval_keys:
        lines.append(_Line("eval", "reward/mean", "validation", VAL_COLOR))
    if lines:
        panels.append(_Panel("Reward: train vs validation", "reward", lines, (DIVERGENCE,)))
    acc = [k for k in ("accuracy/greedy", "accuracy/sampled") if k in eval_keys]
    if acc:
        lines = [
            _Line("eval", k, f"validation {k.split('/')[1]}", c, style=s)
            for k, c, s in zip(acc, (VAL_COLOR, VAL2_COLOR), ("-", "--"))
        ]
        panels.append(
            _Panel("Validation accuracy", "accuracy", lines, (DIVERGENCE,), base_line=lines[0], unit_range=True)
        )
    dims = data.dimensions()
    if len(dims) > MAX_DIMENSION_PANELS:  # too many for a panel each: one panel, one color per dimension
        lines = []
        for i, dim in enumerate(dims):
            color = f"C{i % 10}"
            key = f"reward/{dim}/mean"
            if key in train_keys:
                lines.append(_Line("train", key, dim, color))
            if key in eval_keys:  # same color, dashed; "_" keeps it out of the legend
                lines.append(_Line("eval", key, f"_{dim}", color, style="--"))
        panels.append(_Panel("Reward dimensions", "reward (solid: train, dashed: validation)", lines))
        dims = []
    for dim in dims:
        key = f"reward/{dim}/mean"
        lines = []
        if key in train_keys:
            lines.append(_Line("train", key, "train", TRAIN_COLOR, band_key=f"reward/{dim}/std"))
        if key in eval_keys:
            lines.append(_Line("eval", key, "validation", VAL_COLOR))
        panels.append(_Panel(f"Reward dimension: {dim}", f"{dim} reward", lines))
    lines = []
    if "response_length/mean" in train_keys:
        lines.append(_Line("train", "response_length/mean", "train", TRAIN_COLOR, band_key="response_length/std"))
    if "response_length/mean" in eval_keys:
        lines.append(_Line("eval", "response_length/mean", "validation", VAL_COLOR))
    if lines:
        panels.append(_Panel("Response length", "mean response length", lines, (LENGTH,)))
    for key, title, ylabel, kinds in _TRAIN_PANELS:
        if key not in train_keys:
            continue
        panel = _Panel(title, ylabel, [_Line("train", key, "train", TRAIN_COLOR)], kinds, bars=key.startswith("count/"))
        if key == "entropy":
            _, values = data.series("train", key)
            k = int(th.entropy_baseline_points)
            if len(values) >= k:
                panel.entropy_limit = entropy_threshold(sum(values[:k]) / k, th)
        panels.append(panel)
    return panels


def _smooth_width(n: int) -> int:
    """Moving-average width for a series of ``n`` points: 0 (raw) up to 40 points, else odd, about n / 25."""
    return 0 if n <= 40 else max(3, n // 25) | 1


def _smooth(values: list[float], width: int) -> list[float]:
    """Centered moving average (the window shrinks at the ends)."""
    half = width // 2
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - half) : i + half + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def _draw_panel(ax: Any, panel: _Panel, data: RunMetrics, warnings: list[HackingWarning], xlim: tuple) -> None:
    from matplotlib.ticker import MaxNLocator

    for line in panel.lines:
        steps, values = data.series(line.kind, line.key)
        if not steps:
            continue
        if line.kind == "eval":
            ax.plot(steps, values, line.style, marker="o", ms=5, lw=1.8, color=line.color, label=line.label, zorder=4)
            if panel.base_line is not None and len(steps) > 1:  # accuracy: say where it ended
                ax.annotate(
                    f"{values[-1]:.3g}",
                    (steps[-1], values[-1]),
                    xytext=(-4, 7),
                    textcoords="offset points",
                    ha="right",
                    fontsize=9,
                    color=line.color,
                    fontweight="bold",
                )
            continue
        if panel.bars:
            ax.bar(steps, values, width=0.8, color=line.color, alpha=0.7, label=line.label)
            continue
        width = _smooth_width(len(steps))
        shown = _smooth(values, width) if width else values
        label = line.label
        if line.band_key:
            band = [(s, v, data.train[s].get(line.band_key)) for s, v in zip(steps, shown)]
            band = [(s, v, sd) for s, v, sd in band if sd is not None]
            if band:
                sds = [sd for _, _, sd in band]
                if width:
                    sds = _smooth(sds, width)
                ax.fill_between(
                    [s for s, _, _ in band],
                    [v - sd for (_, v, _), sd in zip(band, sds)],
                    [v + sd for (_, v, _), sd in zip(band, sds)],
                    color=line.color,
                    alpha=0.15,
                    lw=0,
                )
                label += " (mean ± 1 std)"
        if width:
            ax.plot(steps, values, "-", lw=0.8, color=line.color, alpha=0.3)
        marker = "." if len(steps) < 25 else None
        ax.plot(steps, shown, line.style, lw=2, color=line.color, label=label, marker=marker)
    if panel.base_line is not None:
        steps, values = data.series(panel.base_line.kind, panel.base_line.key)
        if steps and steps[0] == 0:
            ax.axhline(values[0], color="0.45", ls=":", lw=1.3, label=f"base model ({values[0]:.3g})")
    if panel.entropy_limit is not None:
        ax.axhline(
            panel.entropy_limit,
            color=WARNING_COLORS[ENTROPY],
            ls="--",
            lw=1.2,
            label=f"collapse threshold ({panel.entropy_limit:.3g})",
        )
    for w in warnings:
        if w.kind not in panel.warn_kinds:
            continue
        lo, hi = (w.start_step - 0.5, w.end_step + 0.5) if w.start_step == w.end_step else (w.start_step, w.end_step)
        ax.axvspan(lo, hi, color=WARNING_COLORS[w.kind], alpha=0.16, lw=0, zorder=0)
        ax.axvline(lo, color=WARNING_COLORS[w.kind], lw=1, alpha=0.6, zorder=0)
    if panel.unit_range:
        lo, hi = ax.get_ylim()
        ax.set_ylim(max(-0.02, min(lo, 0.0)), min(1.02, max(hi, 0.05)))
    ax.set_title(panel.title, fontsize=12, fontweight="bold", loc="left")
    ax.set_xlabel("training step", fontsize=10)
    ax.set_ylabel(panel.ylabel, fontsize=10)
    ax.set_xlim(*xlim)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=8))
    ax.grid(True, color="0.9", lw=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.tick_params(labelsize=9)
    handles, labels = ax.get_legend_handles_labels()
    marked = {w.kind for w in warnings if w.kind in panel.warn_kinds}
    if marked:
        from matplotlib.patches import Patch

        for kind in sorted(marked):
            handles.append(Patch(color=WARNING_COLORS[kind], alpha=0.3))
            labels.append(f"warning: {WARNING_TITLES[kind].lower()}")
    if len(handles) > 1 or (handles and labels[0] != "train"):  # a lone "train" line needs no legend
        ax.legend(handles, labels, fontsize=8.5, loc="best", framealpha=0.85, ncol=2 if len(handles) > 5 else 1)


def _plot(data: RunMetrics, warnings: list[HackingWarning], header: dict[str, str], th: Thresholds, path: Path) -> None:
    from .errors import require

    mpl = require("matplotlib", "report")
    mpl.use("Agg", force=True)
    plt = require("matplotlib.pyplot", "report")

    panels = _panels(data, th)
    steps = data.steps
    span = max(1, steps[-1] - steps[0])
    xlim = (steps[0] - 0.02 * span, steps[-1] + 0.02 * span)
    ncols = 1 if len(panels) == 1 else 2 if len(panels) <= 4 else 3
    nrows = max(1, math.ceil(len(panels) / ncols))
    panel_w, panel_h = 5.8, 3.9
    fig_w = panel_w * ncols

    # header: title, run facts, then one (wrapped) line per warning
    title = " / ".join(v for k, v in header.items() if k in ("project", "experiment")) or data.path.parent.name
    sub = [f"{k} {v}" for k, v in header.items() if k in ("model", "algorithm")]
    sub.append(f"{len(data.train)} training steps, {len(data.eval)} evaluations")
    if width := _smooth_width(len(data.train)):
        sub.append(f"thick lines: moving average over {width} steps, thin: per step")
    chars = max(60, int(fig_w * 72 / (10.5 * 0.6)))
    lines: list[tuple[str, str]] = []  # (text, color)
    if not warnings:
        lines.append(("No reward-hacking warnings.", VAL_COLOR))
    for w in warnings[:6]:
        text = textwrap.wrap(f"\u25a0 {w.title} ({w.steps}): {w.message}", chars, subsequent_indent="    ")
        lines += [(t, WARNING_COLORS[w.kind]) for t in text]
    if len(warnings) > 6:
        lines.append((f"... and {len(warnings) - 6} more (see report.html)", "0.2"))
    header_in = 0.95 + 0.22 * len(lines)
    fig_h = panel_h * nrows + header_in
    with plt.rc_context({"font.family": "DejaVu Sans"}):
        fig = plt.figure(figsize=(fig_w, fig_h), dpi=110)
        try:
            fig.text(0.012, 1 - 0.32 / fig_h, f"reinforge report: {title}", fontsize=16, fontweight="bold", va="center")
            fig.text(0.012, 1 - 0.62 / fig_h, "  |  ".join(sub), fontsize=10.5, color="0.3", va="center")
            for k, (text, color) in enumerate(lines):
                fig.text(0.012, 1 - (0.9 + 0.22 * k) / fig_h, text, fontsize=10.5, color=color, va="center")
            grid = fig.add_gridspec(
                nrows,
                ncols,
                left=0.9 / fig_w,
                right=1 - 0.25 / fig_w,
                bottom=0.55 / fig_h,
                top=1 - (header_in + 0.35) / fig_h,
                wspace=0.95 / panel_w,
                hspace=1.0 / panel_h,
            )
            for i, panel in enumerate(panels):
                ax = fig.add_subplot(grid[i // ncols, i % ncols])
                _draw_panel(ax, panel, data, warnings, xlim)
            fig.savefig(path, dpi=110, facecolor="white")
        finally:
            plt.close(fig)


# --------------------------------------------------------------------------- tables and HTML

_HIGHER_IS_BETTER = ("reward/", "accuracy/")


def _summary(data: RunMetrics) -> list[dict[str, Any]]:
    """One row per metric: first, final, min, max and (for rewards and accuracies) best, with their steps."""
    rows = []
    order = {k: i for i, k in enumerate(["accuracy/greedy", "accuracy/sampled", "reward/mean", "reward/std"])}
    for kind in ("eval", "train"):
        for key in sorted(data.keys(kind), key=lambda k: (order.get(k, len(order)), k)):
            steps, values = data.series(kind, key)
            if not steps:
                continue
            row: dict[str, Any] = {
                "kind": "validation" if kind == "eval" else "train",
                "metric": key,
                "first": values[0],
                "first_step": steps[0],
                "final": values[-1],
                "final_step": steps[-1],
                "min": min(values),
                "max": max(values),
            }
            if key.startswith(_HIGHER_IS_BETTER) and not key.endswith(("/std", "/min")):
                i = max(range(len(values)), key=lambda j: values[j])
                row["best"], row["best_step"] = values[i], steps[i]
            rows.append(row)
    return rows


def _num(x: float | None) -> str:
    if x is None:
        return "&mdash;"
    return f"{x:.4g}"


_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1500px;color:#222;padding:0 16px}
h1{font-size:24px;margin-bottom:4px} h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
.meta{color:#555;margin:2px 0} .ok{color:#2ca02c;font-weight:600}
.warn{border-left:6px solid;padding:6px 12px;margin:8px 0;background:#fafafa}
.warn .t{display:inline-block;min-width:300px;font-weight:700} .warn .s{font-weight:700;margin-right:8px}
.headline{display:flex;gap:16px;flex-wrap:wrap;margin:12px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 14px} .card .v{font-size:22px;font-weight:600}
table{border-collapse:collapse;font-size:14px} th,td{padding:4px 10px;border-bottom:1px solid #eee;text-align:right}
th{background:#f4f4f4} td:first-child,td:nth-child(2),th:first-child,th:nth-child(2){text-align:left}
img{max-width:100%;border:1px solid #eee} code{background:#f4f4f4;padding:1px 4px}
.notes{color:#666;font-size:14px}
"""


def _html(
    data: RunMetrics,
    warnings: list[HackingWarning],
    notes: list[str],
    header: dict[str, str],
    th: Thresholds,
    png: Path,
) -> str:
    e = html.escape
    title = " / ".join(v for k, v in header.items() if k in ("project", "experiment")) or data.path.parent.name
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>reinforge report: {e(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>reinforge report: {e(title)}</h1>",
    ]
    for key in ("project", "experiment", "model", "algorithm"):
        if key in header:
            parts.append(f'<p class="meta"><b>{key}</b>: {e(header[key])}</p>')
    meta = f"run folder <code>{e(str(data.path.parent))}</code>; {len(data.train)} training steps, {len(data.eval)} evaluations"
    if data.first_time is not None and data.last_time is not None and data.last_time > data.first_time:
        meta += f", {(data.last_time - data.first_time) / 60:.1f} min of wall time"
    meta += f"; generated {e(time.strftime('%Y-%m-%d %H:%M:%S'))}"
    parts.append(f'<p class="meta">{meta}</p>')

    cards = []
    for key in ("accuracy/greedy", "accuracy/sampled", "reward/mean"):
        steps, values = data.series("eval", key)
        if len(steps) >= 2:
            cards.append(
                f'<div class="card">validation {e(key)}<div class="v">{values[0]:.3g} &rarr; {values[-1]:.3g}</div>'
                f"step {steps[0]} &rarr; {steps[-1]} ({values[-1] - values[0]:+.3g})</div>"
            )
    if cards:
        parts.append('<div class="headline">' + "".join(cards) + "</div>")

    parts.append(f"<h2>Reward-hacking warnings ({len(warnings)})</h2>")
    if not warnings:
        parts.append('<p class="ok">No warnings: none of the checks below held.</p>')
    for w in warnings:
        color = WARNING_COLORS.get(w.kind, "#d62728")
        parts.append(
            f'<div class="warn" style="border-color:{color}"><span class="t" style="color:{color}">{e(w.title)}</span>'
            f'<span class="s">{e(w.steps)}</span>{e(w.message)}</div>'
        )
    if notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{e(n)}</li>" for n in notes) + "</ul>")

    encoded = base64.b64encode(png.read_bytes()).decode("ascii")
    parts.append("<h2>Dashboard</h2>")
    parts.append(f'<img alt="training dashboard" src="data:image/png;base64,{encoded}">')

    parts.append("<h2>Metrics</h2>")
    parts.append(
        "<table><tr><th>metric</th><th>split</th><th>first</th><th>final</th><th>best</th><th>min</th><th>max</th></tr>"
    )
    for row in _summary(data):
        best = f"{_num(row['best'])} <small>(step {row['best_step']})</small>" if "best" in row else "&mdash;"
        parts.append(
            f"<tr><td>{e(row['metric'])}</td><td>{row['kind']}</td>"
            f"<td>{_num(row['first'])} <small>(step {row['first_step']})</small></td>"
            f"<td>{_num(row['final'])} <small>(step {row['final_step']})</small></td>"
            f"<td>{best}</td><td>{_num(row['min'])}</td><td>{_num(row['max'])}</td></tr>"
        )
    parts.append("</table>")

    parts.append("<h2>Checks and thresholds</h2><ul>")
    parts.append(
        f"<li><b>{WARNING_TITLES[DIVERGENCE]}</b>: over every {th.divergence_eval_points} consecutive evaluations, "
        f"the least-squares trend of the training reward rises by &ge; {th.divergence_min_train_rise:g} while "
        f"validation reward or accuracy falls by &ge; {th.divergence_min_val_drop:g}.</li>"
    )
    parts.append(
        f"<li><b>{WARNING_TITLES[LENGTH]}</b>: over {th.length_window} training steps, the fitted response length "
        f"grows by &ge; {th.length_min_growth * 100:g}% and is nearly monotonic (the later step is longer in "
        f"&ge; {th.length_monotonic_frac * 100:g}% of pairs of steps) while training or validation reward rises by &lt; {th.reward_flat_tol:g}.</li>"
    )
    parts.append(
        f"<li><b>{WARNING_TITLES[ENTROPY]}</b>: entropy below max({th.entropy_collapse_frac:g} &times; its initial "
        f"value (mean of the first {th.entropy_baseline_points} steps), {th.entropy_floor:g}) on "
        f"&ge; {th.min_consecutive} consecutive steps.</li>"
    )
    parts.append(
        '</ul><p class="notes">Change any threshold with <code>reinforge report RUN_DIR --threshold KEY=VALUE</code>. '
        "Warnings are heuristics: confirm them by reading trajectories from the flagged steps.</p>"
    )
    parts.append("</body></html>")
    return "\n".join(parts)


# --------------------------------------------------------------------------- API and CLI


def write_report(
    run_dir: str | Path, out_dir: str | Path | None = None, *, thresholds: Thresholds | None = None
) -> ReportResult:
    """Write ``report.png``, ``report.html`` and ``report.json`` for a run folder (default into ``RUN_DIR/report``).

    Raises :class:`~reinforge.errors.ConfigError` for a missing folder or ``metrics.jsonl`` or a
    malformed line, and :class:`~reinforge.errors.MissingExtraError` without matplotlib
    (``pip install 'reinforge[report]'``).
    """
    th = thresholds or Thresholds()
    data = load_metrics(run_dir)
    run_path = data.path.parent
    notes: list[str] = []
    if data.skipped:
        notes.append(f"{data.skipped} line(s) of {data.path} had no numeric step and were skipped")
    header = _header(_load_config(run_path, notes))
    warnings = detect_warnings(data, th, notes)
    out = Path(out_dir) if out_dir is not None else run_path / "report"
    out.mkdir(parents=True, exist_ok=True)
    png, page, summary = out / "report.png", out / "report.html", out / "report.json"
    _plot(data, warnings, header, th, png)
    page.write_text(_html(data, warnings, notes, header, th, png), encoding="utf-8")
    result = ReportResult(out_dir=out, png=png, html=page, json=summary, warnings=warnings, notes=notes)
    payload = {
        **result.to_dict(),
        "run_dir": str(run_path),
        "header": header,
        "thresholds": dataclasses.asdict(th),
        "metrics": _summary(data),
    }
    summary.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``reinforge report``."""
    parser.add_argument("run_dir", help="run folder holding metrics.jsonl (and config.json)")
    parser.add_argument("--out", dest="out_dir", help="output folder (default: RUN_DIR/report)")
    parser.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change a warning threshold, e.g. entropy_collapse_frac=0.1 (repeatable; see reinforge.report.Thresholds)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--fail-on-warning", action="store_true", help="exit with status 2 when a reward-hacking warning is found"
    )


def run(args: argparse.Namespace) -> int:
    """``reinforge report``: write the report, print where it is and the warnings."""
    result = write_report(args.run_dir, getattr(args, "out_dir", None), thresholds=Thresholds.parse(args.threshold))
    if getattr(args, "json", False):
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(f"dashboard: {result.png}")
        print(f"report:    {result.html}")
        if result.warnings:
            print(f"{len(result.warnings)} reward-hacking warning(s):")
            for w in result.warnings:
                print(f"  - {w}")
        else:
            print("no reward-hacking warnings")
        for note in result.notes:
            print(f"note: {note}")
    return 2 if result.warnings and getattr(args, "fail_on_warning", False) else 0
