"""A tiny random Llama and a batch for it: trainer tests that need no downloaded model."""

from __future__ import annotations

import torch

from reinforge_backend_local.training.trainer import Sample, Samples


def tiny_llama(seed: int = 0, *, frozen_head: bool = False):
    """A one-layer Llama with a 64-token vocabulary; ``frozen_head``: the LM head frozen (the LoRA path)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg).eval()
    if frozen_head:
        model.lm_head.requires_grad_(False)
    return model


def tiny_samples(model, advantages=(1.0, -1.0, 0.5, -0.5), seed: int = 0) -> Samples:
    """Completions sampled from ``model`` itself (so the old logprobs are on-policy), one advantage each."""
    gen = torch.Generator().manual_seed(seed)
    items = []
    for i, adv in enumerate(advantages):
        prompt = [1, 5 + i, 9, 11 + i]
        ids, logps = list(prompt), []
        with torch.no_grad():
            for _ in range(5):
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
                probs = torch.softmax(logits, -1)
                tok = int(torch.multinomial(probs, 1, generator=gen))
                logps.append(float(torch.log(probs[tok])))
                ids.append(tok)
        items.append(Sample(prompt, ids[len(prompt) :], logps, adv))
    return Samples(items)
