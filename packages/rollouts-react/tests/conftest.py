"""Shared test setup: only this package's plugin (and core's built-ins), and no network for LiteLLM.

Other reinforge plugins installed in the same environment (a backend being
developed next door, say) must not change what these tests see.
"""

import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture(autouse=True)
def only_this_plugin(monkeypatch):
    monkeypatch.setenv("REINFORGE_LOAD_PLUGINS", "reinforge-rollouts-react")
