"""Token sampling with one pre-drawn uniform per row and step.

Inverse-CDF sampling (float64 cumulative sums and ``searchsorted``) draws a
single random number per row, where ``torch.multinomial`` draws one per
vocabulary entry; and because each request draws its uniforms from its own
generator, the sampled tokens do not depend on which other requests share
the batch - which is what makes resumed runs reproduce exactly.
"""

from __future__ import annotations

import hashlib

import torch


def request_generator(*key: object) -> torch.Generator:
    """A CPU generator seeded from a stable hash of ``key`` (seed, step, task, rollout, call)."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") & ((1 << 63) - 1))


BLOCK = 1024  # vocabulary entries per block of the two-level inverse CDF


def sample(
    logits: torch.Tensor, uniforms: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; returns (tokens, logprobs under the temperature-scaled policy).

    ``temperature`` 0 means greedy. The logprob is that of the full softmax at
    the row's temperature (top-p only narrows what is drawn), which is what the
    trainer recomputes, so PPO ratios start at 1.
    """
    logits = logits.float()
    greedy = temperature <= 0
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(1)
    logp = torch.log_softmax(logits / temp, dim=-1)
    probs = logp.exp()
    if bool((top_p < 1).any()):
        sorted_p, order = probs.sort(dim=-1, descending=True)
        keep = (sorted_p.cumsum(-1) - sorted_p) < top_p.unsqueeze(1)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p * keep)
        cdf = probs.cumsum(-1, dtype=torch.float64)
        target = (uniforms.to(torch.float64) * cdf[:, -1]).unsqueeze(1)
        tokens = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=logits.shape[-1] - 1)
    else:
        tokens = _inverse_cdf(probs, uniforms)
    if bool(greedy.any()):
        tokens = torch.where(greedy, logits.argmax(-1), tokens)
    return tokens, logp.gather(1, tokens.unsqueeze(1)).squeeze(1)


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The token at ``uniforms`` (one per row) of each row's cumulative distribution, summed in float64.

    Two levels: float64 sums of blocks of :data:`BLOCK` entries locate the block, then only
    that block is summed entry by entry. The same draw as one float64 cumulative sum over
    the whole vocabulary (the two sum in another order: they differ in the 16th digit)
    without that sum's float64 copy of every entry, which at decode shapes (32 rows x 49k
    entries) was three quarters of a sampling step.
    """
    rows, vocab = probs.shape
    pad = (-vocab) % BLOCK
    blocks = (torch.nn.functional.pad(probs, (0, pad)) if pad else probs).view(rows, -1, BLOCK)
    cum = blocks.sum(-1, dtype=torch.float64).cumsum_(-1)  # (rows, blocks)
    target = (uniforms.to(torch.float64) * cum[:, -1]).unsqueeze(1)
    block = torch.searchsorted(cum, target, right=True).clamp_(max=cum.shape[1] - 1)  # (rows, 1)
    before = torch.where(block > 0, cum.gather(1, (block - 1).clamp_(min=0)), torch.zeros_like(target))
    inner = blocks.gather(1, block.unsqueeze(2).expand(rows, 1, BLOCK)).squeeze(1)  # (rows, BLOCK)
    at = torch.searchsorted(inner.cumsum(-1, dtype=torch.float64).add_(before), target, right=True)
    # rounding may put the target just past the block's own sum: take its last entry that can be drawn
    last = torch.where(inner > 0, torch.arange(BLOCK, device=probs.device), -1).amax(-1, keepdim=True)
    return (block * BLOCK + torch.minimum(at, last)).squeeze(1)


def top_logprobs(logits: torch.Tensor, temperature: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely tokens per row and their logprobs, under the same distribution as :func:`sample`'s."""
    temp = torch.where(temperature <= 0, torch.ones_like(temperature), temperature).unsqueeze(1)
    values, ids = torch.log_softmax(logits.float() / temp, dim=-1).topk(k, dim=-1)
    return values, ids
