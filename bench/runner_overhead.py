"""Runner overhead per rollout: 1,000 tasks x group 8 with a scripted model and a rule judge.

The model answers instantly, so everything measured is the runner's own work:
scheduling, recording, retries bookkeeping, judging with ``last_number`` and
metric aggregation. Prints a JSON object as its last line.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import emit

from reinforge import WorkflowOutput
from reinforge.judges.rules import last_number
from reinforge.rewards import JudgeSlot, RewardComposer
from reinforge.runner import Runner, RunnerSettings
from reinforge.signatures import bind
from reinforge.testing import ScriptedChatModel


async def workflow(task, model):
    reply = await model.chat([{"role": "user", "content": task["question"]}])
    return WorkflowOutput(response=reply)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tasks = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(args.tasks)]
    model = ScriptedChatModel(
        lambda messages, tools, sampling: f"The answer is {int(messages[-1]['content'].split()[2]) + 1}"
    )
    composer = RewardComposer([JudgeSlot("correct", bind(last_number, "judge"))])
    settings = RunnerSettings(group_size=args.group_size, max_concurrency=args.concurrency)
    runner = Runner(bind(workflow, "workflow"), composer, model=model, settings=settings)
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        result = runner.run(tasks)
        seconds.append(time.perf_counter() - start)
        assert len(result.trajectories) == args.tasks * args.group_size
    rollouts = args.tasks * args.group_size
    best = statistics.median(seconds)
    emit(
        {
            "bench": "runner_overhead",
            "tasks": args.tasks,
            "group_size": args.group_size,
            "rollouts": rollouts,
            "seconds_median": round(best, 3),
            "rollouts_per_s": round(rollouts / best, 1),
            "overhead_us_per_rollout": round(best / rollouts * 1e6, 1),
            "reward_mean": result.metrics["reward/mean"],
        }
    )


if __name__ == "__main__":
    main()
