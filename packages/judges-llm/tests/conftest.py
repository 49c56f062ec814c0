"""Shared setup: the testing kit's fixtures, no network for LiteLLM, fresh shared judges per test."""

import os

import pytest

from reinforge.testing.plugin import openai_server, reinforge_pm  # noqa: F401

# LiteLLM would otherwise fetch its model cost map from the internet at import.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(autouse=True)
def _fresh_judges():
    from reinforge_judges_llm import reset_judges

    reset_judges()
    yield
    reset_judges()
