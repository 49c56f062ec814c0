"""One real update of SmolLM2-135M with LoRA, on CPU."""

import contextlib
from dataclasses import dataclass

import pytest
import torch

from reinforge.plugin import ConfigError, ModelConfig
from reinforge_backend_local.inference.engine import Engine, GenRequest
from reinforge_backend_local.inference.policy import ChatTemplate
from reinforge_backend_local.model import packing
from reinforge_backend_local.model.modeling import load_policy
from reinforge_backend_local.model.weights import attach_lora, merged_for_decode
from reinforge_backend_local.training.algorithms import ALGORITHMS
from reinforge_backend_local.training.trainer import Sample, Samples, Trainer


@pytest.fixture(scope="module")
def lora_policy(model_folder):
    model, tokenizer, _ = load_policy(str(model_folder))
    cfg = ModelConfig(model_path=str(model_folder), lora_rank=8, lora_alpha=16)
    return attach_lora(model, cfg), tokenizer


@contextlib.contextmanager
def perturbed_lora(model, seed):
    """The LoRA weights nudged off zero (so gradients reach A as well as B); restored, grads cleared, on exit."""
    lora = {n: p for n, p in model.named_parameters() if "lora_" in n}
    saved = {n: p.detach().clone() for n, p in lora.items()}
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in lora.values():
            p.add_(torch.randn_like(p) * 0.02)
    try:
        yield lora
    finally:
        with torch.no_grad():
            for n, p in lora.items():
                p.copy_(saved[n])
        model.zero_grad(set_to_none=True)


@dataclass
class Pass:
    """One loss + backward over a batch (cut into the trainer's micro-batches), and what it gave."""

    micro_batches: int
    loss: float
    run_tokens: float
    entropy_sum: float
    logp: torch.Tensor  # masked to real completion tokens
    entropy: torch.Tensor
    grads: dict


def _run_pass(model, lora, batch, **trainer_args):
    trainer = Trainer(model, ALGORITHMS["grpo"], learning_rate=1e-6, pad_id=2, peft=True, **trainer_args)
    parts = trainer._split(batch)
    model.zero_grad(set_to_none=True)
    loss = run = entropy_sum = 0.0
    for part in parts:
        part_loss, stats = trainer._batch_loss(part, *trainer._totals(batch))
        part_loss.backward()
        loss += float(part_loss.detach())
        run += stats["run_tokens"]
        entropy_sum += stats["entropy"]
    with torch.no_grad():
        logp, entropy, cmask = trainer._forward_logprobs(model, batch)
    grads = {n: p.grad.detach().clone() for n, p in lora.items()}
    return Pass(len(parts), loss, run, entropy_sum, logp * cmask, entropy * cmask, grads)


def _assert_same_pass(got, reference, lora):
    """Logprobs 1e-4, entropies 1e-3, loss 1e-5, LoRA gradients 1e-5 + 1e-3 relative (float32 summation order)."""
    torch.testing.assert_close(got.logp, reference.logp, atol=1e-4, rtol=0)
    torch.testing.assert_close(got.entropy, reference.entropy, atol=1e-3, rtol=0)
    assert abs(got.loss - reference.loss) <= 1e-5
    assert abs(got.entropy_sum - reference.entropy_sum) <= 1e-3 * abs(reference.entropy_sum)
    for n in lora:
        torch.testing.assert_close(got.grads[n], reference.grads[n], atol=1e-5, rtol=1e-3)
    assert any(bool(g.abs().sum() > 0) for n, g in reference.grads.items() if "lora_A" in n)


def _samples(model, tokenizer):
    template = ChatTemplate(tokenizer, 512)
    engine = Engine(model, tokenizer, max_model_len=512)
    prompts = [template.prompt_ids([{"role": "user", "content": f"What is {a} + {a}?"}]) for a in (2, 7)]
    requests = [GenRequest(p, 6, 1.0, seed_key=(i, k)) for i, p in enumerate(prompts) for k in range(2)]
    with merged_for_decode(model, True):
        results = engine.generate(requests)
    advs = [1.0, -1.0, 1.0, -1.0]
    return Samples([Sample(r.prompt_ids, g.token_ids, g.logprobs, a) for r, g, a in zip(requests, results, advs)])


def test_one_grpo_step_changes_only_lora_and_lowers_the_loss(lora_policy):
    model, tokenizer = lora_policy
    trainer = Trainer(model, ALGORITHMS["grpo"], learning_rate=5e-3, temperature=1.0, pad_id=2, peft=True)
    samples = _samples(model, tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss_before = trainer.loss(samples)
    metrics = trainer.step(samples)
    loss_after = trainer.loss(samples)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    assert loss_after < loss_before
    # on-policy first epoch: the ratio against generation-time logprobs is ~1
    assert metrics["ratio/mean"] == pytest.approx(1.0, abs=1e-3)
    assert metrics["grad_norm"] > 0 and metrics["entropy"] > 0


def test_decoding_with_merged_lora_restores_the_exact_weights(lora_policy):
    model, _ = lora_policy
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    with merged_for_decode(model, True):
        pass
    assert all(torch.equal(p, weights[n]) for n, p in model.named_parameters())


def test_lora_target_that_does_not_exist_is_a_clear_error(model_folder):
    model, _, _ = load_policy(str(model_folder))
    with pytest.raises(ConfigError, match=r"lora_target_modules: \['qkv_proj'\] not found.*q_proj"):
        attach_lora(model, ModelConfig(model_path="x", lora_target_modules=["q_proj", "qkv_proj"]))


def test_max_model_len_below_the_prompt_is_a_clear_error(lora_policy):
    _, tokenizer = lora_policy
    with pytest.raises(ConfigError, match="max_model_len is 8 tokens, but a prompt has"):
        ChatTemplate(tokenizer, 8).prompt_ids([{"role": "user", "content": "a long enough question for sure"}])


def test_a_non_finite_loss_raises_and_leaves_the_weights_alone(lora_policy):
    model, tokenizer = lora_policy
    trainer = Trainer(model, ALGORITHMS["grpo"], learning_rate=1e-3, temperature=1.0, pad_id=2, peft=True)
    samples = _samples(model, tokenizer)
    samples.items[0].old_logprobs[0] = float("nan")
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    with pytest.raises(FloatingPointError, match="nan"):
        trainer.step(samples)
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if p.requires_grad)


def test_a_hub_id_that_is_not_on_disk_says_how_to_supply_a_folder(tmp_path, monkeypatch):
    from reinforge_backend_local.model.modeling import resolve_model_path

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"Qwen/Qwen3-0.6B.*not used.*model_path: DIR"):
        resolve_model_path("Qwen/Qwen3-0.6B")
    (tmp_path / "folder").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        resolve_model_path(str(tmp_path / "folder"))


def test_the_trainer_takes_the_algorithms_record_and_its_typed_settings(lora_policy):
    from reinforge_backend_local.training.algorithms import GroupSettings

    model, tokenizer = lora_policy
    settings = GroupSettings(kl_coef=0.1, ppo_epochs=2, clip_range=0.1)
    gspo = ALGORITHMS["gspo"]
    trainer = Trainer(model, gspo, settings, learning_rate=1e-3, temperature=1.0, pad_id=2, peft=True)
    assert trainer.algorithm is gspo and trainer.settings is settings
    metrics = trainer.step(_samples(model, tokenizer))
    assert metrics["kl"] >= 0.0 and metrics["grad_norm"] > 0
    # no settings: the record's defaults (the keys are checked once, by core, for a run file)
    trainer = Trainer(model, ALGORITHMS["reinforce_pp"], learning_rate=1e-3, temperature=1.0, pad_id=2, peft=True)
    assert type(trainer.settings) is ALGORITHMS["reinforce_pp"].settings and trainer.settings.kl_coef == 0.0
    with pytest.raises(ConfigError, match=r"max_grad_norm: must be greater than 0"):
        GroupSettings(max_grad_norm=0.0)


def test_a_shared_prompt_prefix_runs_once_with_the_same_loss_and_lora_gradients(lora_policy):
    """Prefix sharing in training is exact: the rows' gradients through the one prefix forward add up."""
    from reinforge_backend_local.training.trainer import shared_prefix

    model, tokenizer = lora_policy
    template = ChatTemplate(tokenizer, 512)
    system = (
        "You solve arithmetic problems. Use the calculator for anything harder than adding two one-digit "
        "numbers, then give the final answer as a number."
    )
    questions = ("What is 347 * 28?", "What is 9 + 4?", "What is 5120 - 318?")
    prompts = [
        template.prompt_ids([{"role": "system", "content": system}, {"role": "user", "content": q}]) for q in questions
    ]
    completions = [[1000 + i for i in range(n)] for n in (5, 9, 3)]
    batch = [Sample(p, c, [-1.0] * len(c), a) for p, c, a in zip(prompts, completions, (1.0, -0.5, 0.25))]
    assert shared_prefix(batch) >= 30
    with perturbed_lora(model, 0) as lora:
        shared, padded = (
            _run_pass(model, lora, batch, temperature=1.0, share_prefix=x, pack=False) for x in (True, False)
        )
    _assert_same_pass(shared, padded, lora)


def test_each_sample_is_scored_at_its_own_temperature(lora_policy):
    """Online traffic mixes temperatures: a sample's ``temperature`` wins over the trainer's (greedy counts as 1)."""
    model, tokenizer = lora_policy
    items = _samples(model, tokenizer).items

    def logprobs(trainer_temperature, sample_temperatures):
        batch = [
            Sample(s.prompt_ids, s.completion_ids, s.old_logprobs, s.advantage, temperature=t)
            for s, t in zip(items, sample_temperatures)
        ]
        trainer = Trainer(
            model, ALGORITHMS["grpo"], learning_rate=1e-6, temperature=trainer_temperature, pad_id=2, peft=True
        )
        with torch.no_grad():
            return trainer._forward_logprobs(model, batch)[0]

    at_half = logprobs(0.5, [None] * 4)
    at_one = logprobs(1.0, [None] * 4)
    assert not torch.allclose(at_half, at_one)
    torch.testing.assert_close(logprobs(1.0, [0.5] * 4), at_half)
    mixed = logprobs(0.7, [0.5, None, 1.0, 0.0])  # None: the trainer's 0.7; 0.0 (greedy): 1
    for row, expected in ((0, at_half), (2, at_one), (3, at_one)):
        torch.testing.assert_close(mixed[row], expected[row])
    torch.testing.assert_close(mixed[1], logprobs(0.7, [None] * 4)[1])


def test_chunked_logprobs_equal_the_log_softmax_entries():
    from reinforge_backend_local.training.trainer import completion_logprobs

    torch.manual_seed(0)
    head = torch.nn.Linear(16, 300, bias=False)
    hidden, targets = torch.randn(11, 16), torch.randint(0, 300, (11,))
    temps = torch.rand(11) + 0.5
    for t in (0.7, temps):
        full = torch.log_softmax(head(hidden) / (t.unsqueeze(1) if isinstance(t, torch.Tensor) else t), dim=-1)
        for chunk in (1, 4, 64):  # chunk boundaries inside, at and beyond the tokens
            logp, entropy = completion_logprobs(head, hidden, targets, t, chunk)
            torch.testing.assert_close(logp, full.gather(-1, targets.unsqueeze(1)).squeeze(1), atol=1e-6, rtol=0)
            torch.testing.assert_close(entropy, -(full.exp() * full).sum(-1), atol=1e-5, rtol=0)


def test_a_frozen_head_gives_the_log_softmax_entries_and_their_gradient():
    """The fused pass (one exp per logit, softmax kept for backward) against autograd through log_softmax."""
    from reinforge_backend_local.training.trainer import completion_logprobs

    torch.manual_seed(1)
    head = torch.nn.Linear(16, 300, bias=False).requires_grad_(False)
    base, targets = torch.randn(11, 16), torch.randint(0, 300, (11,))
    weights = torch.randn(11)  # an arbitrary loss: sum of weighted logprobs
    for t in (1.0, 0.7, torch.rand(11) + 0.5):
        hidden = base.clone().requires_grad_(True)
        full = torch.log_softmax(head(hidden) / (t.unsqueeze(1) if isinstance(t, torch.Tensor) else t), dim=-1)
        expected = full.gather(-1, targets.unsqueeze(1)).squeeze(1)
        (expected * weights).sum().backward()
        expected_grad = hidden.grad.clone()
        for chunk in (1, 4, 64):
            hidden = base.clone().requires_grad_(True)
            logp, entropy = completion_logprobs(head, hidden, targets, t, chunk)
            assert not entropy.requires_grad
            torch.testing.assert_close(logp, expected.detach(), atol=1e-6, rtol=0)
            torch.testing.assert_close(entropy, -(full.exp() * full).sum(-1).detach(), atol=1e-5, rtol=0)
            (logp * weights).sum().backward()
            torch.testing.assert_close(hidden.grad, expected_grad, atol=1e-6, rtol=1e-5)


def test_the_lm_head_on_completion_tokens_only_gives_the_full_logits_loss_and_gradients(lora_policy, monkeypatch):
    """The trainer's own LM head pass (real completion tokens, in chunks) against the model's padded logits."""
    from reinforge_backend_local.training import trainer as trainer_module

    model, tokenizer = lora_policy
    template = ChatTemplate(tokenizer, 512)
    system = "You solve arithmetic problems and give the final answer as a number."
    questions = ("What is 347 * 28?", "What is 9 + 4?", "What is 5120 - 318?", "Is 7 prime?")
    prompts = [
        template.prompt_ids([{"role": "system", "content": system}, {"role": "user", "content": q}]) for q in questions
    ]
    completions = [[1000 + 7 * i + j for i in range(n)] for j, n in enumerate((5, 9, 1, 13))]  # ragged: padding
    temps = (None, 0.5, 1.0, 0.8)
    batch = [
        Sample(p, c, [-1.0] * len(c), a, temperature=t)
        for p, c, a, t in zip(prompts, completions, (1.0, -0.5, 0.25, -1.0), temps)
    ]
    monkeypatch.setattr(trainer_module, "LOGPROB_CHUNK_TOKENS", 8)  # several chunks for these 28 completion tokens
    with perturbed_lora(model, 1) as lora:
        # (own head, shared prefix, packed); the last: the model's own padded logits, no prefix sharing
        configs = ((True, True, True), (True, True, False), (True, False, False), (False, True, False))
        results = [
            _run_pass(model, lora, batch, temperature=0.9, completion_head=h, share_prefix=s, pack=p)
            for h, s, p in (*configs, (False, False, False))
        ]
    for got in results[:-1]:
        _assert_same_pass(got, results[-1], lora)


def test_packed_micro_batches_give_the_padded_loss_and_lora_gradients(lora_policy):
    """The padding-free layout (shared prefixes once, rows of prefix trees, several micro-batches) is exact."""
    model, tokenizer = lora_policy
    template = ChatTemplate(tokenizer, 512)
    system = "You solve arithmetic problems. Use the calculator when unsure, then give the answer as a number."
    turn1 = [{"role": "system", "content": system}, {"role": "user", "content": "What is 347 * 28?"}]
    turn2 = [*turn1, {"role": "assistant", "content": "calc(347 * 28)"}, {"role": "user", "content": "9716"}]
    grpo = template.prompt_ids([{"role": "system", "content": system}, {"role": "user", "content": "Is 7 prime?"}])
    lone = template.prompt_ids([{"role": "user", "content": "Name a colour."}])
    prompts = [grpo] * 4 + [template.prompt_ids(turn1), template.prompt_ids(turn2), lone]
    completions = [[1000 + 7 * i + j for i in range(n)] for j, n in enumerate((5, 9, 1, 5, 4, 7, 3))]
    completions[3][:2] = completions[0][:2]  # two completions that start alike: shared tokens too
    batch = [
        Sample(p, c, [-1.2] * len(c), a, temperature=t)
        for p, c, a, t in zip(prompts, completions, (1.0, -0.5, 0.25, -1.0, 0.5, 0.3, -0.2), (None,) * 6 + (0.7,))
    ]
    with perturbed_lora(model, 2) as lora:
        one, several, dense, padded = (
            _run_pass(model, lora, batch, temperature=0.9, pack=pack, micro_batch_tokens=budget, segment_attention=seg)
            for pack, budget, seg in ((True, 1024, True), (True, 90, True), (True, 1024, False), (False, 1024, True))
        )
    assert one.micro_batches == 1 and several.micro_batches > 1  # the small budget cut the batch
    for got in (one, several, dense):  # packed rows attending segment by segment, and under the rows' dense mask
        assert got.run_tokens < 0.6 * padded.run_tokens  # the prompts once per tree, no padding
        _assert_same_pass(got, padded, lora)


@pytest.mark.skipif(
    not packing.bf16_packable(),
    reason="oneDNN packs no bf16 weights on this CPU (AVX2 only): matmul_dtype bfloat16 is refused here",
)
def test_bf16_matmuls_with_the_sampler_correction_stay_within_bounds_of_float32(model_folder):
    """Decode and train on bf16 packed weights (``matmul_dtype: bfloat16``) vs float32 throughout.

    The same completions (sampled in bf16); float32 scores them on-policy (ratio 1). bf16 with the
    sampler correction (PPO ratio against the trainer's own logprobs, each token weighted by
    min(p_trainer / p_sampler, 2)): loss within 0.02 of float32's and each LoRA gradient within 25%
    of its norm, cosine at least 0.97 (measured: 0.009; 6-12%: bf16 keeps 8 bits of mantissa, its
    logprobs differ by up to ~0.1 here, and these gradients of a 4-sample batch are small).
    """
    from reinforge_backend_local.model import packing

    model, tokenizer, _ = load_policy(str(model_folder))
    model = attach_lora(model, ModelConfig(model_path=str(model_folder), lora_rank=8, lora_alpha=16))
    low, full = packing.Packer(torch.bfloat16), packing.Packer()
    packing.install(model, low)

    def use(packer):
        for m in model.modules():
            if hasattr(m, "_reinforge_packer"):
                m._reinforge_packer = packer

    template = ChatTemplate(tokenizer, 512)
    engine = Engine(model, tokenizer, max_model_len=512, packer=low)
    prompts = [template.prompt_ids([{"role": "user", "content": f"What is {a} + {a}?"}]) for a in (2, 7)]
    requests = [GenRequest(p, 8, 1.0, seed_key=(i, k)) for i, p in enumerate(prompts) for k in range(2)]
    with perturbed_lora(model, 4) as lora:
        with merged_for_decode(model, True):
            results = engine.generate(requests)
        advs = [1.0, -1.0, 0.5, -0.5]
        sampled = [Sample(r.prompt_ids, g.token_ids, g.logprobs, a) for r, g, a in zip(requests, results, advs)]
        use(full)
        reference = Trainer(model, ALGORITHMS["grpo"], learning_rate=1e-6, temperature=1.0, pad_id=2, peft=True)
        with torch.no_grad():
            logp32, _, cmask = reference._forward_logprobs(model, sampled)
        on_policy = [
            Sample(
                s.prompt_ids,
                s.completion_ids,
                logp32[i, cmask.shape[1] - len(s.completion_ids) :].tolist(),
                s.advantage,
            )
            for i, s in enumerate(sampled)
        ]
        want = _run_pass(model, lora, on_policy, temperature=1.0)
        use(low)
        got = _run_pass(model, lora, sampled, temperature=1.0, sampler_correction=2.0)
    gap = max(abs(a - b) for s, o in zip(sampled, on_policy) for a, b in zip(s.old_logprobs, o.old_logprobs))
    assert 1e-4 < gap < 0.5, gap  # the sampler really ran in bf16, and not far off
    assert abs(got.loss - want.loss) <= 0.02, (got.loss, want.loss)
    for n in lora:
        a, b = got.grads[n].flatten(), want.grads[n].flatten()
        assert float((a - b).norm()) <= 0.25 * float(b.norm()) + 1e-6, n
        assert float(torch.nn.functional.cosine_similarity(a, b, dim=0)) >= 0.97, n


def test_bfloat16_is_refused_naming_the_key_where_onednn_cannot_pack_it(monkeypatch):
    monkeypatch.setattr(packing, "bf16_packable", lambda: False)
    monkeypatch.setattr(packing, "native_bf16", lambda: True)
    with pytest.raises(ConfigError, match=r"backend_args.matmul_dtype: bfloat16 needs a CPU oneDNN packs bf16"):
        packing.resolve_matmul_dtype("bfloat16")
    assert packing.resolve_matmul_dtype("auto") == "float32"  # auto never picks what cannot run
    assert packing.resolve_matmul_dtype("float32") == "float32"
