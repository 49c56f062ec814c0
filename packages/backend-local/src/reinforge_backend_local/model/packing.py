"""Weights in oneDNN's prepacked layout, for the decoder and for frozen layers in training.

On this project's reference CPU, a matmul against a prepacked weight beats
``F.linear`` at every shape a step uses: 1.4x for the layers and 2.5x for
the LM head at decode shapes (32 rows), 1.2-1.4x and 1.8x at training shapes
(~500 rows). A packed copy is made once per weight and kept until the weight
changes (in-place updates bump its version; a swapped tensor has another
address, and the entry holds the old storage so that address cannot be
reused unnoticed). Frozen weights (the base model under LoRA) never change,
so they are packed once per run.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from reinforge.plugin import ConfigError

_KEEP = 2  # packed versions per module: the base weights and, while decoding, the LoRA-merged ones


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AMX tiles or AVX512-BF16), where bf16 matmuls pay.

    A CPU feature query, no tensor work. Without these instructions oneDNN emulates bf16 and it
    runs slower than float32 (an AVX2-only CPU: ``generate`` in bf16 at a third of its float32 speed).
    """
    cpu = getattr(torch, "cpu", None)
    return any(
        bool(getattr(cpu, probe, lambda: False)()) for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    )


@functools.cache
def bf16_packable() -> bool:
    """Whether oneDNN packs and multiplies bf16 weights on this CPU at all (AVX512BW/VL/DQ or AVX-NE-CONVERT).

    An AVX2-only CPU has neither: there ``mkldnn_reorder_linear_weight`` refuses a bf16 weight.
    """
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def resolve_matmul_dtype(setting: str) -> str:
    """``float32`` or ``bfloat16`` for ``backend_args.matmul_dtype`` on prepacked CPU weights.

    ``auto``: bf16 where it pays (a CPU with native bf16 that oneDNN packs for), else float32.

    :raises ConfigError: ``bfloat16`` on a CPU oneDNN cannot pack bf16 weights for.
    """
    if setting == "auto":
        return "bfloat16" if native_bf16() and bf16_packable() else "float32"
    if setting == "bfloat16" and not bf16_packable():
        raise ConfigError(
            "backend_args.matmul_dtype: bfloat16 needs a CPU oneDNN packs bf16 weights for (AVX512BW/VL/DQ or"
            " AVX-NE-CONVERT); this one has neither: use float32 (the default) or auto"
        )
    return setting


@functools.cache
def available() -> bool:
    """oneDNN linear with a prepacked weight works here (and gives ``F.linear``'s result)."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        w, x = torch.randn(8, 16), torch.randn(3, 16)
        packed = torch.ops.mkldnn._reorder_linear_weight(w)
        y = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
        return bool(torch.allclose(y, F.linear(x, w), atol=1e-4))
    except (AttributeError, RuntimeError, TypeError):
        return False


def _version(t: torch.Tensor) -> int:
    """In-place updates bump this; inference tensors have no counter (they are new tensors when changed)."""
    return -1 if t.is_inference() else t._version


_Version = tuple[list[torch.Tensor], list[int], torch.Tensor]  # the weights held, their versions, the packed copy


def _cached(
    versions: list[_Version],
    weights: Sequence[torch.Tensor],
    combine: Any,
    dtype: torch.dtype | None = None,
    packed: bool = True,
) -> torch.Tensor:
    """The packed ``combine(weights)`` (in ``dtype``; not packed unless ``packed``) from ``versions``
    while the weights are unchanged, else made anew.

    The entry used last goes last, so a new version evicts the least recently used one
    (the base weights survive each decode phase's merge). Holding the weights keeps their
    addresses from being reused unnoticed.
    """
    now = [_version(w) for w in weights]
    for k, (held, held_versions, copy) in enumerate(versions):
        if held_versions == now and all(h.data_ptr() == w.data_ptr() for h, w in zip(held, weights)):
            versions.append(versions.pop(k))
            return copy
    held = [w.detach() for w in weights]
    combined = combine(held)
    combined = combined if dtype is None else combined.to(dtype)
    copy = pack(combined) if packed else combined
    versions.append((held, now, copy))
    del versions[:-_KEEP]
    return copy


class Packer:
    """Packed copies of module weights, shared by everything that runs the model."""

    def __init__(self, compute_dtype: torch.dtype | None = None) -> None:
        # packed copies in this dtype (bfloat16: the matmuls' products in it, their sums in float32), else the weights'
        self.compute_dtype = compute_dtype
        self.entries: dict[int, list[_Version]] = {}
        self.pinned: dict[int, torch.Tensor] = {}  # owners whose plain weight is gone: this is their weight
        self.groups: dict[tuple[int, ...], torch.Tensor] = {}  # owners served as one matmul: their stacked weight
        self.grouped: dict[int, tuple[int, ...]] = {}  # owner -> the key of its group
        # projections stacked for decoding while their weights stay as they are (a run's frozen or merged weights)
        self.stacks: dict[tuple[int, ...], list[_Version]] = {}
        self.lows: dict[int, list[_Version]] = {}  # plain compute_dtype copies, for the input gradient in training

    def pin(self, owner: Any, packed: torch.Tensor) -> None:
        """Make ``packed`` the weight of ``owner`` whatever its ``weight`` attribute holds (a server drops those)."""
        self.entries.pop(id(owner), None)  # an entry holds the plain weight: let it go
        self.pinned[id(owner)] = packed

    def pin_group(self, owners: Sequence[Any], packed: torch.Tensor) -> None:
        """Make ``packed`` (the owners' weights stacked along the output axis) their one weight.

        Projections that read the same input (a layer's q, k and v; gate and up) then run as
        one matmul: fewer, wider calls, which is most of what a decode step at small batch
        loses to per-call overhead. Each owner's own packed copy goes, so memory stays one
        copy of every weight; asking for an owner's weight alone is then an error.
        """
        key = tuple(id(o) for o in owners)
        for o in owners:
            self.entries.pop(id(o), None)
            self.pinned.pop(id(o), None)
            self.grouped[id(o)] = key
        self.groups[key] = packed

    def group(self, owners: Sequence[Any]) -> torch.Tensor | None:
        """The stacked packed weight of exactly ``owners`` (in that order), if they were pinned as a group."""
        return self.groups.get(tuple(id(o) for o in owners))

    def stacked(self, owners: Sequence[Any], weights: Sequence[torch.Tensor]) -> torch.Tensor | None:
        """``weights`` (of ``owners``, one input) stacked along the output axis and packed, or ``None``.

        Kept, like :meth:`packed`, until one of the weights changes (the base weights and,
        while decoding, the LoRA-merged ones), so a run's decoder runs a layer's q, k and v
        (gate and up) as one matmul without stacking them again each batch.
        """
        if not all(packable(w) and w.dtype == weights[0].dtype for w in weights):
            return None
        return _cached(self.stacks.setdefault(tuple(id(o) for o in owners), []), weights, torch.cat, self.compute_dtype)

    def packed(self, owner: Any, weight: torch.Tensor) -> torch.Tensor | None:
        """``weight`` (of ``owner``) prepacked, or ``None`` where packing does not apply."""
        if id(owner) in self.grouped:
            raise RuntimeError(
                f"the weight of {type(owner).__name__} {tuple(weight.shape)} is served stacked with others "
                "(Packer.pin_group): it runs through the decoder's fused projections only"
            )
        pinned = self.pinned.get(id(owner))
        if pinned is not None:
            return pinned
        if not packable(weight):
            return None
        return _cached(self.entries.setdefault(id(owner), []), [weight], lambda held: held[0], self.compute_dtype)

    def low(self, owner: Any, weight: torch.Tensor) -> torch.Tensor | None:
        """``weight`` (of ``owner``) as a plain ``compute_dtype`` copy, kept like :meth:`packed`; ``None`` without one."""
        if self.compute_dtype is None or weight.dtype == self.compute_dtype:
            return None
        return _cached(self.lows.setdefault(id(owner), []), [weight], lambda held: held[0], self.compute_dtype, False)


def packable(weight: torch.Tensor) -> bool:
    """Whether ``weight`` can run prepacked here (a float32 or bfloat16 CPU tensor, oneDNN available)."""
    return weight.dtype in (torch.float32, torch.bfloat16) and weight.is_cpu and available()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` in oneDNN's blocked layout (what :class:`Packer` keeps)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x Wᵀ + b`` for a weight packed by :class:`Packer`; in the packed copy's dtype, returned in ``x``'s."""
    if packed.dtype != x.dtype:  # Packer(compute_dtype): x rounded to it, the result back to x's dtype
        low = None if bias is None else bias.to(packed.dtype)
        return torch.ops.mkldnn._linear_pointwise(x.to(packed.dtype).contiguous(), packed, low, "none", [], "").to(
            x.dtype
        )
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


class _FrozenLinear(torch.autograd.Function):
    """``y = x Wᵀ + b`` with a prepacked W that gets no gradient; only ``x`` does.

    Given ``low`` (W in the packer's compute dtype), the input gradient multiplies in it too.
    """

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: Any, packed: torch.Tensor, low: torch.Tensor | None
    ) -> torch.Tensor:
        ctx.save_for_backward(weight if low is None else low)
        return packed_linear(x, packed, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        (weight,) = ctx.saved_tensors
        grad_x = None
        if ctx.needs_input_grad[0]:  # in the saved weight's dtype (``low``: bf16), returned in the gradient's
            grad_x = (grad.to(weight.dtype) @ weight).to(grad.dtype)
        return grad_x, None, None, None, None


def install(model: Any, packer: Packer) -> int:
    """Run every frozen ``nn.Linear`` of ``model`` on packed weights; returns how many were switched.

    A layer whose weight (or bias) requires grad, or is not a float CPU
    tensor, keeps ``F.linear`` at call time, so full fine-tuning is untouched.
    """
    count = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear and "forward" not in vars(module):
            module.forward = types.MethodType(_forward, module)
            module._reinforge_packer = packer
            count += 1
    return count


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    w, b = self.weight, self.bias
    if not w.requires_grad and (b is None or not b.requires_grad) and x.dtype == w.dtype:
        packer = self._reinforge_packer
        packed = packer.packed(self, w)
        if packed is not None:
            return _FrozenLinear.apply(x, w, b, packed, packer.low(self, w))
    return F.linear(x, w, b)
