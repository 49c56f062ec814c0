"""Shared test setup for core: the testing kit's fixtures, and no network for LiteLLM.

The kit's fixtures are imported rather than activated with
``pytest_plugins = ["reinforge.testing"]``: pytest only accepts ``pytest_plugins``
in a top-level conftest, and this one is not top-level when the whole monorepo runs.
"""

import os

from reinforge.testing.plugin import hook_recorder, openai_server, reinforge_pm, scripted_model  # noqa: F401

# LiteLLM would otherwise fetch its model cost map from the internet at import.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
