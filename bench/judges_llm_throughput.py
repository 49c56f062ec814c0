"""LLM judge throughput (judgments/s at concurrency 1, 8, 32) and the cost in calls of each bias control.

Everything runs against a local OpenAI-compatible server (``reinforge.testing.OpenAIServer`` on
127.0.0.1) that answers with a valid verdict, through LiteLLM. The first run answers instantly, so
it measures the judge's own overhead (prompting, LiteLLM, HTTP, parsing); the second adds a fixed
model latency (50 ms by default), where the concurrency limit is what sets the rate. The cache is
off for the throughput runs, so every judgment is a real HTTP call.

Prints a table, then a JSON object as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

try:
    import reinforge_judges_llm  # noqa: F401
except ImportError:  # `nox -s bench` installs core only: use the package from this checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "judges-llm" / "src"))

from _common import emit

from reinforge.testing.openai_server import OpenAIServer, Reply
from reinforge_judges_llm import ListwiseJudge, PairwiseJudge, PointwiseJudge, calibrate

LISTED = re.compile(r'<response id="(\d+)">')
TASK = {"question": "Explain why the sky is blue in two sentences.", "reference": "Rayleigh scattering."}


def serve(latency_s: float, urls: multiprocessing.Queue, stop: multiprocessing.Event) -> None:
    """A judge server in its own process, so it does not share the GIL with the judge it serves."""

    def slow(body: dict) -> Reply:
        return Reply(content=responder(body), delay=latency_s)

    with OpenAIServer(slow if latency_s else responder, model_name="judge") as server:
        urls.put(server.base_url)
        stop.wait()


class ServerProcess:
    def __init__(self, latency_s: float = 0.0):
        self.latency_s = latency_s

    def __enter__(self) -> str:
        ctx = multiprocessing.get_context("spawn")
        urls, self.stop = ctx.Queue(), ctx.Event()
        self.process = ctx.Process(target=serve, args=(self.latency_s, urls, self.stop), daemon=True)
        self.process.start()
        return urls.get(timeout=60)

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.process.join(timeout=10)


def responder(body: dict) -> str:
    user = body["messages"][-1]["content"]
    if "<response_a>" in user:
        return json.dumps({"reason": "A is clearer.", "winner": "A"})  # a position-biased judge
    ids = LISTED.findall(user)
    if ids:
        return json.dumps({"scores": [{"id": int(i), "reason": "ok", "score": 5} for i in ids]})
    return json.dumps({"reason": "Correct and clear.", "score": 4})


def answer(i: int) -> str:
    return f"Answer {i}: sunlight scatters off air molecules, and blue light scatters the most."


async def throughput(url: str, concurrency: int, n: int) -> float:
    judge = PointwiseJudge(model="judge", api_base=url, max_concurrency=concurrency, cache=False)
    await judge(TASK, "warm-up")  # LiteLLM import and client set-up are not part of the rate
    start = time.perf_counter()
    outs = await asyncio.gather(*(judge(TASK, answer(i)) for i in range(n)))
    seconds = time.perf_counter() - start
    assert all(o.reward == 0.75 for o in outs)
    return n / seconds


def calls(server: OpenAIServer, action) -> int:
    before = server.call_count
    asyncio.run(action()) if asyncio.iscoroutinefunction(action) else action()
    return server.call_count - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--judgments", type=int, default=400, help="judgments per concurrency level (1: a quarter)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=50.0, help="latency of the second run (50 ms)")
    args = parser.parse_args()

    latency_key = f"judgments_per_s_at_{args.latency_ms:g}ms_latency"
    results: dict = {"judgments_per_s": {}, latency_key: {}, "calls": {}}
    with ServerProcess() as url:
        for c in (1, 8, 32):
            n = max(20, args.judgments // 4) if c == 1 else args.judgments
            results["judgments_per_s"][f"concurrency_{c}"] = round(asyncio.run(throughput(url, c, n)), 1)
    with ServerProcess(args.latency_ms / 1000) as url:
        for c in (1, 8, 32):
            n = max(20, args.judgments // 20) if c == 1 else args.judgments // 2
            results[latency_key][f"concurrency_{c}"] = round(asyncio.run(throughput(url, c, n)), 1)

    # call counts need the server's request log: an in-process server
    with OpenAIServer(responder, model_name="judge") as server:
        url = server.base_url

        g = args.group_size
        group = [answer(i) for i in range(g)]
        cost = results["calls"]

        async def pointwise() -> None:
            await PointwiseJudge(model="judge", api_base=url, cache=False)(TASK, answer(1))

        async def length_normalized() -> None:
            await PointwiseJudge(model="judge", api_base=url, cache=False, length_normalization=True)(TASK, answer(2))

        async def self_preference_guard() -> None:
            judge = PointwiseJudge(model="judge", api_base=url, cache=False, policy_model="Qwen/Qwen2.5-0.5B")
            await judge(TASK, answer(3))

        async def pairwise_one_order() -> None:
            await PairwiseJudge(model="judge", api_base=url, cache=False, both_orders=False)(TASK, answer(4))

        async def pairwise_both_orders() -> None:
            await PairwiseJudge(model="judge", api_base=url, both_orders=True)(TASK, answer(5))

        async def pairwise_swapped_roles() -> None:  # the reverse comparison of the one above: both orders cached
            await PairwiseJudge(model="judge", api_base=url)({**TASK, "reference": answer(5)}, TASK["reference"])

        async def rerun_cached() -> None:
            judge = PointwiseJudge(model="judge", api_base=url)
            await judge(TASK, answer(6))
            before = server.call_count
            await judge(TASK, answer(6))
            cost["rerun_with_cache_per_judgment"] = server.call_count - before

        cost["pointwise_per_judgment"] = calls(server, pointwise)
        cost["length_normalization_per_judgment"] = calls(server, length_normalized)
        cost["self_preference_guard_per_judgment"] = calls(server, self_preference_guard)
        cost["pairwise_one_order_per_comparison"] = calls(server, pairwise_one_order)
        cost["pairwise_both_orders_per_comparison"] = calls(server, pairwise_both_orders)
        cost["pairwise_reverse_comparison_after_cache"] = calls(server, pairwise_swapped_roles)
        calls(server, rerun_cached)
        for k in (1, 4, None):

            async def listwise(k: int | None = k) -> None:
                await ListwiseJudge(model="judge", api_base=url, cache=False, permutations=k)(TASK, group)

            label = "default_one_per_response" if k is None else k
            cost[f"listwise_group_of_{g}_permutations_{label}"] = calls(server, listwise)

        with tempfile.TemporaryDirectory() as tmp:
            gold = Path(tmp) / "gold.jsonl"
            gold.write_text(
                "\n".join(
                    json.dumps({"task": TASK, "response": answer(100 + i), "label": 1 + i % 5}) for i in range(20)
                )
            )
            settings = {"model": "judge", "api_base": url, "cache_path": str(Path(tmp) / "cache.sqlite")}
            cost["calibration_20_gold_items_first_run"] = calls(
                server, lambda: calibrate("llm-pointwise", gold, args=settings)
            )
            # each calibrate() builds and closes its own judge: the rerun is free through the cache file only
            cost["calibration_20_gold_items_rerun"] = calls(
                server, lambda: calibrate("llm-pointwise", gold, args=settings)
            )

    print("LLM judge throughput against a local OpenAI-compatible server (own process), through LiteLLM")
    for name, rate in results["judgments_per_s"].items():
        slow = results[latency_key][name]
        print(f"  {name:<16} {rate:>8.1f} judgments/s instant replies, {slow:>7.1f} at {args.latency_ms:g} ms latency")
    print("Calls per judgment / comparison / group by bias control")
    for name, n in cost.items():
        print(f"  {name:<48} {n}")
    emit(results)


if __name__ == "__main__":
    main()
