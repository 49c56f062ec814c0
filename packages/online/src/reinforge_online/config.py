"""``online.yaml``: the gateway's settings, checked by core's settings checker.

Every problem names the file and the dotted key (``online.yaml: selection.sampling_rate:
must be in [0, 1], got 1.5``), before anything binds or connects. Secrets are never in the
file: it names the environment variables that hold them, read by :func:`resolve_secrets`.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from reinforge.plugin import (
    ComponentSpec,
    ConfigError,
    FieldError,
    Settings,
    at_least,
    finite,
    in_range,
    load_settings,
    one_of,
)

__all__ = [
    "CHAT_ROUTE",
    "MODES",
    "AuthSettings",
    "CommitterSettings",
    "FeedbackSettings",
    "GateSettings",
    "LimitSettings",
    "ListenSettings",
    "OnlineSettings",
    "PolicySettings",
    "RewardSettings",
    "RollbackSettings",
    "Secrets",
    "SelectionSettings",
    "ShadowSettings",
    "StoreSettings",
    "UpstreamSettings",
    "load_config",
    "resolve_secrets",
]

CHAT_ROUTE = "/v1/chat/completions"
ROUTES = (CHAT_ROUTE,)  # the routes a mode applies to: the ones that generate
MODES = ("route", "record", "shadow")
CONFLICT_POLICIES = ("first-wins", "last-before-commit")


def _mode(key: str, value: str) -> None:
    one_of(key, value, MODES)


def _url(key: str, value: str) -> None:
    if not value.startswith(("http://", "https://")):
        raise FieldError(key, f"expected an http:// or https:// URL, got {value!r}")


@dataclass
class ListenSettings(Settings):
    """Where the gateway binds: loopback unless a deployment says otherwise."""

    host: str = "127.0.0.1"
    port: int = 8100

    def check(self) -> None:
        in_range("port", self.port, 0, 65535)


@dataclass
class AuthSettings(Settings):
    """Names of the environment variables holding the keys (never the keys themselves)."""

    traffic_key_env: str | None = None
    admin_key_env: str | None = None
    feedback_secret_env: str | None = None


@dataclass
class UpstreamSettings(Settings):
    """The original OpenAI-compatible API that unsampled traffic goes to."""

    url: str = ""
    key_env: str | None = None
    timeout_s: float = 600.0
    max_connections: int = 256

    def check(self) -> None:
        _url("url", self.url)
        at_least("timeout_s", self.timeout_s, 0.0, strict=True)
        at_least("max_connections", self.max_connections, 1)


@dataclass
class PolicySettings(Settings):
    """The policy under training: a ``reinforge serve`` endpoint (``model`` replaces the client's model name)."""

    url: str = ""
    key_env: str | None = None
    model: str | None = None
    timeout_s: float = 600.0
    max_connections: int = 64
    failures_before_pause: int = 3
    pause_s: float = 5.0

    def check(self) -> None:
        _url("url", self.url)
        at_least("timeout_s", self.timeout_s, 0.0, strict=True)
        at_least("max_connections", self.max_connections, 1)
        at_least("failures_before_pause", self.failures_before_pause, 1)
        at_least("pause_s", self.pause_s, 0.0)


@dataclass
class SelectionSettings(Settings):
    """Which requests are sampled: ``sampling_rate``, ``explicit`` or a strategy a plugin registers."""

    strategy: str = "sampling_rate"
    sampling_rate: float = 0.0
    salt: str = ""
    header: str = "x-reinforge-sample"
    session_header: str = "x-session-id"
    args: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        in_range("sampling_rate", self.sampling_rate, 0.0, 1.0)
        if not self.strategy.strip():
            raise FieldError("strategy", "must not be empty")


@dataclass
class StoreSettings(Settings):
    """The trace store: a SQLite file (WAL), or a PostgreSQL database (``url``), and its writer thread's queue."""

    path: str = "traces.sqlite"
    url: str | None = None  # postgresql://user@host:port/dbname: several replicas share it (needs [postgres])
    password_env: str | None = None  # the environment variable holding the database password (never the file)
    queue_size: int = 10000
    batch_max: int = 512
    busy_timeout_ms: int = 1000
    ack_timeout_ms: int = 250  # how long a sampled request waits for its call's commit before it goes without headers
    probe_interval_s: float = 1.0
    ttl_s: float | None = None
    sweep_interval_s: float = 60.0
    max_calls_per_trace: int = 256

    def check(self) -> None:
        at_least("ack_timeout_ms", self.ack_timeout_ms, 1)
        if self.ttl_s is not None:
            at_least("ttl_s", self.ttl_s, 0.0, strict=True)
        at_least("sweep_interval_s", self.sweep_interval_s, 0.0, strict=True)
        at_least("max_calls_per_trace", self.max_calls_per_trace, 1)
        if not self.path.strip():
            raise FieldError("path", "must not be empty")
        if self.url is not None:
            parts = urlsplit(self.url)
            if parts.scheme not in ("postgresql", "postgres"):
                raise FieldError(
                    "url", f"expected a postgresql://user@host:port/dbname URL, got scheme {parts.scheme!r}"
                )
            if parts.password is not None:
                raise FieldError("url", "must not hold a password: name its environment variable in store.password_env")
        elif self.password_env is not None:
            raise FieldError("password_env", "is only for a PostgreSQL store (store.url)")
        at_least("queue_size", self.queue_size, 1)
        at_least("batch_max", self.batch_max, 1)
        at_least("busy_timeout_ms", self.busy_timeout_ms, 0)
        at_least("probe_interval_s", self.probe_interval_s, 0.0, strict=True)


@dataclass
class LimitSettings(Settings):
    """Request limits enforced before anything is forwarded (``requests_per_s: null`` switches the rate limit off)."""

    max_body_bytes: int = 4 * 2**20
    body_timeout_s: float = 30.0
    requests_per_s: float | None = 100.0
    burst: int = 200

    def check(self) -> None:
        at_least("max_body_bytes", self.max_body_bytes, 1)
        at_least("body_timeout_s", self.body_timeout_s, 0.0, strict=True)
        if self.requests_per_s is not None:
            at_least("requests_per_s", self.requests_per_s, 0.0, strict=True)
        at_least("burst", self.burst, 0)


@dataclass
class FeedbackSettings(Settings):
    """Delayed rewards: the conflict policy and the declared range (rewards outside are a 400; null: no bound)."""

    conflict: str = "first-wins"
    reward_min: float | None = -1.0
    reward_max: float | None = 1.0

    def check(self) -> None:
        one_of("conflict", self.conflict, CONFLICT_POLICIES)
        for key in ("reward_min", "reward_max"):
            value = getattr(self, key)
            if value is not None:
                finite(key, value)
        if self.reward_min is not None and self.reward_max is not None and self.reward_min > self.reward_max:
            raise FieldError("reward_max", f"must be at least reward_min ({self.reward_min}), got {self.reward_max}")


# where the keys of the built-in committers went in 0.2 (committers became plugins)
_MOVED_COMMITTER_KEYS = {
    "local": "moved to committer.args (kind: local)",
    "trinity": "moved to committer.args (kind: trinity)",
}


@dataclass
class CommitterSettings(Settings):
    """Where rewarded traces go, in batches, and how often: ``kind`` names a committer a plugin registered
    (``sink``, ``local``, ``trinity``, ...; ``none``: they stay in the store), ``args`` are its own settings,
    checked against the class it registered (:mod:`reinforge_online.committers`) when the gateway is built."""

    kind: str = "none"
    interval_s: float = 300.0
    min_traces: int = 100
    max_traces: int = 1000
    retry_s: float = 1.0
    args: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def _normalize(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The 0.1 keys are errors that say where each one went."""
        for key, moved in _MOVED_COMMITTER_KEYS.items():
            if key in data:
                raise FieldError(key, moved)
        if "path" in data:
            where = "committer.args.run_dir (kind: local)" if data.get("kind") == "local" else "committer.args.path"
            raise FieldError("path", f"moved to {where}")
        return data

    def check(self) -> None:
        if not self.kind.strip():
            raise FieldError("kind", "must not be empty (none: no committer)")
        at_least("interval_s", self.interval_s, 0.0, strict=True)
        at_least("min_traces", self.min_traces, 1)
        at_least("max_traces", self.max_traces, 1)
        at_least("retry_s", self.retry_s, 0.0, strict=True)


def _range(lo_key: str, lo: float | None, hi_key: str, hi: float | None) -> None:
    for key, value in ((lo_key, lo), (hi_key, hi)):
        if value is not None:
            finite(key, value)
    if lo is not None and hi is not None and lo > hi:
        raise FieldError(hi_key, f"must be at least {lo_key} ({lo}), got {hi}")


@dataclass
class RewardSettings(Settings):
    """The in-process reward calculator: core's judges and composition, run when a trace closes.

    ``run`` names a run file whose ``judges`` (and ``reward.scores``) are used; ``judges``
    lists them here instead, in the run file's form. A judge that returns FAILED (or raises,
    or times out) is retried ``max_retries`` times; then the trace is unrewarded, never 0.
    """

    run: str | None = None
    judges: list[ComponentSpec] = field(default_factory=list)
    timeout_s: float = 30.0
    max_retries: int = 2
    close_after_s: float = 0.0
    concurrency: int = 4
    queue_size: int = 1000
    reward_min: float | None = None
    reward_max: float | None = None

    def check(self) -> None:
        if self.run is not None and self.judges:
            raise FieldError("judges", "set either run (a run file's judges) or judges, not both")
        if self.run is None and not self.judges:
            raise FieldError("judges", "name at least one judge, or a run file under run")
        if self.run is not None and not self.run.strip():
            raise FieldError("run", "must not be empty")
        at_least("timeout_s", self.timeout_s, 0.0, strict=True)
        at_least("max_retries", self.max_retries, 0)
        at_least("close_after_s", self.close_after_s, 0.0)
        at_least("concurrency", self.concurrency, 1)
        at_least("queue_size", self.queue_size, 1)
        _range("reward_min", self.reward_min, "reward_max", self.reward_max)


@dataclass
class GateSettings(Settings):
    """The promotion gate: a candidate is served only when its score on the check set (a run file's eval
    dataset, workflow and judges, bounded in size and time) is at least the live version's minus ``margin``."""

    run: str = ""  # a run file (relative to online.yaml)
    split: str | None = None  # the eval split to read (default: the run file's eval_dataset as it is)
    limit: int = 64  # tasks at most (the first ones: every version gets the same)
    timeout_s: float = 600.0  # a check that takes longer refuses the candidate
    margin: float = 0.0

    def check(self) -> None:
        if not self.run.strip():
            raise FieldError("run", "name the run file whose eval dataset, workflow and judges make the check set")
        at_least("limit", self.limit, 1)
        at_least("timeout_s", self.timeout_s, 0.0, strict=True)
        finite("margin", self.margin)
        at_least("margin", self.margin, 0.0)


@dataclass
class RollbackSettings(Settings):
    """Automatic rollback: the live version's rolling reward against its predecessor's."""

    enabled: bool = True
    window: int = 50  # the last this many rewarded traces of each version
    min_traces: int = 20  # each side needs this many before anything is decided
    margin: float = 0.1  # rolled back when the live mean is below the predecessor's by more than this ...
    z: float = 2.0  # ... and by more than this many standard errors of the difference (not the windows' noise)

    def check(self) -> None:
        at_least("z", self.z, 0.0)
        finite("z", self.z)
        at_least("window", self.window, 1)
        at_least("min_traces", self.min_traces, 1)
        if self.min_traces > self.window:
            raise FieldError("min_traces", f"must be at most window ({self.window}), got {self.min_traces}")
        at_least("margin", self.margin, 0.0)
        finite("margin", self.margin)


@dataclass
class ShadowSettings(Settings):
    """Shadow mode: sampled requests are answered by the upstream and re-run on the policy in the background.

    ``tools`` is the read-only allowlist: tool name to a ``module:function`` the gateway may run
    itself to continue a shadow run; a tool call not on it is never executed and ends the run there.
    """

    queue_size: int = 100
    concurrency: int = 2
    max_turns: int = 4
    tools: dict[str, str] = field(default_factory=dict)

    def check(self) -> None:
        at_least("queue_size", self.queue_size, 1)
        at_least("concurrency", self.concurrency, 1)
        at_least("max_turns", self.max_turns, 1)
        for name, ref in self.tools.items():
            if not isinstance(ref, str) or ":" not in ref:
                raise FieldError(f"tools.{name}", f"expected a module:function reference, got {ref!r}")


@dataclass
class OnlineSettings(Settings):
    """The whole ``online.yaml``."""

    upstream: UpstreamSettings
    policy: PolicySettings | None = None
    listen: ListenSettings = field(default_factory=ListenSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    dev: bool = False
    mode: str = "route"
    routes: dict[str, str] = field(default_factory=dict)
    selection: SelectionSettings = field(default_factory=SelectionSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    limits: LimitSettings = field(default_factory=LimitSettings)
    feedback: FeedbackSettings = field(default_factory=FeedbackSettings)
    committer: CommitterSettings = field(default_factory=CommitterSettings)
    reward: RewardSettings | None = None
    shadow: ShadowSettings = field(default_factory=ShadowSettings)
    redact: str | None = None
    shutdown_timeout_s: float = 10.0
    gate: GateSettings | None = None
    rollback: RollbackSettings = field(default_factory=RollbackSettings)
    base_dir: str | None = field(default=None, metadata={"yaml": False})  # the file's folder, for `redact`

    def check(self) -> None:
        at_least("shutdown_timeout_s", self.shutdown_timeout_s, 1.0)
        _mode("mode", self.mode)
        for route, mode in self.routes.items():
            if route not in ROUTES:
                raise FieldError(f"routes.{route}", f"not a route with a mode; the routes are {list(ROUTES)}")
            _mode(f"routes.{route}", mode)
        for needs in ("route", "shadow"):
            if needs in self.modes() and self.policy is None:
                raise FieldError("policy", f"{needs} mode needs policy.url (a `reinforge serve` endpoint)")
        a = self.auth
        if not self.dev:
            for key in ("traffic_key_env", "admin_key_env", "feedback_secret_env"):
                if not getattr(a, key):
                    raise FieldError(f"auth.{key}", "is required unless dev: true (no anonymous gateway)")
        if a.traffic_key_env and a.traffic_key_env == a.admin_key_env:
            raise FieldError("auth.admin_key_env", "must name another variable than auth.traffic_key_env")

    def mode_of(self, route: str) -> str:
        """The mode of ``route``: its own entry under ``routes``, else ``mode``."""
        return self.routes.get(route, self.mode)

    def modes(self) -> set[str]:
        return {self.mode_of(r) for r in ROUTES}


@dataclass(frozen=True)
class Secrets:
    """The keys read from the environment (``None``: that check is off, only with ``dev``)."""

    traffic_key: str | None
    admin_key: str | None
    feedback_secret: bytes
    upstream_key: str | None
    policy_key: str | None


def _env(name: str | None, key: str, where: str) -> str | None:
    if not name:
        return None
    value = os.environ.get(name)
    if not value:
        raise ConfigError(f"{where}: {key}: the environment variable {name} is not set or empty")
    return value


def resolve_secrets(settings: OnlineSettings, where: str = "online.yaml") -> Secrets:
    """Read the keys the settings name; the admin key must differ from the traffic key.

    With ``dev`` and no ``auth.feedback_secret_env`` the feedback secret is random per
    process, so feedback tokens do not survive a restart.
    """
    a = settings.auth
    traffic = _env(a.traffic_key_env, "auth.traffic_key_env", where)
    admin = _env(a.admin_key_env, "auth.admin_key_env", where)
    if admin is not None and admin == traffic:
        raise ConfigError(f"{where}: auth.admin_key_env: the admin key must differ from the traffic key")
    secret = _env(a.feedback_secret_env, "auth.feedback_secret_env", where)
    upstream = _env(settings.upstream.key_env, "upstream.key_env", where)
    policy = _env(settings.policy.key_env, "policy.key_env", where) if settings.policy else None
    return Secrets(
        traffic_key=traffic,
        admin_key=admin,
        feedback_secret=secret.encode() if secret else secrets.token_bytes(32),
        upstream_key=upstream,
        policy_key=policy,
    )


def load_config(path: str | Path, *, dev: bool = False) -> OnlineSettings:
    """Read and check ``online.yaml``; relative paths (``store.path``, ``reward.run``) are relative to the
    file's folder, and so are a committer's (``base_dir``, which its factory resolves them against).

    ``dev`` (the command's ``--dev``) sets ``dev: true`` before the checks.
    """
    import yaml

    file = Path(path)
    where = str(file)
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {exc}") from None
    if dev and isinstance(data, dict):
        data = {**data, "dev": True}
    settings = load_settings(OnlineSettings, data, where=where)
    settings.base_dir = str(file.parent.resolve())
    for part in (settings.store,):  # store.path unused (and harmless) with store.url
        where_to = Path(part.path).expanduser()
        if not where_to.is_absolute():
            part.path = str((file.parent / where_to).resolve())
    if settings.gate is not None:
        gate_run = Path(settings.gate.run).expanduser()
        if not gate_run.is_absolute():
            gate_run = (file.parent / gate_run).resolve()
        if not gate_run.is_file():
            raise ConfigError(f"{where}: gate.run: {settings.gate.run!r} does not exist (looked for {gate_run})")
        settings.gate.run = str(gate_run)
    if settings.reward is not None and settings.reward.run is not None:
        run = Path(settings.reward.run).expanduser()
        if not run.is_absolute():
            run = (file.parent / run).resolve()
        if not run.is_file():
            raise ConfigError(f"{where}: reward.run: {settings.reward.run!r} does not exist (looked for {run})")
        settings.reward.run = str(run)
    return settings
