"""Synthetic runs shared by the tests: metric patterns that show each reward-hacking signal."""

import json
import math
import random

STEPS = 40
EVAL_EVERY = 5


def healthy(step):
    """Reward and validation rise together; length and entropy drift mildly."""
    return {
        "reward/mean": 0.2 + 0.5 * step / STEPS,
        "val": 0.25 + 0.4 * step / STEPS,
        "length": 120 + 5 * math.sin(step / 3),
        "entropy": 1.2 - 0.4 * step / STEPS,
    }


def divergence(step):
    """Training reward keeps rising; validation peaks at step 15 and then falls."""
    row = healthy(step)
    row["val"] = 0.25 + 0.02 * step if step <= 15 else 0.55 - 0.015 * (step - 15)
    return row


def length_explosion(step):
    """Response length climbs every step while reward and validation stay flat."""
    row = healthy(step)
    row["reward/mean"] = 0.4 + 0.01 * math.sin(step)
    row["val"] = 0.4 + 0.005 * math.cos(step)
    row["length"] = 100 * 1.04**step
    return row


def entropy_collapse(step):
    row = healthy(step)
    row["entropy"] = 1.2 * math.exp(-step / 6)
    return row


def records(pattern, *, noise=0.0, seed=0):
    """The metric records of a synthetic run, in the order a backend emits them (eval every 5 steps, from 0)."""
    rng = random.Random(seed)
    lines = []
    for step in range(0, STEPS + 1):
        p = pattern(step)
        if step % EVAL_EVERY == 0:
            lines.append(
                {
                    "kind": "eval",
                    "step": step,
                    "accuracy/greedy": p["val"] + rng.gauss(0, noise),
                    "accuracy/sampled": p["val"] - 0.05 + rng.gauss(0, noise),
                    "reward/mean": p["val"] + 0.05,
                    "reward/correct/mean": p["val"],
                    "reward/format/mean": 0.9,
                    "response_length/mean": p["length"],
                }
            )
        if step == 0:
            continue
        line = {
            "kind": "train",
            "step": step,
            "time": 1_700_000_000 + 3 * step,
            "reward/mean": p["reward/mean"] + rng.gauss(0, noise),
            "reward/std": 0.2,
            "reward/correct/mean": p["reward/mean"] - 0.05,
            "reward/format/mean": 0.9,
            "response_length/mean": p["length"] * (1 + rng.gauss(0, noise)),
            "entropy": p["entropy"],
            "kl": 0.001 * step,
            "clip_frac": 0.02,
            "grad_norm": 0.5,
            "loss": 0.1,
            "tokens_per_s": 900.0,
            "truncated_rate": 0.0,
            "some/unknown_key": "text values are ignored",
        }
        if step % 7 == 0:  # any key may be missing on a line
            del line["entropy"], line["kl"]
        lines.append(line)
    return lines


def make_run(tmp_path, pattern, *, noise=0.0, seed=0, config=True, extra_lines=()):
    """A run folder with the metrics.jsonl of ``pattern`` (and a config.json)."""
    run_dir = tmp_path / pattern.__name__
    run_dir.mkdir()
    lines = records(pattern, noise=noise, seed=seed)
    text = "\n".join(json.dumps(x) for x in [*lines, *extra_lines]) + "\n"
    (run_dir / "metrics.jsonl").write_text(text)
    if config:
        cfg = {
            "project_name": "demo",
            "experiment_name": pattern.__name__,
            "model": {"model_path": "smollm2-135m-instruct", "temperature": 1.0},
            "algorithm": {"algorithm_type": "grpo", "learning_rate": 1e-4, "group_size": 4},
        }
        (run_dir / "config.json").write_text(json.dumps(cfg))
    return run_dir
