"""Generate the arithmetic dataset: ``python generate.py`` writes data/train.jsonl and data/test.jsonl.

Small sums the 135M base model almost never gets right greedily but sometimes
samples correctly, so a lenient reward gives GRPO a signal to learn from.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

QUESTION = "What is {a} + {b}?"


def make(rng: random.Random, n: int, low: int, high: int, seen: set[tuple[int, int]]) -> list[dict]:
    rows = []
    while len(rows) < n:
        a, b = rng.randint(low, high), rng.randint(low, high)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        rows.append({"question": QUESTION.format(a=a, b=b), "answer": str(a + b)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--test", type=int, default=200)
    parser.add_argument("--low", type=int, default=1)
    parser.add_argument("--high", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).parent / "data"))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    seen: set[tuple[int, int]] = set()
    test = make(rng, args.test, args.low, args.high, seen)  # test pairs never appear in train
    train = make(rng, args.train, args.low, args.high, seen)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("test", test)):
        with open(out / f"{name}.jsonl", "w") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
    print(f"wrote {len(train)} train and {len(test)} test rows to {out}")


if __name__ == "__main__":
    main()
