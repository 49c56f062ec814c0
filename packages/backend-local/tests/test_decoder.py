"""The hand-written decoder against Hugging Face's forward, on the real SmolLM2-135M."""

import pytest
import torch

from reinforge.plugin import ModelConfig
from reinforge_backend_local.inference.decoder import LlamaDecoder, unsupported_reason
from reinforge_backend_local.inference.engine import Engine, GenRequest
from reinforge_backend_local.inference.policy import ChatTemplate
from reinforge_backend_local.model.modeling import load_policy
from reinforge_backend_local.model.packing import Packer, available
from reinforge_backend_local.model.weights import attach_lora, merged_for_decode

SYSTEM = "You are a careful calculator. Reply with just the number."
ATOL = 2e-3  # logits are O(10); float32 summation order differs between the two paths


def _prompt(tokenizer, question, system=SYSTEM):
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return ChatTemplate(tokenizer, 512).prompt_ids(messages)


def _reference_logits(model, sequences):
    """Next-token logits after each full sequence, one unpadded forward per sequence."""
    with torch.inference_mode():
        return torch.stack([model(input_ids=torch.tensor([s])).logits[0, -1].float() for s in sequences])


def _check_against_hf(model, prompts, row_src, steps=3, packer=None):
    session = LlamaDecoder(model, packer).session()
    with torch.inference_mode():
        logits = session.prefill(prompts, row_src, capacity=steps + 1)
    sequences = [list(prompts[s]) for s in row_src]
    torch.testing.assert_close(logits, _reference_logits(model, sequences), atol=ATOL, rtol=0)
    for k in range(steps):
        feed = torch.tensor([1000 + 37 * r + 11 * k for r in range(len(row_src))])  # a different token per row
        with torch.inference_mode():
            logits = session.step(feed)
        for seq, t in zip(sequences, feed.tolist()):
            seq.append(t)
        torch.testing.assert_close(logits, _reference_logits(model, sequences), atol=ATOL, rtol=0)


@pytest.mark.parametrize("prepacked", [False, True], ids=["plain", "prepacked"])
def test_distinct_prompts_with_a_shared_system_prompt_match_hf(policy, prepacked):
    model, tok = policy
    prompts = [_prompt(tok, q) for q in ("What is 2 + 3?", "What is 41 + 17?", "Add 100 and 250, please.")]
    assert len(set(len(p) for p in prompts)) > 1  # uneven lengths: left padding after the shared prefix
    packer = Packer() if prepacked else None
    if prepacked and not available():
        pytest.skip("oneDNN is not available in this torch build")
    _check_against_hf(model, prompts, [0, 1, 2], packer=packer)


def test_groups_of_identical_prompts_share_one_prefill_and_match_hf(policy):
    model, tok = policy
    prompts = [_prompt(tok, "What is 6 + 9?"), _prompt(tok, "What is 12 + 30?")]
    _check_against_hf(model, prompts, [0, 0, 0, 1, 1])


def test_prompts_without_a_common_prefix_match_hf(policy):
    model, tok = policy
    prompts = [[1, 504, 3300, 28], [9906, 314, 2222, 1133, 17, 47, 12000]]
    _check_against_hf(model, prompts, [0, 1])


def test_dropping_finished_rows_keeps_the_others_exact(policy):
    model, tok = policy
    prompts = [_prompt(tok, f"What is {a} + {a}?") for a in (3, 14, 159, 2653)]
    full, compact = LlamaDecoder(model).session(), LlamaDecoder(model).session()
    with torch.inference_mode():
        full.prefill(prompts, [0, 1, 2, 3], 4)
        compact.prefill(prompts, [0, 1, 2, 3], 4)
        feed = torch.tensor([500, 600, 700, 800])
        full.step(feed)
        compact.step(feed)
        compact.keep([1, 3])
        feed = torch.tensor([901, 902, 903, 904])
        expected = full.step(feed)[[1, 3]]
        got = compact.step(feed[[1, 3]])
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=0)  # kernels round differently for 2 and 4 rows


def test_a_live_lora_adapter_is_applied_and_a_merged_one_is_not_applied_twice(model_folder):
    model, tok, _ = load_policy(str(model_folder))
    model = attach_lora(model, ModelConfig(model_path=str(model_folder), lora_rank=8, lora_alpha=16)).eval()
    torch.manual_seed(0)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    prompts = [_prompt(tok, "What is 5 + 8?")]
    with torch.inference_mode():
        adapted = _reference_logits(model, prompts)
        with model.disable_adapter():
            plain = _reference_logits(model, prompts)
    assert (adapted - plain).abs().max() > 0.1  # the adapter matters
    dec = LlamaDecoder(model)
    with torch.inference_mode():
        live = dec.session().prefill(prompts, [0], 1)
        with merged_for_decode(model, True):
            merged = dec.session().prefill(prompts, [0], 1)
        with model.disable_adapter():
            disabled = dec.session().prefill(prompts, [0], 1)
    torch.testing.assert_close(live, adapted, atol=ATOL, rtol=0)
    torch.testing.assert_close(merged, adapted, atol=ATOL, rtol=0)
    torch.testing.assert_close(disabled, plain, atol=ATOL, rtol=0)


def test_stacked_projections_follow_the_weights_through_merges_and_updates(model_folder):
    """With a packer, q/k/v and gate/up run stacked; the stack is redone when a merge or an update changes them."""
    if not available():
        pytest.skip("oneDNN is not available in this torch build")
    model, tok, _ = load_policy(str(model_folder))
    model = attach_lora(model, ModelConfig(model_path=str(model_folder), lora_rank=8, lora_alpha=16)).eval()
    prompts = [_prompt(tok, "What is 5 + 8?"), _prompt(tok, "What is 13 * 3?")]
    packer = Packer()
    dec = LlamaDecoder(model, packer)
    for seed in (0, 1):  # a training step changes the adapter between two decode phases
        torch.manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(std=0.05)
        with torch.inference_mode():
            adapted = _reference_logits(model, prompts)
            with model.disable_adapter():
                plain = _reference_logits(model, prompts)
            with merged_for_decode(model, True):
                session = dec.session()
                merged = session.prefill(prompts, [0, 1], 1)
            assert session.layers[0].qkv.sizes is not None  # one stacked matmul for q, k and v
            with model.disable_adapter():
                disabled = dec.session().prefill(prompts, [0, 1], 1)
            live = dec.session()
            assert live.layers[0].qkv.sizes is None  # live factors: one matmul per projection
            live_logits = live.prefill(prompts, [0, 1], 1)
        torch.testing.assert_close(merged, adapted, atol=ATOL, rtol=0)
        torch.testing.assert_close(live_logits, adapted, atol=ATOL, rtol=0)
        torch.testing.assert_close(disabled, plain, atol=ATOL, rtol=0)
    assert all(len(v) <= 2 for v in packer.stacks.values())  # the base weights and the latest merge


def test_engine_fast_and_hf_paths_sample_the_same_completions(policy):
    model, tok = policy
    prompts = [_prompt(tok, q) for q in ("What is 7 + 5?", "What is 30 + 12?")]
    requests = [GenRequest(p, 8, temperature=1.0, seed_key=(3, i)) for i, p in enumerate(prompts) for _ in range(2)]
    fast = Engine(model, tok, max_model_len=512, packer=Packer())
    slow = Engine(model, tok, max_model_len=512, fast=False)
    assert fast.decoder is not None and slow.decoder is None
    a, b = fast.generate(requests), slow.generate(requests)
    # Same per-request random numbers; logits agree to ~1e-5, so the draws agree.
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    for x, y in zip(a, b):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-3)
        assert x.finish_reason == y.finish_reason and x.text == y.text


def test_a_batch_over_the_kv_budget_is_decoded_in_parts(policy):
    model, tok = policy
    prompt = _prompt(tok, "What is 1 + 1?")
    per_row = 2 * 30 * 3 * 64 * 4 * (len(prompt) + 4)  # bytes of float32 K and V for one row, 30 layers
    engine = Engine(model, tok, max_model_len=512, kv_cache_mb=2.5 * per_row / 2**20)  # room for two rows
    requests = [GenRequest(prompt, 4, temperature=0.0) for _ in range(6)]
    assert [len(p) for p in engine._parts(requests)] == [2, 2, 2]
    results = engine.generate(requests)
    assert len({tuple(r.token_ids) for r in results}) == 1  # greedy, same prompt: same answer in every part


def test_other_architectures_fall_back_to_the_hf_forward():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=300, n_positions=64)).eval()
    assert "gpt2" in unsupported_reason(model)

    class Tok:
        eos_token_id, pad_token_id = 299, 299

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    engine = Engine(model, Tok(), max_model_len=64)
    assert engine.decoder is None and "gpt2" in engine.slow_reason
    out = engine.generate([GenRequest([5, 6, 7], 3, temperature=0.0), GenRequest([8, 9], 3, temperature=0.0)])
    assert all(1 <= len(r.token_ids) <= 3 for r in out)


def test_an_episode_reuses_its_conversation_so_far_and_gets_the_logits_of_a_fresh_prefill(policy, poisoned_caches):
    """Within-episode KV reuse: turn 2 copies turn 1's keys and values and runs only what is new."""
    from reinforge_backend_local.inference.decoder import KnownTokens

    model, tok = policy
    questions = ("What is 347 * 28?", "What is 9 + 4?", "What is 5120 - 318?")
    first = [_prompt(tok, q) for q in questions]
    dec = LlamaDecoder(model)
    fed = [[1000 + 37 * r + 11 * k for k in range(4)] for r in range(3)]
    with torch.inference_mode():
        turn1 = dec.session()
        turn1.prefill(first, [0, 1, 2], capacity=5)
        for k in range(4):
            turn1.step(torch.tensor([fed[r][k] for r in range(3)]))
        shared = turn1.shared
        assert shared > 0
        known = []
        for r in range(3):  # as the engine keeps them: the batch's prefix once, each row's own tail
            k_all, v_all = turn1.row_kv(r)
            k_tail, v_tail = turn1.row_kv(r, shared)
            assert torch.equal(k_all[:, :, shared:], k_tail) and k_all.shape[2] == len(first[r]) + 4
            known.append(KnownTokens([(0, k_all[:, :, :shared], v_all[:, :, :shared]), (shared, k_tail, v_tail)], 0))
        # turn 2: the conversation so far plus an observation of a different length per row
        second = [first[r] + fed[r] + list(range(2000, 2000 + 3 + 5 * r)) for r in range(3)]
        for r in range(3):
            known[r].length = len(first[r]) + 4
        reused = dec.session()
        got = reused.prefill(second, [0, 1, 2], capacity=3, known=known)
        fresh = dec.session()
        expected = fresh.prefill(second, [0, 1, 2], capacity=3)
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)
        torch.testing.assert_close(got, _reference_logits(model, second), atol=ATOL, rtol=0)
        feed = torch.tensor([3000, 3001, 3002])
        torch.testing.assert_close(reused.step(feed), fresh.step(feed), atol=ATOL, rtol=0)
        # a known part that stops early (the template re-rendered the last turn differently) is used up to there
        known[1].length = len(first[1]) - 2
        partial = dec.session().prefill(second, [0, 1, 2], capacity=1, known=known)
        torch.testing.assert_close(partial, expected, atol=ATOL, rtol=0)


def test_the_engine_reuses_an_episode_until_it_is_forgotten(policy, poisoned_caches):
    model, tok = policy
    prompts = [_prompt(tok, q) for q in ("What is 7 + 5?", "What is 30 + 12?")]
    engine = Engine(model, tok, max_model_len=512, packer=Packer())
    plain = Engine(model, tok, max_model_len=512, packer=Packer())
    plain.episodes = None  # reuse off
    turn1 = [GenRequest(p, 6, temperature=0.0, episode=("rollout", i)) for i, p in enumerate(prompts)]
    a1, b1 = engine.generate(turn1), plain.generate(turn1)
    assert [r.token_ids for r in a1] == [r.token_ids for r in b1]
    assert engine.episode_bytes > 0 and engine.stats.episode_tokens_reused == 0
    observation = tok.encode("\nObservation: 42\n", add_special_tokens=False)
    turn2 = [
        GenRequest(p + r.token_ids + observation, 6, temperature=0.0, episode=("rollout", i))
        for i, (p, r) in enumerate(zip(prompts, a1))
    ]
    a2, b2 = engine.generate(turn2), plain.generate(turn2)
    assert [r.token_ids for r in a2] == [r.token_ids for r in b2]
    for x, y in zip(a2, b2):
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-3)
    # every token of turn 1 but its last sampled one (never fed) came from the episode
    assert engine.stats.episode_tokens_reused == sum(len(p) + len(r.token_ids) - 1 for p, r in zip(prompts, a1))
    for i in range(2):
        engine.forget(("rollout", i))
    assert engine.episodes == {} and engine.episode_bytes == 0


def test_the_gqa_flag_read_off_the_version_matches_what_sdpa_accepts():
    from reinforge_backend_local.inference.decoder import _sdpa_has_gqa

    q = torch.zeros(1, 2, 1, 4)
    try:
        torch.nn.functional.scaled_dot_product_attention(q, q[:, :1], q[:, :1], enable_gqa=True)
        accepts = True
    except TypeError:
        accepts = False
    assert _sdpa_has_gqa() is accepts
