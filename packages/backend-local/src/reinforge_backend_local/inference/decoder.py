"""A hand-written forward for Llama-family models over a preallocated KV cache.

Hugging Face's forward is general; at decode shapes on a CPU its generality
(a growing cache, mask construction per layer) costs as much as the matmuls
it wraps. This one runs the same arithmetic (the tests hold it to the HF
logits) for the architectures it knows, and adds two things the HF cache
cannot do: the prefix every prompt of a batch shares (system prompt, chat
template) is prefilled once, and identical prompts (a GRPO group) are
prefilled once and their cache copied to every row of the group.

LoRA adapters that are live (not merged, not disabled) are applied unmerged,
so the decoder is exact whether or not the caller merged them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..model.packing import Packer, packed_linear

SUPPORTED_TYPES = {"llama", "mistral", "qwen2"}
MIN_SHARED_PREFIX = 4  # below this a separate prefix pass costs more than it saves


def unsupported_reason(model: Any) -> str | None:
    """Why ``model`` cannot use the decoder, or ``None`` when it can."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg: Any = getattr(base, "config", None)
    kind = getattr(cfg, "model_type", None)
    if kind not in SUPPORTED_TYPES:
        return f"model type {kind!r} (the decoder knows {sorted(SUPPORTED_TYPES)})"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r}"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return "sliding-window attention"
    inner: Any = getattr(base, "model", None)
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(inner, name):
            return f"no model.{name}"
    for layer in inner.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is None or mlp is None or hasattr(attn, "q_norm"):
            return "an attention or MLP block it does not know"
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            if not hasattr(attn, name):
                return f"no self_attn.{name}"
        for name in ("gate_proj", "up_proj", "down_proj"):
            if not hasattr(mlp, name):
                return f"no mlp.{name}"
    if not hasattr(base, "lm_head"):
        return "no lm_head"
    return None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's Llama RMSNorm, op for op (so bit-identical to it in float32).

    ``F.rms_norm`` gives the same numbers but, at decode shapes, costs two to three
    times as much on a CPU (it is dispatched as a composite of more, smaller ops).
    """
    if x.dtype != torch.float32:  # HF computes these in float32: F.rms_norm does too
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True).add_(eps)) * weight


def decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention of one new token per row over its cached keys: ``(rows, heads * head_dim)``.

    ``q``: (rows, heads, head_dim); ``keys``/``values``: (rows, kv_heads, slots, head_dim), any
    strides a cache slice has; ``mask``: additive, broadcastable to (rows, 1, 1, slots). At one
    query per row, two batched matmuls and a softmax run in about 0.6x the time of
    ``scaled_dot_product_attention``'s CPU kernel: the query heads that share a key head are
    one matrix, so keys are read once per key head and never repeated.
    """
    rows, heads, dim = q.shape
    kv_heads = keys.shape[1]
    grouped = q.reshape(rows, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(grouped, keys.transpose(-1, -2)).mul_(scale).add_(mask)
    weights = scores.softmax(-1, dtype=torch.float32).to(values.dtype)  # as the fused kernel: in float32
    return torch.matmul(weights, values).view(rows, heads * dim)


@dataclass
class _Linear:
    weight: torch.Tensor | None  # None when only the packed copy exists
    bias: torch.Tensor | None
    lora: list[tuple[torch.Tensor, torch.Tensor, float]]
    packed: torch.Tensor | None = None  # the weight in oneDNN's blocked layout

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            y = packed_linear(x, self.packed, self.bias)
        else:
            assert self.weight is not None
            y = F.linear(x, self.weight, self.bias)
        for a, b, scale in self.lora:
            y = y.add_(F.linear(F.linear(x, a), b), alpha=scale)
        return y


def _linear(module: Any, packer: Packer | None) -> _Linear:
    """The module's effective weights right now, with any live LoRA adapter kept as factors."""
    base = _base_layer(module)
    packed = packer.packed(base, base.weight) if packer is not None else None
    return _Linear(base.weight, base.bias, _lora_factors(module), packed)


def _lora_factors(module: Any) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """``(A, B, scale)`` of each live adapter of a (PEFT-wrapped) module; none when disabled or merged."""
    if _base_layer(module) is module or getattr(module, "disable_adapters", False) or getattr(module, "merged", False):
        return []
    return [
        (module.lora_A[name].weight, module.lora_B[name].weight, float(module.scaling[name]))
        for name in module.active_adapters
        if name in module.lora_A
    ]


def _base_layer(module: Any) -> Any:
    return module.get_base_layer() if hasattr(module, "get_base_layer") else module


@dataclass
class _Projections:
    """Linear maps of one input (q, k, v; gate, up): one matmul over their stacked weights when
    they were pinned as a group (:meth:`Packer.pin_group`), else one each."""

    parts: list[_Linear]
    sizes: list[int] | None = None  # output widths, when ``parts`` is the one stacked map

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.sizes is not None:
            return self.parts[0](x).split(self.sizes, dim=-1)
        return tuple(p(x) for p in self.parts)


def _projections(modules: tuple[Any, ...], packer: Packer | None) -> _Projections:
    bases = tuple(_base_layer(m) for m in modules)
    stacked = packer.group(bases) if packer is not None else None
    if stacked is None:
        # weights as they are for a while (frozen, or LoRA merged for a decode phase): stacked once, kept;
        # live LoRA factors run one matmul per projection, each adding its own
        if packer is not None and not any(_lora_factors(m) for m in modules):
            stacked = packer.stacked(bases, [b.weight for b in bases])
        if stacked is None:
            return _Projections([_linear(m, packer) for m in modules])
    elif any(b is not m for b, m in zip(bases, modules)):  # a LoRA wrapper: the pinned weight cannot carry it
        raise RuntimeError("projections pinned as a group must be plain linear layers (merge the adapter first)")
    biases = [b.bias for b in bases]
    bias = None
    if any(x is not None for x in biases):
        bias = torch.cat([x if x is not None else b.weight.new_zeros(b.out_features) for x, b in zip(biases, bases)])
    return _Projections([_Linear(None, bias, [], stacked)], [b.out_features for b in bases])


def projection_groups(model: Any) -> list[tuple[Any, ...]]:
    """The linear layers that read the same input, per layer: ``(q, k, v)`` and ``(gate, up)``.

    A server pins each group's stacked weight (:meth:`Packer.pin_group`) so a decode step runs
    four matmuls per layer instead of seven.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    groups: list[tuple[Any, ...]] = []
    for layer in base.model.layers:
        a, m = layer.self_attn, layer.mlp
        groups += [(a.q_proj, a.k_proj, a.v_proj), (m.gate_proj, m.up_proj)]
    return groups


@dataclass
class _Layer:
    ln_in: torch.Tensor
    ln_post: torch.Tensor
    qkv: _Projections
    o: _Linear
    gate_up: _Projections
    down: _Linear


class KVCache:
    """Keys and values for ``rows`` sequences and ``slots`` positions: one tensor each, all layers.

    The tensors may be allocated for more rows than are live (``k``/``v`` are views of the
    first ``rows``), so a request joining a running batch is written in place.
    """

    def __init__(
        self,
        layers: int,
        rows: int,
        kv_heads: int,
        slots: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        row_capacity: int | None = None,
    ) -> None:
        shape = (layers, max(rows, row_capacity or 0), kv_heads, slots, head_dim)
        self.store_k = torch.empty(shape, dtype=dtype, device=device)
        self.store_v = torch.empty(shape, dtype=dtype, device=device)
        self.rows = rows
        self.k, self.v = self.store_k[:, :rows], self.store_v[:, :rows]

    @property
    def row_capacity(self) -> int:
        return self.store_k.shape[1]

    @property
    def slots(self) -> int:
        return self.store_k.shape[3]

    def set_rows(self, rows: int) -> None:
        self.rows = rows
        self.k, self.v = self.store_k[:, :rows], self.store_v[:, :rows]

    def keep(self, rows: list[int], used: int) -> None:
        """Keep ``rows`` (ascending), in place: each moves down over a dropped one; only ``used`` slots are copied."""
        for j, r in enumerate(rows):
            if r != j:
                self.store_k[:, j, :, :used] = self.store_k[:, r, :, :used]
                self.store_v[:, j, :, :used] = self.store_v[:, r, :, :used]
        self.set_rows(len(rows))


Prefix = tuple[tuple[int, ...], torch.Tensor, torch.Tensor]  # token ids, keys and values (layers, 1, heads, n, dim)


class KnownTokens:
    """Keys and values already computed for the first ``length`` tokens of a prompt (an episode's last call).

    Held as pieces covering consecutive positions from 0, e.g. a batch's shared prefix (one
    object for all its rows) and one row's own tail, so episodes do not each copy the prefix.
    """

    def __init__(self, pieces: Sequence[tuple[int, torch.Tensor, torch.Tensor]], length: int) -> None:
        self.pieces = list(pieces)  # (first position, keys, values), keys (layers, heads, n, dim)
        self.length = length

    def kv(self, a: int, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions ``a:b`` (layers, heads, b - a, dim)."""
        ks, vs = [], []
        for first, k, v in self.pieces:
            lo, hi = max(a, first), min(b, first + k.shape[2])
            if lo < hi:
                ks.append(k[:, :, lo - first : hi - first])
                vs.append(v[:, :, lo - first : hi - first])
        if sum(k.shape[2] for k in ks) != b - a:
            raise ValueError(f"positions {a}:{b} are not all known (known: {self.length})")
        return (ks[0], vs[0]) if len(ks) == 1 else (torch.cat(ks, dim=2), torch.cat(vs, dim=2))


class LlamaDecoder:
    """Prefill and one-token steps for a Llama-family causal LM; weights are read at ``session`` time."""

    def __init__(self, model: Any, packer: Packer | None = None) -> None:
        reason = unsupported_reason(model)
        if reason:
            raise ValueError(f"the fast decoder does not support this model: {reason}")
        self.model = model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.base = base
        cfg = base.config
        self.n_heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.hidden = cfg.hidden_size
        self.layers = len(base.model.layers)
        attn = base.model.layers[0].self_attn
        self.scale = float(getattr(attn, "scaling", self.head_dim**-0.5))
        norm = base.model.norm
        self.eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
        self.gqa = _sdpa_has_gqa()
        self.packer = packer

    def session(self) -> DecodeSession:
        """A snapshot of the current weights (merged or not) for one batch."""
        inner = self.base.model

        packer = self.packer
        layers = []
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            layers.append(
                _Layer(
                    layer.input_layernorm.weight,
                    layer.post_attention_layernorm.weight,
                    _projections((a.q_proj, a.k_proj, a.v_proj), packer),
                    _linear(a.o_proj, packer),
                    _projections((m.gate_proj, m.up_proj), packer),
                    _linear(m.down_proj, packer),
                )
            )
        head = _linear(self.base.lm_head, packer)
        return DecodeSession(self, layers, inner.embed_tokens.weight, inner.norm.weight, head)


class DecodeSession:
    """One batch: prefill (shared prefix, then each distinct prompt once), then steps with row compaction."""

    def __init__(
        self, dec: LlamaDecoder, layers: list[_Layer], embed: torch.Tensor, norm: torch.Tensor, head: _Linear
    ) -> None:
        self.dec = dec
        self.layers = layers
        self.embed = embed
        self.norm = norm
        self.head = head
        self.dtype = embed.dtype
        self.device = embed.device
        self.cache: KVCache | None = None
        self.mask: torch.Tensor | None = None  # (rows, slots) additive: 0 visible, -inf not
        self.pos: torch.Tensor | None = None  # next position per row
        self.start: torch.Tensor | None = None  # first slot of each row's sequence (rows that joined later start later)
        self.slot = 0  # next slot to write (the same for every row)
        self.computed_prefix: Prefix | None = None  # the shared prefix the last prefill computed, for reuse
        self.shared = 0  # the shared prefix length of the last prefill
        self.prefix_hits = 0  # prompt tokens whose keys and values were reused, not computed

    def fresh(self) -> DecodeSession:
        """An empty session on the same weight snapshot: it prefills requests that then :meth:`join` this one."""
        return DecodeSession(self.dec, self.layers, self.embed, self.norm, self.head)

    @property
    def rows(self) -> int:
        return 0 if self.cache is None else self.cache.rows

    # -- the model --------------------------------------------------------------------------

    def _forward(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        cache: KVCache,
        start: int,
        mask: torch.Tensor | None,
        first: int = 0,
    ) -> torch.Tensor:
        """Run ``ids`` (rows, T) at ``pos``, writing slots ``start:start+T``; the last hidden state per row.

        Attention reads slots ``first:start+T`` (``mask`` covers just those): no row sees a slot
        before ``first``, so the dead slots in front of a batch whose first rows left are not read.
        """
        dec = self.dec
        rows, t = ids.shape
        end = start + t
        h = F.embedding(ids, self.embed)
        cos, sin = dec.base.model.rotary_emb(h, pos)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (rows, 1, T, head_dim)
        half = dec.head_dim // 2
        nh, kvh, hd = dec.n_heads, dec.kv_heads, dec.head_dim

        def rope(x: torch.Tensor) -> torch.Tensor:
            return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

        causal = mask is None and start == 0 and t > 1
        for i, layer in enumerate(self.layers):
            x = rms_norm(h, layer.ln_in, dec.eps)
            q, k, v = layer.qkv(x)
            q = q.view(rows, t, nh, hd).transpose(1, 2)
            k = k.view(rows, t, kvh, hd).transpose(1, 2)
            v = v.view(rows, t, kvh, hd).transpose(1, 2)
            cache.k[i, :, :, start:end] = rope(k)
            cache.v[i, :, :, start:end] = v
            keys, values = cache.k[i, :, :, first:end], cache.v[i, :, :, first:end]
            if t == 1 and mask is not None:  # a decode step: one query per row
                o = decode_attention(rope(q).reshape(rows, nh, hd), keys, values, mask, dec.scale)
                h = h + layer.o(o).view(rows, 1, nh * hd)
            else:
                if not dec.gqa and kvh != nh:
                    keys = keys.repeat_interleave(nh // kvh, dim=1)
                    values = values.repeat_interleave(nh // kvh, dim=1)
                extra = {"enable_gqa": True} if dec.gqa and kvh != nh else {}
                o = F.scaled_dot_product_attention(
                    rope(q), keys, values, attn_mask=mask, is_causal=causal, scale=dec.scale, **extra
                )
                h = h + layer.o(o.transpose(1, 2).reshape(rows, t, nh * hd))
            x = rms_norm(h, layer.ln_post, dec.eps)
            gate, up = layer.gate_up(x)
            h = h + layer.down(F.silu(gate) * up)
        return rms_norm(h[:, -1], self.norm, dec.eps)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(h).float()

    # -- a batch ----------------------------------------------------------------------------

    def prefill(
        self,
        prompts: list[list[int]],
        row_src: list[int],
        capacity: int,
        *,
        row_capacity: int | None = None,
        prefix: Prefix | None = None,
        known: Sequence[KnownTokens | None] | None = None,
    ) -> torch.Tensor:
        """Prefill the distinct ``prompts``; row ``r`` continues prompt ``row_src[r]``.

        ``capacity`` is the number of new tokens the cache must hold (``row_capacity``: the
        rows it is allocated for, so later joins fit in place). ``prefix`` (token ids and their
        keys and values, from an earlier prefill's :attr:`computed_prefix`) is reused where the
        prompts' shared prefix starts with it. ``known[j]`` holds keys and values already
        computed for the first tokens of prompt ``j`` (an episode's conversation so far,
        :class:`KnownTokens`): they are copied in and only the tokens after them are run
        (the widest such tail sets the pass's width). Returns the next-token logits of every row.
        """
        dec, dev = self.dec, self.device
        u = len(prompts)
        shortest = min(map(len, prompts))
        reusable = prefix is not None and len(prefix[0]) < shortest and list(prefix[0]) == prompts[0][: len(prefix[0])]
        if u == 1:  # one pass over what is not known: a separate prefix pass would read every weight twice
            shared = len(prefix[0]) if reusable and prefix is not None else 0
        else:
            shared = min(len(os.path.commonprefix(prompts)), shortest - 1)
        if shared < MIN_SHARED_PREFIX:
            shared = 0
        self.shared = shared  # the prompts' shared prefix (prefilled once for all rows)
        suffixes = [p[shared:] for p in prompts]
        width = max(map(len, suffixes))
        pre = shared + width  # slots taken by the prompts
        n = len(row_src)
        identity = row_src == list(range(u))
        slots = pre + capacity
        cache = KVCache(dec.layers, n, dec.kv_heads, slots, dec.head_dim, self.dtype, dev, row_capacity)
        ucache = cache if identity else KVCache(dec.layers, u, dec.kv_heads, pre, dec.head_dim, self.dtype, dev)
        self.computed_prefix = None
        if shared:
            one = KVCache(dec.layers, 1, dec.kv_heads, shared, dec.head_dim, self.dtype, dev)
            # tokens whose keys and values come from ``prefix``
            from_prefix = len(prefix[0]) if reusable and prefix is not None and len(prefix[0]) <= shared else 0
            if from_prefix:
                assert prefix is not None
                one.k[:, :, :, :from_prefix] = prefix[1]
                one.v[:, :, :, :from_prefix] = prefix[2]
                self.prefix_hits += from_prefix
            if from_prefix < shared:
                ids = torch.tensor([prompts[0][from_prefix:shared]], device=dev)
                pos = torch.arange(from_prefix, shared, device=dev).unsqueeze(0)
                mask = None
                if from_prefix:  # the new tokens see the reused ones and, causally, each other
                    t = shared - from_prefix
                    see = torch.ones((t, shared), dtype=torch.bool, device=dev).tril_(diagonal=from_prefix)
                    mask = torch.zeros(see.shape, dtype=self.dtype, device=dev).masked_fill_(~see, float("-inf"))
                self._forward(ids, pos, one, from_prefix, mask)
            ucache.k[:, :, :, :shared] = one.k
            ucache.v[:, :, :, :shared] = one.v
            if u > 1:
                self.computed_prefix = (tuple(prompts[0][:shared]), one.k, one.v)
            del one
        # Distinct suffixes, left-padded to one width; pads attend only to themselves (finite, never seen).
        ids = torch.zeros((u, width), dtype=torch.long)
        valid = torch.zeros((u, width), dtype=torch.bool)
        pos = torch.zeros((u, width), dtype=torch.long)
        for j, s in enumerate(suffixes):
            ids[j, width - len(s) :] = torch.tensor(s)
            valid[j, width - len(s) :] = True
            pos[j, width - len(s) :] = torch.arange(shared, shared + len(s))
        ids, valid, pos = ids.to(dev), valid.to(dev), pos.to(dev)
        causal = torch.ones((width, width), dtype=torch.bool, device=dev).tril_()
        see = (causal.unsqueeze(0) & valid.unsqueeze(1)) | torch.eye(width, dtype=torch.bool, device=dev).unsqueeze(0)
        see = torch.cat([torch.ones((u, width, shared), dtype=torch.bool, device=dev), see], dim=2)
        add = torch.zeros(see.shape, dtype=self.dtype, device=dev).masked_fill_(~see, float("-inf")).unsqueeze(1)
        run = self._copy_known(known, suffixes, shared, width, ucache) if known is not None else width
        if run < width:  # only each prompt's last ``run`` tokens are computed; the known ones before them are read
            ids, pos, add = ids[:, width - run :], pos[:, width - run :], add[:, :, width - run :]
            h = self._forward(ids, pos, ucache, shared + width - run, add)
        else:
            h = self._forward(ids, pos, ucache, shared, add if (shared or not bool(valid.all())) else None)
        logits = self._logits(h)
        if u == 1:  # all of it but the last token, for the next prefill to start from (a copy: rows move)
            n_known = len(prompts[0]) - 1
            self.computed_prefix = (
                tuple(prompts[0][:n_known]),
                ucache.k[:, :1, :, :n_known].clone(),
                ucache.v[:, :1, :, :n_known].clone(),
            )
        src = torch.tensor(row_src, device=dev)
        if not identity:
            cache.k[:, :, :, :pre] = ucache.k.index_select(1, src)
            cache.v[:, :, :, :pre] = ucache.v.index_select(1, src)
            logits = logits.index_select(0, src)
            valid = valid.index_select(0, src)
        del ucache
        mask = torch.zeros((n, slots), dtype=self.dtype, device=dev)
        mask[:, shared:pre].masked_fill_(~valid, float("-inf"))
        self.cache, self.mask, self.slot = cache, mask, pre
        self.pos = torch.tensor([len(prompts[s]) for s in row_src], device=dev)
        self.start = torch.zeros(n, dtype=torch.long, device=dev)
        return logits

    def _copy_known(
        self, known: Sequence[KnownTokens | None], suffixes: list[list[int]], shared: int, width: int, ucache: KVCache
    ) -> int:
        """Copy each prompt's known keys and values after the shared prefix into its slots; the tokens left to run.

        Prompt ``j``'s suffix sits at slots ``shared + width - len(suffix)`` onwards; the
        keys of its first ``n`` suffix tokens come from ``known[j]`` (at least the last
        token is always run, for its logits). Returns the widest number of tokens to run.
        """
        # the slots the shortened pass does not write (pads of short suffixes) are masked but read:
        # uninitialised memory may hold NaN, and 0 * NaN is NaN in attention
        ucache.k[:, :, :, shared : shared + width] = 0
        ucache.v[:, :, :, shared : shared + width] = 0
        run = 1
        for j, (s, kn) in enumerate(zip(suffixes, known)):
            n = 0 if kn is None else max(0, min(kn.length, shared + len(s) - 1) - shared)
            if n:
                assert kn is not None
                k, v = kn.kv(shared, shared + n)
                at = shared + width - len(s)
                ucache.k[:, j, :, at : at + n] = k
                ucache.v[:, j, :, at : at + n] = v
            run = max(run, len(s) - n)
        return min(run, width)

    def row_kv(self, row: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions ``start`` onwards of one row so far, in order: (layers, heads, n, dim) each.

        What the row's prompt and fed tokens left in the cache (the last sampled token is not
        fed yet), for :class:`KnownTokens` of the next call of the same episode.
        """
        assert self.cache is not None and self.mask is not None and self.pos is not None
        slots = torch.nonzero(self.mask[row, : self.slot] == 0).flatten()
        assert slots.numel() == int(self.pos[row]), "a row's readable slots are its positions"
        slots = slots[start:]
        return self.cache.k[:, row].index_select(2, slots), self.cache.v[:, row].index_select(2, slots)

    # -- continuous batching -------------------------------------------------------------------

    def join(self, other: DecodeSession, capacity: int, row_capacity: int) -> None:
        """Append the rows ``other`` prefilled (see :meth:`fresh`) to this running batch.

        Afterwards every row can take ``capacity`` more tokens. The new rows' prompts end at
        the current slot, so the next :meth:`step` feeds every row together. When the new rows
        fit the allocation they are written in place; otherwise the batch is laid out anew
        (:meth:`compact`).
        """
        assert self.cache is not None and self.mask is not None and self.pos is not None and self.start is not None
        assert other.cache is not None and other.mask is not None and other.pos is not None and other.start is not None
        assert not bool(other.start.any()), "only a freshly prefilled session joins"
        pre, slot = other.slot, self.slot
        old, new = self.cache.rows, other.cache.rows
        if pre <= slot and slot + capacity <= self.cache.slots and old + new <= self.cache.row_capacity:
            off = slot - pre
            self.cache.set_rows(old + new)
            self.cache.k[:, old:, :, off:slot] = other.cache.k[:, :, :, :pre]
            self.cache.v[:, old:, :, off:slot] = other.cache.v[:, :, :, :pre]
            # masked, but read: uninitialised memory may hold NaN, and 0 * NaN is NaN in attention
            self.cache.k[:, old:, :, :off] = 0
            self.cache.v[:, old:, :, :off] = 0
            mask = torch.zeros((new, self.mask.shape[1]), dtype=self.dtype, device=self.device)
            mask[:, :off] = float("-inf")
            mask[:, off:slot] = other.mask[:, :pre]
            self.mask = torch.cat([self.mask, mask])
            self.pos = torch.cat([self.pos, other.pos])
            self.start = torch.cat([self.start, other.start + off])
            return
        self._relayout([self, other], capacity, row_capacity)

    def compact(self, capacity: int, row_capacity: int, *, end_at: int = 0, more_rows: int = 0) -> None:
        """Lay the batch out anew so every row can take ``capacity`` more tokens: rows right-aligned, no dead slots.

        ``end_at``: the sequences end at this slot at least (so a longer prompt fits in front of it);
        ``more_rows``: room for that many rows more (see :meth:`step_admitting`).
        """
        self._relayout([self], capacity, row_capacity, end_at=end_at, more_rows=more_rows)

    def fits(self, capacity: int) -> bool:
        """Whether every row can take ``capacity`` more tokens without a new layout."""
        return self.cache is not None and self.slot + capacity <= self.cache.slots

    def _relayout(
        self, parts: list[DecodeSession], capacity: int, row_capacity: int, *, end_at: int = 0, more_rows: int = 0
    ) -> None:
        """Lay the rows of ``parts`` out again, each row's sequence ending at the same slot.

        In this batch's own cache when it is large enough (each row moved through a copy of
        just that row), else in a new one: a second cache the size of the first would double
        the peak memory of a server's largest batch.
        """
        dec = self.dec
        spans: list[tuple[DecodeSession, int, int]] = []  # (part, row, first slot)
        for part in parts:
            assert part.start is not None
            spans += [(part, j, first) for j, first in enumerate(part.start.tolist())]
        end = max([end_at] + [part.slot - first for part, _, first in spans])  # the longest sequence
        rows = len(spans)
        room = rows + more_rows
        own = self.cache
        if parts[0] is self and own is not None and own.row_capacity >= room and own.slots >= end + capacity:
            cache = own
            cache.set_rows(rows)
        else:
            headroom = max(32, (end + capacity) // 4)  # so joins do not lay the batch out every step
            cap = min(max(row_capacity, room), -(-room // 8) * 8)
            slots = end + capacity + headroom
            cache = KVCache(dec.layers, rows, dec.kv_heads, slots, dec.head_dim, self.dtype, self.device, cap)
        mask = torch.zeros((rows, cache.slots), dtype=self.dtype, device=self.device)
        for r, (part, j, first) in enumerate(spans):
            assert part.cache is not None and part.mask is not None
            dst = end - (part.slot - first)
            k, v = part.cache.k[:, j, :, first : part.slot], part.cache.v[:, j, :, first : part.slot]
            if part.cache is cache:  # moving within one row: the source may overlap the destination
                k, v = k.clone(), v.clone()
            cache.k[:, r, :, dst:end] = k
            cache.v[:, r, :, dst:end] = v
            cache.k[:, r, :, :dst] = 0  # masked but read (see join)
            cache.v[:, r, :, :dst] = 0
            mask[r, :dst] = float("-inf")
            mask[r, dst:end] = part.mask[j, first : part.slot]
        lengths = torch.tensor([part.slot - first for part, _, first in spans], device=self.device)
        self.pos = torch.cat([p.pos for p in parts if p.pos is not None])
        self.cache, self.mask, self.slot, self.start = cache, mask, end, end - lengths

    def keep(self, rows: list[int]) -> None:
        """Drop every row not in ``rows`` (indices into the current rows)."""
        assert self.cache is not None and self.mask is not None and self.pos is not None
        index = torch.tensor(rows, device=self.device)
        self.cache.keep(rows, self.slot)
        self.mask = self.mask.index_select(0, index)
        self.pos = self.pos.index_select(0, index)
        if self.start is not None:
            self.start = self.start.index_select(0, index)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row; the next-token logits."""
        assert self.cache is not None and self.mask is not None and self.pos is not None
        rows = tokens.shape[0]
        slot = self.slot
        assert slot < self.cache.slots, "the KV cache is full: compact() before stepping"
        first = int(self.start.min()) if self.start is not None else 0
        mask = self.mask[:, None, None, first : slot + 1]
        h = self._forward(tokens.view(rows, 1), self.pos.view(rows, 1), self.cache, slot, mask, first)
        self.slot += 1
        self.pos = self.pos + 1
        return self._logits(h)

    # -- a step that also admits new rows --------------------------------------------------------

    def can_admit(self, prompts: list[list[int]], known: int, capacity: int) -> bool:
        """Whether :meth:`step_admitting` can take ``prompts`` (each its own new row) at the next step.

        Each new prompt must end at the current slot (so it fits in front of it), the rows and
        ``capacity`` more tokens for every row must fit the allocation, and the prompts must
        not share much beyond the ``known`` prefix (that part would be computed once per row).
        """
        if self.cache is None or not prompts:
            return False
        longest = max(map(len, prompts))
        if longest > self.slot + 1 or self.slot + 1 + capacity > self.cache.slots:
            return False
        if self.cache.rows + len(prompts) > self.cache.row_capacity:
            return False
        shared = len(os.path.commonprefix(prompts)) if len(prompts) > 1 else 0
        return shared - known < 4 * MIN_SHARED_PREFIX

    def step_admitting(self, tokens: torch.Tensor, prompts: list[list[int]], prefix: Prefix | None) -> torch.Tensor:
        """Feed one token per row and prefill ``prompts`` as new rows in the same pass; the next-token logits.

        One forward instead of a prefill and a step: every weight is read once for both, and the
        matmuls run on the decode rows and the prompt tokens together. Each prompt is laid out
        ending at this step's slot (its keys and values from ``prefix`` where it starts with it),
        so afterwards the new rows step with the others. Returns logits for the old rows, then
        the new ones (in order). Check :meth:`can_admit` first.
        """
        assert self.cache is not None and self.mask is not None and self.pos is not None and self.start is not None
        dev, cache = self.device, self.cache
        old, u, s = self.cache.rows, len(prompts), self.slot
        known = len(prefix[0]) if prefix is not None else 0
        if prefix is not None and not all(len(p) > known and p[:known] == list(prefix[0]) for p in prompts):
            known, prefix = 0, None
        lengths = [len(p) for p in prompts]
        n = [length - known for length in lengths]  # tokens to compute per new row
        width = max(n)
        starts = [s + 1 - length for length in lengths]  # each prompt ends at slot s
        cache.set_rows(old + u)
        for j, first in enumerate(starts):
            r = old + j
            cache.k[:, r, :, :first] = 0  # masked but read (see join)
            cache.v[:, r, :, :first] = 0
            if known:
                assert prefix is not None
                cache.k[:, r, :, first : first + known] = prefix[1][:, 0]
                cache.v[:, r, :, first : first + known] = prefix[2][:, 0]
        self.prefix_hits += known * u  # every new row starts with the reused prefix
        # the prompt tokens left-padded to ``width``: compute index w of row j is suffix token w - (width - n_j)
        ids = torch.zeros((u, width), dtype=torch.long)
        pos = torch.zeros((u, width), dtype=torch.long)
        for j, p in enumerate(prompts):
            ids[j, width - n[j] :] = torch.tensor(p[known:])
            pos[j, width - n[j] :] = torch.arange(known, lengths[j])
        lo = s + 1 - max(lengths)  # the first slot a new row reads
        span = s + 1 - lo
        t = torch.arange(width).unsqueeze(0) - (width - torch.tensor(n)).unsqueeze(1)  # (u, width); < 0: a pad
        first_col = (torch.tensor(starts) - lo).view(u, 1, 1)
        cols = torch.arange(span).view(1, 1, span)
        see = (cols >= first_col) & (cols <= first_col + known + t.unsqueeze(2))  # its prefix, causally
        see[:, :, span - 1] |= t < 0  # a pad sees its row's last slot (finite; its output is never used)
        add = torch.zeros(see.shape, dtype=self.dtype).masked_fill_(~see, float("-inf")).unsqueeze(1).to(dev)
        first = int(self.start.min())
        dec_mask = self.mask[:, None, None, first : s + 1]
        h = self._mixed_forward(tokens, ids.to(dev), pos.to(dev), n, (first, dec_mask), (lo, add))
        logits = self._logits(h)
        # the new rows' bookkeeping: visible from their first slot on
        mask = torch.zeros((u, self.mask.shape[1]), dtype=self.dtype, device=dev)
        for j, first_slot in enumerate(starts):
            mask[j, :first_slot] = float("-inf")
        self.mask = torch.cat([self.mask, mask])
        self.pos = torch.cat([self.pos + 1, torch.tensor(lengths, device=dev)])
        self.start = torch.cat([self.start, torch.tensor(starts, device=dev)])
        self.slot = s + 1
        last = prompts[-1]
        r = old + u - 1
        first_slot = starts[-1]
        self.computed_prefix = (
            tuple(last[:-1]),
            cache.k[:, r : r + 1, :, first_slot : first_slot + len(last) - 1].clone(),
            cache.v[:, r : r + 1, :, first_slot : first_slot + len(last) - 1].clone(),
        )
        return logits

    def _mixed_forward(
        self,
        tokens: torch.Tensor,
        ids: torch.Tensor,
        pos: torch.Tensor,
        n: list[int],
        dec_attn: tuple[int, torch.Tensor],
        new_attn: tuple[int, torch.Tensor],
    ) -> torch.Tensor:
        """One pass over the decode rows' tokens and the new rows' prompt tokens; last hidden state per row."""
        assert self.cache is not None and self.pos is not None
        dec, cache = self.dec, self.cache
        old, (u, width) = tokens.shape[0], ids.shape
        s = self.slot
        nh, kvh, hd, half = dec.n_heads, dec.kv_heads, dec.head_dim, dec.head_dim // 2
        total = old + u * width
        flat_ids = torch.cat([tokens.view(-1), ids.reshape(-1)])
        flat_pos = torch.cat([self.pos.view(-1), pos.reshape(-1)]).view(1, total)
        h = F.embedding(flat_ids, self.embed)  # (tokens, hidden): every matmul runs on all of them
        cos, sin = dec.base.model.rotary_emb(h.unsqueeze(0), flat_pos)
        cos, sin = cos.view(total, 1, hd), sin.view(total, 1, hd)

        def rope(x: torch.Tensor) -> torch.Tensor:  # x: (tokens, heads, head_dim)
            return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

        first, dec_mask = dec_attn
        lo, new_mask = new_attn
        extra = {"enable_gqa": True} if dec.gqa and kvh != nh else {}
        rows_new = slice(old, old + u)
        for i, layer in enumerate(self.layers):
            x = rms_norm(h, layer.ln_in, dec.eps)
            q, k, v = layer.qkv(x)
            q = rope(q.view(total, nh, hd))
            k = rope(k.view(total, kvh, hd))
            v = v.view(total, kvh, hd)
            cache.k[i, :old, :, s] = k[:old]
            cache.v[i, :old, :, s] = v[:old]
            k_new = k[old:].view(u, width, kvh, hd).transpose(1, 2)
            v_new = v[old:].view(u, width, kvh, hd).transpose(1, 2)
            for j in range(u):  # only the real tokens go into the cache, ending at slot s
                cache.k[i, old + j, :, s + 1 - n[j] : s + 1] = k_new[j, :, width - n[j] :]
                cache.v[i, old + j, :, s + 1 - n[j] : s + 1] = v_new[j, :, width - n[j] :]
            keys, values = cache.k[i, :old, :, first : s + 1], cache.v[i, :old, :, first : s + 1]
            keys_new, values_new = cache.k[i, rows_new, :, lo : s + 1], cache.v[i, rows_new, :, lo : s + 1]
            if not dec.gqa and kvh != nh:
                keys_new, values_new = (t.repeat_interleave(nh // kvh, dim=1) for t in (keys_new, values_new))
            o_dec = decode_attention(q[:old], keys, values, dec_mask, dec.scale)  # (old, heads * head_dim)
            o_new = F.scaled_dot_product_attention(
                q[old:].view(u, width, nh, hd).transpose(1, 2),
                keys_new,
                values_new,
                attn_mask=new_mask,
                scale=dec.scale,
                **extra,
            )  # (u, heads, width, head_dim)
            o = torch.cat([o_dec, o_new.transpose(1, 2).reshape(u * width, nh * hd)])
            h = h + layer.o(o)
            x = rms_norm(h, layer.ln_post, dec.eps)
            gate, up = layer.gate_up(x)
            h = h + layer.down(F.silu(gate) * up)
        last = torch.cat([h[:old], h[old:].view(u, width, -1)[:, -1]])
        return rms_norm(last, self.norm, dec.eps)


def _sdpa_has_gqa() -> bool:
    """Whether ``scaled_dot_product_attention`` takes ``enable_gqa`` (torch 2.5 and later).

    Read off the version, not probed with a call: a probe is tensor work on whichever thread
    builds the decoder (the caller's, not the compute thread), and that gives the caller its own
    OpenMP team, which made every parallel region of the compute thread 2-4x slower (.compute).
    """
    return bool(torch.__version__ >= "2.5")  # a TorchVersion: compared as a version ("2.13" > "2.5"), not a string
