"""``backend_args.device`` and ``model.dtype: auto``: checked before any model loads, resolved per machine.

CPU only: CUDA's presence is monkeypatched where a test needs a GPU machine's answers.
"""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
import torch

from reinforge.plugin import ConfigError
from reinforge_backend_local.backend import LocalBackend, LocalSettings
from reinforge_backend_local.model import checkpoint
from reinforge_backend_local.model.modeling import device_problem, load_policy, resolve_device, resolve_dtype


def check(**backend_args: object) -> LocalSettings:
    """``backend_args`` through the settings checker, as core runs it on a run file."""
    return LocalBackend().check_settings(SimpleNamespace(backend_args=backend_args), where="run.yaml")


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)


def test_device_defaults_to_auto_and_accepts_cpu() -> None:
    assert LocalSettings().device == "auto"
    assert check().device == "auto"
    assert check(device="cpu").device == "cpu"
    assert check(device="auto").device == "auto"


def test_cuda_without_a_gpu_fails_at_check_time_naming_the_key(no_cuda: None) -> None:
    for device in ("cuda", "cuda:0"):
        with pytest.raises(ConfigError, match=r"run\.yaml: backend_args\.device: .*no CUDA device is available"):
            check(device=device)


@pytest.mark.parametrize("device", ["tpu", "gpu", "cuda:x", "cuda:", "mps", ""])
def test_unknown_devices_are_rejected(device: str) -> None:
    with pytest.raises(ConfigError, match=r"backend_args\.device: must be one of auto, cpu, cuda, cuda:N"):
        check(device=device)


def test_a_gpu_index_past_the_last_gpu_is_rejected(one_gpu: None) -> None:
    assert check(device="cuda:0").device == "cuda:0"
    with pytest.raises(ConfigError, match=r"backend_args\.device: 'cuda:1', but this machine has 1 CUDA device"):
        check(device="cuda:1")


def test_auto_resolves_to_the_gpu_only_when_there_is_one(monkeypatch: pytest.MonkeyPatch, one_gpu: None) -> None:
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="device: 'cuda', but no CUDA device"):
        resolve_device("cuda")


def test_dtype_auto_is_bf16_on_a_gpu_that_has_it_and_float32_on_a_cpu(
    monkeypatch: pytest.MonkeyPatch, one_gpu: None
) -> None:
    assert resolve_dtype("auto", "cpu") == "float32"  # CPU behaviour does not change
    assert resolve_dtype("auto", torch.device("cuda")) == "bfloat16"
    assert resolve_dtype("float32", "cuda") == "float32"  # an explicit dtype is kept
    assert resolve_dtype("bfloat16", "cpu") == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert resolve_dtype("auto", "cuda") == "float32"
    with pytest.raises(ConfigError, match="model.dtype: 'float64'"):
        resolve_dtype("float64", "cpu")


def test_cpu_and_auto_need_no_torch_query() -> None:
    """The checker's default path stays cheap: no CUDA probing for auto or cpu."""
    assert device_problem("auto") is None and device_problem("cpu") is None


@pytest.fixture(scope="module")
def tiny_model(model_folder, tmp_path_factory):
    """A 2-layer random Llama with SmolLM2's tokenizer and chat template: loads in well under a second."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(str(model_folder))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("dtype", ["float32", "auto", "bfloat16"])
def test_load_policy_on_the_cpu(tiny_model, dtype: str) -> None:
    model, tokenizer, folder = load_policy(str(tiny_model), dtype=dtype, device="cpu")
    param = next(model.parameters())
    assert param.device.type == "cpu" and folder == tiny_model and tokenizer.chat_template
    assert param.dtype == (torch.bfloat16 if dtype == "bfloat16" else torch.float32)
    assert not model.training


def test_load_policy_auto_without_a_gpu_is_the_cpu(tiny_model, no_cuda: None) -> None:
    model, _, _ = load_policy(str(tiny_model), device="auto")
    assert next(model.parameters()).device.type == "cpu"


def test_load_policy_refuses_a_missing_gpu(tiny_model, no_cuda: None) -> None:
    with pytest.raises(ConfigError, match="device: 'cuda', but no CUDA device"):
        load_policy(str(tiny_model), device="cuda")


def test_a_checkpoint_holds_cpu_tensors_and_loads_back(tiny_model, tmp_path) -> None:
    """Saved tensors are CPU tensors whatever the device; here (CPU) the round trip is exact."""
    model, _, _ = load_policy(str(tiny_model), device="cpu")
    model.requires_grad_(True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    folder = checkpoint.save(tmp_path / "step-1", model=model, optimizer=optimizer, state={"step": 1}, peft=False)
    saved = torch.load(folder / "optimizer.pt")
    tensors = [v for s in saved["state"].values() for v in s.values() if isinstance(v, torch.Tensor)]
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    assert all(t.device.type == "cpu" for t in torch.load(folder / "model.pt").values())
    state = checkpoint.load(folder, model=model, optimizer=optimizer, peft=False)
    assert state == {"step": 1}
    nested = checkpoint._to_cpu({"a": [torch.ones(1)], "b": (1, "x")})
    assert isinstance(nested["a"][0], torch.Tensor) and nested["b"] == (1, "x")
