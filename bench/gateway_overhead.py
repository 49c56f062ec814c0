"""Added latency and throughput of the online gateway (reinforge-online) vs LiteLLM's proxy, same fake upstream.

One fake OpenAI server process on 127.0.0.1 (starlette + uvicorn, fixed short answers, `/v1/models` and
`/v1/chat/completions`, non-stream and stream: a few SSE chunks and `[DONE]`) is both the upstream and
the policy: a request with ``return_token_ids: true`` gets a vLLM-style answer (``prompt_token_ids``,
``choices[].token_ids``, ``logprobs.content[]``, an ``x-policy-version`` header). In front of it, each
its own process on a free port:

- ``gateway``: ``reinforge online serve`` with ``selection.sampling_rate: 0`` (every request passes
  through to the upstream) -- the unsampled path;
- ``gateway-sampled``: the same with ``sampling_rate: 1.0`` in ``route`` mode, ``policy.url`` = the fake
  (every request goes to the policy with token ids and logprobs, and is recorded in SQLite) -- the
  sampled path;
- ``litellm``: LiteLLM's proxy (``litellm[proxy]`` 1.108.7 from its own venv), one worker, a master
  key, no database, one ``openai/<model>`` entry whose ``api_base`` is the fake.

Both servers run with their real auth (traffic key / master key) and without access logs
(``--log-level warning``; ``LITELLM_LOG=ERROR``). Latency (concurrency 1, one keep-alive connection):
per run, ``--warmup`` requests and then ``--requests`` measured ones for each target, non-stream then
stream (time to the last byte), targets in alternating order from run to run, so drift hits all alike.
The baselines are the fake itself: ``direct`` (what the upstream takes) for the unsampled path and
LiteLLM, ``policy-direct`` (the body the gateway sends the policy: ``return_token_ids``, ``logprobs``,
``policy.model``) for the sampled path. Added latency = each run's percentile minus the baseline's
percentile in the same run; the median over ``--runs`` is reported. Every response is checked (status,
which server answered, the trace header on sampled answers only) so a fallback cannot pass as a fast
sampled call. Throughput: ``--concurrency`` closed-loop clients for ``--throughput-seconds`` (at most
``--throughput-max`` requests), req/s per target, medians of ``--throughput-runs``; the load client
(aiohttp, one connection per client) shares the machine's cores with the servers, so on a 2-core VM
it is a ceiling for every target alike. CPU ms per request and the RSS of each server process come
from psutil; the gateways' own metrics (recorded calls, fallbacks, store errors) go in the JSON.

``--setup`` makes the two venvs under ``--venvs``: ``gateway/`` (this checkout's reinforge core and
reinforge-online, editable, plus aiohttp and psutil for the load client: ``requirements-gateway.txt``)
and ``litellm-proxy/`` (``requirements-litellm-proxy.txt``, pinned, installed with ``--no-deps``). The
benchmark itself runs on any Python with aiohttp and psutil, else it re-runs itself with the gateway
venv's. Only 127.0.0.1 traffic; every request loop is bounded in count and time; the servers are
stopped on exit (errors and Ctrl-C included).

Prints markdown tables, then a JSON object as its last stdout line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common
from _common import (
    emit,
    fmt,
    free_port,
    make_venv,
    median_of,
    percentile,
    process_tree,
    say,
    tree_cpu_s,
    tree_rss,
    venv_python,
    versions,
)

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
VENVS = ("gateway", "litellm-proxy")
REQUIREMENTS = {
    "gateway": BENCH / "requirements-gateway.txt",
    "litellm-proxy": BENCH / "requirements-litellm-proxy.txt",
}
IMPORT_CHECK = {
    "gateway": "import reinforge_online.app, aiohttp, psutil, uvicorn; print(reinforge_online.__version__)",
    "litellm-proxy": "import litellm.proxy.proxy_server; print('ok')",
}
MODEL = "bench-model"
POLICY_MODEL = "bench-trained"
SECRETS = {
    "GWBENCH_UPSTREAM_KEY": "gwbench-upstream-key",
    "GWBENCH_TRAFFIC_KEY": "gwbench-traffic-key",
    "GWBENCH_ADMIN_KEY": "gwbench-admin-key",
    "GWBENCH_FEEDBACK_SECRET": "gwbench-feedback-secret",
}
MASTER_KEY = "sk-gwbench-master-key"
QUIET_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the model cost map at startup
    "LITELLM_LOG": "ERROR",  # also LiteLLM's uvicorn log level: no access log, like the gateway's --log-level warning
    "LITELLM_TELEMETRY": "False",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}
PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")
UPSTREAM_MARK = b"upstream"  # a word of the fake upstream's answer (the stream's too)
POLICY_MARK = b"policy"  # ... of the fake policy's
TRACE_HEADER = "x-reinforge-trace-id"
RATIO_TARGET = 0.5
UNSAMPLED_P50_MS, UNSAMPLED_P99_MS, SAMPLED_P50_MS = 1.0, 5.0, 2.0
MODES = ("nonstream", "stream")
GATEWAY_DISTS = ("reinforge-online", "reinforge", "starlette", "uvicorn", "httpx", "httptools", "uvloop", "aiohttp")
LITELLM_DISTS = ("litellm", "litellm-enterprise", "litellm-proxy-extras", "fastapi", "uvicorn", "httpx", "openai")


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every server: no HTTP proxies (127.0.0.1 only), the keys, quiet logs."""
    env = {k: v for k, v in os.environ.items() if k not in PROXY_VARS}
    return {**env, **QUIET_ENV, **SECRETS, **(extra or {})}


# -- the fake upstream and policy (run by the gateway venv's python: starlette + uvicorn) ---------------------------


def _completion(content: str, model: str, policy: bool) -> bytes:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": content},
        "logprobs": None,
        "finish_reason": "stop",
    }
    body: dict[str, Any] = {
        "id": "chatcmpl-gwbench",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "system_fingerprint": "fp_gwbench",
        "choices": [choice],
        "usage": {"prompt_tokens": 24, "completion_tokens": 5, "total_tokens": 29},
    }
    if policy:
        pieces = content.split(" ")
        choice["token_ids"] = [1000 + i for i in range(len(pieces))]
        choice["logprobs"] = {
            "content": [
                {"token": p, "logprob": -0.1 * (i + 1), "bytes": list(p.encode()), "top_logprobs": []}
                for i, p in enumerate(pieces)
            ]
        }
        body["prompt_token_ids"] = list(range(1, 25))
    return json.dumps(body).encode()


def _chunks(content: str, model: str, policy: bool) -> list[bytes]:
    base = {"id": "chatcmpl-gwbench", "object": "chat.completion.chunk", "created": 1700000000, "model": model}

    def event(choice: dict[str, Any], **extra: Any) -> bytes:
        return b"data: " + json.dumps({**base, **extra, "choices": [choice]}).encode() + b"\n\n"

    first: dict[str, Any] = {"prompt_token_ids": list(range(1, 25))} if policy else {}
    out = [event({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}, **first)]
    pieces = content.split(" ")
    for i, piece in enumerate(pieces):
        text = piece if i == len(pieces) - 1 else piece + " "
        choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
        if policy:
            choice["token_ids"] = [1000 + i]
            choice["logprobs"] = {
                "content": [
                    {"token": text, "logprob": -0.1 * (i + 1), "bytes": list(text.encode()), "top_logprobs": []}
                ]
            }
        out.append(event(choice))
    out.append(event({"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}))
    out.append(b"data: [DONE]\n\n")
    return out


def serve_fake(port: int) -> None:
    """The fake OpenAI server: the upstream's fixed answers, or the policy's (token ids) on ``return_token_ids``."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    upstream_text = "This is the upstream answer, short and fixed."
    policy_text = "This is the policy answer, short and fixed."
    bodies = {False: _completion(upstream_text, MODEL, False), True: _completion(policy_text, POLICY_MODEL, True)}
    streams = {False: _chunks(upstream_text, MODEL, False), True: _chunks(policy_text, POLICY_MODEL, True)}
    models = json.dumps(
        {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 1700000000, "owned_by": "gwbench"}]}
    ).encode()

    async def chat(request: Request) -> Response:
        body = json.loads(await request.body())
        policy = body.get("return_token_ids") is True
        headers = {"x-policy-version": "1"} if policy else {"x-request-id": "gwbench"}
        if body.get("stream"):
            chunks = streams[policy]

            async def gen() -> Any:
                for c in chunks:
                    yield c

            return StreamingResponse(gen(), media_type="text/event-stream", headers=headers)
        return Response(bodies[policy], media_type="application/json", headers=headers)

    async def list_models(request: Request) -> Response:
        return Response(models, media_type="application/json")

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/chat/completions", chat, methods=["POST"]),
            Route("/v1/models", list_models, methods=["GET"]),
        ]
    )
    uvicorn.run(
        app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning", access_log=False
    )


# -- servers -------------------------------------------------------------------------------------------------------


@dataclass
class Server(_common.Server):
    """A server of this benchmark: its environment (:func:`child_env`), its idle and peak RSS."""

    env: dict[str, str] = field(default_factory=dict)
    idle_rss_mb: float | None = None
    peak_rss: int = 0

    def start(self, log_dir: Path) -> None:  # type: ignore[override]
        super().start(child_env(self.env), log_dir, log_dir / f"{self.name}.log")

    def poll_ready(self) -> bool:
        ok = super().poll_ready()
        if ok:
            assert self.proc is not None
            self.idle_rss_mb = round(tree_rss(self.proc.pid) / 1e6, 1)
        return ok


class RssPoller:
    """Peak RSS of each server's process tree, polled every 0.5 s in a thread (the trees looked up every 5 s:
    a lookup scans every process on the machine, a cost the servers would share)."""

    def __init__(self, servers: list[Server], interval_s: float = 0.5, rescan_s: float = 5.0) -> None:
        self.servers = servers
        self.interval_s = interval_s
        self.rescan_s = rescan_s
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import psutil

        trees: dict[str, list[Any]] = {}
        scanned = 0.0
        while not self.stopped.wait(self.interval_s):
            if time.perf_counter() - scanned > self.rescan_s:
                trees = {s.name: process_tree(s.proc.pid) for s in self.servers if s.proc is not None}
                scanned = time.perf_counter()
            for s in self.servers:
                rss = 0
                for p in trees.get(s.name, ()):
                    with suppress(psutil.Error):
                        rss += p.memory_info().rss
                s.peak_rss = max(s.peak_rss, rss)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=2)


# -- what is measured ----------------------------------------------------------------------------------------------


@dataclass
class Target:
    """Where requests go, what they carry, and how an answer is checked (None: fine, else the error)."""

    name: str
    path: str  # "unsampled" or "sampled": which comparison this target belongs to
    url: str
    headers: dict[str, str]
    body: dict[str, Any]
    server: Server
    check: Callable[[bytes, Any], str | None]
    baseline: str | None = None  # the target whose latency this one's added latency is measured against
    reason: str | None = None  # why it is not measured

    def data(self, stream: bool) -> bytes:
        return json.dumps({**self.body, "stream": True} if stream else self.body).encode()


def request_body() -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a terse assistant. Answer in one short sentence."},
            {"role": "user", "content": "What is two plus two? Say it in words, please."},
        ],
        "max_tokens": 16,
        "temperature": 0.7,
    }


def expect(mark: bytes, sampled: bool | None, stripped: bool = False) -> Callable[[bytes, Any], str | None]:
    """A check: the answer carries ``mark``; the trace header is there iff ``sampled``; no token ids if ``stripped``."""

    def check(payload: bytes, headers: Any) -> str | None:
        if mark not in payload:
            return f"not the expected server's answer ({mark.decode()!r} missing): {payload[:200]!r}"
        if sampled is not None and (TRACE_HEADER in headers) != sampled:
            return "a trace header on an unsampled answer" if not sampled else "no trace header: not sampled"
        if stripped and b"token_ids" in payload:
            return "token ids the client did not ask for are in the answer"
        return None

    return check


@dataclass
class Outcome:
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    not_sent: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0


async def one(session: Any, target: Target, data: bytes, stream: bool) -> tuple[float, str | None]:
    """One request, timed to the last byte of the answer; (seconds, error or None)."""
    import aiohttp

    start = time.perf_counter()
    try:
        async with session.post(target.url, data=data, headers=target.headers) as resp:
            payload = await resp.read()
            elapsed = time.perf_counter() - start
            if resp.status != 200:
                return elapsed, f"HTTP {resp.status}: {payload[:200]!r}"
            if stream and b"[DONE]" not in payload:
                return elapsed, f"a stream without [DONE]: {payload[-200:]!r}"
            return elapsed, target.check(payload, resp.headers)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return time.perf_counter() - start, f"{type(exc).__name__}: {exc}"[:300]


def client_session(concurrency: int) -> Any:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False, enable_cleanup_closed=True)
    timeout = aiohttp.ClientTimeout(total=30, connect=10)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False, auto_decompress=False)


async def latency_block(target: Target, stream: bool, args: argparse.Namespace) -> Outcome:
    """``--warmup`` requests, then ``--requests`` timed ones, one at a time on one connection."""
    out = Outcome()
    data = target.data(stream)
    assert target.server.proc is not None
    pid = target.server.proc.pid
    async with client_session(1) as session:
        for _ in range(args.warmup):
            await one(session, target, data, stream)
        cpu0, start = tree_cpu_s(pid), time.perf_counter()
        deadline = start + args.block_timeout
        for i in range(args.requests):
            if time.perf_counter() > deadline:
                out.not_sent = args.requests - i
                break
            elapsed, error = await one(session, target, data, stream)
            if error is None:
                out.latencies.append(elapsed)
            else:
                out.errors.append(error)
        out.wall_s = time.perf_counter() - start
        out.cpu_s = tree_cpu_s(pid) - cpu0
    return out


async def throughput_block(target: Target, stream: bool, args: argparse.Namespace) -> Outcome:
    """``--concurrency`` closed-loop clients for ``--throughput-seconds``, at most ``--throughput-max`` requests."""
    out = Outcome()
    data = target.data(stream)
    assert target.server.proc is not None
    pid = target.server.proc.pid
    async with client_session(args.concurrency) as session:
        warm = [one(session, target, data, stream) for _ in range(2 * args.concurrency)]
        await asyncio.gather(*warm)  # every connection open
        budget = [args.throughput_max]
        cpu0, start = tree_cpu_s(pid), time.perf_counter()
        deadline = start + args.throughput_seconds

        async def worker() -> None:
            while budget[0] > 0 and time.perf_counter() < deadline:
                budget[0] -= 1
                elapsed, error = await one(session, target, data, stream)
                if error is None:
                    out.latencies.append(elapsed)
                else:
                    out.errors.append(error)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        out.wall_s = time.perf_counter() - start
        out.cpu_s = tree_cpu_s(pid) - cpu0
    return out


def latency_row(o: Outcome) -> dict[str, Any]:
    n = len(o.latencies)
    return {
        "p50_ms": None if not n else percentile(o.latencies, 0.5) * 1e3,
        "p99_ms": None if not n else percentile(o.latencies, 0.99) * 1e3,
        "mean_ms": None if not n else statistics.fmean(o.latencies) * 1e3,
        "ok": n,
        "errors": len(o.errors),
        "not_sent": o.not_sent,
        "cpu_ms_per_request": o.cpu_s * 1e3 / n if n else None,
        "error_examples": sorted(set(o.errors))[:3],
    }


def throughput_row(o: Outcome) -> dict[str, Any]:
    row = latency_row(o)
    row["req_s"] = len(o.latencies) / o.wall_s if o.wall_s > 0 else 0.0
    row["wall_s"] = o.wall_s
    row["cpu_cores"] = o.cpu_s / o.wall_s if o.wall_s > 0 else None  # of the server's process (tree)
    return row


async def smoke(targets: list[Target]) -> None:
    """One request per target and mode; a target that answers wrongly is left out, with the reason."""
    async with client_session(1) as session:
        for t in targets:
            for stream in (False, True):
                _, error = await one(session, t, t.data(stream), stream)
                if error is not None and t.reason is None:
                    t.reason = f"{'stream' if stream else 'non-stream'} smoke request failed: {error}"


async def measure(targets: list[Target], args: argparse.Namespace) -> tuple[dict, dict]:
    """Alternating runs: latency (every target, non-stream then stream), then throughput."""
    lat: dict[str, dict[str, list[dict]]] = {t.name: {m: [] for m in args.modes} for t in targets}
    thr: dict[str, dict[str, list[dict]]] = {t.name: {m: [] for m in args.modes} for t in targets}
    for r in range(args.runs):
        order = targets if r % 2 == 0 else list(reversed(targets))
        say(f"latency run {r + 1}/{args.runs}: {', '.join(t.name for t in order)}")
        for mode in args.modes:
            for t in order:
                row = latency_row(await latency_block(t, mode == "stream", args))
                lat[t.name][mode].append(row)
                say(
                    f"  {t.name} {mode}: p50 {fmt(row['p50_ms'], '.2f')} ms, p99 {fmt(row['p99_ms'], '.2f')} ms, "
                    f"{row['errors']} errors"
                )
    for r in range(args.throughput_runs):
        order = targets if r % 2 == 0 else list(reversed(targets))
        say(f"throughput run {r + 1}/{args.throughput_runs} (concurrency {args.concurrency})")
        for mode in args.modes:
            for t in order:
                row = throughput_row(await throughput_block(t, mode == "stream", args))
                thr[t.name][mode].append(row)
                say(f"  {t.name} {mode}: {row['req_s']:.0f} req/s, {row['errors']} errors")
    return lat, thr


# -- setup ---------------------------------------------------------------------------------------------------------


def setup(args: argparse.Namespace) -> dict:
    """Create (or renew) the gateway and LiteLLM proxy venvs; a failure is recorded in DIR/NAME/SETUP_FAILED.txt."""
    results: dict[str, Any] = {}
    base = args.setup_python or sys.executable
    for name in VENVS:
        venv = args.venvs / name
        python = venv_python(venv)
        install = [str(python), "-m", "pip", "install", "-r", str(REQUIREMENTS[name])]
        if name == "litellm-proxy":
            install.insert(4, "--no-deps")
        steps = [install, [str(python), "-c", IMPORT_CHECK[name]]]
        # cwd: the gateway's requirements name the checkout's packages relative to the repository root
        log = args.venvs / f"setup-{name}.log"
        results[name] = make_venv(name, venv, steps, base_python=base, log=log, env=child_env(), cwd=ROOT)
        if results[name]["ok"]:
            results[name]["versions"] = versions(str(python), GATEWAY_DISTS if name == "gateway" else LITELLM_DISTS)
    return results


def not_installed(venv: Path, what: str) -> str:
    return _common.not_installed(venv, venv, what, "gateway_overhead.py")


def gateway_python(args: argparse.Namespace) -> str | None:
    """The gateway's interpreter: --gateway-python, else VENVS/gateway, else this one if it has reinforge-online."""
    if args.gateway_python:
        return args.gateway_python
    venv = args.venvs / "gateway" / "bin" / "python"
    if venv.is_file():
        return str(venv)
    done = subprocess.run([sys.executable, "-c", "import reinforge_online.app, uvicorn"], capture_output=True)
    return sys.executable if done.returncode == 0 else None


def ensure_client_deps(args: argparse.Namespace) -> None:
    """The load client needs aiohttp and psutil: without them here, run again with the gateway venv's python."""
    try:
        import aiohttp  # noqa: F401
        import psutil  # noqa: F401
    except ImportError as exc:
        venv = args.venvs / "gateway" / "bin" / "python"
        elsewhere = Path(sys.prefix).resolve() != (args.venvs / "gateway").resolve()  # (its python is a symlink)
        if venv.is_file() and elsewhere and not os.environ.get("GWBENCH_REEXEC"):
            print(f"{exc}: running again with {venv}", file=sys.stderr, flush=True)
            os.environ["GWBENCH_REEXEC"] = "1"
            os.execv(str(venv), [str(venv), str(Path(__file__).resolve()), *sys.argv[1:]])
        raise SystemExit(f"{exc}: the load client needs aiohttp and psutil (run `{__file__} --setup` first)") from None


# -- report --------------------------------------------------------------------------------------------------------


def r3(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def summarise(lat: dict, thr: dict, targets: list[Target], modes: list[str]) -> tuple[list[dict], list[dict]]:
    """Per target and mode: medians over runs; added latency against the baseline, run by run."""
    by = {t.name: t for t in targets}
    rows = []
    for t in targets:
        for mode in modes:
            runs = lat[t.name][mode]
            row: dict[str, Any] = {"target": t.name, "path": t.path, "mode": mode, "baseline": t.baseline}
            for key in ("p50_ms", "p99_ms", "mean_ms", "cpu_ms_per_request"):
                row[key] = r3(median_of([x[key] for x in runs]))
            if t.baseline in by:
                base = lat[t.baseline][mode]
                for q in ("p50", "p99"):
                    added = [
                        a[f"{q}_ms"] - b[f"{q}_ms"]
                        for a, b in zip(runs, base)
                        if a[f"{q}_ms"] is not None and b[f"{q}_ms"] is not None
                    ]
                    row[f"added_{q}_ms"] = r3(median_of(added))
                    row[f"added_{q}_ms_runs"] = [round(x, 3) for x in added]
            row["requests"] = sum(x["ok"] for x in runs)
            row["errors"] = sum(x["errors"] for x in runs)
            row["not_sent"] = sum(x["not_sent"] for x in runs)
            examples = sorted({e for x in runs for e in x["error_examples"]})
            if examples:
                row["error_examples"] = examples[:3]
            rows.append(row)
    trows = []
    for t in targets:
        for mode in modes:
            runs = thr[t.name][mode]
            if not runs:
                continue
            row = {"target": t.name, "path": t.path, "mode": mode}
            for key in ("req_s", "p50_ms", "p99_ms", "cpu_ms_per_request", "cpu_cores"):
                row[key] = r3(median_of([x[key] for x in runs]))
            row["req_s_runs"] = [round(x["req_s"], 1) for x in runs]
            row["requests"] = sum(x["ok"] for x in runs)
            row["errors"] = sum(x["errors"] for x in runs)
            examples = sorted({e for x in runs for e in x["error_examples"]})
            if examples:
                row["error_examples"] = examples[:3]
            trows.append(row)
    return rows, trows


def evaluate(rows: list[dict]) -> dict[str, dict]:
    """The issue's targets, per mode: ratio to LiteLLM's added latency, and the absolute budgets."""
    by = {(r["target"], r["mode"]): r for r in rows}
    targets: dict[str, dict] = {}

    def put(key: str, value: float | None, limit: float, note: str | None = None) -> None:
        entry: dict[str, Any] = {"value": r3(value), "target": f"<= {limit}", "met": None}
        if value is not None:
            entry["met"] = value <= limit
        if note:
            entry["note"] = note
        targets[key] = entry

    for mode in MODES:
        gw, ll, sp = by.get(("gateway", mode)), by.get(("litellm", mode)), by.get(("gateway-sampled", mode))
        for q in ("p50", "p99"):
            a, b = (gw or {}).get(f"added_{q}_ms"), (ll or {}).get(f"added_{q}_ms")
            ratio = a / b if a is not None and b else None
            note = "LiteLLM's added latency is not above 0: no ratio" if b is not None and b <= 0 else None
            put(f"gateway/litellm added {q} ({mode})", ratio, RATIO_TARGET, note)
        put(f"gateway unsampled added p50 ms ({mode})", (gw or {}).get("added_p50_ms"), UNSAMPLED_P50_MS)
        put(f"gateway unsampled added p99 ms ({mode})", (gw or {}).get("added_p99_ms"), UNSAMPLED_P99_MS)
        put(
            f"gateway sampled added p50 ms beyond the policy ({mode})",
            (sp or {}).get("added_p50_ms"),
            SAMPLED_P50_MS,
        )
    return targets


def latency_table(rows: list[dict]) -> str:
    head = (
        "| target | path | mode | p50 / p99 (ms) | added p50 / p99 (ms) | vs | server CPU ms/req | requests | errors |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['target']} | {r['path']} | {r['mode']} | {fmt(r['p50_ms'])} / {fmt(r['p99_ms'])} | "
            f"{fmt(r.get('added_p50_ms'))} / {fmt(r.get('added_p99_ms'))} | {r['baseline'] or '-'} | "
            f"{fmt(r['cpu_ms_per_request'])} | {r['requests']} | {r['errors']} |"
        )
    return "\n".join(lines)


def throughput_table(rows: list[dict], concurrency: int) -> str:
    lines = [
        f"| target | mode | req/s at {concurrency} clients | p50 / p99 (ms) | server CPU ms/req | server cores | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['target']} | {r['mode']} | {fmt(r['req_s'], '.0f')} | {fmt(r['p50_ms'])} / {fmt(r['p99_ms'])} | "
            f"{fmt(r['cpu_ms_per_request'])} | {fmt(r['cpu_cores'])} | {r['errors']} |"
        )
    return "\n".join(lines)


def memory_table(servers: list[Server]) -> str:
    lines = ["| server | startup (s) | idle RSS (MB) | peak RSS (MB) |", "|---|---|---|---|"]
    for s in servers:
        lines.append(
            f"| {s.name} | {fmt(s.startup_s, '.1f')} | {fmt(s.idle_rss_mb, '.0f')} | {fmt(s.peak_rss / 1e6, '.0f')} |"
        )
    return "\n".join(lines)


def gateway_metrics(port: int) -> dict[str, float]:
    """The gateway's own counters (its /metrics, admin key): recorded calls, fallbacks, store errors, added latency."""
    wanted = (
        "reinforge_online_requests_total",
        "reinforge_online_sampled_total",
        "reinforge_online_fallbacks_total",
        "reinforge_online_recorded_calls_total",
        "reinforge_online_store_errors_total",
        "reinforge_online_sampling_paused_total",
        "reinforge_online_added_latency_seconds_sum",
        "reinforge_online_added_latency_seconds_count",
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"authorization": f"Bearer {SECRETS['GWBENCH_ADMIN_KEY']}"}
    )
    out: dict[str, float] = {}
    try:
        with opener.open(req, timeout=10) as resp:
            text = resp.read().decode()
    except OSError as exc:
        return {"error": str(exc)}  # type: ignore[dict-item]
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        if name in wanted:
            with suppress(ValueError):
                out[name_labels] = float(value)
    return out


# -- main ----------------------------------------------------------------------------------------------------------


def build(args: argparse.Namespace, work: Path) -> tuple[list[Server], list[Target], dict[str, Any]]:
    """The servers to start and the targets to load; peers that cannot run are recorded, not started."""
    info: dict[str, Any] = {}
    gw_python = gateway_python(args)
    if gw_python is None:
        raise SystemExit(not_installed(args.venvs / "gateway", "reinforge-online"))
    info["gateway"] = {"python": gw_python, "versions": versions(gw_python, GATEWAY_DISTS)}
    fake_port = free_port()
    fake = Server(
        "fake",
        [gw_python, str(Path(__file__).resolve()), "--fake-server", str(fake_port)],
        f"http://127.0.0.1:{fake_port}/v1/models",
    )
    fake_v1 = f"http://127.0.0.1:{fake_port}/v1"
    servers = [fake]
    body = request_body()
    up_auth = {"content-type": "application/json", "authorization": f"Bearer {SECRETS['GWBENCH_UPSTREAM_KEY']}"}
    traffic = {"content-type": "application/json", "authorization": f"Bearer {SECRETS['GWBENCH_TRAFFIC_KEY']}"}
    policy_body = dict(body, return_token_ids=True, logprobs=True, model=POLICY_MODEL)  # what the gateway sends
    targets: list[Target] = []
    if "unsampled" in args.paths:
        targets.append(
            Target(
                "direct", "unsampled", f"{fake_v1}/chat/completions", up_auth, body, fake, expect(UPSTREAM_MARK, None)
            )
        )
    if "sampled" in args.paths:
        targets.append(
            Target(
                "policy-direct",
                "sampled",
                f"{fake_v1}/chat/completions",
                up_auth,
                policy_body,
                fake,
                expect(POLICY_MARK, None),
            )
        )
    for path in args.paths:
        sampled = path == "sampled"
        name = "gateway-sampled" if sampled else "gateway"
        port = free_port()
        config = {
            "upstream": {"url": fake_v1, "key_env": "GWBENCH_UPSTREAM_KEY"},
            "policy": {"url": fake_v1, "model": POLICY_MODEL},
            "listen": {"host": "127.0.0.1", "port": port},
            "auth": {
                "traffic_key_env": "GWBENCH_TRAFFIC_KEY",
                "admin_key_env": "GWBENCH_ADMIN_KEY",
                "feedback_secret_env": "GWBENCH_FEEDBACK_SECRET",
            },
            "mode": "route",
            "selection": {"sampling_rate": 1.0 if sampled else 0.0, "salt": "gwbench"},
            "store": {"path": f"traces-{name}.sqlite"},
            "limits": {"requests_per_s": None},  # one load client address: the default per-client limit would 429
            "committer": {"kind": "none"},
        }
        cfg = work / f"online-{name}.yaml"
        cfg.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
        server = Server(
            name,
            [gw_python, "-m", "reinforge", "online", "serve", str(cfg), "--log-level", "warning"],
            f"http://127.0.0.1:{port}/healthz",
        )
        servers.append(server)
        check = expect(POLICY_MARK, True, stripped=True) if sampled else expect(UPSTREAM_MARK, False)
        targets.append(
            Target(
                name,
                path,
                f"http://127.0.0.1:{port}/v1/chat/completions",
                traffic,
                body,
                server,
                check,
                baseline="policy-direct" if sampled else "direct",
            )
        )
        info[name] = {"config": config, "command": server.command, "port": port}
    if "unsampled" in args.paths and "litellm" in args.peers:
        venv = args.venvs / "litellm-proxy"
        python = Path(args.litellm_python or venv / "bin" / "python")
        info["litellm"] = {"python": str(python)}
        reason = None
        if not python.is_file():
            reason = not_installed(venv, "litellm[proxy]")
        else:
            try:
                info["litellm"]["versions"] = versions(str(python), LITELLM_DISTS)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                reason = str(exc)
            if reason is None and "litellm" not in info["litellm"]["versions"]:
                reason = not_installed(venv, "litellm[proxy]")
        if reason is None:
            port = free_port()
            config = {
                "model_list": [
                    {
                        "model_name": MODEL,
                        "litellm_params": {
                            "model": f"openai/{MODEL}",
                            "api_base": fake_v1,
                            "api_key": SECRETS["GWBENCH_UPSTREAM_KEY"],
                        },
                    }
                ],
                "general_settings": {"master_key": MASTER_KEY},
            }
            cfg = work / "litellm-config.yaml"
            cfg.write_text(json.dumps(config, indent=2) + "\n")
            cli = str(python.parent / "litellm")
            command = [cli, "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
            server = Server("litellm", command, f"http://127.0.0.1:{port}/health/liveliness")
            servers.append(server)
            master = {"content-type": "application/json", "authorization": f"Bearer {MASTER_KEY}"}
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            targets.append(
                Target(
                    "litellm", "unsampled", url, master, body, server, expect(UPSTREAM_MARK, None), baseline="direct"
                )
            )
            info["litellm"].update({"config": config, "command": command, "port": port})
        info["litellm"]["reason"] = reason
        if reason:
            say(f"skipping litellm: {reason}")
    return servers, targets, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400, help="timed requests per target, mode and run (400)")
    parser.add_argument("--warmup", type=int, default=50, help="untimed requests before them (50)")
    parser.add_argument("--runs", type=int, default=6, help="latency runs; the target order alternates (6)")
    parser.add_argument("--block-timeout", type=float, default=120.0, help="no new timed request after this (s)")
    parser.add_argument("--concurrency", type=int, default=16, help="clients of the throughput phase (16)")
    parser.add_argument("--throughput-seconds", type=float, default=5.0, help="per target and mode (5)")
    parser.add_argument("--throughput-max", type=int, default=20000, help="requests per target and mode at most")
    parser.add_argument("--throughput-runs", type=int, default=2, help="throughput runs, alternating (2; 0: none)")
    parser.add_argument("--modes", default="nonstream,stream", help="nonstream,stream")
    parser.add_argument("--paths", default="unsampled,sampled", help="unsampled,sampled")
    parser.add_argument("--peers", default="litellm", help="peers beside the gateway: litellm (or empty)")
    parser.add_argument("--startup-timeout", type=float, default=180.0, help="seconds for every server to be ready")
    parser.add_argument("--venvs", type=Path, default=Path.home() / ".cache" / "reinforge-bench")
    parser.add_argument("--gateway-python", help="python with reinforge-online (default VENVS/gateway/bin/python)")
    parser.add_argument("--litellm-python", help="python with litellm[proxy] (default VENVS/litellm-proxy)")
    parser.add_argument("--setup", action="store_true", help="create the two venvs under --venvs, then exit")
    parser.add_argument("--setup-python", help="interpreter the venvs are made from (default: this one)")
    parser.add_argument("--work-dir", type=Path, help="configs, logs, trace stores (default: a temporary folder)")
    parser.add_argument("--fake-server", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fake_server is not None:
        serve_fake(args.fake_server)
        return
    args.venvs = args.venvs.expanduser().resolve()
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    args.paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for key, known in (("modes", MODES), ("paths", ("unsampled", "sampled")), ("peers", ("litellm",))):
        unknown = sorted(set(getattr(args, key)) - set(known))
        if unknown:
            raise SystemExit(f"--{key}: unknown {unknown} (known: {', '.join(known)})")
    if args.setup:
        emit({"bench": "gateway_overhead", "setup": setup(args)})
        return
    ensure_client_deps(args)
    loop = "asyncio"
    with suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        loop = f"uvloop {uvloop.__version__}"
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="gwbench-"))
    work.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally below stops the servers
    with ExitStack() as stack:
        servers, targets, info = build(args, work)
        for s in servers:
            stack.callback(s.stop)
            s.start(work)
        say(f"starting {', '.join(s.name for s in servers)} (logs in {work})")
        _common.wait_ready(servers, args.startup_timeout)
        poller = RssPoller(servers)
        stack.callback(poller.stop)
        asyncio.run(smoke(targets))
        for t in targets:
            if t.reason:
                say(f"leaving out {t.name}: {t.reason}")
        live = [t for t in targets if t.reason is None]
        lat, thr = asyncio.run(measure(live, args))
        for t in live:
            if t.name.startswith("gateway"):
                info[t.name]["metrics"] = gateway_metrics(info[t.name]["port"])
        poller.stop()
        rows, trows = summarise(lat, thr, live, args.modes)
        targets_met = evaluate(rows)
        memory = {
            s.name: {
                "startup_s": r3(s.startup_s),
                "idle_rss_mb": s.idle_rss_mb,
                "peak_rss_mb": round(s.peak_rss / 1e6, 1),
            }
            for s in servers
        }
        print(latency_table(rows))
        print()
        if trows:
            print(throughput_table(trows, args.concurrency))
            print()
        print(memory_table(servers))
        print()
        for key, target in targets_met.items():
            met = target["met"]
            verdict = "" if met is None else (" (met)" if met else " (NOT met)")
            print(f"{key}: {fmt(target['value'], '.3f')} {target['target']}{verdict}")
        result = {
            "bench": "gateway_overhead",
            "requests": args.requests,
            "warmup": args.warmup,
            "runs": args.runs,
            "modes": args.modes,
            "concurrency": args.concurrency,
            "throughput_seconds": args.throughput_seconds,
            "throughput_runs": args.throughput_runs,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
            "client": {"aiohttp": __import__("aiohttp").__version__, "loop": loop},
            "latency": rows,
            "throughput": trows,
            "memory": memory,
            "targets": targets_met,
            "left_out": {t.name: t.reason for t in targets if t.reason},
            "peers": info,
            "request_body": request_body(),
            "logs": str(work),
        }
        emit(result)


if __name__ == "__main__":
    main()
