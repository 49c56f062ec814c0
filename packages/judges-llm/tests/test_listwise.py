"""llm-listwise: K shuffled orders cancel a judge's position bias; the output always matches the group."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from judges_llm_testlib import JudgeScript, quality

from reinforge import GroupRewardOutput, TaskStatus
from reinforge.plugin import ComponentSpec, build_component
from reinforge.testing import plugin_registry
from reinforge_judges_llm import ListwiseJudge, plugin, spearman

GROUP = 4


def early_position_bias(task: str, texts: list[str]) -> list[int]:
    """True quality (1-4) plus 2 points for every place nearer the top: position dominates."""
    n = len(texts)
    return [quality(t) + 2 * (n - 1 - pos) for pos, t in enumerate(texts)]


def groups(count: int = 10, seed: int = 7) -> list[tuple[dict, list[str], list[int]]]:
    rng = random.Random(seed)
    out = []
    for g in range(count):
        qualities = rng.sample(range(1, GROUP + 1), GROUP)  # distinct true qualities, random order
        texts = [f"answer {g}.{i}: quality={q}" for i, q in enumerate(qualities)]
        out.append(({"question": f"Question {g}?"}, texts, qualities))
    return out


def mean_rho(judge: ListwiseJudge) -> tuple[float, list[float]]:
    rhos = []
    for task, texts, qualities in groups():
        out = asyncio.run(judge(task, texts))
        assert out.status is TaskStatus.SUCCESS and len(out.rewards) == GROUP
        rhos.append(spearman(qualities, out.rewards) or 0.0)
    return sum(rhos) / len(rhos), rhos


def test_permutations_recover_true_quality_from_a_position_biased_judge(openai_server) -> None:
    srv = openai_server(JudgeScript(listwise=early_position_bias))
    with_perm = ListwiseJudge(model="judge", api_base=srv.base_url)  # default: one order per response
    rho, rhos = mean_rho(with_perm)
    assert rho >= 0.9 and min(rhos) >= 0.9
    assert srv.call_count == GROUP * len(rhos)  # one call per order

    without = ListwiseJudge(model="judge", api_base=srv.base_url, permutations=1, shuffle=False)
    rho_plain, rhos_plain = mean_rho(without)
    assert rho_plain < 0.5, rhos_plain  # scores follow where a response was shown, not its quality
    assert sum(r >= 0.9 for r in rhos_plain) < len(rhos_plain) // 2


def test_every_response_is_shown_at_every_position_when_k_equals_the_group(openai_server) -> None:
    srv = openai_server(JudgeScript(listwise=early_position_bias))
    task, texts, _ = groups(1)[0]
    out = asyncio.run(ListwiseJudge(model="judge", api_base=srv.base_url, permutations=GROUP)(task, texts))
    positions = {t: set() for t in texts}
    for request in srv.requests:
        user = request["messages"][-1]["content"]
        shown = [t for t in sorted(texts, key=lambda t: user.index(t))]
        for pos, t in enumerate(shown):
            positions[t].add(pos)
    assert all(p == set(range(GROUP)) for p in positions.values())
    assert out.metrics["position_bias"] > 0.8  # the judge's bias is measured ...
    assert out.metrics["permutations"] == GROUP
    assert out.metrics["permutation_spread"] > 0.0  # ... and averaged away


def test_orders_are_deterministic_and_balanced() -> None:
    judge = ListwiseJudge(model="judge", permutations=3)
    a, b = judge.orders("ab" * 32, 6), judge.orders("ab" * 32, 6)
    assert a == b and len(a) == 3 and all(sorted(o) == list(range(6)) for o in a)
    assert len({tuple(o) for o in a}) == 3
    many = ListwiseJudge(model="judge", permutations=8).orders("cd" * 32, 4)
    assert len(many) == 8 and len({tuple(o) for o in many}) == 8  # rotations, then reversed rotations
    assert ListwiseJudge(model="judge", permutations=5).orders("ef" * 32, 1) == [[0]]
    assert len(ListwiseJudge(model="judge").orders("ab" * 32, 6)) == 6  # default: as many orders as responses


def test_a_reply_with_the_wrong_count_is_retried_then_failed_never_padded(openai_server) -> None:
    srv = openai_server(JudgeScript(listwise=lambda task, texts: [5] * (len(texts) - 1)))
    judge = ListwiseJudge(model="judge", api_base=srv.base_url, permutations=1, max_retries=2, backoff_s=0)
    out = asyncio.run(judge({"question": "q"}, ["a quality=1", "b quality=2", "c quality=3"]))
    assert out.status is TaskStatus.FAILED
    assert out.rewards == []
    assert "2 scores for 3 responses" in out.error
    assert srv.call_count == 3  # 1 + max_retries
    assert out.metrics["usage/retries"] == 2.0


def test_wrong_count_then_right_count_succeeds(openai_server) -> None:
    replies = iter(
        [
            json.dumps({"scores": [{"id": 1, "score": 3}]}),
            json.dumps({"scores": [{"id": 1, "score": 9}, {"id": 1, "score": 2}]}),  # duplicate id
            json.dumps({"scores": [{"id": 2, "score": 4}, {"id": 1, "score": 7}]}),
        ]
    )
    srv = openai_server(JudgeScript(listwise=lambda task, texts: next(replies)))
    judge = ListwiseJudge(model="judge", api_base=srv.base_url, permutations=1, shuffle=False, backoff_s=0)
    out = asyncio.run(judge({"question": "q"}, ["x", "y"]))
    assert out.status is TaskStatus.SUCCESS and srv.call_count == 3
    assert out.rewards == pytest.approx([(7 - 1) / 9, (4 - 1) / 9])


def test_empty_responses_are_scored_without_being_shown(openai_server) -> None:
    srv = openai_server(JudgeScript(listwise=lambda task, texts: [quality(t) for t in texts]))
    judge = ListwiseJudge(model="judge", api_base=srv.base_url, permutations=2, empty_score=0.0)
    out = asyncio.run(judge({"question": "q"}, ["a quality=3", "   ", "b quality=8"]))
    assert out.rewards[1] == 0.0 and len(out.rewards) == 3
    assert out.rewards[0] == pytest.approx(2 / 9) and out.rewards[2] == pytest.approx(7 / 9)
    assert all('<response id="3">' not in r["messages"][-1]["content"] for r in srv.requests)
    assert out.metrics["skipped"] == 1.0
    all_empty = asyncio.run(judge({"question": "q"}, ["", ""]))
    assert all_empty.rewards == [0.0, 0.0] and srv.call_count == 2


def test_registered_group_reward_passes_core_checks(openai_server, reinforge_pm) -> None:
    srv = openai_server(JudgeScript(listwise=lambda task, texts: [quality(t) for t in texts]))
    reinforge_pm.register(plugin, name="reinforge-judges-llm")
    spec = ComponentSpec(ref="llm-listwise", args={"model": "judge", "api_base": srv.base_url, "permutations": 2})
    bound = build_component(spec, "group_reward", plugin_registry(reinforge_pm), where="run.yaml: group_reward")
    assert isinstance(bound.func, ListwiseJudge) and bound.func.config.permutations == 2
    out = bound.check_output(asyncio.run(bound.call({"question": "q"}, ["a quality=2", "b quality=5"])), group_size=2)
    assert isinstance(out, GroupRewardOutput) and out.rewards == pytest.approx([1 / 9, 4 / 9])
    bound.close()
    assert bound.func.closed
