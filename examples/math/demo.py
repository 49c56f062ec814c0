"""Demo until a training backend is installed: evaluate the math example end to end.

Starts a scripted OpenAI-compatible server on 127.0.0.1 (a stand-in "model"
that is right about half the time and sometimes chatty), then runs
``reinforge eval run.yaml`` against it through litellm: dataset, workflow,
three weighted judges, accuracy and every reward dimension.
"""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

from reinforge.cli import main as reinforge_main
from reinforge.testing.openai_server import OpenAIServer

HERE = Path(__file__).parent


def scripted_student(seed: int = 0):
    rng = random.Random(seed)

    def reply(body: dict) -> str:
        question = body["messages"][-1]["content"]
        a, b = map(int, re.findall(r"-?\d+", question)[:2])
        roll = rng.random()
        if roll < 0.5:
            return str(a + b)
        if roll < 0.75:
            return f"The answer is {a + b + rng.choice([-10, -1, 1, 2])}."
        return f"Let me think. {a} plus {b} equals {a + b}, so the answer is {a + b}."

    return reply


def main() -> int:
    with OpenAIServer(scripted_student(), model_name="scripted-student") as server:
        return reinforge_main(
            [
                "eval",
                str(HERE / "run.yaml"),
                "--api-base",
                server.base_url,
                "--model",
                "scripted-student",
                "--limit",
                "50",
            ]
        )


if __name__ == "__main__":
    sys.exit(main())
