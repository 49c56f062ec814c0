"""The optional Trinity-RFT install (the ``trinity`` extra): found without importing it, required on use.

Nothing here imports ``trinity`` at module level: the package, its entry point and ``tune --dry-run``
work without Trinity installed; what needs it raises a ``MissingExtraError`` that says what to install.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from reinforge.plugin import require

__all__ = ["INSTALL_HINT", "require_trinity", "trinity_installed"]

INSTALL_HINT = "pip install 'reinforge-backend-trinity[trinity]' && pip install 'numpy>=2'"


def trinity_installed() -> bool:
    """True when ``import trinity`` would find Trinity-RFT (it is not imported)."""
    return importlib.util.find_spec("trinity") is not None


def require_trinity(module: str = "trinity") -> Any:
    """Import a Trinity-RFT module, or raise ``MissingExtraError`` naming the extra to install."""
    return require(module, "trinity", package="reinforge-backend-trinity")
