"""Prometheus metrics of one server (its own registry, so several servers in one process do not mix)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/healthz", "/metrics", "/admin/adapter")
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "reinforge_serve_requests", "HTTP requests by route and status", ["route", "status"], registry=r
        )
        self.prompt_tokens = Counter("reinforge_serve_prompt_tokens", "prompt tokens of served requests", registry=r)
        self.completion_tokens = Counter("reinforge_serve_completion_tokens", "completion tokens generated", registry=r)
        self.batch_size = Histogram(
            "reinforge_serve_batch_size",
            "rows decoded together, per decode step",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=r,
        )
        self.running = Gauge("reinforge_serve_running_rows", "rows in the running decode batch", registry=r)
        self.joined = Counter(
            "reinforge_serve_joined_running_batch",
            "completions admitted into a batch that was already decoding (continuous batching)",
            registry=r,
        )
        self.queue_wait = Histogram(
            "reinforge_serve_queue_wait_seconds",
            "arrival of a completion to its admission into the decode batch",
            buckets=_LATENCY,
            registry=r,
        )
        self.ttft = Histogram(
            "reinforge_serve_time_to_first_token_seconds",
            "request arrival to its first completion token leaving the server",
            buckets=_LATENCY,
            registry=r,
        )
        self.policy_version = Gauge(
            "reinforge_serve_policy_version", "the served weights' version: +1 per hot adapter swap", registry=r
        )
        self.swaps = Counter(
            "reinforge_serve_adapter_swaps", "POST /admin/adapter attempts by result", ["result"], registry=r
        )
        self.latency = Histogram(
            "reinforge_serve_request_seconds",
            "request arrival to its last byte of generation",
            buckets=_LATENCY,
            registry=r,
        )

    def route(self, path: str) -> str:
        if path in ROUTES:
            return path
        return "/v1/models/{id}" if path.startswith("/v1/models/") else "other"

    def on_admit(self, waits: list[float], joined: int) -> None:
        """Called by the scheduler on the decode thread as completions are admitted."""
        for w in waits:
            self.queue_wait.observe(w)
        if joined:
            self.joined.inc(joined)

    def on_step(self, rows: int) -> None:
        """Called by the scheduler on the decode thread at every decode step."""
        self.batch_size.observe(rows)
        self.running.set(rows)

    def render(self) -> bytes:
        return generate_latest(self.registry)
