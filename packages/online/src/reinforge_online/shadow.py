"""Shadow mode: sampled requests are answered by the upstream as usual and re-run on the policy in the background.

The user only ever sees the upstream's answer. A sampled request is queued (bounded: when
the queue is full it is dropped and counted, never waited for) and a worker sends the same
messages to the policy, with token ids and logprobs, recording each policy call like route
mode does (``mode = 'shadow'``). When the policy asks for tools, only those on the read-only
allowlist (``shadow.tools``: name to ``module:function``) are run by the gateway itself, and the
run goes on with their results; a tool call not on the list is never executed: the shadow run
stops there, with what it recorded so far. When the run ends its trace closes (the reward
calculator scores it).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from reinforge.plugin import ConfigError, Kind, Registry, ResolveError, resolve_ref

from .config import CHAT_ROUTE, OnlineSettings, ShadowSettings
from .pipeline import Pipeline, task_of
from .proxy import Upstream, UpstreamError
from .store import CallRecord
from .streams import logprobs_of

__all__ = ["ShadowRunner", "resolve_tools"]

_log = logging.getLogger("reinforge_online.shadow")
SHADOW_TOOLS = Kind("shadow_tools", "shadow tool")
_NOT_SENT = ("stream", "stream_options", "n", "metadata", "user")  # a shadow run is one non-streamed choice


def resolve_tools(settings: OnlineSettings, where: str = "online.yaml") -> dict[str, Callable[..., Any]]:
    """The allowlisted tools ``shadow.tools`` names (``module:function``, found next to ``online.yaml`` too)."""
    registry = Registry()
    registry.add_kind(SHADOW_TOOLS)  # no names: only module:function references resolve
    tools = {}
    for name, ref in settings.shadow.tools.items():
        key = f"{where}: shadow.tools.{name}"
        try:
            found = resolve_ref(ref, SHADOW_TOOLS, registry, where=key, base_dir=settings.base_dir)
        except ResolveError as exc:
            raise ConfigError(str(exc)) from None
        if not callable(found):
            raise ConfigError(f"{key}: {ref!r} is not callable")
        tools[name] = found
    return tools


async def _run_tool(fn: Callable[..., Any], arguments: str) -> str:
    """One allowlisted tool call's result as the ``tool`` message's content (an error is reported, not raised)."""
    try:
        args = json.loads(arguments or "{}")
        if not isinstance(args, dict):
            raise TypeError("the tool's arguments are not a JSON object")
        if inspect.iscoroutinefunction(fn):
            out = await fn(**args)
        else:
            out = await asyncio.to_thread(fn, **args)
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"
    return out if isinstance(out, str) else json.dumps(out)


class ShadowRunner:
    """The gateway's background shadow runs: a bounded queue and ``shadow.concurrency`` workers on its loop.

    :param policy: the policy's client; ``model``: the name sent to it (None: the client's).
    :param pipeline: where calls are recorded, the breaker told and the runs counted.
    :param settings: ``shadow``'s settings; ``tools``: the allowlist, resolved (see :func:`resolve_tools`).
    """

    def __init__(
        self,
        policy: Upstream,
        model: str | None,
        pipeline: Pipeline,
        settings: ShadowSettings,
        tools: dict[str, Callable[..., Any]],
    ) -> None:
        self.policy = policy
        self.model = model
        self.pipeline = pipeline
        self.settings = settings
        self.tools = tools
        self._queue: asyncio.Queue[tuple[dict[str, Any], str | None, str]] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self.finished = 0  # shadow runs done (any result)
        self._changed = threading.Condition()

    def submit(self, body: dict[str, Any], session: str | None, trace_id: str) -> bool:
        """Queue a shadow run of ``body`` (on the event loop); False when the queue is full (dropped, counted)."""
        if self._queue is None:
            self._queue = asyncio.Queue(maxsize=self.settings.queue_size)
            self._workers = [asyncio.create_task(self._work()) for _ in range(self.settings.concurrency)]
        try:
            self._queue.put_nowait((body, session, trace_id))
        except asyncio.QueueFull:
            self.pipeline.metrics.shadow.labels("dropped").inc()
            return False
        return True

    def wait_finished(self, n: int, timeout: float | None = None) -> bool:
        """Wait (from another thread) until ``n`` shadow runs finished; whether they did."""
        with self._changed:
            return self._changed.wait_for(lambda: self.finished >= n, timeout)

    async def _work(self) -> None:
        assert self._queue is not None
        while True:
            body, session, trace_id = await self._queue.get()
            try:
                result = await self._run(body, session, trace_id)
            except Exception:
                _log.exception("a shadow run failed")
                result = "failed"
            self.pipeline.metrics.shadow.labels(result).inc()
            with self._changed:
                self.finished += 1
                self._changed.notify_all()

    async def _run(self, body: dict[str, Any], session: str | None, trace_id: str) -> str:
        """One shadow run; its result: ``recorded``, ``stopped`` (a tool off the allowlist) or ``failed``."""
        up, pipeline, model = self.policy, self.pipeline, self.model
        messages = list(body.get("messages") or [])
        base = {k: v for k, v in body.items() if k not in _NOT_SENT}
        futures = []
        result = "recorded"
        for _ in range(self.settings.max_turns):
            request = dict(base, messages=list(messages))
            payload = dict(request, return_token_ids=True, logprobs=True, stream=False)
            if model:
                payload["model"] = model
            sent = time.perf_counter()
            try:
                resp = await up.send(
                    "POST", up.target(CHAT_ROUTE), content=json.dumps(payload).encode(), headers=up.own_headers()
                )
                raw = await resp.read()
                if resp.status_code != 200:
                    raise UpstreamError(f"status {resp.status_code}")
                data = json.loads(raw)
                choice = data["choices"][0]
                message = dict(choice["message"])
            except Exception as exc:
                _log.warning("the policy failed a shadow run: %s: %s", type(exc).__name__, exc)
                pipeline.policy_failed()
                result = "failed"
                break
            pipeline.policy_ok()
            record = CallRecord(
                trace_id=trace_id,
                call_id=uuid.uuid4().hex,
                route=CHAT_ROUTE,
                mode="shadow",
                request=request,
                response=data,
                session_id=session,
                prompt_token_ids=data.get("prompt_token_ids"),
                token_ids=choice.get("token_ids"),
                logprobs=logprobs_of(choice) or None,
                policy_version=resp.header("x-policy-version"),
                timing={"received_at": time.time(), "upstream_s": time.perf_counter() - sent},
                task=task_of(body),
            )
            future = pipeline.record_future(record)
            if future is None:
                result = "failed"
                break
            futures.append(future)
            calls = message.get("tool_calls") or []
            if not calls:
                break
            if any((c.get("function") or {}).get("name") not in self.tools for c in calls):
                result = "stopped"  # never executed: the run ends with what it has
                break
            messages.append(message)
            for c in calls:
                fn = c["function"]
                content = await _run_tool(self.tools[fn["name"]], fn.get("arguments") or "{}")
                messages.append({"role": "tool", "tool_call_id": c.get("id"), "content": content})
        if futures:
            await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)
            pipeline.close_trace(trace_id)  # after its calls are in the store
        return result

    async def aclose(self) -> None:
        """Cancel the workers; queued shadow runs are dropped (they never answered anyone)."""
        for task in self._workers:
            task.cancel()
        if self._workers:
            await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
