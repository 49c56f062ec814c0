"""OpenAI-style errors the gateway answers itself (the upstream's own errors pass through untouched).

The class is core's (:class:`reinforge.plugin.ApiError`), shared with ``reinforge serve``.
"""

from __future__ import annotations

from reinforge.plugin import ApiError

__all__ = ["ApiError"]
