"""The in-process reward calculator: core's judges and reward composition, run on a trace when it closes.

Judges are loaded and composed by reinforge core, exactly as for a training run: a run
file's ``judges`` (``reward.run``) or the same list written under ``reward.judges``, through
core's component loading and :class:`reinforge.rewards.RewardComposer` (weights, gates,
sub-dimensions, boundary scores). Core calls each judge with a timeout and retries a
FAILED (or raising, or timed-out) judge up to its budget; a trace whose judges still fail
is marked ``unrewarded`` (counted), never given a reward of 0. A reward that is not a finite
number is unrewarded too; finite ones are clamped to the declared range.

A trace *closes* ``close_after_s`` seconds after its last acknowledged call (0: as soon as
its call is in the store), or when closed explicitly. The calculator runs on its own thread
and event loop, so a slow judge never holds up the gateway's requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from reinforge import ChatResponse, TaskStatus
from reinforge.plugin import (
    KINDS,
    ComponentSpec,
    ConfigError,
    Registry,
    RunConfig,
    collect,
    get_plugin_manager,
    plan_component,
)
from reinforge.plugin import metric_names as mn

from .config import RewardSettings
from .store import StoreUnavailable, TraceStore, _dumps

if TYPE_CHECKING:
    import pluggy

    from reinforge.plugin import RewardComposer

__all__ = ["RewardCalculator", "build_composer", "clamp_reward"]

_log = logging.getLogger("reinforge_online.rewards")
_NO_WORKFLOW = "reinforge_online:no_workflow"  # the run a composer is wired from needs one; it is never resolved


def build_composer(
    settings: RewardSettings,
    *,
    where: str = "online.yaml",
    base_dir: str | None = None,
    pm: pluggy.PluginManager | None = None,
) -> RewardComposer:
    """Core's reward composer over the judges ``settings`` name (each built once, for this gateway).

    :raises ConfigError, ResolveError, SignatureError: naming the file and key (``reward.judges[0]``).
    """
    from reinforge.plugin import build_composer as wire  # core's wiring of built judges into a composer
    from reinforge.plugin import load_run

    pm = pm or get_plugin_manager()
    registry = Registry(plugin_manager=pm)
    for kind in KINDS:
        collect(pm, kind, registry)
    if settings.run is not None:
        run = load_run(settings.run, registry=registry)
        if run.group_reward is not None:
            raise ConfigError(
                f"{where}: reward.run: {settings.run} has a group_reward; online traces are scored one at a time"
            )
        if not run.judges:
            raise ConfigError(f"{where}: reward.run: {settings.run} names no judges")
        base = run.base_dir

        def key(i: int) -> str:
            return run.where(f"judges[{i}]")
    else:
        run = RunConfig(workflow=ComponentSpec(ref=_NO_WORKFLOW), judges=list(settings.judges))
        base = base_dir

        def key(i: int) -> str:
            return f"{where}: reward.judges[{i}]"

    built = []
    try:
        for i, spec in enumerate(run.judges):
            built.append(plan_component(spec, "judge", registry, where=key(i), base_dir=base).build())
        composer = wire(run, built)
    except BaseException:
        for bound in built:
            bound.close()
        raise
    composer.judge_timeout_s = settings.timeout_s
    composer.max_retries = settings.max_retries
    return composer


def clamp_reward(reward: float, low: float | None, high: float | None) -> float:
    """``reward`` inside the declared range (a bound that is None does not apply)."""
    if low is not None:
        reward = max(low, reward)
    if high is not None:
        reward = min(high, reward)
    return reward


def _write_reward(db: sqlite3.Connection, trace_id: str, reward: float, metrics: dict[str, float]) -> bool:
    """In the writer's transaction: the judges' reward for a trace still open without one; whether it was set."""
    row = db.execute("SELECT status, data FROM traces WHERE trace_id = ?", (trace_id,)).fetchone()
    if row is None or row[0] != "open":
        return False  # feedback came first, or the trace went away
    if db.execute("SELECT 1 FROM rewards WHERE trace_id = ?", (trace_id,)).fetchone() is not None:
        return False
    data = {**json.loads(row[1] or "{}"), "reward_metrics": metrics}
    db.execute(
        "INSERT INTO rewards (trace_id, reward, source, created_at) VALUES (?, ?, 'judge', ?)",
        (trace_id, reward, time.time()),
    )
    db.execute("UPDATE traces SET status = 'rewarded', data = ? WHERE trace_id = ?", (_dumps(data), trace_id))
    return True


def _mark_unrewarded(db: sqlite3.Connection, trace_id: str, reason: str, error: str | None) -> bool:
    """In the writer's transaction: an open trace marked ``unrewarded`` with why; whether it was open."""
    row = db.execute("SELECT status, data FROM traces WHERE trace_id = ?", (trace_id,)).fetchone()
    if row is None or row[0] != "open":
        return False
    data = {**json.loads(row[1] or "{}"), "unrewarded": {"reason": reason, "error": error}}
    db.execute("UPDATE traces SET status = 'unrewarded', data = ? WHERE trace_id = ?", (_dumps(data), trace_id))
    return True


def _open_traces(db: sqlite3.Connection, limit: int, before: float) -> list[tuple[str, float]]:
    """Up to ``limit`` open traces created before ``before`` (this start), oldest first, with the time of their
    last call (to score after a restart; traces this process opens are scheduled as their calls arrive)."""
    rows = db.execute(
        "SELECT t.trace_id, MAX(c.created_at) FROM traces t JOIN calls c ON c.trace_id = t.trace_id"
        " WHERE t.status = 'open' AND t.created_at < ? GROUP BY t.trace_id ORDER BY MAX(c.created_at) LIMIT ?",
        (before, limit),
    ).fetchall()
    return [(str(r[0]), float(r[1])) for r in rows]


def judge_inputs(trace: dict[str, Any]) -> tuple[dict[str, Any], ChatResponse]:
    """The ``task`` and ``response`` a judge gets for a stored trace.

    ``task`` is the trace's task (the first request's ``metadata`` through the gateway, or
    what the Python API was given) plus ``messages`` (the first request's) and ``trace_id``;
    ``response`` is the last call's first choice as a core :class:`~reinforge.ChatResponse`.
    """
    calls = trace["calls"]
    first, last = calls[0], calls[-1]
    task = dict(trace.get("task") or {})
    task.setdefault("messages", first["request"].get("messages") or [])
    task.setdefault("trace_id", trace["trace_id"])
    choices = last["response"].get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], dict) else {}
    version = last.get("policy_version")
    response = ChatResponse(
        message=dict(choice.get("message") or {"role": "assistant", "content": ""}),
        finish_reason=choice.get("finish_reason"),
        usage=dict(last["response"].get("usage") or {}),
        prompt_token_ids=last.get("prompt_token_ids"),
        completion_token_ids=last.get("token_ids"),
        logprobs=last.get("logprobs"),
        policy_version=int(version) if isinstance(version, str) and version.isdigit() else None,
        model=last["response"].get("model"),
    )
    return task, response


class RewardCalculator:
    """Scores closed traces with a composer on its own thread; results go to the store (see the module docstring).

    :param on_result: called with ``("rewarded", None)``, ``("unrewarded", reason)`` or ``("skipped", None)``
        for every trace it looked at (reasons: ``failed``, ``error``, ``not_finite``, ``queue_full``, ``store``,
        ``incomplete``).
    """

    def __init__(
        self,
        store: TraceStore,
        composer: RewardComposer,
        *,
        close_after_s: float = 0.0,
        concurrency: int = 4,
        queue_size: int = 1000,
        reward_min: float | None = None,
        reward_max: float | None = None,
        on_result: Callable[[str, str | None], None] | None = None,
        on_rewarded: Callable[[str, float], None] | None = None,
    ) -> None:
        self.store = store
        self.composer = composer
        self.close_after_s = close_after_s
        self.concurrency = concurrency
        self.queue_size = queue_size
        self.reward_min, self.reward_max = reward_min, reward_max
        self._on_result = on_result or (lambda result, reason: None)
        self._on_rewarded = on_rewarded or (lambda trace_id, reward: None)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="reinforge-online-rewards", daemon=True)
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._scoring: dict[str, int] = {}  # trace id -> its scorings in flight
        self._sem: asyncio.Semaphore | None = None
        self._done = threading.Condition()
        self.results: dict[str, int] = {}  # "rewarded", "skipped", "unrewarded/<reason>" -> how many
        self._stopping = False
        self._started_at = time.time()

    def start(self) -> RewardCalculator:
        """Start the thread and schedule the traces a previous process left open."""
        self._started_at = time.time()  # before any traffic: traces older than this are a previous process's
        self._thread.start()
        self._loop.call_soon_threadsafe(self._resume)
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._sem = asyncio.Semaphore(self.concurrency)
        self._loop.run_forever()

    def _resume(self) -> None:
        try:
            started = self._started_at
            future = self.store.submit(lambda db: _open_traces(db, self.queue_size, started))
        except StoreUnavailable:
            return

        def schedule(f: Any) -> None:
            if f.exception() is None:
                now = time.time()
                for trace_id, last in f.result():
                    delay = max(0.0, last + self.close_after_s - now)
                    self._loop.call_soon_threadsafe(self._schedule, trace_id, delay, False)

        future.add_done_callback(schedule)

    # -- from any thread -----------------------------------------------------------------------

    def touched(self, trace_id: str) -> None:
        """A call of ``trace_id`` was acknowledged: it closes ``close_after_s`` from now (a later call resets it)."""
        if not self._stopping:
            self._loop.call_soon_threadsafe(self._schedule, trace_id, self.close_after_s)

    def close_trace(self, trace_id: str) -> None:
        """Score ``trace_id`` now (its episode ended); a trace being scored already is not scored again."""
        if not self._stopping:
            self._loop.call_soon_threadsafe(self._close, trace_id)

    def wait_results(self, n: int, timeout: float | None = None) -> bool:
        """Wait until ``n`` traces were looked at in all (rewarded, unrewarded or skipped); whether they were."""
        with self._done:
            return self._done.wait_for(lambda: sum(self.results.values()) >= n, timeout)

    def stop(self, timeout: float = 10.0) -> bool:
        """Finish the scoring in flight within ``timeout`` and stop the thread; whether it finished. Never raises.

        Traces still waiting to close stay open in the store; the next start schedules them again.
        """
        self._stopping = True
        if not self._thread.is_alive():
            return True
        deadline = time.monotonic() + timeout

        async def drain() -> bool:
            for handle in self._timers.values():
                handle.cancel()
            self._timers.clear()
            pending = list(self._tasks)
            if not pending:
                return True
            _, still = await asyncio.wait(pending, timeout=max(0.0, deadline - time.monotonic()))
            for task in still:
                task.cancel()
            return not still

        try:
            finished = asyncio.run_coroutine_threadsafe(drain(), self._loop).result(timeout + 1.0)
        except Exception:
            _log.exception("draining the reward calculator failed")
            finished = False
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(max(0.1, deadline - time.monotonic()))
        if self._thread.is_alive():
            return False  # a judge blocks its loop; the daemon thread is left to it
        self._loop.close()
        return finished

    # -- on the calculator's loop --------------------------------------------------------------

    def _count(self, result: str, reason: str | None = None) -> None:
        with self._done:
            key = result if reason is None else f"{result}/{reason}"
            self.results[key] = self.results.get(key, 0) + 1
            self._done.notify_all()
        try:
            self._on_result(result, reason)
        except Exception:
            _log.exception("the reward result callback raised")

    def _schedule(self, trace_id: str, delay: float, live: bool = True) -> None:
        """Score ``trace_id`` after ``delay`` (a new call resets it); a live trace beyond ``queue_size`` is shed.

        Traces found open at start (not ``live``) that do not fit stay open for a later start.
        """
        if self._stopping:
            return
        old = self._timers.pop(trace_id, None)
        if old is not None:
            old.cancel()
        elif len(self._timers) + len(self._tasks) >= self.queue_size:
            if live:
                self._unrewarded(trace_id, "queue_full", f"more than {self.queue_size} traces waiting for a reward")
            return
        self._timers[trace_id] = self._loop.call_later(delay, self._due, trace_id)

    def _close(self, trace_id: str) -> None:
        if not self._scoring.get(trace_id):  # being scored: its judges are not asked twice
            self._schedule(trace_id, 0.0)

    def _due(self, trace_id: str) -> None:
        self._timers.pop(trace_id, None)
        task = self._loop.create_task(self._score(trace_id))
        self._tasks.add(task)
        self._scoring[trace_id] = self._scoring.get(trace_id, 0) + 1

        def finished(task: asyncio.Task[None]) -> None:
            self._tasks.discard(task)
            left = self._scoring.pop(trace_id, 1) - 1
            if left:
                self._scoring[trace_id] = left

        task.add_done_callback(finished)

    def _unrewarded(self, trace_id: str, reason: str, error: str | None) -> None:
        _log.warning("trace %s is unrewarded (%s): %s", trace_id, reason, error)
        with contextlib.suppress(StoreUnavailable):  # still open then: a later start schedules it again
            self.store.submit(lambda db: _mark_unrewarded(db, trace_id, reason, error))
        self._count("unrewarded", reason)

    async def _score(self, trace_id: str) -> None:
        assert self._sem is not None
        async with self._sem:
            try:
                await self._score_one(trace_id)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._unrewarded(trace_id, "error", f"{type(exc).__name__}: {exc}")

    async def _score_one(self, trace_id: str) -> None:
        trace = await asyncio.to_thread(self.store.trace, trace_id)
        if trace is None or trace["status"] != "open" or not trace["calls"]:
            self._count("skipped")  # rewarded by feedback first, committed, or swept
            return
        last = trace["calls"][-1].get("state", "complete")
        if last != "complete":  # a stream that broke off, failed or never ended: its answer is not whole
            self._unrewarded(trace_id, "incomplete", f"the trace's last call is {last}, not complete")
            return
        task, response = judge_inputs(trace)
        try:
            score = await self.composer.score(task, response, truncated=response.truncated)
        except Exception as exc:
            self._unrewarded(trace_id, "error", f"{type(exc).__name__}: {exc}")
            return
        if score.status is TaskStatus.FAILED:
            self._unrewarded(trace_id, "failed", score.error)
            return
        reward = score.reward
        if (
            reward is None
            or isinstance(reward, bool)
            or not isinstance(reward, (int, float))
            or not math.isfinite(reward)
        ):
            self._unrewarded(trace_id, "not_finite", f"the composed reward is {reward!r}, not a finite number")
            return
        value = clamp_reward(float(reward), self.reward_min, self.reward_max)
        metrics = {k: float(v) for k, v in score.rewards.items() if math.isfinite(float(v))}
        metrics[mn.REWARD] = value
        try:
            written = await asyncio.wrap_future(
                self.store.submit(lambda db: _write_reward(db, trace_id, value, metrics))
            )
        except StoreUnavailable as exc:
            self._unrewarded(trace_id, "store", str(exc))
            return
        if not written:
            self._count("skipped")
            return
        self._count("rewarded")
        try:
            self._on_rewarded(trace_id, value)
        except Exception:
            _log.exception("the rewarded callback raised")
