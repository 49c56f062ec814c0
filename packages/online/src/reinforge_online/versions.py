"""Policy versions: what a committer that trains the served policy hands back, and what online asks of it.

A plain committer only takes batches (:class:`~reinforge_online.committers.Committer`). A committer
that trains the policy the gateway serves (``local``) is a :class:`VersionedCommitter`: each batch
makes a new :class:`Version`, which is only a *candidate*. Online's promotion gate
(:mod:`reinforge_online.promotion`) decides whether it is served: it asks the committer to
:meth:`~VersionedCommitter.check` the candidate on a held-out check set, compares that with the live
version's score, and then calls :meth:`~VersionedCommitter.serve` (promoted) or
:meth:`~VersionedCommitter.train_from` with the live version (refused: training goes on from what is
served). A live version whose rolling reward falls below its predecessor's is rolled back the same
way: the predecessor is served again and training goes on from it. Versions are kept (the committer
must be able to serve and train from any version it made that was once live).

Every method runs on the outbox's thread, one at a time, never on the request path; each may take as
long as it needs (a check runs a few dozen tasks) and raises when it fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["CheckResult", "CheckSpec", "Version", "VersionedCommitter"]


@dataclass(frozen=True)
class Version:
    """A policy version a committer made.

    :ivar name: the committer's own name for it, unique within its run (``step-12``); it is how the
        committer is asked to check, serve or train from it again.
    :ivar detail: plain JSON data kept with it in the store (a checkpoint folder, training metrics).
    """

    name: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckSpec:
    """The held-out check set: the eval dataset, workflow and judges of a run file, bounded.

    :ivar run: the run file's absolute path (``gate.check.run``).
    :ivar split: the eval split to read (None: the run file's ``eval_dataset`` as it says).
    :ivar limit: at most this many tasks (the first ones: the same tasks for every version).
    :ivar timeout_s: a check that takes longer fails (the candidate is refused).
    """

    run: str
    split: str | None = None
    limit: int = 64
    timeout_s: float = 600.0


@dataclass(frozen=True)
class CheckResult:
    """One version's score on the check set.

    :ivar score: the run file's accuracy (``eval.accuracy_key`` at ``eval.threshold``), or the mean
        reward when it has none; higher is better.
    :ivar tasks: tasks scored (failed rollouts are not).
    :ivar seconds: how long the check took.
    :ivar metrics: every reward dimension's mean, for the record.
    """

    score: float
    tasks: int
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class VersionedCommitter(Protocol):
    """A committer whose batches train the served policy: each one a :class:`Version`, served only when promoted."""

    def send(self, batch_id: str, rows: list[dict[str, Any]]) -> Version | None:
        """Train on the batch and return the version it made, *without serving it*.

        Called again with the same ``batch_id`` after a failure (or a crash): a batch already trained
        returns the version it made then. None: nothing new to serve (the batch trained nothing).
        """

    def initial_version(self) -> Version:
        """The version served before any batch (the base model, or the adapter the server started with)."""

    def check(self, version: Version, spec: CheckSpec) -> CheckResult:
        """Score ``version`` on the check set (greedy, as the run file's eval says), whatever is served now."""

    def serve(self, version: Version) -> str | None:
        """Make the policy server serve ``version``; the policy version its responses carry from now
        (``x-policy-version``), or None if it does not say."""

    def train_from(self, version: Version) -> None:
        """The next batch trains on top of ``version`` (its weights and optimizer state), not on the newest."""
