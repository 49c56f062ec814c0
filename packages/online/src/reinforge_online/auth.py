"""Bearer keys compared in constant time: the traffic key for ``/v1/*``, the admin key for ``/metrics`` and
the version routes (core's :func:`reinforge.plugin.check_bearer`, shared with ``reinforge serve``)."""

from __future__ import annotations

from reinforge.plugin import bearer, check_bearer

__all__ = ["bearer", "check_admin", "check_traffic"]


def check_traffic(header: str | None, key: str | None) -> None:
    """A 401 unless ``header`` carries the traffic key (``None``: anonymous, only with ``dev``)."""
    check_bearer(header, key)


def check_admin(header: str | None, key: str | None) -> None:
    """A 401 unless ``header`` carries the admin key (``None``: open, only with ``dev``)."""
    check_bearer(header, key, admin=True)
