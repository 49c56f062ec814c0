"""Token sampling with one pre-drawn uniform per row and step.

Inverse-CDF sampling (a float64 cumulative sum and ``searchsorted``) draws a
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
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    cdf = probs.cumsum(-1, dtype=torch.float64)
    target = (uniforms.to(torch.float64) * cdf[:, -1]).unsqueeze(1)
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=logits.shape[-1] - 1)
    if bool(greedy.any()):
        tokens = torch.where(greedy, logits.argmax(-1), tokens)
    return tokens, logp.gather(1, tokens.unsqueeze(1)).squeeze(1)


def top_logprobs(logits: torch.Tensor, temperature: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely tokens per row and their logprobs, under the same distribution as :func:`sample`'s."""
    temp = torch.where(temperature <= 0, torch.ones_like(temperature), temperature).unsqueeze(1)
    values, ids = torch.log_softmax(logits.float() / temp, dim=-1).topk(k, dim=-1)
    return values, ids
