"""Length normalization: remove a judge's fitted preference for longer responses.

The trend is an ordinary least-squares line of normalized score on
``log(1 + characters)`` over the last ``window`` distinct judgments (a cached
rerun of the same judgment does not count twice). Only a positive slope is
removed: a judge that prefers longer answers teaches the policy to pad, one
that prefers shorter answers does not. The adjusted score is
``score - slope * (x - mean(x))``, clipped to [0, 1]; before ``min_samples``
judgments have been seen nothing is adjusted. A fixed ``slope`` (e.g. from
``reinforge judge audit``) replaces the fit.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict

__all__ = ["LengthTrend"]


class LengthTrend:
    def __init__(self, window: int = 512, min_samples: int = 16, slope: float | None = None) -> None:
        self.window = window
        self.min_samples = min_samples
        self.fixed_slope = slope
        self._points: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._points)

    def slope(self) -> float | None:
        """The current fitted slope per unit of log(1 + chars), or None before ``min_samples``."""
        with self._lock:
            return self._fit()[0]

    def _fit(self) -> tuple[float | None, float]:
        n = len(self._points)
        if n == 0:
            return None, 0.0
        xs = [p[0] for p in self._points.values()]
        ys = [p[1] for p in self._points.values()]
        mean_x = sum(xs) / n
        if self.fixed_slope is not None:
            return self.fixed_slope, mean_x
        if n < self.min_samples:
            return None, mean_x
        mean_y = sum(ys) / n
        sxx = sum((x - mean_x) ** 2 for x in xs)
        if sxx <= 0:
            return 0.0, mean_x
        return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sxx, mean_x

    def adjust(self, key: str, length: int, score: float) -> tuple[float, float]:
        """Record ``(length, score)`` under ``key`` and return ``(adjusted score, adjustment)``."""
        x = math.log1p(max(length, 0))
        with self._lock:
            self._points[key] = (x, score)
            self._points.move_to_end(key)
            while len(self._points) > self.window:
                self._points.popitem(last=False)
            slope, center = self._fit()
        if slope is None or slope <= 0:
            return score, 0.0
        adjusted = min(1.0, max(0.0, score - slope * (x - center)))
        return adjusted, adjusted - score
