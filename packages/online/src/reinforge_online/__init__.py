"""reinforge-online: an OpenAI-compatible gateway that trains the policy it serves on production traffic."""

from .__about__ import __version__
from .config import OnlineSettings, Secrets, load_config, resolve_secrets
from .errors import ApiError
from .feedback import feedback_token
from .selection import ExplicitMarking, SamplingRate, Selection, SelectionRequest, build_selection
from .store import CallRecord, StoreUnavailable, TraceStore

__all__ = [
    "ApiError",
    "CallRecord",
    "ExplicitMarking",
    "OnlineSettings",
    "SamplingRate",
    "Secrets",
    "Selection",
    "SelectionRequest",
    "StoreUnavailable",
    "TraceStore",
    "__version__",
    "build_selection",
    "feedback_token",
    "load_config",
    "resolve_secrets",
]
