"""Padding-free layout of a training micro-batch: shared prefixes once, sequences packed into rows.

A GRPO batch is groups of samples with the same prompt, and the calls of a
multi-turn episode share the conversation so far. Laid out as padded rows, every
sample runs its whole prompt again and pads to the longest. Here the samples'
input sequences (prompt, then completion without its last token: nothing is
predicted from that one) are sorted, so that each shares its longest common
prefix with the one before it; consecutive sequences that share at least
``MIN_SHARED`` tokens form a prefix tree (each token once, at its position in its
sequences); trees are packed whole into rows, and an attention mask keeps every
token to the tokens of its own sequence before it. Logprobs, loss and gradients
equal the padded computation: the gradients through a shared token add up, as
they would over its copies.

Attention under the mask costs a row's width squared, most of it masked out, so
unrelated trees share a row only to fill what would be padding (``row_tokens``);
:mod:`.attention` runs the same attention sequence by sequence (:class:`Segments`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

ROW_TOKENS = 128  # the narrowest row: prefix trees narrower than this share rows (measured: see the CHANGELOG)
TREE_TOKENS = 512  # a prefix tree wider than this starts another, its prefix laid out again
MIN_SHARED = 16  # sequences that share fewer tokens (a chat template's first line) go in separate trees


@dataclass
class Packed:
    """A micro-batch laid out in ``rows`` x ``width`` tokens.

    ``predict[k]`` is the flat index (``row * width + col``) of the position whose
    hidden state predicts ``targets[k]``; the completion tokens come sample by
    sample, in the batch's order, each sample's in order.
    """

    ids: torch.Tensor  # (rows, width) token ids, pad where nothing is
    positions: torch.Tensor  # (rows, width) each token's position in its sequences
    mask: torch.Tensor  # (rows, 1, width, width) additive: 0 where a query may attend to a key, else dtype min
    predict: torch.Tensor  # (completion tokens,)
    targets: torch.Tensor  # (completion tokens,)
    tokens: int  # real (non-pad) tokens laid out
    segments: Segments  # the same attention, sequence by sequence (:mod:`.attention`)


@dataclass
class Segments:
    """The attention of a packed micro-batch as one small causal attention per sequence.

    A tree token's attention depends on its own path only, so each token is computed once, in
    the first sequence that holds it (its *segment*: a suffix of that sequence). Segment ``s``'s
    queries are the flat positions ``queries[s, :n]``; its keys are its whole sequence,
    ``keys[s]``; ``mask`` lets the query at depth ``v`` see depths ``0..v``. ``back[p]`` is where
    the output of flat position ``p`` is in the (segments x longest segment) queries. Padded
    entries point one past the end (a zero row); padded query slots see key 0 (no empty softmax)
    and nothing reads them. Each real flat position is one query slot: ``back`` inverts ``queries``.
    """

    queries: torch.Tensor  # (segments, longest segment) flat positions, rows * width where padded
    keys: torch.Tensor  # (segments, longest sequence) flat positions, rows * width where padded
    mask: torch.Tensor  # (segments, 1, longest segment, longest sequence) additive
    back: torch.Tensor  # (rows * width,)

    def to(self, device: torch.device | str) -> Segments:
        return Segments(*(t.to(device) for t in (self.queries, self.keys, self.mask, self.back)))


def segments(flat_spots: Sequence[Sequence[int]], positions: int, dtype: torch.dtype) -> Segments:
    """:class:`Segments` of sequences laid out at ``flat_spots`` (each sequence's flat positions, in order)."""
    owned: set[int] = set()
    segs: list[tuple[int, list[int]]] = []  # (depth of the first query, the sequence's positions)
    for sp in flat_spots:
        start = sum(1 for p in sp if p in owned)  # earlier sequences hold a prefix of this one's path
        if start < len(sp):
            segs.append((start, list(sp)))
            owned.update(sp[start:])
    width_q = max(len(sp) - start for start, sp in segs)
    width_k = max(len(sp) for _, sp in segs)
    queries = torch.full((len(segs), width_q), positions, dtype=torch.long)
    keys = torch.full((len(segs), width_k), positions, dtype=torch.long)
    allowed = torch.zeros((len(segs), width_q, width_k), dtype=torch.bool)
    allowed[:, :, 0] = True
    back = torch.full((positions,), len(segs) * width_q, dtype=torch.long)
    for s, (start, sp) in enumerate(segs):
        n = len(sp) - start
        queries[s, :n] = torch.tensor(sp[start:])
        keys[s, : len(sp)] = torch.tensor(sp)
        depth = torch.arange(start, len(sp)).unsqueeze(1)
        allowed[s, :n, : len(sp)] = torch.arange(len(sp)).unsqueeze(0) <= depth
        back[queries[s, :n]] = s * width_q + torch.arange(n)
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    return Segments(queries, keys, mask.unsqueeze(1), back)


def inputs(prompt: Sequence[int], completion: Sequence[int]) -> list[int]:
    """The tokens a sample runs through the model: everything but its last completion token."""
    if not prompt or not completion:
        raise ValueError("every training sample needs a prompt token and a completion token")
    return [*prompt, *completion[:-1]]


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    return len(os.path.commonprefix([list(a), list(b)]))


def order(seqs: Sequence[Sequence[int]]) -> list[int]:
    """Sample indices in token order: a sequence's longest common prefix with any other is with a neighbour."""
    return sorted(range(len(seqs)), key=lambda i: list(seqs[i]))


@dataclass
class _Tree:
    """Consecutive sequences (in token order) that share prefixes, each token once."""

    tokens: list[int]
    spots: dict[int, list[int]]  # sample index -> the tree offset of each of its tokens


def _trees(seqs: Sequence[Sequence[int]], cap: int) -> list[_Tree]:
    """Prefix trees of the sequences, in token order.

    A sequence joins the tree before it when it shares at least ``MIN_SHARED`` tokens
    with the last sequence there (or is that sequence) and the tree stays within ``cap``
    tokens; otherwise it starts a tree, prefix and all.
    """
    trees: list[_Tree] = []
    last = -1
    for i in order(seqs):
        seq = seqs[i]
        shared = _common(seq, seqs[last]) if trees else 0
        if not trees or shared < min(MIN_SHARED, len(seq)) or len(trees[-1].tokens) + len(seq) - shared > cap:
            trees.append(_Tree([], {}))
            shared = 0
        tree = trees[-1]
        before = tree.spots[last][:shared] if shared else []
        tree.spots[i] = before + list(range(len(tree.tokens), len(tree.tokens) + len(seq) - shared))
        tree.tokens.extend(seq[shared:])
        last = i
    return trees


def _first_fit(sizes: Sequence[int], capacity: int | None) -> list[list[int]]:
    """Indices of ``sizes`` in bins of at most ``capacity`` (None: one bin), first fit decreasing."""
    bins: list[list[int]] = []
    used: list[int] = []
    for k in sorted(range(len(sizes)), key=lambda k: -sizes[k]):
        for b in range(len(bins)):
            if capacity is None or used[b] + sizes[k] <= capacity:
                bins[b].append(k)
                used[b] += sizes[k]
                break
        else:
            bins.append([k])
            used.append(sizes[k])
    return bins


def split(
    prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], budget: int | None
) -> list[list[int]]:
    """Micro-batches (sample indices) of at most ``budget`` laid-out tokens each (a longer sample goes alone).

    Samples that share a prefix stay together: a prefix tree is cut only where it would
    pass the budget, and each part then runs the prefix.
    """
    seqs = [inputs(p, c) for p, c in zip(prompts, completions)]
    trees = _trees(seqs, TREE_TOKENS if budget is None else min(TREE_TOKENS, budget))
    bins = _first_fit([len(t.tokens) for t in trees], budget)
    return [sorted(i for k in b for i in trees[k].spots) for b in bins]


def arrange(
    seqs: Sequence[Sequence[int]], row_tokens: int = ROW_TOKENS
) -> tuple[list[list[int]], list[list[tuple[int, int]]]]:
    """Rows of token ids, and per sequence the (row, column) of each of its tokens.

    Prefix trees (:func:`_trees`) are packed whole into rows as wide as the widest tree
    or ``row_tokens``, first fit decreasing: a row's attention costs its width squared,
    so unrelated sequences share a row only to fill what would be padding.
    """
    trees = _trees(seqs, TREE_TOKENS)
    width = max(row_tokens, *(len(t.tokens) for t in trees))
    rows: list[list[int]] = []
    spots: list[list[tuple[int, int]]] = [[] for _ in seqs]
    for r, b in enumerate(_first_fit([len(t.tokens) for t in trees], width)):
        row: list[int] = []
        for k in b:
            for i, local in trees[k].spots.items():
                spots[i] = [(r, len(row) + x) for x in local]
            row.extend(trees[k].tokens)
        rows.append(row)
    return rows, spots


def tokens_run(prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]) -> int:
    """Real tokens :func:`pack` lays out for these samples."""
    rows, _ = arrange([inputs(p, c) for p, c in zip(prompts, completions)])
    return sum(map(len, rows))


def pack(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    dtype: torch.dtype = torch.float32,
    row_tokens: int = ROW_TOKENS,
) -> Packed:
    """Lay one micro-batch out in rows of prefix trees, at most ``max(row_tokens, longest sequence)`` wide."""
    rows, spots = arrange([inputs(p, c) for p, c in zip(prompts, completions)], row_tokens)
    n_rows, width = len(rows), max(len(r) for r in rows)
    ids = torch.full((n_rows, width), pad_id, dtype=torch.long)
    positions = torch.zeros((n_rows * width,), dtype=torch.long)
    allowed = torch.zeros((n_rows * width, width), dtype=torch.bool)  # (flat query, key column)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = torch.tensor(row, dtype=torch.long)
        pad = torch.arange(r * width + len(row), (r + 1) * width)
        allowed[pad, pad % width] = True  # padding sees itself only: no empty softmax
    flat_spots = [[r * width + col for r, col in sp] for sp in spots]
    for sp in flat_spots:
        at = torch.tensor(sp, dtype=torch.long)
        positions[at] = torch.arange(len(sp))
        cols = at % width
        # the token at depth v sees the sequence's tokens at depths 0..v
        query = at.unsqueeze(1).expand(len(sp), len(sp))
        key = cols.unsqueeze(0).expand(len(sp), len(sp))
        keep = torch.ones(len(sp), len(sp), dtype=torch.bool).tril()
        allowed[query[keep], key[keep]] = True
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    predict = [sp[len(p) - 1 + j] for p, c, sp in zip(prompts, completions, flat_spots) for j in range(len(c))]
    return Packed(
        ids=ids,
        positions=positions.view(n_rows, width),
        mask=mask.view(n_rows, 1, width, width),
        predict=torch.tensor(predict, dtype=torch.long),
        targets=torch.tensor([t for c in completions for t in c], dtype=torch.long),
        tokens=sum(len(r) for r in rows),
        segments=segments(flat_spots, n_rows * width, dtype),
    )
