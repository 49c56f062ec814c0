"""The entropy bonus (``entropy_coef``): its gradient, its sign, and that 0 leaves the loss as it was."""

import copy

import pytest
import torch
from toolbox_testlib import tiny_llama, tiny_samples

from reinforge.plugin import AlgorithmConfig, ConfigError
from reinforge_backend_local.training.algorithms import ALGORITHMS, GroupSettings
from reinforge_backend_local.training.trainer import Trainer, completion_logprobs


def _trainer(model, entropy_coef, **kw):
    settings = GroupSettings(entropy_coef=entropy_coef)
    return Trainer(model, ALGORITHMS["grpo"], settings, learning_rate=1e-2, temperature=1.0, pad_id=0, peft=False, **kw)


@pytest.mark.parametrize("frozen", [True, False], ids=["frozen-head", "trained-head"])
def test_the_entropy_gradient_through_the_head_is_autograds(frozen):
    """Both paths (the fused frozen head and plain autograd) give d(entropy)/d(hidden) of the log-softmax formula."""
    torch.manual_seed(2)
    head = torch.nn.Linear(16, 300, bias=False).requires_grad_(not frozen)
    base, targets = torch.randn(11, 16), torch.randint(0, 300, (11,))
    w_lp, w_h = torch.randn(11), torch.randn(11)  # an arbitrary loss over logprobs and entropies
    for t in (1.0, 0.7, torch.rand(11) + 0.5):
        hidden = base.clone().requires_grad_(True)
        full = torch.log_softmax(head(hidden) / (t.unsqueeze(1) if isinstance(t, torch.Tensor) else t), dim=-1)
        expected_h = -(full.exp() * full).sum(-1)
        ((full.gather(-1, targets.unsqueeze(1)).squeeze(1) * w_lp).sum() + (expected_h * w_h).sum()).backward()
        expected_grad = hidden.grad.clone()
        for chunk in (1, 4, 64):
            hidden = base.clone().requires_grad_(True)
            logp, entropy = completion_logprobs(head, hidden, targets, t, chunk, entropy_grad=True)
            assert entropy.requires_grad
            torch.testing.assert_close(entropy, expected_h.detach(), atol=1e-5, rtol=0)
            ((logp * w_lp).sum() + (entropy * w_h).sum()).backward()
            torch.testing.assert_close(hidden.grad, expected_grad, atol=1e-5, rtol=1e-4)


def _mean_entropy(model, samples):
    with torch.no_grad():
        _, entropy, cmask = _trainer(model, 0.0)._forward_logprobs(model, samples.items)
    return float((entropy * cmask).sum() / cmask.sum())


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "padded"])
def test_the_loss_term_is_minus_the_coefficient_times_the_mean_token_entropy(pack):
    model = tiny_llama(frozen_head=True)
    samples = tiny_samples(model)
    plain, bonus = _trainer(model, 0.0, pack=pack), _trainer(model, 0.25, pack=pack)
    assert bonus.loss(samples) - plain.loss(samples) == pytest.approx(-0.25 * _mean_entropy(model, samples), rel=1e-4)


@pytest.mark.parametrize("frozen", [True, False], ids=["frozen-head", "trained-head"])
def test_a_step_with_the_bonus_raises_the_policys_entropy_against_one_without(frozen):
    """Same start, same batch: the step with entropy_coef > 0 ends at a higher mean entropy than without."""
    start = tiny_llama(seed=3, frozen_head=frozen)
    with torch.no_grad():
        start.lm_head.weight.mul_(20.0)  # a peaked policy (a random one is near the uniform's maximum)
    samples = tiny_samples(start, advantages=(1.0, -1.0, 1.0, -1.0), seed=3)
    before = _mean_entropy(start, samples)
    after = {}
    for coef in (0.0, 0.5):
        model = copy.deepcopy(start)
        _trainer(model, coef).step(samples)
        after[coef] = _mean_entropy(model, samples)
    assert after[0.5] > after[0.0]
    # with no policy-gradient signal at all (advantages 0) the bonus alone raises it
    flat = copy.deepcopy(start)
    _trainer(flat, 0.5).step(tiny_samples(start, advantages=(0.0,) * 4, seed=3))
    assert _mean_entropy(flat, samples) > before


def test_zero_leaves_the_loss_and_the_gradients_bit_identical():
    model = tiny_llama(frozen_head=True)
    samples = tiny_samples(model)
    default = Trainer(model, ALGORITHMS["grpo"], learning_rate=1e-2, temperature=1.0, pad_id=0, peft=False)
    grads = []
    for trainer in (default, _trainer(model, 0.0)):
        model.zero_grad(set_to_none=True)
        loss, _ = trainer._batch_loss(samples.items, *trainer._totals(samples.items))
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    assert torch.equal(grads[0][0], grads[1][0])
    assert all(torch.equal(a, b) for a, b in zip(grads[0][1], grads[1][1]))


def test_entropy_coef_is_checked_naming_the_key():
    from reinforge_backend_local.backend import LocalBackend

    with pytest.raises(ConfigError, match=r"algorithm\.entropy_coef: must be at least 0"):
        LocalBackend().check_algorithm(AlgorithmConfig(entropy_coef=-0.01), where="algorithm")
