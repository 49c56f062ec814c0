"""reinforge's local backend vs TRL's GRPOTrainer, same settings, alternating in one run.

SmolLM2-135M-Instruct fp32, LoRA r16 alpha 32 on q/k/v/o, 4 prompts x 4
generations per step, 32 new tokens, temperature 1.0, lr 1e-4, beta 0, token-
level loss (TRL's "dapo" = reinforge's token-mean), 2 threads, the same
prompts (examples/math train split) and the same reward (last number equals
the answer, plus a small brevity term so every step trains in both). Each block runs in its own process (so peak RSS is per library);
blocks alternate TRL / reinforge ``--rounds`` times. The first step of every
block is a warm-up and is not timed.

Prints per-step lines, then a JSON object as the last line: median step time
of each, the ratio, peak RSS of each, reward per step, reinforge's time
breakdown and its training FLOP utilisation against a matmul peak measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import emit, last_json

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = "You are a careful calculator. Reply with just the number."
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def rows(n: int) -> list[dict]:
    data = [json.loads(x) for x in (ROOT / "examples/math/data/train.jsonl").read_text().splitlines()]
    return data[:n]


def correct(text: str, answer: str) -> float:
    """1 for the right last number, plus a small brevity term.

    The brevity term gives almost every group some reward spread, so both
    libraries run a real update every step: reinforge skips zero-variance groups
    (no gradient) where TRL still runs forward/backward, which would flatter
    reinforge's step time.
    """
    found = NUMBER.findall(text)
    right = float(bool(found) and float(found[-1]) == float(answer))
    return right + 0.1 * max(0.0, 1.0 - len(text) / 200)


# -- children ------------------------------------------------------------------------------------


def child_trl(steps: int, seed: int, gradient_checkpointing: bool, bf16: bool = False) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from reinforge_backend_local.model.modeling import resolve_model_path

    torch.set_num_threads(2)
    data = [
        {
            "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": r["question"]}],
            "answer": r["answer"],
        }
        for r in rows(4 * steps)
    ]

    def reward(completions, answer, **_):
        return [correct(c[-1]["content"] if isinstance(c, list) else c, a) for c, a in zip(completions, answer)]

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t)

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=16,
            num_generations=4,
            max_completion_length=32,
            temperature=1.0,
            top_p=1.0,
            learning_rate=1e-4,
            beta=0.0,
            loss_type="dapo",
            max_steps=steps,
            logging_steps=1,
            report_to="none",
            use_cpu=True,
            bf16=bf16,
            save_strategy="no",
            seed=seed,
            gradient_checkpointing=gradient_checkpointing,
            dataloader_num_workers=0,
            shuffle_dataset=False,
        )
        trainer = GRPOTrainer(
            model=str(resolve_model_path(None)),
            reward_funcs=reward,
            args=config,
            train_dataset=Dataset.from_list(data),
            peft_config=LoraConfig(
                r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"
            ),
            callbacks=[Timer()],
        )
        trainer.train()
        rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {"step_seconds": times, "rewards": rewards, "peak_rss_mb": peak_rss_mb()}


def child_reinforge(steps: int, seed: int, bf16: bool = False) -> dict:
    from reinforge import JudgeOutput, WorkflowOutput, hookimpl, tune
    from reinforge.config import AlgorithmConfig, DatasetConfig, ModelConfig
    from reinforge.plugins import get_plugin_manager

    async def workflow(task, model):
        reply = await model.chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}])
        return WorkflowOutput(response=reply)

    def judge(task, response):
        return JudgeOutput(reward=correct(response.content, task["answer"]))

    records: list[dict] = []

    class Steps:
        @hookimpl
        def on_step_end(self, step, metrics):
            records.append(metrics)

    with tempfile.TemporaryDirectory() as out:
        data = Path(out) / "train.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows(4 * steps)))
        pm = get_plugin_manager()
        pm.register(Steps(), name="bench-steps")
        tune(
            workflow_func=workflow,
            judge_func=judge,
            train_dataset=DatasetConfig(path=str(data), total_steps=steps),
            model=ModelConfig(
                model_path="smollm2-135m-instruct",
                max_tokens=32,
                temperature=1.0,
                top_p=1.0,
                lora_rank=16,
                lora_alpha=32,
                lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            ),
            algorithm=AlgorithmConfig(
                algorithm_type="grpo",
                group_size=4,
                batch_size=4,
                learning_rate=1e-4,
                kl_coef=0.0,
                loss_agg_mode="token-mean",
                save_interval_steps=0,
                seed=seed,
            ),
            backend="local",
            backend_args={
                "output_dir": out,
                "progress": False,
                "tensorboard": False,
                "threads": 2,
                "matmul_dtype": "bfloat16" if bf16 else "float32",
            },
            plugin_manager=pm,
        )
    keys = [
        "time/decode",
        "time/forward_backward",
        "time/reference",
        "time/optimizer",
        "time/rollout",
        "time/train",
        "train/tokens",
        "train/seq_tokens",
        "train/run_tokens",
    ]
    return {
        "step_seconds": [r["step_seconds"] for r in records],
        "rewards": [r.get("reward/mean") for r in records],
        "trained": [r.get("train/samples", 0.0) > 0 for r in records],
        "breakdown": [{k: r.get(k, 0.0) for k in keys} for r in records],
        "train_tokens": [r.get("train/tokens", 0.0) + 0.0 for r in records],
        "peak_rss_mb": peak_rss_mb(),
    }


# -- parent ------------------------------------------------------------------------------------------


def matmul_peak_gflops() -> float:
    import torch

    torch.set_num_threads(2)
    n = 3072
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    best = 0.0
    for _ in range(8):
        t = time.perf_counter()
        a @ b
        best = max(best, 2 * n**3 / (time.perf_counter() - t) / 1e9)
    return best


def run_child(kind: str, steps: int, seed: int, extra: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--steps", str(steps), "--seed", str(seed), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "2", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"{kind} child failed with exit code {proc.returncode}")
    return last_json(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child", choices=["trl", "reinforge"])
    parser.add_argument("--steps", type=int, default=6, help="steps per block (the first is a warm-up)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="both in bfloat16 where they offer it: TRL's bf16=True (CPU autocast), reinforge's matmul_dtype: bfloat16",
    )
    parser.add_argument(
        "--trl-gradient-checkpointing",
        action="store_true",
        help="TRL's default; off by default here because it only slows TRL on this small model",
    )
    args = parser.parse_args()
    if args.child == "trl":
        emit(child_trl(args.steps, args.seed, args.trl_gradient_checkpointing, args.bf16))
        return
    if args.child == "reinforge":
        emit(child_reinforge(args.steps, args.seed, args.bf16))
        return

    extra = ["--trl-gradient-checkpointing"] if args.trl_gradient_checkpointing else []
    both = ["--bf16"] if args.bf16 else []
    runs: dict[str, list[dict]] = {"trl": [], "reinforge": []}
    for r in range(args.rounds):
        for kind in ("trl", "reinforge"):
            res = run_child(kind, args.steps, args.seed + r, (extra if kind == "trl" else []) + both)
            runs[kind].append(res)
            timed = res["step_seconds"][1:]
            print(
                f"round {r + 1} {kind}: median {statistics.median(timed):.2f} s/step over {len(timed)} steps, "
                f"rewards {[round(x, 3) for x in res['rewards']]}, peak RSS {res['peak_rss_mb']:.0f} MB",
                flush=True,
            )
    med = {k: statistics.median([s for res in v for s in res["step_seconds"][1:]]) for k, v in runs.items()}
    rss = {k: max(res["peak_rss_mb"] for res in v) for k, v in runs.items()}
    steps = [b for res in runs["reinforge"] for b in res["breakdown"][1:]]
    breakdown = {k: statistics.median([b[k] for b in steps]) for k in steps[0]}
    step_s = med["reinforge"]
    parts = {
        "decode": breakdown["time/decode"],
        "reference_logprobs": breakdown["time/reference"],
        "forward_backward": breakdown["time/forward_backward"],
        "optimizer": breakdown["time/optimizer"],
    }
    parts["overhead"] = step_s - sum(parts.values())
    # LoRA training FLOPs per token ~ 4 N (forward 2N + backward through frozen weights 2N), N = 134.5M
    train_s = breakdown["time/forward_backward"]
    seq_tokens = breakdown["train/seq_tokens"]  # prompt + completion tokens of the step's sequences
    # what the forward actually ran: a shared prompt once, no padding (packed layout); the LM head (the tied
    # embedding, 28.3M of N) only on completion tokens, the other 106.2M weights on every run token
    run_tokens, completion_tokens = breakdown["train/run_tokens"], breakdown["train/tokens"]
    executed_flops = 4 * (106.2e6 * run_tokens + 28.3e6 * completion_tokens)
    peak = matmul_peak_gflops()
    result = {
        "bench": "grpo_vs_trl",
        "settings": {
            "prompts_per_step": 4,
            "generations": 4,
            "max_new_tokens": 32,
            "lora_rank": 16,
            "trl_gradient_checkpointing": bool(extra),
            "bf16": args.bf16,
        },
        "trl_median_step_s": round(med["trl"], 3),
        "reinforge_median_step_s": round(step_s, 3),
        "ratio": round(step_s / med["trl"], 3),
        "trl_peak_rss_mb": round(rss["trl"]),
        "reinforge_peak_rss_mb": round(rss["reinforge"]),
        "trl_rewards": [[round(x, 3) for x in res["rewards"]] for res in runs["trl"]],
        "reinforge_rewards": [[round(x or 0.0, 3) for x in res["rewards"]] for res in runs["reinforge"]],
        "reinforge_breakdown_s": {k: round(v, 3) for k, v in parts.items()},
        "reinforge_timed_steps_that_trained": f"{sum(sum(r['trained'][1:]) for r in runs['reinforge'])}"
        f"/{sum(len(r['trained'][1:]) for r in runs['reinforge'])}",
        "matmul_peak_gflops": round(peak, 1),
        "train_tokens_per_step": seq_tokens,
        "train_flops_note": "utilisation = 4 * 134.5e6 * (prompt+completion tokens) / forward_backward time / peak",
        "train_flop_utilisation": round(4 * 134.5e6 * seq_tokens / train_s / (peak * 1e9), 3) if train_s else None,
        "train_run_tokens_per_step": run_tokens,
        "executed_flops_note": "4 * (106.2e6 * run tokens + 28.3e6 * completion tokens) / forward_backward / peak",
        "executed_flop_utilisation": round(executed_flops / train_s / (peak * 1e9), 3) if train_s else None,
    }
    emit(result)


if __name__ == "__main__":
    main()
