"""Agreement statistics in pure Python: Spearman's rho, Kendall's tau-b, Cohen's kappa.

Ties are handled the textbook way: Spearman ranks tied values by their average
rank, Kendall's tau-b corrects the denominator for ties in either variable.
A statistic that is undefined (a constant input, fewer than two items) is
``None``, never a made-up 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["cohen_kappa", "kendall_tau", "pearson", "rankdata", "spearman"]


def _check(x: Sequence[float], y: Sequence[float]) -> None:
    if len(x) != len(y):
        raise ValueError(f"the two sequences differ in length ({len(x)} and {len(y)})")


def rankdata(values: Sequence[float]) -> list[float]:
    """1-based ranks; tied values share the average of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        average = (i + j) / 2 + 1
        for k in range(i, j + 1):
            ranks[order[k]] = average
        i = j + 1
    return ranks


def pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Pearson's r, or None when either input is constant or shorter than 2."""
    _check(x, y)
    n = len(x)
    if n < 2:
        return None
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    if sxx <= 0 or syy <= 0:
        return None
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rho: Pearson's r of the average ranks (exact with ties)."""
    _check(x, y)
    return pearson(rankdata(x), rankdata(y))


def _tie_pairs(values: Sequence[float]) -> int:
    counts: dict[float, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return sum(t * (t - 1) // 2 for t in counts.values())


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Kendall's tau-b: (concordant - discordant) / sqrt((n0 - ties_x) * (n0 - ties_y))."""
    _check(x, y)
    n = len(x)
    if n < 2:
        return None
    concordant = discordant = 0
    for i in range(n):
        for j in range(i + 1, n):
            s = (x[i] - x[j]) * (y[i] - y[j])
            if s > 0:
                concordant += 1
            elif s < 0:
                discordant += 1
    n0 = n * (n - 1) // 2
    denominator = (n0 - _tie_pairs(x)) * (n0 - _tie_pairs(y))
    if denominator <= 0:
        return None
    return (concordant - discordant) / math.sqrt(denominator)


def cohen_kappa(
    a: Sequence[object], b: Sequence[object], *, categories: Sequence[object] | None = None, weights: str | None = None
) -> float | None:
    """Cohen's kappa of two raters' category labels.

    :param categories: the ordered category set; by default the sorted union of
        both label sets. Needed for weighted kappa, where distance is the
        difference of positions in this order.
    :param weights: None (unweighted), ``"linear"`` or ``"quadratic"``.
    :return: kappa, or None when chance agreement is total (both raters use one
        and the same category throughout) or there are no items.
    """
    if len(a) != len(b):
        raise ValueError(f"the two raters labelled different numbers of items ({len(a)} and {len(b)})")
    if weights not in (None, "linear", "quadratic"):
        raise ValueError(f"weights must be None, 'linear' or 'quadratic', got {weights!r}")
    n = len(a)
    if n == 0:
        return None
    cats = list(categories) if categories is not None else sorted(set(a) | set(b), key=_sort_key)
    index = {c: i for i, c in enumerate(cats)}
    missing = sorted({str(v) for v in (*a, *b) if v not in index})
    if missing:
        raise ValueError(f"labels {missing} are not among the categories {cats}")
    k = len(cats)
    observed = [[0.0] * k for _ in range(k)]
    for u, v in zip(a, b):
        observed[index[u]][index[v]] += 1.0 / n
    row = [sum(observed[i]) for i in range(k)]
    col = [sum(observed[i][j] for i in range(k)) for j in range(k)]

    def weight(i: int, j: int) -> float:  # disagreement weight
        if weights is None:
            return 0.0 if i == j else 1.0
        d = abs(i - j) / max(k - 1, 1)
        return d if weights == "linear" else d * d

    disagree_observed = sum(weight(i, j) * observed[i][j] for i in range(k) for j in range(k))
    disagree_expected = sum(weight(i, j) * row[i] * col[j] for i in range(k) for j in range(k))
    if disagree_expected <= 0:
        return None
    return 1.0 - disagree_observed / disagree_expected


def _sort_key(value: object) -> tuple[int, object]:
    return (0, value) if isinstance(value, (int, float)) else (1, str(value))
