"""Exceptions raised by reinforge.

Every error a user can cause names the thing to fix: the file, key, row or
function. They all derive from :class:`ReinforgeError` so a CLI can print them
without a traceback.
"""

from __future__ import annotations


class ReinforgeError(Exception):
    """Base class of every error reinforge raises on purpose."""


class ConfigError(ReinforgeError, ValueError):
    """A run file, config object or argument is invalid."""


class SignatureError(ReinforgeError, TypeError):
    """A user function does not follow the workflow/judge/group-reward contract."""


class PluginError(ReinforgeError):
    """Plugins could not be loaded, or two plugins claim the same name."""


class ResolveError(ReinforgeError, LookupError):
    """A ``module:attr`` reference or a registered name could not be resolved."""


class MissingExtraError(ReinforgeError, ImportError):
    """An optional dependency is missing; the message says which extra to install."""


class RunnerError(ReinforgeError, RuntimeError):
    """The runner cannot continue (e.g. every rollout of a batch failed)."""


class RewardError(ReinforgeError, ValueError):
    """A judge or group reward returned something that breaks the contract."""


def require(module: str, extra: str, *, package: str = "reinforge"):
    """Import ``module`` or raise a :class:`MissingExtraError` naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{module!r} is not installed; install it with: pip install '{package}[{extra}]'"
        ) from exc
