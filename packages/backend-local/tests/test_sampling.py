"""The sampler draws what one float64 cumulative sum over the whole vocabulary would."""

from __future__ import annotations

import pytest
import torch

from reinforge_backend_local.inference import sampling


def _one_sum_draw(logits: torch.Tensor, uniforms: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling the plain way: the whole vocabulary's cumulative sum in float64."""
    temp = torch.where(temperature <= 0, torch.ones_like(temperature), temperature).unsqueeze(1)
    cdf = torch.log_softmax(logits / temp, -1).exp().cumsum(-1, dtype=torch.float64)
    target = (uniforms.to(torch.float64) * cdf[:, -1]).unsqueeze(1)
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=logits.shape[-1] - 1)
    return torch.where(temperature <= 0, logits.argmax(-1), tokens)


@pytest.mark.parametrize("vocab", [49152, 49153, 700])  # a multiple of the block, one more, less than a block
def test_two_level_draw_equals_one_float64_sum(vocab: int) -> None:
    g = torch.Generator().manual_seed(vocab)
    for _ in range(20):
        logits = torch.randn(16, vocab, generator=g) * 4
        uniforms = torch.rand(16, dtype=torch.float64, generator=g)
        temperature = torch.rand(16, generator=g) * 1.5
        temperature[0], temperature[1] = 0.0, 1.0  # greedy, and the plain softmax
        tokens, logprobs = sampling.sample(logits, uniforms, temperature, torch.ones(16))
        assert torch.equal(tokens, _one_sum_draw(logits, uniforms, temperature))
        temp = torch.where(temperature <= 0, torch.ones_like(temperature), temperature).unsqueeze(1)
        expected = torch.log_softmax(logits / temp, -1).gather(1, tokens.unsqueeze(1)).squeeze(1)
        assert torch.equal(logprobs, expected)


def test_draw_never_lands_on_an_impossible_token() -> None:
    """Entries of probability 0 (masked, or past the vocabulary in the last block) are never drawn."""
    logits = torch.full((3, 2500), float("-inf"))
    logits[0, 5] = logits[0, 1030] = 0.0  # two tokens in different blocks
    logits[1, 2047] = 0.0  # the last entry of a block
    logits[2, 2499] = 0.0  # the last real entry of the padded last block
    for u in (0.0, 0.25, 0.5, 0.999999):
        tokens, logprobs = sampling.sample(
            logits, torch.full((3,), u, dtype=torch.float64), torch.ones(3), torch.ones(3)
        )
        assert tokens[0].item() == (5 if u < 0.5 else 1030)
        assert tokens[1:].tolist() == [2047, 2499]
        assert bool(torch.isfinite(logprobs).all())
