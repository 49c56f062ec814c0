"""The traffic and admin keys: ``Authorization: Bearer <key>``, compared in constant time (core's
:func:`reinforge.plugin.check_bearer`, shared with the online gateway)."""

from __future__ import annotations

import os

from reinforge.plugin import ApiError, ConfigError, check_bearer


def key_from_env(name: str | None, option: str = "--api-key-env") -> str | None:
    """The key in environment variable ``name`` (``None``: no key, the server is open)."""
    if not name:
        return None
    key = os.environ.get(name)
    if not key:
        raise ConfigError(f"{option}: the environment variable {name} is not set or empty")
    return key


def check_admin(header: str | None, key: str | None) -> None:
    """The admin routes: 403 without an admin key configured, 401 unless ``header`` carries it."""
    if key is None:
        raise ApiError(
            "admin endpoint disabled: start the server with --admin-key-env NAME",
            status=403,
            code="admin_disabled",
            kind="permission_error",
        )
    check_bearer(header, key, admin=True)


def check(header: str | None, key: str | None) -> None:
    """Raise a 401 :class:`ApiError` unless ``header`` carries ``key`` (always passes when ``key`` is ``None``)."""
    check_bearer(header, key)
