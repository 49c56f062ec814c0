"""The decode engine's fused projections give the same tokens as the model's own layers."""

import pytest
import torch

from reinforge.config import ModelConfig
from reinforge_backend_local.engine import Engine, GenRequest
from reinforge_backend_local.modeling import load_policy
from reinforge_backend_local.policy import ChatTemplate
from reinforge_backend_local.weights import attach_lora, merged_for_decode


@pytest.fixture(scope="module")
def lora_model(model_folder):
    model, tokenizer, _ = load_policy(str(model_folder))
    model = attach_lora(model, ModelConfig(model_path="x", lora_rank=8, lora_alpha=16))
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)  # an adapter that changes the outputs
    return model, tokenizer


def _requests(tokenizer):
    template = ChatTemplate(tokenizer, 512)
    prompts = [template.prompt_ids([{"role": "user", "content": q}]) for q in ("What is 2 + 3?", "Name a color.")]
    return [GenRequest(p, 8, t, seed_key=(i, t)) for i, p in enumerate(prompts) for t in (0.0, 1.0)]


def _decode(engine, requests, fused):
    sites = engine.fused.sites
    if not fused:
        engine.fused.sites = []
    try:
        return engine.generate(requests)
    finally:
        engine.fused.sites = sites


def test_fused_decode_matches_the_unfused_model(lora_model):
    model, tokenizer = lora_model
    engine = Engine(model, tokenizer, max_model_len=512)
    assert len(engine.fused.sites) == 60  # q/k/v and gate/up in each of the 30 layers
    requests = _requests(tokenizer)
    with merged_for_decode(model, True):
        fused = _decode(engine, requests, True)
        plain = _decode(engine, requests, False)
    assert [r.token_ids for r in fused] == [r.token_ids for r in plain]
    for a, b in zip(fused, plain):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_an_active_unmerged_adapter_is_never_fused_away(lora_model):
    model, tokenizer = lora_model
    engine = Engine(model, tokenizer, max_model_len=512)
    requests = _requests(tokenizer)
    with_adapter = _decode(engine, requests, True)  # adapter active, not merged: fusion must stand aside
    with merged_for_decode(model, True):
        merged = _decode(engine, requests, True)
    assert [r.token_ids for r in with_adapter] == [r.token_ids for r in merged]
    with model.disable_adapter():
        base = _decode(engine, requests, True)
    assert [r.token_ids for r in base] != [r.token_ids for r in merged]  # the adapter does matter here
