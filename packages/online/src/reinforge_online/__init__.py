"""reinforge-online: an OpenAI-compatible gateway that trains the policy it serves on production traffic."""

from typing import TYPE_CHECKING, Any

from .__about__ import __version__
from .committers import Committer, CommitterContext, CommitterPlan, build_committer, committer_registry
from .config import OnlineSettings, Secrets, load_config, resolve_secrets
from .errors import ApiError
from .feedback import feedback_token
from .selection import ExplicitMarking, SamplingRate, Selection, SelectionRequest, build_selection
from .store import CallRecord, StoreUnavailable, TraceStore
from .versions import CheckResult, CheckSpec, Version, VersionedCommitter

if TYPE_CHECKING:
    from .trainer import OnlineChatModel, OnlineChatResponse, OnlineTrainer

_LAZY = {"OnlineChatModel", "OnlineChatResponse", "OnlineTrainer"}  # the Python API: loaded on first use


def __getattr__(name: str) -> Any:
    """``OnlineTrainer`` and its chat model load on first use (``reinforge`` commands import this package)."""
    if name not in _LAZY:
        raise AttributeError(f"module 'reinforge_online' has no attribute {name!r}")
    from . import trainer

    value = getattr(trainer, name)
    globals()[name] = value
    return value


__all__ = [
    "ApiError",
    "CallRecord",
    "CheckResult",
    "CheckSpec",
    "Committer",
    "CommitterContext",
    "CommitterPlan",
    "ExplicitMarking",
    "OnlineChatModel",
    "OnlineChatResponse",
    "OnlineSettings",
    "OnlineTrainer",
    "SamplingRate",
    "Secrets",
    "Selection",
    "SelectionRequest",
    "StoreUnavailable",
    "TraceStore",
    "Version",
    "VersionedCommitter",
    "__version__",
    "build_committer",
    "build_selection",
    "committer_registry",
    "feedback_token",
    "load_config",
    "resolve_secrets",
]
