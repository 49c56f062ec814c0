"""Baselines for ungrouped rewards: what production traffic gives a policy-gradient update.

Offline GRPO samples a group of answers per prompt and subtracts the group's mean. Live traffic
has one answer per request, so the baseline has to come from elsewhere:

- ``running``: an exponential moving average of every reward seen so far.
- ``cluster`` (the default): a moving average per *prompt cluster*, the conversation a trace's
  first call was asked (its messages, whitespace collapsed). A cluster with fewer than ``min_count``
  past rewards is not trusted yet: when the batch holds other traces of the same cluster their
  leave-one-out mean is used (GRPO's group baseline, when users repeat a question), else the
  running average of all rewards.

Before any history exists, the batch's own mean stands in for the running average. Baselines are
computed from the state *before* the batch and then updated with it, so a batch sent twice gets the
same advantages. With ``scale: std`` advantages are divided by the running standard deviation of
rewards (never below ``1e-3``). The state is plain JSON: the local committer saves it with each
checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["BASELINES", "SCALES", "Baseline", "cluster_key"]

BASELINES = ("cluster", "running")
SCALES = ("none", "std")
MIN_STD = 1e-3


def cluster_key(messages: Sequence[Any]) -> str:
    """A stable key for a conversation: a hash of its roles and contents, whitespace collapsed."""
    parts = []
    for m in messages:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if not isinstance(content, str):
            content = json.dumps(content, sort_keys=True, separators=(",", ":"))
        parts.append([str(m.get("role", "")), " ".join(content.split())])
    blob = json.dumps(parts, separators=(",", ":"), ensure_ascii=False).encode()
    return hashlib.blake2b(blob, digest_size=12).hexdigest()


class Baseline:
    """Advantages of a batch of (cluster, reward) pairs, and the moving averages they update.

    :param kind: ``cluster`` or ``running`` (see the module docstring).
    :param decay: weight of the history in each moving average (0: only the newest reward counts).
    :param min_count: past rewards a cluster needs before its own average is its baseline.
    :param max_clusters: clusters remembered (the least recently seen are forgotten first).
    :param scale: ``none`` or ``std``.
    :param state: a saved :meth:`state` to continue from.
    """

    def __init__(
        self,
        kind: str = "cluster",
        *,
        decay: float = 0.9,
        min_count: int = 2,
        max_clusters: int = 10000,
        scale: str = "none",
        state: dict[str, Any] | None = None,
    ) -> None:
        if kind not in BASELINES:
            raise ValueError(f"baseline kind: expected one of {BASELINES}, got {kind!r}")
        if scale not in SCALES:
            raise ValueError(f"baseline scale: expected one of {SCALES}, got {scale!r}")
        self.kind = kind
        self.decay = decay
        self.min_count = min_count
        self.max_clusters = max_clusters
        self.scale = scale
        state = state or {}
        self.count = int(state.get("count", 0))
        self.mean = float(state.get("mean", 0.0))
        self.var = float(state.get("var", 0.0))
        # cluster -> [count, mean], in least-recently-seen-first order
        self.clusters: dict[str, list[float]] = {
            k: [float(v[0]), float(v[1])] for k, v in state.get("clusters", {}).items()
        }

    def state(self) -> dict[str, Any]:
        """The moving averages as JSON-able data (what :class:`Baseline` takes back as ``state``)."""
        return {
            "kind": self.kind,
            "count": self.count,
            "mean": self.mean,
            "var": self.var,
            "clusters": {k: [int(v[0]), v[1]] for k, v in self.clusters.items()},
        }

    def advantages(self, items: Sequence[tuple[str, float]]) -> list[float]:
        """One advantage per ``(cluster, reward)``, from the state before this batch."""
        if not items:
            return []
        rewards = [r for _, r in items]
        overall = self.mean if self.count else sum(rewards) / len(rewards)
        same: dict[str, list[float]] = {}
        for key, r in items:
            same.setdefault(key, []).append(r)
        out = []
        for key, r in items:
            base = overall
            if self.kind == "cluster":
                seen = self.clusters.get(key)
                peers = same[key]
                if seen is not None and seen[0] >= self.min_count:
                    base = seen[1]
                elif len(peers) > 1:
                    base = (sum(peers) - r) / (len(peers) - 1)
            out.append(r - base)
        if self.scale == "std":
            std = math.sqrt(self.var) if self.count > 1 else _std(rewards)
            out = [a / max(std, MIN_STD) for a in out]
        return out

    def update(self, items: Sequence[tuple[str, float]]) -> None:
        """Fold a batch's rewards into the moving averages (after :meth:`advantages`)."""
        d = self.decay
        for key, r in items:
            if self.count == 0:
                self.mean, self.var = r, 0.0
            else:
                delta = r - self.mean
                self.mean += (1 - d) * delta
                self.var = d * (self.var + (1 - d) * delta * delta)
            self.count += 1
            if self.kind == "cluster":
                seen = self.clusters.pop(key, None)  # re-inserted last: the most recently seen
                if seen is None:
                    seen = [1.0, r]
                else:
                    seen = [seen[0] + 1, seen[1] + (1 - d) * (r - seen[1])]
                self.clusters[key] = seen
        while len(self.clusters) > self.max_clusters:
            del self.clusters[next(iter(self.clusters))]


def _std(values: Sequence[float]) -> float:
    if len(values) < 2:
        return 0.0
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))
