"""Generate the dataset: ``python generate.py`` writes data/train.jsonl and data/test.jsonl.

Most questions are arithmetic slightly beyond what SmolLM2-135M does in its
head (a 3-digit by 2-digit product, a sum of three 3-digit numbers, a 4-digit
difference), so the calculator tool is needed; about one in five is a one-digit
sum the model can answer directly (``needs_tool: false``). No hard test
question appears in the training set (there are only 81 one-digit sums).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def hard(rng: random.Random) -> dict:
    kind = rng.choice(["product", "sum3", "difference"])
    if kind == "product":
        a, b = rng.randint(100, 999), rng.randint(11, 99)
        return {"question": f"What is {a} * {b}?", "answer": str(a * b), "kind": kind}
    if kind == "sum3":
        a, b, c = (rng.randint(100, 999) for _ in range(3))
        return {"question": f"What is {a} + {b} + {c}?", "answer": str(a + b + c), "kind": kind}
    a, b = rng.randint(1000, 9999), rng.randint(100, 999)
    return {"question": f"What is {a} - {b}?", "answer": str(a - b), "kind": kind}


def easy(rng: random.Random) -> dict:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    return {"question": f"What is {a} + {b}?", "answer": str(a + b), "kind": "small_sum"}


def make(rng: random.Random, n: int, easy_share: float, seen: set[str]) -> list[dict]:
    rows = []
    easy_left = round(n * easy_share)
    while len(rows) < n:
        want_easy = easy_left > 0 and rng.random() < easy_share
        row = easy(rng) if want_easy else hard(rng)
        if row["question"] in seen and row["kind"] != "small_sum":
            continue
        seen.add(row["question"])
        easy_left -= want_easy
        row["needs_tool"] = not want_easy
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--test", type=int, default=200)
    parser.add_argument("--easy-share", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).parent / "data"))
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    seen: set[str] = set()
    test = make(rng, args.test, args.easy_share, seen)  # first, so no hard test question is in train
    train = make(rng, args.train, args.easy_share, seen)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("test", test)):
        with open(out / f"{name}.jsonl", "w") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
    print(f"wrote {len(train)} train and {len(test)} test rows to {out}")


if __name__ == "__main__":
    main()
