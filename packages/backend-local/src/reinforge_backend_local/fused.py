"""Decode-time fusion of the projections that read the same input (q/k/v, gate/up).

At decode shapes (a few dozen rows) one wider matmul runs faster than three
narrow ones. During a decode the attention's ``q_proj``/``k_proj``/``v_proj``
(and the MLP's ``gate_proj``/``up_proj``) are swapped for views of one fused
product, and put back afterwards; training never sees the swap. The fused
weights are rebuilt for every decode (a copy of ~0.3 GB at 135M: cheap next
to the decode, and never stale after a LoRA merge). A LoRA layer is fused only
while its adapter is merged or switched off, so an active adapter is never
dropped. Architectures without these modules are left alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _linear(module: Any) -> Any:
    """The plain Linear behind a module (a peft LoraLayer's base layer, whose weight holds the merge)."""
    return getattr(module, "base_layer", module)


class _Fused:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, sizes: list[int]):
        self.weight, self.bias, self.sizes = weight, bias, sizes
        self._x: torch.Tensor | None = None
        self._parts: tuple[torch.Tensor, ...] = ()

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        if self._x is not x:  # the first of the group computes all of them
            self._parts = torch.nn.functional.linear(x, self.weight, self.bias).split(self.sizes, dim=-1)
            self._x = x
        return self._parts[index]


class _Part(nn.Module):
    def __init__(self, fused: _Fused, index: int):
        super().__init__()
        self.fused, self.index = fused, index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.part(x, self.index)


class FusedProjections:
    """Finds the fusable projection groups of a model; ``active()`` swaps fused views in."""

    def __init__(self, model: Any):
        self.sites: list[tuple[Any, tuple[str, ...]]] = []
        for module in model.modules():
            for names in GROUPS:
                if all(isinstance(_linear(getattr(module, n, None)), nn.Linear) for n in names):
                    self.sites.append((module, names))

    @staticmethod
    def _fusable(module: Any) -> bool:
        if module is _linear(module):
            return True
        return bool(getattr(module, "disable_adapters", False) or getattr(module, "merged", False))

    @staticmethod
    def _fuse(group: list[Any]) -> _Fused:
        weight = torch.cat([lin.weight.detach() for lin in group], dim=0)
        biases = [lin.bias for lin in group]
        bias = torch.cat([b.detach() for b in biases]) if all(b is not None for b in biases) else None
        return _Fused(weight, bias, [lin.out_features for lin in group])

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        if not self.sites:
            yield
            return
        originals = []
        try:
            for module, names in self.sites:
                parts = [getattr(module, n) for n in names]
                if not all(self._fusable(p) for p in parts):
                    continue
                fused = self._fuse([_linear(p) for p in parts])
                for i, name in enumerate(names):
                    originals.append((module, name, getattr(module, name)))
                    setattr(module, name, _Part(fused, i))
            yield
        finally:
            for module, name, original in originals:
                setattr(module, name, original)
