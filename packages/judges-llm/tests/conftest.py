"""Shared setup: the testing kit's fixtures and no network for LiteLLM.

Judges keep no module-level state (each judge object owns its client, cache and length trend), so
tests need no reset between them.
"""

import os

from reinforge.testing.plugin import openai_server, reinforge_pm  # noqa: F401

# LiteLLM would otherwise fetch its model cost map from the internet at import.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
