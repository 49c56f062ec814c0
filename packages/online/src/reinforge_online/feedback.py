"""Delayed rewards: ``POST /online/v1/feedback``, authorised by the trace's own feedback token.

The token is ``HMAC-SHA256(secret, trace_id)``, handed to the caller with the sampled
response (header ``x-reinforge-feedback-token``), so only whoever got the response can
reward it, and the gateway needs no table of tokens. Checks run cheapest and least
revealing first: a bad token is a 401 before the store is asked whether the trace exists.

The write runs on the store's writer thread, ordered after the trace's own write, so
feedback sent right after a response finds its trace. An answer that changed the trace's reward
(status and body) is stored under its idempotency key in the same transaction: a retry gets the
first answer, and the same key with another reward is a 409 naming the stored one. Answers that
changed nothing (``unchanged``, conflicts, unknown traces) are not stored, so a client cannot grow
the table by sending new keys; a trace keeps at most :data:`MAX_PER_TRACE` feedback rows.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from .errors import ApiError

__all__ = [
    "FEEDBACK_TOKEN_HEADER",
    "MAX_PER_TRACE",
    "FeedbackOutcome",
    "apply_feedback",
    "check_token",
    "feedback_token",
    "parse",
]

FEEDBACK_TOKEN_HEADER = "x-reinforge-feedback-token"
TRACE_ID_HEADER = "x-reinforge-trace-id"
MAX_PER_TRACE = 32  # stored feedback rows of one trace (each one changed its reward)


def feedback_token(secret: bytes, trace_id: str) -> str:
    """The token that authorises feedback on ``trace_id``."""
    return hmac.new(secret, trace_id.encode(), hashlib.sha256).hexdigest()


def check_token(secret: bytes, trace_id: str, token: str | None) -> None:
    """A 401 unless ``token`` is ``trace_id``'s (constant-time compare)."""
    if not token or not hmac.compare_digest(feedback_token(secret, trace_id).encode(), token.strip().encode()):
        raise ApiError(
            f"missing or incorrect feedback token for this trace: send the {FEEDBACK_TOKEN_HEADER} header the "
            "gateway returned with the response",
            status=401,
            code="invalid_feedback_token",
        )


@dataclass(frozen=True)
class FeedbackRequest:
    trace_id: str
    reward: float
    idempotency_key: str | None


def parse(body: dict[str, Any], low: float | None = None, high: float | None = None) -> FeedbackRequest:
    """``{trace_id, reward, idempotency_key?}`` checked: a non-empty id and a finite number in the declared
    range ``[low, high]`` (a bound that is None does not apply); else a 400 naming the field (and the range)."""
    trace_id = body.get("trace_id")
    if not isinstance(trace_id, str) or not trace_id or len(trace_id) > 200:
        raise ApiError(
            "trace_id must be a non-empty string of at most 200 characters", param="trace_id", code="invalid_value"
        )
    reward = body.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise ApiError(f"reward must be a finite number, got {reward!r}", param="reward", code="invalid_value")
    if (low is not None and reward < low) or (high is not None and reward > high):
        span = f"[{'-inf' if low is None else f'{low:g}'}, {'inf' if high is None else f'{high:g}'}]"
        raise ApiError(
            f"reward {reward!r} is outside the declared range {span} (feedback.reward_min/reward_max)",
            param="reward",
            code="reward_out_of_range",
        )
    key = body.get("idempotency_key")
    if key is not None and (not isinstance(key, str) or not key or len(key) > 200):
        raise ApiError(
            "idempotency_key must be a non-empty string of at most 200 characters",
            param="idempotency_key",
            code="invalid_value",
        )
    unknown = sorted(set(body) - {"trace_id", "reward", "idempotency_key", "feedback_token"})
    if unknown:
        raise ApiError(f"unknown field(s) {unknown}", param=unknown[0], code="unknown_field")
    return FeedbackRequest(trace_id, float(reward), key)


@dataclass(frozen=True)
class FeedbackOutcome:
    status: int
    body: dict[str, Any]


def _error(status: int, message: str, code: str) -> FeedbackOutcome:
    kind = {404: "not_found_error", 409: "conflict_error"}.get(status, "invalid_request_error")
    return FeedbackOutcome(status, {"error": {"message": message, "type": kind, "param": "trace_id", "code": code}})


def apply_feedback(db: sqlite3.Connection, req: FeedbackRequest, reward: float, conflict: str) -> FeedbackOutcome:
    """Run inside the writer's transaction: the outcome of one feedback, remembered under its key when it
    changed the trace's reward (see the module docstring)."""
    if req.idempotency_key is not None:
        row = db.execute(
            "SELECT status, body FROM feedback WHERE trace_id = ? AND idempotency_key = ?",
            (req.trace_id, req.idempotency_key),
        ).fetchone()
        if row is not None:
            first = json.loads(row[1])
            if first.get("reward") == reward:
                return FeedbackOutcome(int(row[0]), first)
            out = _error(
                409,
                f"idempotency_key {req.idempotency_key!r} was used for reward {first.get('reward')} on this trace;"
                f" {reward} was not recorded",
                "idempotency_key_reused",
            )
            out.body["error"]["param"] = "idempotency_key"
            out.body["stored"] = first
            return out
    trace = db.execute("SELECT status FROM traces WHERE trace_id = ?", (req.trace_id,)).fetchone()
    if trace is None:
        return _error(404, f"no trace {req.trace_id!r} is stored here", "trace_not_found")
    existing = db.execute("SELECT reward FROM rewards WHERE trace_id = ?", (req.trace_id,)).fetchone()
    if existing is not None and float(existing[0]) == reward:
        return FeedbackOutcome(200, {"trace_id": req.trace_id, "reward": reward, "status": "unchanged"})
    (kept,) = db.execute("SELECT COUNT(*) FROM feedback WHERE trace_id = ?", (req.trace_id,)).fetchone()
    if trace[0] in ("committing", "committed"):
        return _error(409, f"trace {req.trace_id!r} was already committed for training", "trace_committed")
    if int(kept) >= MAX_PER_TRACE:
        return _error(
            409, f"trace {req.trace_id!r} has had its reward changed {kept} times, the most allowed", "feedback_limit"
        )
    if existing is None:
        db.execute(
            "INSERT INTO rewards (trace_id, reward, source, created_at) VALUES (?, ?, 'feedback', ?)",
            (req.trace_id, reward, time.time()),
        )
        db.execute("UPDATE traces SET status = 'rewarded' WHERE trace_id = ?", (req.trace_id,))
        outcome = FeedbackOutcome(200, {"trace_id": req.trace_id, "reward": reward, "status": "recorded"})
    elif conflict == "last-before-commit":
        db.execute(
            "UPDATE rewards SET reward = ?, created_at = ? WHERE trace_id = ?", (reward, time.time(), req.trace_id)
        )
        outcome = FeedbackOutcome(200, {"trace_id": req.trace_id, "reward": reward, "status": "replaced"})
    else:
        return _error(
            409,
            f"trace {req.trace_id!r} already has reward {float(existing[0])} (conflict policy first-wins)",
            "reward_conflict",
        )
    if req.idempotency_key is not None:
        db.execute(
            "INSERT INTO feedback (trace_id, idempotency_key, status, body, created_at) VALUES (?, ?, ?, ?, ?)",
            (req.trace_id, req.idempotency_key, outcome.status, json.dumps(outcome.body), time.time()),
        )
    return outcome
