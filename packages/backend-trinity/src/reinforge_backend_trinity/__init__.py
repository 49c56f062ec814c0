"""reinforge's ``trinity`` backend: a run as a Trinity-RFT config, for Ray clusters."""

from .__about__ import __version__

__all__ = ["__version__"]
