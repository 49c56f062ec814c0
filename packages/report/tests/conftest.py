"""Shared setup: the testing kit's fixtures, no network for LiteLLM."""

import os

from reinforge.testing.plugin import reinforge_pm  # noqa: F401

# LiteLLM (imported by some core paths) would otherwise fetch its model cost map from the internet.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
