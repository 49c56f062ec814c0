"""Prometheus metrics of one gateway (its own registry, so several gateways in one process do not mix)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["Metrics"]

_ADDED = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Metrics:
    """Counters by route, path taken (upstream, policy, record, fallback, gateway) and status."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "reinforge_online_requests",
            "requests by route, the path taken (upstream, policy, record, fallback, gateway) and status",
            ["route", "path", "status"],
            registry=r,
        )
        self.sampled = Counter("reinforge_online_sampled", "requests selected for the policy or recording", registry=r)
        self.paused = Counter(
            "reinforge_online_sampling_paused",
            "requests not offered to selection because the store or the policy was unhealthy",
            ["reason"],
            registry=r,
        )
        self.policy_healthy = Gauge(
            "reinforge_online_policy_healthy", "0 while sampling pauses after policy failures", registry=r
        )
        self.policy_healthy.set(1)
        self.fallbacks = Counter(
            "reinforge_online_fallbacks", "sampled requests answered by the upstream instead", ["reason"], registry=r
        )
        self.store_errors = Counter(
            "reinforge_online_store_errors", "trace writes dropped (queue_full, write_failed)", ["kind"], registry=r
        )
        self.recorded = Counter("reinforge_online_recorded_calls", "calls acknowledged by the store", registry=r)
        self.traces_dropped = Counter(
            "reinforge_online_traces_dropped",
            "sampled calls answered without trace headers because the store did not commit them in time"
            " (queue_full, write_failed, unhealthy, closed, timeout, invalid)",
            ["reason"],
            registry=r,
        )
        self.streams = Counter(
            "reinforge_online_streamed_calls",
            "recorded streamed calls by how they ended (complete, aborted: broke off or cut, failed: an error event)",
            ["state"],
            registry=r,
        )
        self.broken_streams = Counter(
            "reinforge_online_broken_streams",
            "responses cut off because the upstream or policy broke off mid-body (the client's connection is"
            " closed without the final chunk), by path",
            ["path"],
            registry=r,
        )
        self.redacted = Counter(
            "reinforge_online_redaction_drops",
            "calls the redactor kept out of the store (dropped: it returned None; error: it raised)",
            ["result"],
            registry=r,
        )
        self.closed_trace_calls = Counter(
            "reinforge_online_closed_trace_calls",
            "calls not recorded because the trace they continue already had its reward",
            registry=r,
        )
        self.store_healthy = Gauge("reinforge_online_store_healthy", "1 while the trace store takes writes", registry=r)
        self.store_healthy.set(1)
        self.feedback = Counter("reinforge_online_feedback", "feedback requests by status", ["status"], registry=r)
        self.batches = Counter(
            "reinforge_online_batches", "committer batches by result (committed, failed)", ["result"], registry=r
        )
        self.committed_traces = Counter(
            "reinforge_online_committed_traces", "rewarded traces in committed batches", registry=r
        )
        self.judged = Counter(
            "reinforge_online_rewards",
            "traces the reward calculator looked at: rewarded, or skipped (feedback came first, or gone)",
            ["result"],
            registry=r,
        )
        self.unrewarded = Counter(
            "reinforge_online_unrewarded_traces",
            "closed traces left without a reward (failed, error, not_finite, queue_full, store), never given 0",
            ["reason"],
            registry=r,
        )
        self.shadow = Counter(
            "reinforge_online_shadow_runs",
            "shadow runs by result (recorded, dropped: queue full, stopped: a tool not on the allowlist, failed)",
            ["result"],
            registry=r,
        )
        self.version_decisions = Counter(
            "reinforge_online_version_decisions",
            "policy versions by what happened to them (candidate, promoted, refused, rolled_back, manual_rollback)",
            ["decision"],
            registry=r,
        )
        self.live_version = Gauge("reinforge_online_live_version", "the number of the version being served", registry=r)
        self.check_score = Gauge(
            "reinforge_online_check_score",
            "the gate's check-set score of the live version and of the last candidate",
            ["version"],
            registry=r,
        )
        self.rolling_reward = Gauge(
            "reinforge_online_rolling_reward",
            "mean reward over the last rollback.window traces of the live version and of its predecessor",
            ["version"],
            registry=r,
        )
        self.added = Histogram(
            "reinforge_online_added_latency_seconds",
            "time spent in the gateway itself (before forwarding and after the response arrived), by path",
            ["path"],
            buckets=_ADDED,
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
