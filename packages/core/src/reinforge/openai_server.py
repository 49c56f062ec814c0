"""Deprecated alias of :mod:`reinforge.testing.openai_server` (removed in core 0.4).

The stdlib server is a test double, so it lives in the testing kit; this name stays one minor
release so that tests written against 0.3.0 keep importing.
"""

from __future__ import annotations

import warnings

from .testing.openai_server import OpenAIServer, Reply, Responder

__all__ = ["OpenAIServer", "Reply", "Responder"]

warnings.warn(
    "reinforge.openai_server is deprecated and goes in reinforge 0.4: import reinforge.testing.openai_server",
    DeprecationWarning,
    stacklevel=2,
)
