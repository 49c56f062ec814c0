"""Exceptions raised by reinforge.

Every error a user can cause names the thing to fix: the file, key, row or
function. They all derive from :class:`ReinforgeError` so a CLI can print them
without a traceback.
"""

from __future__ import annotations

from typing import Any


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
    """A judge or group reward returned something that breaks the contract (a NaN, a reward out of range)."""


class ConfigurationError(ReinforgeError):
    """Raise it from a workflow, judge or group reward for a permanent error: not retried, the run stops.

    For example a judge whose schema file does not parse: retrying cannot
    help, and scoring on would train on nothing. Transient problems return
    ``TaskStatus.FAILED`` (or raise any other exception) instead.
    """


class ComponentError(ConfigurationError):
    """A component reported a permanent error (``TaskStatus.ERROR`` or :class:`ConfigurationError`)."""


def attributed(exc: ReinforgeError, label: str) -> ReinforgeError:
    """``exc`` with ``label`` (``"judge my_judge"``) in front, unless its message already names it."""
    if label in str(exc):
        return exc
    try:
        made = type(exc)(f"{label}: {exc}")
    except Exception:
        made = ComponentError(f"{label}: {exc}")
    made.__cause__ = exc
    return made


def require(module: str, extra: str, *, package: str = "reinforge") -> Any:
    """Import ``module`` or raise a :class:`MissingExtraError` naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(
            f"{module!r} is not installed; install it with: pip install '{package}[{extra}]'"
        ) from exc
