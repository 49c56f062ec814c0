"""Bearer keys compared in constant time: the traffic key for ``/v1/*``, the admin key for ``/metrics``."""

from __future__ import annotations

import hmac

from .errors import ApiError

__all__ = ["bearer", "check_admin", "check_traffic"]


def bearer(header: str | None) -> str:
    """The token of ``Authorization: Bearer <token>`` ('' when absent or another scheme)."""
    scheme, _, token = (header or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def _matches(header: str | None, key: str) -> bool:
    return hmac.compare_digest(bearer(header).encode(), key.encode())


def check_traffic(header: str | None, key: str | None) -> None:
    """A 401 unless ``header`` carries the traffic key (``None``: anonymous, only with ``dev``)."""
    if key is not None and not _matches(header, key):
        raise ApiError(
            "missing or incorrect API key: send Authorization: Bearer <key>",
            status=401,
            code="invalid_api_key",
        )


def check_admin(header: str | None, key: str | None) -> None:
    """A 401 unless ``header`` carries the admin key (``None``: open, only with ``dev``)."""
    if key is not None and not _matches(header, key):
        raise ApiError(
            "missing or incorrect admin key: send Authorization: Bearer <admin key>",
            status=401,
            code="invalid_admin_key",
        )
