"""Completion tokens/s: 32 concurrent workflow calls through the micro-batcher vs HF ``generate`` at batch 32.

Same model (SmolLM2-135M-Instruct, fp32), same prompts (math questions in the
example's chat format), 32 new tokens at most, temperature 1.0, 2 threads.
Both decode on backend-local's compute thread (one OpenMP team in the process).
Two workloads: ``grouped`` (4 questions x 8 samples, as GRPO asks for them) and
``distinct`` (32 different questions). Runs alternate engine/HF, medians of
``--repeats``. The speedup is against ``generate`` in the engine's matmul dtype
(``--matmul-dtype``, float32 by default; bfloat16: against ``generate`` with the
model cast to bfloat16, which is measured either way). Prints a JSON object as
its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import time
from pathlib import Path

import torch
from _common import emit

from reinforge.config import ModelConfig
from reinforge_backend_local.inference.policy import PolicyChatModel
from reinforge_backend_local.model.compute import on_compute_thread
from reinforge_backend_local.rollouts.runtime import PolicyRuntime

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = "You are a careful calculator. Reply with just the number."


def questions(n: int) -> list[str]:
    rows = [json.loads(line) for line in (ROOT / "examples/math/data/test.jsonl").read_text().splitlines()]
    return [r["question"] for r in rows[:n]]


def messages(q: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]


def run_engine(policy: PolicyRuntime, prompts: list[str], max_tokens: int, seed: int) -> tuple[float, int]:
    async def one(i: int, q: str) -> int:
        model = PolicyChatModel(
            policy.batcher,
            policy.template,
            seed_key=(seed, i),
            order_key=(i,),
            version=0,
            model_name="bench",
            defaults={"max_tokens": max_tokens, "temperature": 1.0},
        )
        try:
            reply = await model.chat(messages(q))
        finally:
            model.release()
        return len(reply.completion_token_ids)

    async def all_calls() -> list[int]:
        return await asyncio.gather(*(one(i, q) for i, q in enumerate(prompts)))

    start = time.perf_counter()
    counts = asyncio.run(all_calls())
    return time.perf_counter() - start, sum(counts)


def run_hf(policy: PolicyRuntime, prompts: list[str], max_tokens: int, seed: int, model=None) -> tuple[float, int]:
    model = model if model is not None else policy.model
    ids = [policy.template.prompt_ids(messages(q)) for q in prompts]
    width = max(map(len, ids))
    pad = policy.engine.pad_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
    torch.manual_seed(seed)

    def generate() -> torch.Tensor:
        with torch.inference_mode():
            return model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=max_tokens,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                pad_token_id=pad,
            )

    start = time.perf_counter()
    out = on_compute_thread(generate)  # the thread the engine decodes on: one OpenMP team for both
    seconds = time.perf_counter() - start
    gen = out[:, width:]
    tokens = 0
    for row in gen.tolist():  # real completion tokens: up to and including the first EOS
        n = 0
        for t in row:
            n += 1
            if t in policy.engine.eos_ids:
                break
        tokens += n
    return seconds, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--matmul-dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="the engine's matmul_dtype; with bfloat16 the speedup is against generate in bfloat16",
    )
    args = parser.parse_args()
    on_compute_thread(torch.set_num_threads, args.threads)  # torch's count, and the decoding thread's OpenMP count
    policy = PolicyRuntime(
        ModelConfig(model_path="smollm2-135m-instruct"),
        max_batch=64,
        window_s=0.05,
        lora=False,
        matmul_dtype=args.matmul_dtype,
    )
    bf16 = on_compute_thread(lambda: copy.deepcopy(policy.model).to(torch.bfloat16))
    workloads = {"grouped": [q for q in questions(4) for _ in range(8)], "distinct": questions(32)}
    result: dict = {
        "bench": "decode_throughput",
        "batch": 32,
        "max_tokens": args.max_tokens,
        "threads": args.threads,
        "matmul_dtype": args.matmul_dtype,
    }
    low = args.matmul_dtype == "bfloat16"
    run_engine(policy, workloads["grouped"][:8], 4, 0)  # warm-up
    run_hf(policy, workloads["grouped"][:8], 4, 0)
    run_hf(policy, workloads["grouped"][:8], 4, 0, bf16)
    result["decoder"] = "hand-written" if policy.engine.decoder is not None else f"hf ({policy.engine.slow_reason})"
    for name, prompts in workloads.items():
        engine_tps, hf_tps, bf16_tps = [], [], []
        for r in range(args.repeats):
            s, n = run_engine(policy, prompts, args.max_tokens, r)
            engine_tps.append(n / s)
            s, n = run_hf(policy, prompts, args.max_tokens, r)
            hf_tps.append(n / s)
            s, n = run_hf(policy, prompts, args.max_tokens, r, bf16)
            bf16_tps.append(n / s)
        e, h, b = (statistics.median(x) for x in (engine_tps, hf_tps, bf16_tps))
        result[name] = {
            "engine_tok_s": round(e, 1),
            "hf_generate_tok_s": round(h, 1),
            "speedup": round(e / (b if low else h), 3),
            "speedup_vs_float32_generate": round(e / h, 3),
            "hf_generate_bf16_tok_s": round(b, 1),
            "engine_runs": [round(x, 1) for x in engine_tps],
            "hf_runs": [round(x, 1) for x in hf_tps],
        }
        print(
            f"{name}: micro-batcher ({args.matmul_dtype}) {e:.1f} tok/s, HF generate {h:.1f} tok/s, x{e / h:.2f} "
            f"(HF generate in bf16: {b:.1f} tok/s, x{e / b:.2f})",
            flush=True,
        )
    policy.close()
    emit(result)


if __name__ == "__main__":
    main()
