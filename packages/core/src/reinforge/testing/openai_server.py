"""The OpenAI-compatible server, under the testing kit's name (it lives in :mod:`reinforge.openai_server`)."""

from ..openai_server import OpenAIServer, Reply, Responder

__all__ = ["OpenAIServer", "Reply", "Responder"]
