"""llm-pairwise: both orders, position-flip detection, and what the cache saves."""

from __future__ import annotations

import asyncio

from judges_llm_testlib import JudgeScript, quality

from reinforge import TaskStatus
from reinforge_judges_llm import PairwiseJudge

TASKS = [
    {"question": f"Explain topic {i}.", "reference": f"reference answer {i} quality={i % 3 + 1}"} for i in range(12)
]
CANDIDATES = [f"candidate answer {i} quality={(i * 7) % 5 + 1}" for i in range(12)]


def better(task: str, a: str, b: str) -> str:
    qa, qb = quality(a), quality(b)
    return "A" if qa > qb else "B" if qb > qa else "tie"


def run(coro):
    return asyncio.run(coro)


def test_a_judge_that_always_prefers_the_first_position_never_gives_a_win(openai_server) -> None:
    srv = openai_server(JudgeScript(pairwise=lambda task, a, b: "A"))
    judge = PairwiseJudge(model="judge", api_base=srv.base_url)
    outs = [run(judge(task, cand)) for task, cand in zip(TASKS, CANDIDATES)]
    assert all(o.status is TaskStatus.SUCCESS for o in outs)
    assert [o.metrics["win"] for o in outs] == [0.0] * len(outs)  # never a win
    assert [o.metrics["loss"] for o in outs] == [0.0] * len(outs)
    assert all(o.metrics["tie"] == 1.0 and o.reward == 0.5 for o in outs)  # a tie in 100% of comparisons
    assert all(o.metrics["position_flip"] == 1.0 and o.metrics["inconsistent"] == 1.0 for o in outs)
    assert srv.call_count == 2 * len(outs)  # every comparison was asked in both orders


def test_a_consistent_judge_wins_loses_and_ties_by_quality(openai_server) -> None:
    srv = openai_server(JudgeScript(pairwise=better))
    judge = PairwiseJudge(model="judge", api_base=srv.base_url, tie_score=0.4)
    for task, cand in zip(TASKS, CANDIDATES):
        out = run(judge(task, cand))
        qc, qr = quality(cand), quality(task["reference"])
        expected = 1.0 if qc > qr else 0.0 if qc < qr else 0.4
        assert out.reward == expected, (cand, task["reference"])
        assert out.metrics["position_flip"] == 0.0 and out.metrics["inconsistent"] == 0.0
        assert out.metrics["win"] == float(qc > qr) and out.metrics["loss"] == float(qc < qr)


def test_both_orders_put_each_response_in_each_position(openai_server) -> None:
    script = JudgeScript(pairwise=better)
    srv = openai_server(script)
    run(PairwiseJudge(model="judge", api_base=srv.base_url)(TASKS[0], CANDIDATES[0]))
    firsts = sorted(
        r["messages"][-1]["content"].split("<response_a>\n")[1].split("\n</response_a>")[0] for r in srv.requests
    )
    assert firsts == sorted([CANDIDATES[0], TASKS[0]["reference"]])


def test_second_order_costs_one_call_and_reruns_and_swapped_roles_cost_none(openai_server) -> None:
    srv = openai_server(JudgeScript(pairwise=better))
    one_order = PairwiseJudge(model="judge", api_base=srv.base_url, both_orders=False)
    run(one_order(TASKS[0], CANDIDATES[0]))
    assert srv.call_count == 1

    judge = PairwiseJudge(model="judge", api_base=srv.base_url)
    out = run(judge(TASKS[1], CANDIDATES[1]))
    assert srv.call_count == 1 + 2  # the second order is one extra call, not two
    assert out.metrics["usage/calls"] == 2.0

    again = run(judge(TASKS[1], CANDIDATES[1]))
    assert srv.call_count == 3  # a rerun makes zero HTTP calls
    assert again.reward == out.reward and again.metrics["usage/cache_hits"] == 2.0
    assert again.metrics["usage/calls"] == 0.0 and again.metrics["usage/prompt_tokens"] == 0.0

    # the same two texts with the roles swapped are the same two prompts: nothing new to ask
    swapped_task = {**TASKS[1], "reference": CANDIDATES[1]}
    swapped = run(judge(swapped_task, TASKS[1]["reference"]))
    assert srv.call_count == 3
    assert swapped.reward == 1.0 - out.reward


def test_one_judge_shares_its_cache_between_calls_and_a_new_judge_starts_empty(openai_server) -> None:
    srv = openai_server(JudgeScript(pairwise=better))
    settings = {"model": "judge", "api_base": srv.base_url}
    with PairwiseJudge(**settings) as judge:
        run(judge(TASKS[2], CANDIDATES[2]))
        run(judge(TASKS[2], CANDIDATES[2]))
    assert srv.call_count == 2
    with PairwiseJudge(**settings, rubric="Which is more polite?") as polite:
        run(polite(TASKS[2], CANDIDATES[2]))
    assert srv.call_count == 4  # other settings: other prompts, other cache keys
    with PairwiseJudge(**settings) as fresh:  # a judge of a new run shares nothing with the last one
        assert run(fresh(TASKS[2], CANDIDATES[2])).metrics["usage/cache_hits"] == 0.0
    assert srv.call_count == 6
