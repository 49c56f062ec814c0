"""Online learning end to end: simulated users through the gateway, 10% sampled, the served policy trained live.

On this machine, all on 127.0.0.1 (each its own process):

- ``reinforge serve`` with the default SmolLM2-135M-Instruct (``--threads 1`` by default: training gets the other core; an admin key for swaps): the
  policy under training;
- a fake production upstream (``bench/gateway_overhead.py --fake-server``: fixed short answers) for the
  requests that are not sampled;
- ``reinforge online serve``: ``route`` mode, ``sampling_rate`` 0.1 sticky per session, rewards from
  ``examples/math/run.yaml``'s judges when a trace closes (``metadata`` carries the question and answer),
  the ``local`` committer every ``--commit-s`` seconds or ``--min-traces`` rewarded traces (the served LoRA trained in the gateway's worker
  process, then hot-swapped into the server).

A user population sends math questions of ``examples/math/data/train.jsonl`` (the example's system prompt,
``max_tokens`` 24, temperature 0.8, each question its own session) at ``--rate`` requests per second,
open loop, for ``--minutes`` (at most ``--rate x --minutes x 60`` requests and ``--max-in-flight`` at
once: bounded in count and time). Half-way after every tenth arrival the same request goes straight to the
fake upstream as an arrival of its own, so each minute has its own baseline measured the same way: the gateway's added latency on unsampled requests is its p50/p99
minus the direct one's, per minute. Those arrivals find every process idle (open loop at a low rate), which on
this VM makes even the direct call about 2.5x slower than back to back; so each minute also gets ``--probe-pairs``
closed-loop probe pairs (one keep-alive connection each way, direct then gateway, back to back, one session that
is not sampled), the method ``bench/gateway_overhead.py``'s targets are defined with, under this run's load
(serving and training next to it). Both are reported; the probes' added latency is checked against the targets
and the users' is shown beside it. Held-out greedy accuracy of the served policy on
``examples/math/data/test.jsonl`` (core's ``last_number`` judge, as the example's ``eval.accuracy_key``)
is measured straight at the server before the users start and after they stop (and every
``--eval-every-min`` minutes on ``--eval-mid-n`` questions, if set). After the run the gateway is
stopped (SIGTERM) and every trace a user was acknowledged (a response with ``x-reinforge-trace-id``) is
looked up in the SQLite store: none may be missing.

The promotion gate (``--gate-n``, default 100): the last ``--gate-n`` questions of train.jsonl are the check
set (a run file written into the work folder: the math example's workflow and its trusted judges, greedy;
users never ask them), and each trained version is served only when it scores at least the live one
(``--gate-margin``). ``--poison-from-min A --poison-to-min B`` poisons the reward calculator for that stretch:
its correctness judge pays wrong answers and not right ones (a flag file the judge reads). After the run
every version that was live is measured on the held-out test set (its checkpoint swapped into the server):
the served policy's accuracy over time, its best, and its worst drop below the best so far; and the gate's
promotions, refusals and rollbacks (``GET /online/v1/versions``).

Prints a markdown summary, then a JSON object as its last stdout line. Needs reinforge-backend-local and
reinforge-online (with aiohttp) in this Python: ``nox -s bench -- online_e2e`` installs them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from _common import Server, emit, free_port  # bench/ is this script's folder: the shared helpers
from _common import percentile as pct

ROOT = Path(__file__).resolve().parents[1]
MATH = ROOT / "examples" / "math"
SYSTEM_PROMPT = "You are a careful calculator. Reply with just the number."
SERVED = "smollm2-135m-instruct"
KEYS = {
    "E2E_SERVE_KEY": "e2e-serve-traffic",
    "E2E_SERVE_ADMIN": "e2e-serve-admin",
    "E2E_UPSTREAM_KEY": "gwbench-upstream-key",  # the fake upstream's key (bench/gateway_overhead.py)
    "E2E_TRAFFIC_KEY": "e2e-gateway-traffic",
    "E2E_ADMIN_KEY": "e2e-gateway-admin",
    "E2E_FEEDBACK_SECRET": "e2e-feedback-secret",
}
UPSTREAM_HEADERS = {"authorization": f"Bearer {KEYS['E2E_UPSTREAM_KEY']}", "content-type": "application/json"}
GATEWAY_HEADERS = {"authorization": f"Bearer {KEYS['E2E_TRAFFIC_KEY']}", "content-type": "application/json"}
PROBE_WARMUP = 5
TARGETS = {
    "versions": 5,
    "accuracy_gain_points": 15.0,
    "unsampled_added_p50_ms": 1.0,
    "unsampled_added_p99_ms": 5.0,
    "max_drop_below_best_points": 5.0,
}
POISON_JUDGE = '''"""The reward calculator's correctness judge, poisoned while the flag file exists: it pays wrong answers."""

from pathlib import Path

from reinforge.judges.rules import last_number as trusted

FLAG = Path(__file__).with_name("POISONED")


def last_number(task, response):
    out = trusted(task, response)
    return 1.0 - out.reward if FLAG.exists() else out
'''


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def messages(question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


def proc(name: str, argv: list[str], ready_url: str, log: Path, headers: dict[str, str] | None = None) -> Server:
    """A server of this run: signalled alone (SIGTERM; the gateway stops its committer's worker itself)."""
    return Server(name, argv, ready_url, headers=headers or {}, own_group=False, log=log)


def start(server: Server, env: dict[str, str], timeout: float) -> float:
    """Start ``server`` from the repository root; seconds until it answered (exit with its log's tail if it did not)."""
    server.start(env, ROOT)
    try:
        return server.wait_ready(timeout)
    except RuntimeError as exc:
        raise SystemExit(f"{exc}\n(see {server.log})") from None


# -- held-out accuracy -----------------------------------------------------------------------------------------


async def accuracy(serve: str, tests: list[dict[str, Any]], concurrency: int = 32) -> dict[str, Any]:
    """Greedy held-out accuracy of what the server serves now (core's ``last_number`` judge)."""
    from reinforge.judges.rules import last_number

    headers = {"authorization": f"Bearer {KEYS['E2E_SERVE_KEY']}"}
    sem = asyncio.Semaphore(concurrency)
    versions: set[str] = set()

    async def one(session: aiohttp.ClientSession, task: dict[str, Any]) -> float:
        body = {"model": SERVED, "messages": messages(task["question"]), "max_tokens": 24, "temperature": 0}
        async with sem, session.post(f"{serve}/v1/chat/completions", json=body, headers=headers) as r:
            data = await r.json()
            versions.add(r.headers.get("x-policy-version", "?"))
        text = data["choices"][0]["message"]["content"] or ""
        return float(last_number(task, text).reward)

    t0 = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        scores = await asyncio.gather(*(one(session, t) for t in tests))
    return {
        "accuracy": sum(scores) / len(scores),
        "n": len(scores),
        "policy_versions": sorted(versions),
        "seconds": round(time.monotonic() - t0, 1),
    }


# -- the users ---------------------------------------------------------------------------------------------------


def _body(task: dict[str, Any]) -> dict[str, Any]:
    """A user's request: the math example's prompt; ``metadata`` carries what the judges need."""
    return {
        "model": "gpt-production",
        "messages": messages(task["question"]),
        "max_tokens": 24,
        "temperature": 0.8,
        "metadata": {"question": task["question"], "answer": str(task["answer"])},
    }


class Users:
    """Open-loop arrivals at ``rate`` per second; latencies by minute; acknowledged trace ids."""

    def __init__(self, gateway: str, upstream: str, train: list[dict[str, Any]], args: argparse.Namespace) -> None:
        self.gateway, self.upstream, self.train, self.args = gateway, upstream, train, args
        self.rng = random.Random(args.seed)
        self.minutes: dict[int, dict[str, list[float]]] = {}
        self.acknowledged: list[str] = []
        self.counts = {"sent": 0, "sampled": 0, "unsampled": 0, "errors": 0, "not_sent": 0, "direct": 0}
        self.errors: dict[str, int] = {}
        self.in_flight = 0

    def _minute(self, t: float) -> dict[str, list[float]]:
        empty: dict[str, list[float]] = {
            "unsampled": [],
            "sampled": [],
            "direct": [],
            "probe_gw": [],
            "probe_direct": [],
        }
        return self.minutes.setdefault(int(t // 60), empty)

    async def _probes(self, t0: float) -> None:
        """``--probe-pairs`` direct/gateway pairs back to back on warm connections (a session that is not sampled)."""
        a = self.args
        timeout = aiohttp.ClientTimeout(total=30)
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), timeout=timeout) as direct,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), timeout=timeout) as gateway,
        ):
            session_id = uuid.uuid4().hex
            for i in range(PROBE_WARMUP + a.probe_pairs):
                raw = json.dumps(_body(self.rng.choice(self.train))).encode()
                start = time.perf_counter()
                async with direct.post(f"{self.upstream}/chat/completions", data=raw, headers=UPSTREAM_HEADERS) as r:
                    await r.read()
                    ok = r.status == 200
                middle = time.perf_counter()
                async with gateway.post(
                    f"{self.gateway}/v1/chat/completions",
                    data=raw,
                    headers={**GATEWAY_HEADERS, "x-session-id": session_id},
                ) as r:
                    await r.read()
                    sampled = "x-reinforge-trace-id" in r.headers
                    ok = ok and r.status == 200
                end = time.perf_counter()
                if sampled:  # this session is sampled (sticky): the next pairs use another one
                    session_id = uuid.uuid4().hex
                    continue
                if ok and i >= PROBE_WARMUP:  # the first pairs open the connections
                    m = self._minute(start - t0)
                    m["probe_direct"].append((middle - start) * 1000)
                    m["probe_gw"].append((end - middle) * 1000)

    async def _direct(self, session: aiohttp.ClientSession, task: dict[str, Any], t0: float, delay: float) -> None:
        """The same request straight to the upstream, as an arrival of its own (the minute's baseline)."""
        await asyncio.sleep(delay)  # half-way between two user arrivals: no request of ours is in flight with it
        raw = json.dumps(_body(task)).encode()
        try:
            start = time.perf_counter()
            async with session.post(f"{self.upstream}/chat/completions", data=raw, headers=UPSTREAM_HEADERS) as r:
                await r.read()
                if r.status == 200:
                    self.counts["direct"] += 1
                    self._minute(start - t0)["direct"].append((time.perf_counter() - start) * 1000)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self.errors[f"direct {type(exc).__name__}"] = self.errors.get(f"direct {type(exc).__name__}", 0) + 1

    async def _one(self, session: aiohttp.ClientSession, task: dict[str, Any], t0: float) -> None:
        raw = json.dumps(_body(task)).encode()
        self.in_flight += 1
        try:
            start = time.perf_counter()
            headers = {**GATEWAY_HEADERS, "x-session-id": uuid.uuid4().hex}
            async with session.post(f"{self.gateway}/v1/chat/completions", data=raw, headers=headers) as r:
                await r.read()
                elapsed = (time.perf_counter() - start) * 1000
                trace = r.headers.get("x-reinforge-trace-id")
                if r.status != 200:
                    self.counts["errors"] += 1
                    self.errors[str(r.status)] = self.errors.get(str(r.status), 0) + 1
                elif trace:
                    self.counts["sampled"] += 1
                    self.acknowledged.append(trace)
                    self._minute(start - t0)["sampled"].append(elapsed)
                else:
                    self.counts["unsampled"] += 1
                    self._minute(start - t0)["unsampled"].append(elapsed)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self.counts["errors"] += 1
            self.errors[type(exc).__name__] = self.errors.get(type(exc).__name__, 0) + 1
        finally:
            self.in_flight -= 1

    async def run(self, on_minute: Any) -> None:
        a = self.args
        total = int(a.rate * a.minutes * 60)
        deadline = a.minutes * 60
        connector = aiohttp.TCPConnector(limit=a.max_in_flight)
        tasks: set[asyncio.Task[Any]] = set()
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
            t0 = time.perf_counter()
            next_minute, next_probes = 60.0, 30.0
            for i in range(total):
                due = i / a.rate
                now = time.perf_counter() - t0
                if now >= deadline:
                    break
                if due > now:
                    await asyncio.sleep(due - now)  # pacing the arrivals (open loop), not a measurement
                if a.probe_pairs and time.perf_counter() - t0 >= next_probes:  # mid-minute
                    probes = asyncio.create_task(self._probes(t0))
                    tasks.add(probes)
                    probes.add_done_callback(tasks.discard)
                    next_probes += 60.0
                if time.perf_counter() - t0 >= next_minute:  # off the loop: the users' timings stay clean
                    probe = asyncio.create_task(asyncio.to_thread(on_minute, int(next_minute // 60)))
                    tasks.add(probe)
                    probe.add_done_callback(tasks.discard)
                    next_minute += 60.0
                if self.in_flight >= a.max_in_flight:
                    self.counts["not_sent"] += 1
                    continue
                self.counts["sent"] += 1
                question = self.rng.choice(self.train)
                task = asyncio.create_task(self._one(session, question, t0))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                if i % 10 == 0:
                    probe = asyncio.create_task(self._direct(session, question, t0, 0.5 / a.rate))
                    tasks.add(probe)
                    probe.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks, timeout=300)

    def by_minute(self) -> list[dict[str, Any]]:
        out = []
        for minute, m in sorted(self.minutes.items()):
            row: dict[str, Any] = {"minute": minute, "unsampled": len(m["unsampled"]), "sampled": len(m["sampled"])}
            row["probe_pairs"] = len(m["probe_gw"])
            for q, name in ((0.5, "p50"), (0.99, "p99")):
                gw, direct = pct(m["unsampled"], q), pct(m["direct"], q)
                row[f"unsampled_{name}_ms"] = None if gw is None else round(gw, 2)
                row[f"direct_{name}_ms"] = None if direct is None else round(direct, 2)
                row[f"added_{name}_ms"] = None if gw is None or direct is None else round(gw - direct, 2)
                pg, pd = pct(m["probe_gw"], q), pct(m["probe_direct"], q)
                row[f"probe_added_{name}_ms"] = None if pg is None or pd is None else round(pg - pd, 2)
                s = pct(m["sampled"], q)
                row[f"sampled_{name}_ms"] = None if s is None else round(s, 1)
            out.append(row)
        return out


# -- main ----------------------------------------------------------------------------------------------------------


def run_file(work: Path, name: str, correct: str, eval_split: str | None = None) -> Path:
    """A copy of the math example's run file in ``work`` (its workflow and judges beside it), with the
    correctness judge ``correct`` and, for the gate, the check set as its eval dataset."""
    import shutil

    for module in ("workflow.py", "judges.py"):
        shutil.copy(MATH / module, work / module)
    text = (MATH / "run.yaml").read_text()
    text = text.replace("  - name: last_number\n", f"  - name: {correct}\n")
    text = text.replace("path: data, split: train", f"path: {MATH / 'data'}, split: train")
    if eval_split is not None:
        text = text.replace(
            "eval_dataset: {path: data, split: test}", f"eval_dataset: {{path: {work / 'check'}, split: {eval_split}}}"
        )
    path = work / name
    path.write_text(text)
    return path


def gateway_config(work: Path, port: int, serve: str, upstream: str, args: argparse.Namespace) -> Path:
    (work / "poison.py").write_text(POISON_JUDGE)
    reward_run = run_file(work, "reward.yaml", "poison:last_number")  # poisoned only while work/POISONED exists
    config: dict[str, Any] = {
        "upstream": {"url": upstream, "key_env": "E2E_UPSTREAM_KEY"},
        "policy": {"url": f"{serve}/v1", "model": SERVED, "key_env": "E2E_SERVE_KEY", "timeout_s": 120},
        "listen": {"host": "127.0.0.1", "port": port},
        "auth": {
            "traffic_key_env": "E2E_TRAFFIC_KEY",
            "admin_key_env": "E2E_ADMIN_KEY",
            "feedback_secret_env": "E2E_FEEDBACK_SECRET",
        },
        "mode": "route",
        "selection": {"sampling_rate": args.sampling, "salt": "e2e"},
        "store": {"path": str(work / "traces.sqlite")},
        "reward": {"run": str(reward_run), "close_after_s": 0},
        "committer": {
            "kind": "local",
            "interval_s": args.commit_s,
            "min_traces": args.min_traces,  # ... or as soon as this many traces got their rewards
            "args": {  # the local committer's own settings (reinforge-backend-local's LocalCommitterSettings)
                "run_dir": str(work / "online-run"),
                "admin_key_env": "E2E_SERVE_ADMIN",
                "model": SERVED,
                "learning_rate": args.lr,
                "mini_batch_size": args.mini_batch,
                "threads": args.train_threads,
                "nice": args.train_nice,
                "swap_timeout_s": 300,
            },
        },
    }
    if args.gate_n > 0:
        config["gate"] = {
            "run": str(run_file(work, "check.yaml", "last_number", eval_split="test")),
            "limit": args.gate_n,
            "margin": args.gate_margin,
            "timeout_s": 600,
        }
    config["rollback"] = {"window": 50, "min_traces": 20, "margin": args.rollback_margin}
    config["shutdown_timeout_s"] = 150  # the last commit trains and checks one more batch before the gateway exits
    path = work / "online.yaml"
    path.write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
    return path


def versions_of(gateway: str) -> dict[str, Any]:
    """The gateway's versions and decisions (its admin route)."""
    import urllib.request

    req = urllib.request.Request(
        f"{gateway}/online/v1/versions", headers={"authorization": f"Bearer {KEYS['E2E_ADMIN_KEY']}"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        answer: dict[str, Any] = json.loads(r.read())
        return answer


def stored_versions(db: Path) -> dict[str, Any]:
    """The versions and decisions tables, in the shape of ``GET /online/v1/versions``."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        versions = []
        for seq, name, state, created, parent, score, data in con.execute(
            "SELECT seq, name, state, created_at, parent, score, data FROM versions ORDER BY seq"
        ):
            extra = json.loads(data or "{}")
            versions.append(
                {
                    "version": seq,
                    "name": name,
                    "state": state,
                    "created_at": created,
                    "parent": parent,
                    "score": score,
                    "check": extra.get("check"),
                    "stints": extra.get("stints") or [],
                    "detail": extra.get("detail") or {},
                }
            )
        decisions = [
            {"at": at, "version": v, "decision": d, "reason": r}
            for at, v, d, r in con.execute("SELECT at, version, decision, reason FROM decisions ORDER BY at DESC")
        ]
    finally:
        con.close()
    live = next((v["version"] for v in versions if v["state"] == "live"), None)
    return {"live": live, "versions": versions, "decisions": decisions}


def swap(serve: str, checkpoint: str | None) -> str:
    """The server serves ``checkpoint`` (None: the base model); its policy version."""
    import urllib.request

    req = urllib.request.Request(
        f"{serve}/admin/adapter",
        data=json.dumps({"path": checkpoint}).encode(),
        headers={"authorization": f"Bearer {KEYS['E2E_SERVE_ADMIN']}", "content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        return str(json.loads(r.read())["policy_version"])


def served_over_time(serve: str, listing: dict[str, Any], tests: list[dict[str, Any]], t0: float) -> dict[str, Any]:
    """Held-out accuracy of every version that was live, in the order they were served, and the worst drop of
    the served policy below its best so far (points)."""
    stints = []
    for v in listing["versions"]:
        for s in v["stints"]:
            stints.append((float(s["from"]), v))
    stints.sort(key=lambda pair: pair[0])
    measured: dict[int, float] = {}
    timeline = []
    for start, v in stints:
        if v["version"] not in measured:
            swap(serve, (v["detail"] or {}).get("checkpoint") or (v["detail"] or {}).get("adapter"))
            measured[v["version"]] = asyncio.run(accuracy(serve, tests))["accuracy"]
            print(f"held-out v{v['version']} ({v['name']}): {measured[v['version']]:.1%}", file=sys.stderr)
        timeline.append(
            {"minute": round((start - t0) / 60, 2), "version": v["version"], "accuracy": measured[v["version"]]}
        )
    best, worst_drop = 0.0, 0.0
    for point in timeline:
        best = max(best, point["accuracy"])
        worst_drop = max(worst_drop, (best - point["accuracy"]) * 100)
    return {"timeline": timeline, "best": best, "worst_drop_points": round(worst_drop, 1)}


def store_report(db: Path, acknowledged: list[str]) -> dict[str, Any]:
    """Lost acknowledged traces, and the sampled traffic's reward per policy version (the training curve)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        present = {r[0] for r in con.execute("SELECT trace_id FROM traces")}
        query = "SELECT c.policy_version, r.reward FROM rewards r JOIN calls c ON c.trace_id = r.trace_id"
        by_version: dict[str, list[float]] = {}
        for version, reward in con.execute(query):
            by_version.setdefault(str(version), []).append(float(reward))
        curve = [
            {"policy_version": v, "traces": len(by_version[v]), "mean_reward": statistics.mean(by_version[v])}
            for v in sorted(by_version, key=lambda v: int(v) if v.isdigit() else -1)
        ]
        states = dict(con.execute("SELECT status, COUNT(*) FROM traces GROUP BY status").fetchall())
        batches = dict(con.execute("SELECT state, COUNT(*) FROM batches GROUP BY state").fetchall())
    finally:
        con.close()
    lost = [t for t in acknowledged if t not in present]
    return {
        "acknowledged": len(acknowledged),
        "lost": len(lost),
        "lost_ids": lost[:20],
        "trace_states": states,
        "batch_states": batches,
        "curve": curve,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=15.0, help="how long the users send (15)")
    p.add_argument("--rate", type=float, default=20.0, help="user requests per second through the gateway (20)")
    p.add_argument("--sampling", type=float, default=0.1, help="the gateway's sampling rate (0.1)")
    p.add_argument("--commit-s", type=float, default=60.0, help="the committer's interval (60)")
    p.add_argument("--min-traces", type=int, default=64, help="the committer's min_traces (64)")
    p.add_argument("--lr", type=float, default=3e-4, help="learning rate of the served LoRA (3e-4)")
    p.add_argument("--mini-batch", type=int, default=32, help="samples per optimizer step (32)")
    p.add_argument("--train-threads", type=int, default=1, help="torch threads of the training worker (1)")
    p.add_argument("--train-nice", type=int, default=10, help="niceness of the training worker (10)")
    p.add_argument("--serve-nice", type=int, default=10, help="niceness of reinforge serve (10)")
    p.add_argument(
        "--front-nice",
        type=int,
        default=-5,
        help="niceness of the gateway, the upstream and the users (-5; needs root)",
    )
    p.add_argument("--serve-threads", type=int, default=1, help="torch threads of reinforge serve (1)")
    p.add_argument("--probe-pairs", type=int, default=100, help="closed-loop probe pairs each minute (100; 0: none)")
    p.add_argument("--max-in-flight", type=int, default=256, help="requests in flight at most (256)")
    p.add_argument("--eval-n", type=int, default=200, help="held-out questions before and after (200)")
    p.add_argument("--eval-every-min", type=float, default=0.0, help="a held-out check every N minutes (0: none)")
    p.add_argument("--eval-mid-n", type=int, default=50, help="questions of each mid-run check (50)")
    p.add_argument(
        "--gate-n", type=int, default=100, help="check-set questions of the promotion gate (100; 0: no gate)"
    )
    p.add_argument("--gate-margin", type=float, default=0.0, help="the gate's margin (0.0)")
    p.add_argument("--rollback-margin", type=float, default=0.1, help="rollback.margin (0.1)")
    p.add_argument("--poison-from-min", type=float, help="the reward calculator pays wrong answers from this minute...")
    p.add_argument("--poison-to-min", type=float, help="... to this one")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", type=Path, help="configs, logs, store, run folder (default: a temporary folder)")
    args = p.parse_args()

    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="online-e2e-"))).resolve()
    if work.exists() and any(work.iterdir()):
        # an old store or run folder would be resumed: its traces and trained adapter would count as this run's
        raise SystemExit(f"--work-dir {work} is not empty: give a new or empty folder")
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **KEYS, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_PROXY": "127.0.0.1,localhost"}
    train, tests = rows(MATH / "data" / "train.jsonl"), rows(MATH / "data" / "test.jsonl")[: args.eval_n]
    if args.gate_n > 0:  # the gate's check set: questions users never ask
        train, check = train[: -args.gate_n], train[-args.gate_n :]
        (work / "check").mkdir()
        (work / "check" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in check))
    py = sys.executable
    serve_port, fake_port, gw_port = free_port(), free_port(), free_port()
    serve_url, upstream_v1 = f"http://127.0.0.1:{serve_port}", f"http://127.0.0.1:{fake_port}/v1"
    gw_url = f"http://127.0.0.1:{gw_port}"
    auth = {"authorization": f"Bearer {KEYS['E2E_SERVE_KEY']}"}
    serve = proc(
        "serve",
        ["nice", "-n", str(args.serve_nice), py, "-m", "reinforge", "serve", SERVED]
        + ["--port", str(serve_port), "--threads", str(args.serve_threads)]
        + ["--api-key-env", "E2E_SERVE_KEY", "--admin-key-env", "E2E_SERVE_ADMIN", "--max-model-len", "512"]
        + ["--log-level", "warning"],
        f"{serve_url}/v1/models",
        work / "serve.log",
        auth,
    )
    # The request path (users, gateway, upstream) runs ahead of the policy's heavy work (serving, training), as it
    # would on machines of its own; negative niceness needs root, else everything runs at the default.
    front = ["nice", "-n", str(args.front_nice)] if args.front_nice < 0 and os.geteuid() == 0 else []
    if front:
        os.nice(args.front_nice)
    fake = proc(
        "upstream",
        [*front, py, str(ROOT / "bench" / "gateway_overhead.py"), "--fake-server", str(fake_port)],
        f"{upstream_v1}/models",
        work / "upstream.log",
    )
    config = gateway_config(work, gw_port, serve_url, upstream_v1, args)
    gateway = proc(
        "gateway",
        [*front, py, "-m", "reinforge", "online", "serve", str(config), "--log-level", "warning"],
        f"{gw_url}/healthz",
        work / "gateway.log",
    )

    def version_now() -> str:
        import urllib.request

        req = urllib.request.Request(f"{serve_url}/v1/models", headers=auth)
        with urllib.request.urlopen(req, timeout=30) as r:
            return str(json.loads(r.read())["data"][0]["policy_version"])

    result: dict[str, Any] = {"bench": "online_e2e", "args": {k: str(v) for k, v in vars(args).items()}}
    result["work_dir"] = str(work)
    print(f"work dir: {work}", file=sys.stderr)
    try:
        result["startup_s"] = {"serve": round(start(serve, env, 300), 1), "upstream": round(start(fake, env, 60), 1)}
        before = asyncio.run(accuracy(serve_url, tests))
        print(f"held-out before: {before}", file=sys.stderr)
        result["startup_s"]["gateway"] = round(start(gateway, env, 120), 1)
        result["policy_version_start"] = version_now()
        versions: list[dict[str, Any]] = []
        mid: list[dict[str, Any]] = []

        started = time.monotonic()
        started_wall = time.time()

        flag = work / "POISONED"

        def on_minute(minute: int) -> None:
            v = version_now()
            versions.append({"minute": minute, "policy_version": v})
            if args.poison_from_min is not None and args.poison_to_min is not None:
                poisoned = args.poison_from_min <= minute < args.poison_to_min
                if poisoned and not flag.exists():
                    flag.write_text("the reward calculator pays wrong answers\n")
                elif not poisoned and flag.exists():
                    flag.unlink()
            print(
                f"minute {minute}: policy version {v}{' (poisoned rewards)' if flag.exists() else ''}", file=sys.stderr
            )

        users = Users(gw_url, upstream_v1, train, args)

        async def drive() -> None:
            load = asyncio.create_task(users.run(on_minute))
            if args.eval_every_min > 0:
                every = args.eval_every_min * 60
                while not load.done():
                    done, _ = await asyncio.wait({load}, timeout=every)
                    if load.done():
                        break
                    check = await accuracy(serve_url, tests[: args.eval_mid_n], concurrency=8)
                    check["minute"] = round((time.monotonic() - started) / 60, 1)
                    mid.append(check)
                    print(f"held-out check: {check}", file=sys.stderr)
            await load

        asyncio.run(drive())
        result["users_s"] = round(time.monotonic() - started, 1)
        versions.append({"minute": "end", "policy_version": version_now()})
        flag.unlink(missing_ok=True)
        route = versions_of(gw_url)  # the admin route, as an operator sees it
        result["versions_route"] = {"live": route["live"], "versions": len(route["versions"])}
        # a last commit may train one more batch first
        result["gateway_exit"] = gateway.stop(signal.SIGTERM, timeout_s=180)
        listing = stored_versions(work / "traces.sqlite")  # ... so the final word is the store's
        result["version_listing"] = listing
        decided = [d["decision"] for d in listing["decisions"]]
        result["decisions"] = {k: decided.count(k) for k in sorted(set(decided))}
        result["versions"] = versions
        result["policy_version_end"] = version_now()
        after = asyncio.run(accuracy(serve_url, tests))  # what the server serves: the live version
        print(f"held-out after: {after}", file=sys.stderr)
        result.update(
            accuracy_before=before, accuracy_after=after, mid_checks=mid, counts=users.counts, errors=users.errors
        )
        result["served"] = served_over_time(serve_url, listing, tests, started_wall)
        result["minutes"] = users.by_minute()
        result["store"] = store_report(work / "traces.sqlite", users.acknowledged)
    finally:
        for server in (gateway, fake, serve):
            server.stop(signal.SIGTERM, timeout_s=60)

    gain = (result["accuracy_after"]["accuracy"] - result["accuracy_before"]["accuracy"]) * 100
    swaps = sum(1 for v in result["version_listing"]["versions"] if v["stints"]) - 1  # versions served after v0

    def worst(key: str) -> float | None:
        return max((m[key] for m in result["minutes"] if m[key] is not None), default=None)

    # the targets' method: closed-loop probes (bench/gateway_overhead.py's); the open-loop users' beside it
    worst_p50, worst_p99 = worst("probe_added_p50_ms"), worst("probe_added_p99_ms")
    result["summary"] = {
        "policy_versions_advanced": swaps,
        "accuracy_gain_points": round(gain, 1),
        "worst_minute_probe_added_p50_ms": worst_p50,
        "worst_minute_probe_added_p99_ms": worst_p99,
        "worst_minute_users_added_p50_ms": worst("added_p50_ms"),
        "worst_minute_users_added_p99_ms": worst("added_p99_ms"),
        "lost_acknowledged_traces": result["store"]["lost"],
        "decisions": result["decisions"],
        "served_best": result["served"]["best"],
        "served_worst_drop_points": result["served"]["worst_drop_points"],
        "targets": TARGETS,
        "met": {
            "versions": swaps >= TARGETS["versions"],
            "accuracy": gain >= TARGETS["accuracy_gain_points"],
            "unsampled_p50": worst_p50 is not None and worst_p50 <= TARGETS["unsampled_added_p50_ms"],
            "unsampled_p99": worst_p99 is not None and worst_p99 <= TARGETS["unsampled_added_p99_ms"],
            "no_lost_traces": result["store"]["lost"] == 0,
            "served_never_5_below_best": result["served"]["worst_drop_points"] <= TARGETS["max_drop_below_best_points"],
        },
    }
    print(
        "| minute | unsampled | sampled | added p50 / p99, probes (ms) | added p50 / p99, users (ms) | sampled p50 / p99 (ms) |"
    )
    print("|---|---|---|---|---|---|")
    for m in result["minutes"]:
        probes = f"{m['probe_added_p50_ms']} / {m['probe_added_p99_ms']}"
        users_ = f"{m['added_p50_ms']} / {m['added_p99_ms']}"
        sampled = f"{m['sampled_p50_ms']} / {m['sampled_p99_ms']}"
        print(f"| {m['minute']} | {m['unsampled']} | {m['sampled']} | {probes} | {users_} | {sampled} |")
    print()
    print("| policy version | sampled traces | mean reward |")
    print("|---|---|---|")
    for c in result["store"]["curve"]:
        print(f"| {c['policy_version']} | {c['traces']} | {c['mean_reward']:.3f} |")
    print()
    print("| minute served | version | held-out |")
    print("|---|---|---|")
    for point in result["served"]["timeline"]:
        print(f"| {point['minute']} | v{point['version']} | {point['accuracy']:.1%} |")
    print()
    print("decisions:", ", ".join(f"{k} {n}" for k, n in result["decisions"].items()))
    for d in reversed(result["version_listing"]["decisions"]):
        print(f"  v{d['version']} {d['decision']}: {d['reason']}")
    print()
    b, a = result["accuracy_before"]["accuracy"], result["accuracy_after"]["accuracy"]
    print(f"held-out greedy accuracy: {b:.1%} -> {a:.1%} ({gain:+.1f} points); policy versions advanced: {swaps}")
    emit(result)


if __name__ == "__main__":
    main()
