"""The learning-rate schedule (``lr_warmup_steps``, ``lr_schedule``, ``lr_min_ratio``): its values and the optimizer."""

import math

import pytest
import torch
from toolbox_testlib import tiny_llama, tiny_samples

from reinforge.plugin import AlgorithmConfig, ConfigError
from reinforge_backend_local.training.algorithms import ALGORITHMS, GroupSettings
from reinforge_backend_local.training.schedule import lr_factor
from reinforge_backend_local.training.trainer import Trainer


def test_warm_up_ramps_linearly_to_the_full_rate():
    assert [lr_factor(s, 10, warmup=4) for s in range(1, 7)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert [lr_factor(s, 10) for s in (1, 5, 10, 12)] == [1.0] * 4  # the default: constant, no warm-up


def test_linear_and_cosine_decay_end_at_the_min_ratio_on_the_last_step():
    for schedule in ("linear", "cosine"):
        f = [lr_factor(s, 10, warmup=4, schedule=schedule, min_ratio=0.1) for s in range(1, 13)]
        assert f[:4] == [0.25, 0.5, 0.75, 1.0]  # warm-up first
        assert f[9] == pytest.approx(0.1) and f[10:] == [pytest.approx(0.1)] * 2  # step 10 of 10, and past it
        assert f[6] == pytest.approx(0.55)  # step 7: half-way through the 6 decay steps, for both shapes
        assert all(a >= b for a, b in zip(f[3:], f[4:]))  # never rises after the warm-up
    assert lr_factor(5, 10, warmup=4, schedule="linear") == pytest.approx(1 - 1 / 6)
    assert lr_factor(5, 10, warmup=4, schedule="cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi / 6)))
    assert lr_factor(10, 10, schedule="cosine") == pytest.approx(0.0)  # min_ratio 0: down to nothing


def test_the_trainers_optimizer_takes_the_scheduled_rate_at_each_step():
    model = tiny_llama()
    settings = GroupSettings(lr_warmup_steps=2, lr_schedule="linear", lr_min_ratio=0.2)
    trainer = Trainer(
        model, ALGORITHMS["grpo"], settings, learning_rate=1e-2, temperature=1.0, pad_id=0, peft=False, total_steps=4
    )
    samples = tiny_samples(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    metrics = trainer.step(samples, at_step=1)
    # Adam's first update moves each parameter by about lr (|m / sqrt(v)| = 1): half the rate in warm-up
    moved = max(float((p.detach() - before[n]).abs().max()) for n, p in model.named_parameters())
    assert moved == pytest.approx(0.5e-2, rel=1e-3)
    assert metrics["train/lr"] == trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.5e-2)
    lrs = []
    for step in (2, 3, 4):
        lrs.append(trainer.step(samples, at_step=step)["train/lr"])
        assert trainer.optimizer.param_groups[0]["lr"] == lrs[-1]
    assert lrs == [pytest.approx(1e-2), pytest.approx(0.6e-2), pytest.approx(0.2e-2)]


def test_without_a_schedule_the_optimizers_rate_is_left_alone():
    model = tiny_llama()
    trainer = Trainer(model, ALGORITHMS["grpo"], learning_rate=1e-3, temperature=1.0, pad_id=0, peft=False)
    trainer.optimizer.param_groups[0]["lr"] = 3e-4  # e.g. what a resumed checkpoint's optimizer holds
    metrics = trainer.step(tiny_samples(model), at_step=5)
    assert trainer.optimizer.param_groups[0]["lr"] == 3e-4 and "train/lr" not in metrics


def test_a_decaying_schedule_needs_the_runs_total_steps():
    with pytest.raises(ValueError, match="algorithm.lr_schedule cosine"):
        Trainer(
            tiny_llama(),
            ALGORITHMS["grpo"],
            GroupSettings(lr_schedule="cosine"),
            learning_rate=1e-3,
            temperature=1.0,
            pad_id=0,
            peft=False,
        )


def _checked(**keys):
    from reinforge_backend_local.backend import LocalBackend

    return LocalBackend().check_algorithm(AlgorithmConfig(**keys), where="algorithm")


def test_the_schedule_keys_are_checked_naming_the_key():
    got = _checked(algorithm_type="rloo", lr_warmup_steps=3, lr_schedule="cosine", lr_min_ratio=0.1)
    assert (got.lr_warmup_steps, got.lr_schedule, got.lr_min_ratio, got.lr_scheduled) == (3, "cosine", 0.1, True)
    with pytest.raises(ConfigError, match=r"algorithm\.lr_schedule: must be one of constant, linear, cosine"):
        _checked(lr_schedule="step")
    with pytest.raises(ConfigError, match=r"algorithm\.lr_min_ratio: must be between 0.0 and 1.0"):
        _checked(lr_min_ratio=1.5)
    with pytest.raises(ConfigError, match=r"algorithm\.lr_warmup_steps"):
        _checked(lr_warmup_steps=-1)


def test_every_algorithm_defaults_to_no_schedule_and_no_entropy_term():
    for name, record in ALGORITHMS.items():
        s = record.settings()
        assert (s.lr_warmup_steps, s.lr_schedule, s.lr_min_ratio, s.entropy_coef) == (0, "constant", 0.0, 0.0), name
        assert not s.lr_scheduled
        assert getattr(s, "dynamic_sampling", False) is False, name
    assert torch.get_default_dtype() == torch.float32
