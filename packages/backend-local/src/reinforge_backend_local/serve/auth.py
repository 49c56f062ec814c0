"""The traffic API key: ``Authorization: Bearer <key>``, compared in constant time."""

from __future__ import annotations

import hmac
import os

from reinforge.errors import ConfigError

from .protocol import ApiError


def key_from_env(name: str | None) -> str | None:
    """The key in environment variable ``name`` (``None``: no key, the server is open)."""
    if not name:
        return None
    key = os.environ.get(name)
    if not key:
        raise ConfigError(f"--api-key-env: the environment variable {name} is not set or empty")
    return key


def check(header: str | None, key: str | None) -> None:
    """Raise a 401 :class:`ApiError` unless ``header`` carries ``key`` (always passes when ``key`` is ``None``)."""
    if key is None:
        return
    scheme, _, token = (header or "").partition(" ")
    ok = scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())
    if not ok:
        raise ApiError(
            "missing or incorrect API key: send Authorization: Bearer <key>",
            status=401,
            code="invalid_api_key",
            kind="invalid_request_error",
        )
