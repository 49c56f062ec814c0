"""The traffic and admin keys: ``Authorization: Bearer <key>``, compared in constant time."""

from __future__ import annotations

import hmac
import os

from reinforge.plugin import ConfigError

from .protocol import ApiError


def key_from_env(name: str | None, option: str = "--api-key-env") -> str | None:
    """The key in environment variable ``name`` (``None``: no key, the server is open)."""
    if not name:
        return None
    key = os.environ.get(name)
    if not key:
        raise ConfigError(f"{option}: the environment variable {name} is not set or empty")
    return key


def _matches(header: str | None, key: str) -> bool:
    scheme, _, token = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


def check_admin(header: str | None, key: str | None) -> None:
    """The admin routes: 403 without an admin key configured, 401 unless ``header`` carries it."""
    if key is None:
        raise ApiError(
            "admin endpoint disabled: start the server with --admin-key-env NAME",
            status=403,
            code="admin_disabled",
            kind="permission_error",
        )
    if not _matches(header, key):
        raise ApiError(
            "missing or incorrect admin key: send Authorization: Bearer <admin key>",
            status=401,
            code="invalid_admin_key",
            kind="invalid_request_error",
        )


def check(header: str | None, key: str | None) -> None:
    """Raise a 401 :class:`ApiError` unless ``header`` carries ``key`` (always passes when ``key`` is ``None``)."""
    if key is None:
        return
    if not _matches(header, key):
        raise ApiError(
            "missing or incorrect API key: send Authorization: Bearer <key>",
            status=401,
            code="invalid_api_key",
            kind="invalid_request_error",
        )
