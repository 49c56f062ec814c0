"""Calibration: agreement of any judge with human labels on a gold set.

``reinforge judge calibrate --judge REF --gold gold.jsonl`` and the Python API
below score every gold item with the judge and compare with the human label:
Spearman's rho, Kendall's tau-b and Cohen's kappa, passing when rho reaches the
threshold (0.6 by default). The judge can be any reference core resolves: a
registered name, ``module:attr`` or a callable.

A run requires a pass before training in one of two ways: the judge setting
``require_calibration: gold.jsonl`` (checked on the judge's first call, which
happens before the first training step; a failed pass stops the run), or
:func:`require_calibration` called by a script or backend before it trains.

Gold file: JSON lines, each ``{"task": {...}, "response": ..., "label": 4}``.
Without ``task``, the line's other fields are the task. ``score`` and
``human_label`` are accepted for ``label``.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reinforge import JudgeOutput, TaskStatus
from reinforge.plugin import ConfigError, ReinforgeError

from .stats import cohen_kappa, kendall_tau, spearman

__all__ = [
    "CalibrationError",
    "CalibrationReport",
    "Example",
    "calibrate",
    "calibrate_async",
    "load_examples",
    "require_calibration",
    "resolve_judge",
    "score_examples",
]

LABEL_KEYS = ("label", "score", "human_label")
DEFAULT_MIN_SPEARMAN = 0.6
MIN_ITEMS = 3


class CalibrationError(ReinforgeError):
    """A judge did not pass calibration against its gold set."""


@dataclass
class Example:
    """One gold (or audit) item: the task, the response and, for gold, the human label."""

    task: dict[str, Any]
    response: Any
    label: float | None = None
    line: int = 0


def load_examples(path: str | Path, *, require_label: bool = True, limit: int | None = None) -> list[Example]:
    """Read a JSONL file of ``{task, response, label}`` lines; errors name the file and line."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"{path}: no such file (looked for {file.absolute()})")
    out: list[Example] = []
    with file.open(encoding="utf-8") as fh:
        for number, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{where}: not valid JSON: {exc.msg}") from None
            if not isinstance(row, dict) or "response" not in row:
                raise ConfigError(f"{where}: each line must be a JSON object with 'response' (and 'task', 'label')")
            label_key = next((k for k in LABEL_KEYS if k in row), None)
            label = row.get(label_key) if label_key else None
            if label is not None and (
                isinstance(label, bool) or not isinstance(label, (int, float)) or not math.isfinite(label)
            ):
                raise ConfigError(f"{where}: {label_key} must be a number, got {label!r}")
            if require_label and label is None:
                raise ConfigError(f"{where}: missing the human label (one of {', '.join(LABEL_KEYS)})")
            if "task" in row:
                task = row["task"]
                if not isinstance(task, dict):
                    raise ConfigError(f"{where}: 'task' must be a JSON object, got {type(task).__name__}")
            else:
                task = {k: v for k, v in row.items() if k not in ("response", *LABEL_KEYS)}
            out.append(Example(task=task, response=row["response"], label=label, line=number))
            if limit is not None and len(out) >= limit:
                break
    if not out:
        raise ConfigError(f"{path}: the file has no items")
    return out


def resolve_judge(
    judge: Any, args: dict[str, Any] | None = None, *, registry: Any = None, where: str = "calibration"
) -> Any:
    """Build a judge as core builds it for a run: a ``BoundFunction`` for a registered name, ``module:attr``
    or callable, its ``args`` checked against its settings. Close it with ``bound.close()`` when done.

    ``module:attr`` references import from the working directory too. ``registry``: the one to look names up
    in; ``None``: the installed plugins' (what ``reinforge judge calibrate`` and ``audit`` use).
    """
    from reinforge.plugin import ComponentSpec, build_component, build_registry, get_plugin_manager

    if registry is None:
        registry = build_registry(get_plugin_manager())
    spec = ComponentSpec(ref=judge, args=dict(args or {}))
    return build_component(spec, "judge", registry, where=where, base_dir=str(Path.cwd()))


async def score_examples(
    bound: Any,
    examples: list[Example],
    *,
    auxiliary_models: dict[str, Any] | None = None,
    concurrency: int = 8,
    timeout_s: float = 600.0,
    max_retries: int = 0,
) -> list[Any]:
    """Each example's ``JudgeOutput`` (FAILED ones included), checked as core's runner checks a judge's output.

    A judgment that times out, raises or returns FAILED is tried again up to
    ``max_retries`` times, then FAILED; a reinforge error (a bad setting, a
    failed required calibration) propagates.
    """
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(example: Example) -> Any:
        async with gate:
            return await _judge_once(bound, example, auxiliary_models, timeout_s, max_retries)

    return list(await asyncio.gather(*(one(e) for e in examples)))


async def _judge_once(bound: Any, example: Example, aux: Any, timeout_s: float, max_retries: int) -> Any:
    last = "no attempt"
    for _ in range(1 + max(0, max_retries)):
        try:
            out = await asyncio.wait_for(bound.call(example.task, example.response, auxiliary_models=aux), timeout_s)
        except ReinforgeError:
            raise
        except asyncio.TimeoutError:
            last = f"judge {bound.name} timed out after {timeout_s:g}s"
            continue
        except Exception as exc:  # a transient failure of the judge, never a reward of 0
            last = f"judge {bound.name} raised {type(exc).__name__}: {exc}"
            continue
        out = bound.check_output(out)
        if out.status is TaskStatus.SUCCESS:
            return out
        last = f"judge {bound.name} returned FAILED: {out.error}"
    return JudgeOutput(status=TaskStatus.FAILED, error=last)


@dataclass
class CalibrationReport:
    """Agreement of a judge with a gold set, and whether it passes."""

    judge: str
    gold: str
    items: int
    scored: int
    failed: int
    spearman: float | None
    kendall: float | None
    kappa: float | None
    kappa_weights: str | None
    categories: list[float] | None
    min_spearman: float
    min_kendall: float | None
    min_kappa: float | None
    max_failed_fraction: float
    passed: bool
    reasons: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def verdict(self) -> str:
        head = "PASS" if self.passed else "FAIL"
        return f"{head}: " + "; ".join(self.reasons)

    def table(self) -> str:
        def fmt(v: float | None) -> str:
            return "undefined" if v is None else f"{v:.4f}"

        def need(v: float | None) -> str:
            return "-" if v is None else f">= {v:g}"

        def ok(v: float | None, low: float | None) -> str:
            if low is None:
                return ""
            return "pass" if v is not None and v >= low else "FAIL"

        weights = f" ({self.kappa_weights})" if self.kappa_weights else ""
        lines = [
            f"calibration of {self.judge} on {self.gold}: {self.items} items, {self.scored} scored, "
            f"{self.failed} failed",
            f"  {'statistic':<24}{'value':>10}  {'threshold':<11}result",
            f"  {'Spearman rho':<24}{fmt(self.spearman):>10}  {need(self.min_spearman):<11}"
            f"{ok(self.spearman, self.min_spearman)}",
            f"  {'Kendall tau-b':<24}{fmt(self.kendall):>10}  {need(self.min_kendall):<11}"
            f"{ok(self.kendall, self.min_kendall)}",
            f"  {'Cohen kappa' + weights:<24}{fmt(self.kappa):>10}  {need(self.min_kappa):<11}"
            f"{ok(self.kappa, self.min_kappa)}",
            self.verdict(),
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("rows")
        return data


def _categories(labels: list[float], label_scale: tuple[float, float] | None) -> tuple[list[float] | None, str]:
    if label_scale is not None:
        low, high = label_scale
        if not (float(low).is_integer() and float(high).is_integer() and low < high):
            raise ConfigError(f"label_scale must be two integers low < high, got {label_scale!r}")
        return [float(v) for v in range(int(low), int(high) + 1)], ""
    if labels and all(float(v).is_integer() for v in labels):
        low, high = int(min(labels)), int(max(labels))
        if low == high:
            return None, "every human label is the same"
        return [float(v) for v in range(low, high + 1)], ""
    return None, "the human labels are not integer categories; give label_scale to bin them"


def _to_category(reward: float, categories: list[float]) -> float:
    """A reward in [0, 1] mapped onto the label scale and rounded half up to a category."""
    low, high = categories[0], categories[-1]
    value = low + min(1.0, max(0.0, reward)) * (high - low)
    return min(high, max(low, math.floor(value + 0.5)))


async def calibrate_async(
    judge: Any,
    gold: str | Path,
    *,
    args: dict[str, Any] | None = None,
    auxiliary_models: dict[str, Any] | None = None,
    min_spearman: float = DEFAULT_MIN_SPEARMAN,
    min_kendall: float | None = None,
    min_kappa: float | None = None,
    kappa_weights: str | None = None,
    label_scale: tuple[float, float] | None = None,
    max_failed_fraction: float = 0.1,
    concurrency: int = 8,
    limit: int | None = None,
    registry: Any = None,
    judge_label: str | None = None,
) -> CalibrationReport:
    """Score the gold set with ``judge`` and compare with the human labels. See :func:`calibrate`."""
    if kappa_weights in ("none", ""):
        kappa_weights = None
    if kappa_weights not in (None, "linear", "quadratic"):
        raise ConfigError(f"kappa_weights must be none, linear or quadratic, got {kappa_weights!r}")
    examples = load_examples(gold, limit=limit)
    bound = resolve_judge(judge, args, registry=registry, where=f"calibration on {gold}")
    label = judge_label or (judge if isinstance(judge, str) else bound.name)
    try:
        outputs = await score_examples(bound, examples, auxiliary_models=auxiliary_models, concurrency=concurrency)
    finally:
        bound.close()  # what was built for this calibration (a judge's client and cache)
    rows: list[dict[str, Any]] = []
    for example, out in zip(examples, outputs):
        ok = out.status.value == "success"
        rows.append(
            {
                "line": example.line,
                "label": float(example.label),  # type: ignore[arg-type]
                "reward": float(out.reward) if ok else None,
                "error": None if ok else out.error,
            }
        )
    scored = [r for r in rows if r["reward"] is not None]
    labels: list[float] = [float(r["label"]) for r in scored]
    rewards: list[float] = [float(r["reward"]) for r in scored]
    rho = spearman(labels, rewards) if len(scored) >= 2 else None
    tau = kendall_tau(labels, rewards) if len(scored) >= 2 else None
    categories, why_no_kappa = _categories(labels, label_scale)
    kappa = None
    if categories is not None and scored:
        for r, reward in zip(scored, rewards):
            r["category"] = _to_category(reward, categories)
        human = [min(categories[-1], max(categories[0], float(math.floor(v + 0.5)))) for v in labels]
        kappa = cohen_kappa(human, [r["category"] for r in scored], categories=categories, weights=kappa_weights)

    reasons = []
    failed = len(rows) - len(scored)
    passed = True
    if len(scored) < MIN_ITEMS:
        passed = False
        reasons.append(f"only {len(scored)} item(s) scored; at least {MIN_ITEMS} are needed")
    if rows and failed / len(rows) > max_failed_fraction:
        passed = False
        first = next(r["error"] for r in rows if r["reward"] is None)
        reasons.append(
            f"{failed} of {len(rows)} judgments FAILED (more than {max_failed_fraction:.0%}); first error: {first}"
        )
    undefined = "constant scores or labels"
    checks = (
        ("Spearman rho", rho, min_spearman, undefined),
        ("Kendall tau-b", tau, min_kendall, undefined),
        ("Cohen's kappa", kappa, min_kappa, why_no_kappa or "no agreement beyond chance is possible"),
    )
    for name, value, low, why in checks:
        if low is None:
            continue
        if value is None:
            passed = False
            reasons.append(f"{name} is undefined ({why})")
        elif value < low:
            passed = False
            reasons.append(f"{name} {value:.3f} < {low:g}")
        else:
            reasons.append(f"{name} {value:.3f} >= {low:g}")
    return CalibrationReport(
        judge=str(label),
        gold=str(gold),
        items=len(rows),
        scored=len(scored),
        failed=failed,
        spearman=rho,
        kendall=tau,
        kappa=kappa,
        kappa_weights=kappa_weights,
        categories=categories,
        min_spearman=min_spearman,
        min_kendall=min_kendall,
        min_kappa=min_kappa,
        max_failed_fraction=max_failed_fraction,
        passed=passed,
        reasons=reasons,
        rows=rows,
    )


def calibrate(judge: Any, gold: str | Path, **options: Any) -> CalibrationReport:
    """Agreement of ``judge`` with the human labels of ``gold`` (a JSONL file).

    :param judge: a registered judge name, ``"module:attr"`` or a judge callable.
    :param gold: JSONL of ``{"task", "response", "label"}`` lines.
    :param options: ``args`` (the judge's settings), ``auxiliary_models``,
        ``min_spearman`` (0.6), ``min_kendall``, ``min_kappa`` (None: not
        required), ``kappa_weights`` (None, "linear", "quadratic"),
        ``label_scale`` ((low, high) of integer labels; default: the labels'
        range), ``max_failed_fraction`` (0.1), ``concurrency``, ``limit``.
    :return: a :class:`CalibrationReport`; ``report.passed`` says whether it passes.

    Runs its own event loop: from async code use :func:`calibrate_async`.
    Rewards in [0, 1] are mapped onto the label scale for kappa.
    """
    return asyncio.run(calibrate_async(judge, gold, **options))


def require_calibration(judge: Any, gold: str | Path, **options: Any) -> CalibrationReport:
    """Like :func:`calibrate`, but raise :class:`CalibrationError` unless the judge passes.

    Call it before training starts (a script, or a backend before its first step).
    """
    report = calibrate(judge, gold, **options)
    if not report.passed:
        raise CalibrationError(f"judge {report.judge} failed calibration on {report.gold}: {report.verdict()}")
    return report
