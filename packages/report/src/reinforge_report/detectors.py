"""Reward-hacking checks on a run's metrics: :func:`detect_warnings` and its :class:`Thresholds`.

They run on a whole run (``reinforge report``) and live, after every step (the sentinels), on
the same :class:`~reinforge_report.metrics.RunMetrics`.

Trends are least-squares lines fitted over a window; a trend's *change* is its slope times the
window's length in steps, so it is in the metric's own units. Reward thresholds are in reward
units: reinforge normalizes judge weights to sum to 1, so rewards usually lie in [0, 1].

1. ``train_val_divergence`` -- the training reward rises while validation falls (the "anti-hacking
   sentinel" of the monitoring playbook). For every window of ``divergence_eval_points``
   consecutive evaluations, it holds when training ``reward/mean`` (fitted over the training steps
   inside the window) rises by at least ``divergence_min_train_rise`` while a validation metric
   (``reward/mean``, ``accuracy/greedy`` or ``accuracy/sampled`` of the eval records) falls by at least
   ``divergence_min_val_drop``.
2. ``length_growth`` -- response length rises (nearly) monotonically while reward is flat: over a
   window of ``length_window`` training points, the fitted ``response_length/mean`` grows by at
   least ``length_min_growth`` (relative), it is nearly monotonic (in at least
   ``length_monotonic_frac`` of the pairs of steps of the window, the later step has the longer
   responses: 1 = strictly increasing, 0.5 = no trend; robust to per-step noise), and the training
   reward or a validation reward/accuracy (fitted over the evaluations from the last one at or before
   the window to the first one at or after it) rises by less than ``reward_flat_tol`` (flat or falling).
3. ``entropy_collapse`` -- ``entropy`` falls below ``entropy_collapse_frac`` of its initial value
   (mean of the first ``entropy_baseline_points`` points) or below ``entropy_floor``, for at least
   ``min_consecutive`` consecutive points.

Windows are taken at several scales (the size above, twice it, four times it... and the whole run,
the larger ones slid by a fifth of their size), so both a sharp change and a slow drift over a long run are seen.
A larger window is only tried where no smaller one held. Overlapping windows that hold are merged
into one warning per span of steps (length windows less than half a window apart, too).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reinforge.plugin import ConfigError
from reinforge.plugin import metric_names as mn

from .metrics import RunMetrics

__all__ = [
    "DIVERGENCE",
    "ENTROPY",
    "LENGTH",
    "WARNING_TITLES",
    "HackingWarning",
    "ThresholdError",
    "Thresholds",
    "detect_warnings",
    "entropy_threshold",
]

DIVERGENCE = "train_val_divergence"
LENGTH = "length_growth"
ENTROPY = "entropy_collapse"

WARNING_TITLES = {
    DIVERGENCE: "Training reward up, validation down",
    LENGTH: "Response length growing, reward flat",
    ENTROPY: "Entropy collapse",
}

# Validation metrics used as the anti-hacking sentinel, in order of preference.
SENTINELS = (mn.REWARD_MEAN, mn.ACCURACY_GREEDY, mn.ACCURACY_SAMPLED)
_MIN_TRAIN_POINTS = 3  # training points needed inside a window to fit a trend
_MIN_LENGTH_POINTS = 5  # fewest training points for the length check


class ThresholdError(ConfigError):
    """A threshold is unknown or has a bad value; ``key`` names it, ``detail`` says what is wrong."""

    def __init__(self, key: str, detail: str, *, unknown: bool = False) -> None:
        self.key, self.detail, self.unknown = key, detail, unknown
        super().__init__(f"threshold {key}: {detail}")


def _is_int_field(f: dataclasses.Field[Any]) -> bool:
    return f.type in ("int", int)


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
                raise ThresholdError(f.name, f"must be a finite number, got {value!r}")
            if value < 0:
                raise ThresholdError(f.name, f"must be >= 0, got {value!r}")
            if _is_int_field(f) and value != int(value):
                raise ThresholdError(f.name, f"must be a whole number, got {value!r}")
        for name, low in (
            ("divergence_eval_points", 2),
            ("length_window", 2),
            ("entropy_baseline_points", 1),
            ("min_consecutive", 1),
        ):
            if getattr(self, name) < low:
                raise ThresholdError(name, f"must be >= {low}, got {getattr(self, name)!r}")

    @classmethod
    def names(cls) -> list[str]:
        """The threshold keys, in declaration order."""
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Thresholds:
        """Thresholds from ``{key: number}`` (a run file's ``sentinels.thresholds``); whole numbers become ints.

        Raises :class:`ThresholdError` for an unknown key (``unknown=True``) or a bad value.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        out: dict[str, Any] = {}
        for key, value in values.items():
            if key not in fields:
                raise ThresholdError(key, f"unknown threshold; known: {', '.join(fields)}", unknown=True)
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            whole = is_number and math.isfinite(value) and value == int(value)
            out[key] = int(value) if _is_int_field(fields[key]) and whole else value
        return cls(**out)

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
            values[key] = int(number) if _is_int_field(names[key]) and number == int(number) else number
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


def _span(steps: list[int], lo: int, hi: int) -> range:
    """Indices of the (sorted, distinct) ``steps`` with ``lo <= step <= hi``: a bisection, not a scan.

    The detectors run after every step of a live run, so this keeps each check near-linear in the run's length.
    """
    return range(bisect.bisect_left(steps, lo), bisect.bisect_right(steps, hi))


def _change(steps: list[int], values: list[float], lo: int, hi: int, min_points: int = 2) -> float | None:
    """Fitted change of a series over the steps ``lo..hi`` (slope x span), None with too few points."""
    idx = _span(steps, lo, hi)
    if len(idx) < min_points:
        return None
    fit = _fit([float(steps[i]) for i in idx], [values[i] for i in idx])
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
    t_steps, t_vals = data.series(mn.KIND_TRAIN, mn.REWARD_MEAN)
    sentinels = {m: data.series(mn.KIND_EVAL, m) for m in SENTINELS}
    sentinels = {m: s for m, s in sentinels.items() if len(s[0]) >= 2}
    if not t_steps:
        notes.append(f"no training {mn.REWARD_MEAN}: the train/validation divergence check was skipped")
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
        numbers = {f"train {mn.REWARD_MEAN} change": train}
        parts: list[str] = []
        metrics = [f"train {mn.REWARD_MEAN}"]
        for m, (steps, vals) in sentinels.items():
            val = _change(steps, vals, lo, hi)
            if val is not None and val <= -th.divergence_min_val_drop:
                numbers[f"validation {m} change"] = val
                metrics.append(f"validation {m}")
                parts.append(f"validation {m} {_fmt(val)}")
        message = (
            f"training {mn.REWARD_MEAN} {_fmt(train)} while {', '.join(parts)} (least-squares trend over the span)"
        )
        out.append(HackingWarning(DIVERGENCE, lo, hi, message, metrics, numbers))
    return out


def _length_growth(data: RunMetrics, th: Thresholds, notes: list[str]) -> list[HackingWarning]:
    l_steps, l_vals = data.series(mn.KIND_TRAIN, mn.RESPONSE_LENGTH_MEAN)
    t_steps, t_vals = data.series(mn.KIND_TRAIN, mn.REWARD_MEAN)
    sentinels = {m: data.series(mn.KIND_EVAL, m) for m in SENTINELS}
    if len(l_steps) < _MIN_LENGTH_POINTS:
        notes.append(
            f"fewer than {_MIN_LENGTH_POINTS} training points with {mn.RESPONSE_LENGTH_MEAN}: the length check was skipped"
        )
        return []
    if not t_steps and not any(len(s) >= 2 for s, _ in sentinels.values()):
        notes.append("no reward to compare response length with: the length check was skipped")
        return []

    def window(lo: int, hi: int) -> dict[str, float] | None:
        """The numbers of one window, or None when the length rule does not hold on it."""
        idx = _span(l_steps, lo, hi)
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
            flat[f"train {mn.REWARD_MEAN}"] = train
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
            held = [w for w in (window(a, b) for a, b in flagged if lo <= a and b <= hi) if w is not None]
            nums = max(held, key=lambda d: d["growth"])  # every flagged window held, so none is None
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
        out.append(HackingWarning(LENGTH, lo, hi, message, [f"train {mn.RESPONSE_LENGTH_MEAN}", *flat], values))
    return out


def entropy_threshold(initial: float, th: Thresholds) -> float:
    """The entropy below which it counts as collapsed."""
    return max(th.entropy_collapse_frac * initial, th.entropy_floor)


def _entropy(data: RunMetrics, th: Thresholds, notes: list[str]) -> list[HackingWarning]:
    steps, values = data.series(mn.KIND_TRAIN, mn.ENTROPY)
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
        out.append(HackingWarning(ENTROPY, steps[idx[0]], steps[idx[-1]], message, [f"train {mn.ENTROPY}"], values_))
    return out


def detect_warnings(
    data: RunMetrics, thresholds: Thresholds | None = None, notes: list[str] | None = None
) -> list[HackingWarning]:
    """The reward-hacking warnings of a run, in step order. Checks lacking data append to ``notes``."""
    th = thresholds or Thresholds()
    notes = notes if notes is not None else []
    found = _divergence(data, th, notes) + _length_growth(data, th, notes) + _entropy(data, th, notes)
    return sorted(found, key=lambda w: (w.start_step, w.end_step, w.kind))
