"""reinforge's embedded ``local`` backend: GRPO-family training with torch + peft."""

from .__about__ import __version__

__all__ = ["__version__"]
