"""Audit: how biased is a judge on a sample? Position-flip rate and length correlation.

- **Length correlation**: Spearman's rho between response length (characters)
  and the judge's reward over the sample, plus the fitted slope of reward on
  ``log(1 + chars)`` (the value ``length_slope`` would take). Works for any judge.
- **Position-flip rate**: the share of comparisons in which the judge picks the
  same *position* in both orders (so its verdict follows the position, not the
  response). A judge that reports a ``position_flip`` metric (``llm-pairwise``)
  is measured from its own judgments; the other LLM judges of this package are
  measured by asking their model, with their settings, to compare pairs of
  sample responses that share a task, in both orders. For any other judge the
  rate is not measurable and reported as such.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reinforge import response_text

from .calibration import load_examples, resolve_judge, score_examples
from .stats import spearman

__all__ = ["AuditReport", "audit", "audit_async"]


@dataclass
class AuditReport:
    judge: str
    sample: str
    items: int
    scored: int
    failed: int
    length_spearman: float | None
    length_slope: float | None
    flip_rate: float | None
    comparisons: int
    flip_source: str
    max_flip_rate: float
    max_length_rho: float
    passed: bool
    reasons: list[str] = field(default_factory=list)

    def table(self) -> str:
        def fmt(v: float | None, spec: str = ".4f") -> str:
            return "n/a" if v is None else format(v, spec)

        lines = [
            f"audit of {self.judge} on {self.sample}: {self.items} items, {self.scored} scored, {self.failed} failed",
            f"  length-reward Spearman rho   {fmt(self.length_spearman):>8}   (|rho| <= {self.max_length_rho:g})",
            f"  length slope (per log char)  {fmt(self.length_slope):>8}",
            f"  position-flip rate           {fmt(self.flip_rate, '.2%'):>8}   (<= {self.max_flip_rate:.0%}; "
            f"{self.comparisons} comparisons, {self.flip_source})",
            ("PASS: " if self.passed else "FAIL: ") + "; ".join(self.reasons),
        ]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _slope(xs: list[float], ys: list[float]) -> float | None:
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def _llm_judge(obj: Any) -> Any:
    """The judge object of this package behind a built component, or None."""
    from .judges import LLMJudge

    return obj if isinstance(obj, LLMJudge) else None


def _pairs(examples: list[Any], limit: int) -> list[tuple[Any, Any]]:
    by_task: dict[str, list[Any]] = {}
    for e in examples:
        by_task.setdefault(json.dumps(e.task, sort_keys=True, default=str), []).append(e)
    out = []
    for group in by_task.values():
        for i in range(len(group)):
            for j in range(i + 1, len(group)):
                if response_text(group[i].response) != response_text(group[j].response):
                    out.append((group[i], group[j]))
                if len(out) >= limit:
                    return out
    return out


async def _pairwise_flips(
    judge_obj: Any, examples: list[Any], pairs: int, aux: dict[str, Any] | None
) -> tuple[list[float], str]:
    from .config import PairwiseConfig
    from .judges import PairwiseJudge

    keep = set(PairwiseConfig.keys()) - {"require_calibration", "reference_field", "scale"}
    comparer = PairwiseJudge(**{k: v for k, v in judge_obj.config.values().items() if k in keep})
    try:
        return await _compare_pairs(comparer, examples, pairs, aux)
    finally:
        comparer.close()


async def _compare_pairs(
    comparer: Any, examples: list[Any], pairs: int, aux: dict[str, Any] | None
) -> tuple[list[float], str]:
    from .prompts import show

    model = comparer.client.model_for(aux)
    chosen = _pairs(examples, pairs)

    async def one(a: Any, b: Any) -> float | None:
        from .client import JudgeFailed, Usage

        usage = Usage()
        first, second = show(a.response, comparer.config), show(b.response, comparer.config)
        try:
            forward, backward = await asyncio.gather(
                comparer.compare(a.task, first, second, model, usage),
                comparer.compare(a.task, second, first, model, usage),
            )
        except JudgeFailed:
            return None
        return float(forward == backward and forward != "tie")  # same position both times

    results = await asyncio.gather(*(one(a, b) for a, b in chosen))
    return [r for r in results if r is not None], "pairs of sample responses sharing a task, both orders"


async def audit_async(
    judge: Any,
    sample: str | Path,
    *,
    args: dict[str, Any] | None = None,
    auxiliary_models: dict[str, Any] | None = None,
    pairs: int = 50,
    max_flip_rate: float = 0.2,
    max_length_rho: float = 0.3,
    concurrency: int = 8,
    limit: int | None = None,
    registry: Any = None,
) -> AuditReport:
    """Score ``sample`` with ``judge`` and measure its length correlation and position-flip rate."""
    examples = load_examples(sample, require_label=False, limit=limit)
    bound = resolve_judge(judge, args, registry=registry, where=f"audit on {sample}")
    try:
        return await _audit(
            bound, judge, sample, examples, auxiliary_models, pairs, concurrency, max_flip_rate, max_length_rho
        )
    finally:
        bound.close()  # what was built for this audit (a judge's client and cache)


async def _audit(
    bound: Any,
    judge: Any,
    sample: str | Path,
    examples: list[Any],
    auxiliary_models: dict[str, Any] | None,
    pairs: int,
    concurrency: int,
    max_flip_rate: float,
    max_length_rho: float,
) -> AuditReport:
    outputs = await score_examples(bound, examples, auxiliary_models=auxiliary_models, concurrency=concurrency)
    lengths, rewards, flips_from_metrics = [], [], []
    for example, out in zip(examples, outputs):
        if out.status.value != "success":
            continue
        lengths.append(float(len(response_text(example.response))))
        rewards.append(float(out.reward))
        if "position_flip" in out.metrics:
            flips_from_metrics.append(float(out.metrics["position_flip"]))
    rho = spearman(lengths, rewards) if len(rewards) >= 2 else None
    slope = _slope([math.log1p(v) for v in lengths], rewards)
    flips: list[float] = []
    source = "not measurable for this judge (not an LLM judge of reinforge-judges-llm)"
    if flips_from_metrics:
        flips, source = flips_from_metrics, "the judge's own position_flip metric"
    elif _llm_judge(bound.func) is not None and pairs > 0:
        flips, source = await _pairwise_flips(bound.func, examples, pairs, auxiliary_models)
        if not flips:
            source = "no two sample responses share a task"
    flip_rate = sum(flips) / len(flips) if flips else None

    reasons = []
    passed = True
    if rho is None:
        passed = False
        reasons.append("length correlation undefined (fewer than 2 scored items, or constant lengths or rewards)")
    elif abs(rho) > max_length_rho:
        passed = False
        reasons.append(
            f"length-reward rho {rho:.3f} exceeds {max_length_rho:g}; consider args.length_normalization: true"
        )
    else:
        reasons.append(f"length-reward |rho| {abs(rho):.3f} <= {max_length_rho:g}")
    if flip_rate is not None:
        if flip_rate > max_flip_rate:
            passed = False
            reasons.append(f"position-flip rate {flip_rate:.1%} exceeds {max_flip_rate:.0%}")
        else:
            reasons.append(f"position-flip rate {flip_rate:.1%} <= {max_flip_rate:.0%}")
    label = judge if isinstance(judge, str) else bound.name
    return AuditReport(
        judge=str(label),
        sample=str(sample),
        items=len(examples),
        scored=len(rewards),
        failed=len(examples) - len(rewards),
        length_spearman=rho,
        length_slope=slope,
        flip_rate=flip_rate,
        comparisons=len(flips),
        flip_source=source,
        max_flip_rate=max_flip_rate,
        max_length_rho=max_length_rho,
        passed=passed,
        reasons=reasons,
    )


def audit(judge: Any, sample: str | Path, **options: Any) -> AuditReport:
    """Synchronous :func:`audit_async` (runs its own event loop)."""
    return asyncio.run(audit_async(judge, sample, **options))
