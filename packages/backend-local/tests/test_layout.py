"""The padding-free training layout: what each position may see, what is shared, how micro-batches split."""

import pytest
import torch

from reinforge_backend_local.training import layout

SYSTEM = list(range(100, 140))  # a 40-token system prompt the prompts below start with


def _visible(packed: layout.Packed, flat: int) -> list[tuple[int, int]]:
    """(position, token) of every key the query at ``flat`` may attend to, in position order."""
    width = packed.ids.shape[1]
    row, col = divmod(flat, width)
    keys = (packed.mask[row, 0, col] == 0).nonzero().flatten().tolist()
    return sorted((int(packed.positions[row, k]), int(packed.ids[row, k])) for k in keys)


def _check_every_prediction(packed, prompts, completions):
    """Each completion token is predicted at the last position of its sequence so far, which sees exactly it."""
    assert packed.targets.tolist() == [t for c in completions for t in c]
    k = 0
    for prompt, completion in zip(prompts, completions):
        for j in range(len(completion)):
            sequence = prompt + completion[:j]
            flat = int(packed.predict[k])
            assert int(packed.positions.flatten()[flat]) == len(sequence) - 1
            assert int(packed.ids.flatten()[flat]) == sequence[-1]
            assert _visible(packed, flat) == list(enumerate(sequence))
            k += 1


def test_every_completion_token_is_predicted_from_exactly_its_own_sequence_so_far():
    prompts = [SYSTEM + [1, 2, 3], SYSTEM + [1, 2, 3], SYSTEM + [4], [7, 8], SYSTEM + [1, 2, 3], SYSTEM + [1, 2, 3]]
    completions = [[11, 12, 13], [21], [31, 32], [41, 42, 43, 44], [11, 12, 99], [11, 12, 13]]
    packed = layout.pack(prompts, completions, pad_id=0)
    _check_every_prediction(packed, prompts, completions)
    # one row, each token once: [7, 8, 41, 42, 43]; SYSTEM + [1, 2, 3] (the sample whose completion is [21]);
    # + [11, 12] (three samples run exactly these 45 tokens); + [4, 31]. Padded: 6 rows x 45.
    assert packed.tokens == 5 + 43 + 2 + 2 == layout.tokens_run(prompts, completions)
    assert packed.ids.shape[0] == 1
    assert packed.mask.dtype == torch.float32 and packed.mask.shape == (1, 1, packed.tokens, packed.tokens)


def test_a_prefix_tree_past_its_cap_starts_another_that_lays_the_prefix_out_again(monkeypatch):
    prompts = [SYSTEM + [g] for g in range(4) for _ in range(3)]
    completions = [[50 + i, 60 + i, 70] for i in range(12)]
    whole = layout.pack(prompts, completions, pad_id=0)
    _check_every_prediction(whole, prompts, completions)
    assert whole.ids.shape[0] == 1 and whole.tokens == 40 + 4 * (1 + 3 * 2)  # the system prompt once
    monkeypatch.setattr(layout, "TREE_TOKENS", 60)  # 40 + 3 x (1 + 3 x 2) = 61: the 9th sample starts a tree
    cut = layout.pack(prompts, completions, pad_id=0, row_tokens=8)
    _check_every_prediction(cut, prompts, completions)
    assert cut.ids.shape[0] == 2 and all(cut.ids[r, :40].tolist() == SYSTEM for r in range(2))
    assert cut.tokens == whole.tokens + 40 + 1  # the system prompt and the third group's token again


def test_unrelated_sequences_share_rows_only_up_to_the_row_width():
    prompts = [[1000 + 50 * i + k for k in range(30)] for i in range(6)]  # nothing in common
    completions = [[7, 8]] * 6
    packed = layout.pack(prompts, completions, pad_id=0, row_tokens=70)
    _check_every_prediction(packed, prompts, completions)
    assert packed.ids.shape == (3, 62) and packed.tokens == 6 * 31  # two sequences of 31 per row
    few = [[5, 6, 7] + p for p in prompts]  # 3 tokens in common: below MIN_SHARED, not shared
    assert layout.pack(few, completions, pad_id=0, row_tokens=70).tokens == 6 * 34


def test_padding_sees_only_itself_so_no_row_has_an_empty_softmax():
    packed = layout.pack([list(range(1, 200)), [9]], [[7, 8], [10]], pad_id=0)
    pads = (packed.ids == 0).nonzero().tolist()
    assert pads, "the short sequence's row should be padded to the long one's width"
    for row, col in pads:
        assert (packed.mask[row, 0, col] == 0).nonzero().flatten().tolist() == [col]


def test_a_sample_without_a_prompt_or_completion_token_is_refused():
    with pytest.raises(ValueError, match="prompt token and a completion token"):
        layout.pack([[1, 2]], [[]], pad_id=0)
    with pytest.raises(ValueError, match="prompt token and a completion token"):
        layout.split([[]], [[3]], 10)


def test_micro_batches_keep_to_the_budget_and_keep_groups_together():
    prompts = [SYSTEM + [g] for g in range(4) for _ in range(4)]  # 4 groups of 4 (GRPO)
    completions = [[1000 + i] * (5 + i % 7) for i in range(16)]
    assert layout.split(prompts, completions, None) == [list(range(16))]
    budget = 100  # one group: 41 + 4 x 5..11 completion tokens (shared too where equal) <= 100
    parts = layout.split(prompts, completions, budget)
    assert sorted(i for part in parts for i in part) == list(range(16))
    for part in parts:
        assert layout.tokens_run([prompts[i] for i in part], [completions[i] for i in part]) <= budget
    for g in range(4):  # a group that fits is never split apart
        assert sum(1 for part in parts if any(i // 4 == g for i in part)) == 1


def test_a_group_larger_than_the_budget_runs_its_prefix_once_per_part_and_a_long_sample_goes_alone():
    prompts = [SYSTEM] * 6 + [list(range(500, 800))]
    completions = [[7] + [i] * 29 for i in range(6)] + [[3] * 20]  # 30 tokens, the first one shared
    parts = layout.split(prompts, completions, 100)
    assert sorted(i for part in parts for i in part) == list(range(7))
    assert [6] in parts  # 319 tokens: over the budget on its own
    # 41 + 28 + 28 = 97 <= 100 < 41 + 3 x 28: two samples per part
    assert sorted(len(part) for part in parts if 6 not in part) == [2, 2, 2]


def _segment_case():
    """A packed batch of two prefix trees and a lone sequence, in rows with padding."""
    shared = list(range(1, 21))
    prompts = [shared + [30, 31]] * 3 + [shared + [40]] + [[50, 51, 52]]
    completions = [[60, 61, 62], [60, 63], [64, 65, 66, 67], [70, 71], [80, 81]]
    return prompts, completions, layout.pack(prompts, completions, 0, row_tokens=40)


def test_each_real_position_is_one_segments_query_and_back_inverts_queries():
    _, _, packed = _segment_case()
    seg = packed.segments
    n = packed.ids.numel()
    real = seg.queries[seg.queries < n]
    assert sorted(real.tolist()) == sorted(set(real.tolist()))  # no position computed twice
    assert len(real) == packed.tokens  # and every real token computed once
    slots = seg.back[seg.back < seg.queries.numel()]
    assert len(slots) == packed.tokens
    assert torch.equal(seg.queries.reshape(-1)[slots], torch.nonzero(seg.back < seg.queries.numel()).squeeze(1))


def test_segment_attention_equals_the_rows_dense_masked_attention_and_its_gradients():
    import torch.nn.functional as F

    from reinforge_backend_local.training.attention import _attention, segmented

    _, _, packed = _segment_case()
    rows, width = packed.ids.shape
    real = (packed.mask.squeeze(1).diagonal(dim1=1, dim2=2) == 0).reshape(-1)  # every position sees itself
    pad = packed.ids.reshape(-1) == 0
    torch.manual_seed(0)
    q = torch.randn(rows, 6, width, 8, requires_grad=True)
    k = torch.randn(rows, 2, width, 8, requires_grad=True)
    v = torch.randn(rows, 2, width, 8, requires_grad=True)
    weights = torch.randn(rows, width, 6, 8)
    dense = F.scaled_dot_product_attention(
        q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), attn_mask=packed.mask, scale=0.3
    ).transpose(1, 2)

    class Config:
        _attn_implementation = "sdpa"

    class Model:
        config = Config()

    with segmented(Model(), packed.segments):
        got, _ = _attention(None, q, k, v, packed.mask, scaling=0.3)
    keep = (real & ~pad).view(rows, width)
    torch.testing.assert_close(got[keep], dense[keep], atol=1e-5, rtol=1e-5)
    grads = []
    for out in (got, dense):
        (out[keep] * weights[keep]).sum().backward()
        grads.append([t.grad.clone() for t in (q, k, v)])
        for t in (q, k, v):
            t.grad = None
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert Model.config._attn_implementation == "sdpa"  # restored after the block
