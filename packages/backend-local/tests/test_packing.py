"""Prepacked weights: same results and gradients as ``F.linear``, repacked exactly when a weight changes."""

import pytest
import torch

from reinforge.plugin import ConfigError, ModelConfig
from reinforge_backend_local.model import packing
from reinforge_backend_local.model.modeling import load_policy
from reinforge_backend_local.model.weights import attach_lora

pytestmark = pytest.mark.skipif(not packing.available(), reason="oneDNN is not available in this torch build")


def _linear(requires_grad: bool, bias: bool = True) -> torch.nn.Linear:
    torch.manual_seed(0)
    layer = torch.nn.Linear(48, 24, bias=bias)
    layer.requires_grad_(requires_grad)
    return layer


def test_a_frozen_linear_gives_f_linear_output_and_input_gradient():
    layer, plain = _linear(False), _linear(False)
    assert packing.install(layer, packing.Packer()) == 1
    x1 = torch.randn(3, 5, 48, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    y1, y2 = layer(x1), plain(x2)
    torch.testing.assert_close(y1, y2, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(y1)
    y1.backward(g)
    y2.backward(g)
    torch.testing.assert_close(x1.grad, x2.grad, atol=1e-5, rtol=1e-5)
    assert layer.weight.grad is None


def test_a_trainable_linear_keeps_f_linear_and_gets_weight_gradients():
    layer = _linear(True)
    packer = packing.Packer()
    packing.install(layer, packer)
    layer(torch.randn(4, 48)).sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0
    assert packer.entries == {}  # never packed


def test_a_weight_is_repacked_exactly_when_it_changes():
    layer = _linear(False, bias=False)
    packer = packing.Packer()
    first = packer.packed(layer, layer.weight)
    assert packer.packed(layer, layer.weight) is first
    with torch.no_grad():
        layer.weight.add_(1.0)  # in place: a new version
    second = packer.packed(layer, layer.weight)
    assert second is not first
    x = torch.randn(2, 48)
    y = torch.ops.mkldnn._linear_pointwise(x, second, None, "none", [], "")
    torch.testing.assert_close(y, torch.nn.functional.linear(x, layer.weight), atol=1e-5, rtol=1e-5)
    original = layer.weight.data
    layer.weight.data = original * 2  # swapped tensor, as LoRA merging does
    third = packer.packed(layer, layer.weight)
    assert third is not second
    layer.weight.data = original
    assert packer.packed(layer, layer.weight) is second  # two versions are kept: base and merged
    assert len(packer.entries[id(layer)]) == 2


def test_the_base_weights_stay_packed_while_each_decode_phase_merges_a_new_adapter():
    """Train (base), decode (merged k), train (base), decode (merged k+1)...: the base is packed once."""
    layer = _linear(False, bias=False)
    packer = packing.Packer()
    base = layer.weight.data
    packed_base = packer.packed(layer, layer.weight)
    stacked_base = packer.stacked([layer, layer], [layer.weight, layer.weight])
    for k in range(3):
        layer.weight.data = base + (k + 1)  # this phase's merge: a new tensor
        assert packer.packed(layer, layer.weight) is not packed_base
        assert packer.stacked([layer, layer], [layer.weight, layer.weight]) is not stacked_base
        layer.weight.data = base
        assert packer.packed(layer, layer.weight) is packed_base
        assert packer.stacked([layer, layer], [layer.weight, layer.weight]) is stacked_base
    x = torch.randn(3, 48)
    y = torch.ops.mkldnn._linear_pointwise(x, stacked_base, None, "none", [], "")
    torch.testing.assert_close(y, torch.cat([x @ base.T, x @ base.T], dim=1), atol=1e-5, rtol=1e-5)


def test_lora_training_on_packed_frozen_weights_gives_the_same_loss_and_gradients(model_folder):
    def build(pack: bool):
        model, _, _ = load_policy(str(model_folder))
        torch.manual_seed(0)
        model = attach_lora(model, ModelConfig(model_path=str(model_folder), lora_rank=4, lora_alpha=8))
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
        if pack:
            packing.install(model, packing.Packer())
        return model

    ids = torch.tensor([[1, 504, 3300, 28, 9906, 314, 2222, 1133, 17, 47]])
    grads = []
    losses = []
    for pack in (False, True):
        model = build(pack)
        logits = model(input_ids=ids).logits
        loss = torch.log_softmax(logits[0, :-1], -1).gather(1, ids[0, 1:, None]).mean()
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-3)


def test_matmul_dtype_auto_is_bf16_exactly_where_the_cpu_has_native_bf16_that_onednn_packs(monkeypatch):
    for flags, packable, expected in (
        ({"_is_amx_tile_supported"}, True, "bfloat16"),
        ({"_is_avx512_bf16_supported"}, True, "bfloat16"),
        ({"_is_avx512_bf16_supported"}, False, "float32"),
        (set(), True, "float32"),
        (set(), False, "float32"),
    ):
        for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
            monkeypatch.setattr(torch.cpu, probe, lambda on=probe in flags: on, raising=False)
        monkeypatch.setattr(packing, "bf16_packable", lambda on=packable: on)
        assert packing.native_bf16() is bool(flags)
        assert packing.resolve_matmul_dtype("auto") == expected
        assert packing.resolve_matmul_dtype("float32") == "float32"
        if packable:
            assert packing.resolve_matmul_dtype("bfloat16") == "bfloat16"
        else:
            with pytest.raises(ConfigError, match="backend_args.matmul_dtype"):
                packing.resolve_matmul_dtype("bfloat16")
