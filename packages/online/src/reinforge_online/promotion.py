"""The promotion gate and automatic rollback: which trained version the gateway's sampled traffic gets.

Every version a :class:`~reinforge_online.versions.VersionedCommitter` trains is a *candidate*. The gate
(``gate:`` in online.yaml) scores it on a held-out check set (a run file's eval dataset, workflow and
judges, bounded) and compares that with the live version's score: it is *promoted* (served) when it is
at least the live score minus ``gate.margin``, else *refused*, and training goes on from the live
version. Without ``gate`` every candidate is promoted at once (logged as such).

While a version is live its rolling reward (the last ``rollback.window`` rewards of the traces it
answered) is compared with its predecessor's (the version it replaced, over that one's last window
while it was live); when it falls below by more than ``rollback.margin`` and by more than
``rollback.z`` standard errors of the difference (both with at least ``rollback.min_traces``
rewards: a drop the windows' noise explains is not acted on), the predecessor is served again
(*rolled back*). An operator can roll
back to any version that was live once (``reinforge online rollback N``). Versions are kept and
numbered (``v0`` is what was served before any training); every decision is written to the store's
``decisions`` table, logged, and counted in ``reinforge_online_version_decisions_total{decision}``.

Everything here runs on the outbox's thread (or, for an operator's rollback, under the same lock), one
step at a time, never on the request path.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .config import GateSettings, RollbackSettings
from .metrics import Metrics
from .store import TraceStore
from .versions import CheckResult, CheckSpec, Version, VersionedCommitter

__all__ = ["Promoter", "PromotionError", "VersionRecord"]

_log = logging.getLogger("reinforge_online.promotion")
LIVE_STATES = ("retired", "rolled_back")  # once live: an operator may roll back to these


class PromotionError(Exception):
    """An operator's request the promoter cannot do (an unknown version, one never served)."""


@dataclass
class VersionRecord:
    """One row of the ``versions`` table."""

    seq: int
    name: str
    state: str  # candidate, live, refused, retired, rolled_back
    created_at: float
    parent: int | None = None  # the version that was live when this one was made
    score: float | None = None
    data: dict[str, Any] = field(default_factory=dict)  # detail (the committer's), check, stints

    @property
    def version(self) -> Version:
        return Version(self.name, dict(self.data.get("detail") or {}))

    @property
    def stints(self) -> list[dict[str, Any]]:
        """The spans it was live: ``{served_as, from, until}`` (``until`` None while it is)."""
        return list(self.data.get("stints") or [])

    def public(self) -> dict[str, Any]:
        return {
            "version": self.seq,
            "name": self.name,
            "state": self.state,
            "created_at": self.created_at,
            "parent": self.parent,
            "score": self.score,
            "check": self.data.get("check"),
            "stints": self.stints,
            "detail": self.data.get("detail") or {},
        }


def _row(r: Any) -> VersionRecord:
    return VersionRecord(int(r[0]), str(r[1]), str(r[2]), float(r[3]), r[4], r[5], json.loads(r[6] or "{}"))


_COLUMNS = "seq, name, state, created_at, parent, score, data"


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def _all(db: Any) -> list[VersionRecord]:
    return [_row(r) for r in db.execute(f"SELECT {_COLUMNS} FROM versions ORDER BY seq")]


def _insert(db: Any, name: str, state: str, parent: int | None, data: dict[str, Any]) -> VersionRecord:
    (top,) = db.execute("SELECT MAX(seq) FROM versions").fetchone()
    seq = 0 if top is None else int(top) + 1
    record = VersionRecord(seq, name, state, time.time(), parent, None, data)
    db.execute(
        f"INSERT INTO versions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (seq, name, state, record.created_at, parent, None, _dumps(data)),
    )
    return record


def _update(db: Any, record: VersionRecord) -> None:
    db.execute(
        "UPDATE versions SET state = ?, score = ?, data = ? WHERE seq = ?",
        (record.state, record.score, _dumps(record.data), record.seq),
    )


def _decide(db: Any, seq: int | None, decision: str, reason: str, data: dict[str, Any]) -> None:
    db.execute(
        "INSERT INTO decisions (at, version, decision, reason, data) VALUES (?, ?, ?, ?, ?)",
        (time.time(), seq, decision, reason, _dumps(data)),
    )


def _decisions(db: Any, limit: int) -> list[dict[str, Any]]:
    rows = db.execute(
        "SELECT at, version, decision, reason, data FROM decisions ORDER BY at DESC LIMIT ?", (limit,)
    ).fetchall()
    return [{"at": r[0], "version": r[1], "decision": r[2], "reason": r[3], **json.loads(r[4] or "{}")} for r in rows]


def _rewards(db: Any, stints: list[dict[str, Any]], limit: int) -> list[float]:
    """The last ``limit`` rewards of traces answered by a version during its stints (newest first)."""
    out: list[float] = []
    for stint in reversed(stints):
        if stint.get("served_as") is None or len(out) >= limit:
            continue
        rows = db.execute(
            "SELECT r.reward FROM rewards r WHERE r.trace_id IN (SELECT c.trace_id FROM calls c"
            " WHERE c.policy_version = ? AND c.created_at >= ? AND c.created_at < ?) ORDER BY r.created_at DESC LIMIT ?",
            (str(stint["served_as"]), float(stint["from"]), float(stint.get("until") or 1e300), limit - len(out)),
        ).fetchall()
        out.extend(float(r[0]) for r in rows)
    return out


def _variance(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1)


class Promoter:
    """Decides which version is served (see the module docstring); owns the ``versions`` and ``decisions`` rows.

    :param gate: the gate's check set and margin (None: no gate, every candidate is promoted).
    """

    def __init__(
        self,
        store: TraceStore,
        committer: VersionedCommitter,
        metrics: Metrics,
        *,
        gate: GateSettings | None,
        rollback: RollbackSettings | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.committer = committer
        self.metrics = metrics
        self.gate = gate
        self.check_spec = (
            CheckSpec(gate.run, split=gate.split, limit=gate.limit, timeout_s=gate.timeout_s)
            if gate is not None
            else None
        )
        self.rollback_settings = rollback
        self.clock = clock
        self.lock = threading.RLock()  # the outbox's thread and an operator's rollback, one at a time
        self.started = False
        self.decided = 0  # decisions made by this promoter (promoted, refused, rolled back)
        self._decided = threading.Condition()

    # -- the store -------------------------------------------------------------------------------

    def _db(self, write: Callable[[Any], Any]) -> Any:
        return self.store.submit(write).result()

    def versions(self) -> list[VersionRecord]:
        """Every version, oldest first."""
        result: list[VersionRecord] = self._db(_all)
        return result

    def live(self) -> VersionRecord | None:
        return next((v for v in self.versions() if v.state == "live"), None)

    def decisions(self, limit: int = 100) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._db(lambda db: _decisions(db, limit))
        return result

    def _record(self, seq: int | None, decision: str, reason: str, **data: Any) -> None:
        self._db(lambda db: _decide(db, seq, decision, reason, data))
        self.metrics.version_decisions.labels(decision).inc()
        level = logging.INFO if decision == "promoted" else logging.WARNING
        _log.log(level, "version v%s %s: %s", seq, decision, reason)
        with self._decided:
            self.decided += 1
            self._decided.notify_all()

    def wait_decided(self, n: int, timeout: float | None = None) -> bool:
        """Wait until this promoter made ``n`` decisions in all (v0's promotion counts); whether it did."""
        with self._decided:
            return self._decided.wait_for(lambda: self.decided >= n, timeout)

    def _set_live_gauges(self, live: VersionRecord) -> None:
        self.metrics.live_version.set(live.seq)
        if live.score is not None:
            self.metrics.check_score.labels("live").set(live.score)

    # -- start -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Before the first batch: the live version recorded (v0: what is served now) and served, training
        going on from it; a candidate a crash left undecided is refused. Raises (the outbox retries)."""
        with self.lock:
            versions = self.versions()
            live = next((v for v in versions if v.state == "live"), None)
            if live is None:
                first = self.committer.initial_version()
                served_as = self.committer.serve(first)
                now = self.clock()
                data = {"detail": first.detail, "stints": [{"served_as": served_as, "from": now, "until": None}]}
                live = self._db(lambda db: _insert(db, first.name, "live", None, data))
                self._record(live.seq, "promoted", "what was served before any training (v0)")
            else:
                self._serve(live, reason="restart")  # a restarted server may serve a newer, unpromoted checkpoint
                self._db(lambda db: _update(db, live))
                self.committer.train_from(live.version)
            for left in (v for v in versions if v.state == "candidate"):
                self._abandon(left)
            if self.check_spec is not None and live.score is None:
                self._score(live)
            self._set_live_gauges(live)
            self.started = True

    def _abandon(self, left: VersionRecord) -> None:
        left.state = "refused"
        self._db(lambda db: _update(db, left))
        self._record(left.seq, "refused", "interrupted before its gate decided (the gateway stopped)")

    def _serve(self, record: VersionRecord, *, reason: str) -> None:
        """Serve ``record`` and open a new stint for it (a stint a restart left open ends now); not saved here."""
        served_as = self.committer.serve(record.version)
        now = self.clock()
        stints = [s for s in record.stints]
        if stints and stints[-1].get("until") is None:
            stints[-1]["until"] = now  # a restart: the old stint ends here
        stints.append({"served_as": served_as, "from": now, "until": None, "reason": reason})
        record.data["stints"] = stints

    def _score(self, record: VersionRecord) -> CheckResult | None:
        """``record`` checked on the check set (its score kept); None when the check failed (logged)."""
        assert self.check_spec is not None
        try:
            result = self.committer.check(record.version, self.check_spec)
        except Exception as exc:
            _log.warning("checking version v%s (%s) failed: %s: %s", record.seq, record.name, type(exc).__name__, exc)
            record.data["check"] = {"error": f"{type(exc).__name__}: {exc}"}
            self._db(lambda db: _update(db, record))
            return None
        record.score = result.score
        record.data["check"] = {"score": result.score, "tasks": result.tasks, "seconds": result.seconds}
        self._db(lambda db: _update(db, record))
        return result

    # -- a new candidate ---------------------------------------------------------------------------

    def on_version(self, version: Version) -> VersionRecord:
        """A batch made ``version``: record it as a candidate, run the gate, promote or refuse it."""
        with self.lock:
            live = self.live()
            parent = live.seq if live is not None else None
            record = self._db(lambda db: _insert(db, version.name, "candidate", parent, {"detail": version.detail}))
            self.metrics.version_decisions.labels("candidate").inc()
            if self.check_spec is None or live is None:
                self._promote(record, live, "no gate configured: promoted at once")
                return record
            if live.score is None:
                self._score(live)
            result = self._score(record)
            if result is None or live.score is None:
                self._refuse(record, live, "the check failed" if result is None else "the live version has no score")
                return record
            self.metrics.check_score.labels("candidate").set(result.score)
            margin = self.gate.margin if self.gate is not None else 0.0
            floor = live.score - margin
            if result.score >= floor:
                self._promote(
                    record, live, f"check {result.score:.3f} >= live v{live.seq} {live.score:.3f} - margin {margin:g}"
                )
            else:
                self._refuse(
                    record, live, f"check {result.score:.3f} < live v{live.seq} {live.score:.3f} - margin {margin:g}"
                )
            return record

    def _promote(self, record: VersionRecord, live: VersionRecord | None, reason: str) -> None:
        try:
            self._serve(record, reason="promoted")
        except Exception as exc:
            self._refuse(record, live, f"serving it failed: {type(exc).__name__}: {exc}")
            return
        now = self.clock()
        if live is not None:
            live.state = "retired"
            live.data["stints"] = [dict(s, until=s.get("until") or now) for s in live.stints]
            self._db(lambda db: _update(db, live))
        record.state = "live"
        self._db(lambda db: _update(db, record))
        self._record(record.seq, "promoted", reason, name=record.name, score=record.score)
        self._set_live_gauges(record)

    def _refuse(self, record: VersionRecord, live: VersionRecord | None, reason: str) -> None:
        record.state = "refused"
        self._db(lambda db: _update(db, record))
        self._record(record.seq, "refused", reason, name=record.name, score=record.score)
        if live is not None:
            try:
                self.committer.train_from(live.version)
            except Exception:
                _log.exception("training could not go back to the live version v%s", live.seq)

    # -- rollback ----------------------------------------------------------------------------------

    def watch(self) -> str | None:
        """Compare the live version's rolling reward with its predecessor's; roll back when it fell too far.

        The decision's reason, or None when nothing happened.
        """
        settings = self.rollback_settings
        if settings is None or not settings.enabled:
            return None
        with self.lock:
            versions = {v.seq: v for v in self.versions()}
            live = next((v for v in versions.values() if v.state == "live"), None)
            if live is None or live.parent is None or live.parent not in versions:
                return None
            previous = versions[live.parent]
            current = live.stints[-1:]  # since it went live (again)
            mine = self._db(lambda db: _rewards(db, current, settings.window))
            theirs = self._db(lambda db: _rewards(db, previous.stints, settings.window))
            if mine:
                self.metrics.rolling_reward.labels("live").set(sum(mine) / len(mine))
            if theirs:
                self.metrics.rolling_reward.labels("previous").set(sum(theirs) / len(theirs))
            if len(mine) < settings.min_traces or len(theirs) < settings.min_traces:
                return None
            m, t = sum(mine) / len(mine), sum(theirs) / len(theirs)
            se = math.sqrt(_variance(mine) / len(mine) + _variance(theirs) / len(theirs))
            if m >= t - settings.margin or (t - m) < settings.z * se:
                return None  # within the margin, or a drop the windows' noise explains
            reason = (
                f"rolling reward {m:.3f} over {len(mine)} traces fell below v{previous.seq}'s {t:.3f}"
                f" over {len(theirs)} by more than the margin {settings.margin:g} (and {settings.z:g} standard"
                f" errors, {se:.3f})"
            )
            self._roll_back(live, previous, reason, "rolled_back")
            return reason

    def rollback(self, to: int | None = None, *, reason: str = "an operator asked") -> VersionRecord:
        """Serve version ``to`` again (default: the live version's predecessor); the version now live.

        :raises PromotionError: no such version, or one that was never live.
        """
        with self.lock:
            versions = {v.seq: v for v in self.versions()}
            live = next((v for v in versions.values() if v.state == "live"), None)
            if live is None:
                raise PromotionError("no version is live yet")
            target_seq = live.parent if to is None else to
            if target_seq is None or target_seq not in versions:
                raise PromotionError(f"no version v{target_seq} to roll back to")
            target = versions[target_seq]
            if target.seq == live.seq:
                raise PromotionError(f"v{target.seq} is the live version already")
            if target.state not in LIVE_STATES:
                raise PromotionError(f"v{target.seq} was never live ({target.state}): only versions once served return")
            self._roll_back(live, target, reason, "manual_rollback")
            return target

    def _roll_back(self, live: VersionRecord, target: VersionRecord, reason: str, decision: str) -> None:
        self._serve(target, reason=decision)
        now = self.clock()
        live.state = "rolled_back"
        live.data["stints"] = [dict(s, until=s.get("until") or now) for s in live.stints]
        self._db(lambda db: _update(db, live))
        target.state = "live"
        self._db(lambda db: _update(db, target))
        self._record(live.seq, decision, f"{reason}; v{target.seq} ({target.name}) is served again", to=target.seq)
        self._set_live_gauges(target)
        try:
            self.committer.train_from(target.version)
        except Exception:
            _log.exception("training could not go back to v%s", target.seq)
