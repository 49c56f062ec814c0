"""Length bias: the instruction against it is in every prompt, and length normalization removes the trend."""

from __future__ import annotations

import asyncio
import math
import random

from judges_llm_testlib import JudgeScript, quality

from reinforge_judges_llm import PointwiseJudge, spearman
from reinforge_judges_llm.length import LengthTrend

BOUND = 0.2  # stated bound on |Spearman rho(length, reward)| with length normalization on


def length_loving(task: str, response: str, reference: str | None) -> int:
    """True quality 1-3, plus up to 2 points for length (log scale): a judge that prefers longer answers."""
    bonus = round(2 * (math.log(len(response)) - math.log(30)) / (math.log(3000) - math.log(30)))
    return min(5, quality(response) + max(0, bonus))


def responses(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        q = rng.randint(1, 3)  # true quality, independent of length
        length = int(math.exp(rng.uniform(math.log(30), math.log(3000))))
        head = f"answer {seed}.{i} quality={q} "
        out.append(head + "padding " * max(0, (length - len(head)) // 8))
    return out


def score_all(judge: PointwiseJudge, texts: list[str]) -> list[float]:
    async def go() -> list[float]:
        outs = [await judge({"question": "Describe the water cycle."}, t) for t in texts]
        return [o.reward for o in outs]

    return asyncio.run(go())


def test_length_normalization_removes_a_judges_length_preference(openai_server, tmp_path) -> None:
    srv = openai_server(JudgeScript(pointwise=length_loving))
    warmup, test = responses(40, seed=1), responses(40, seed=2)
    lengths = [len(t) for t in test]
    shared = {"model": "judge", "api_base": srv.base_url, "cache_path": str(tmp_path / "verdicts.sqlite")}

    plain = PointwiseJudge(**shared)
    score_all(plain, warmup)
    rho_plain = spearman(lengths, score_all(plain, test))
    assert rho_plain > 0.5  # the scripted judge really is length-biased

    normalized = PointwiseJudge(**shared, length_normalization=True, length_min_samples=16)
    score_all(normalized, warmup)  # a warm-up batch fits the trend (cached verdicts: no new calls)
    rewards = score_all(normalized, test)
    rho_normalized = spearman(lengths, rewards)
    print(f"length-reward rho: {rho_plain:.3f} plain, {rho_normalized:.3f} normalized")
    assert abs(rho_normalized) < BOUND, rho_normalized
    assert normalized.length_trend.slope() > 0
    # the true quality still shows through
    assert spearman([quality(t) for t in test], rewards) > 0.6
    assert srv.call_count == 80  # the normalized judge reused every verdict of the plain one (one cache file)
    plain.close()
    normalized.close()


def test_every_prompt_tells_the_judge_length_is_not_quality(openai_server) -> None:
    srv = openai_server(JudgeScript(pointwise=lambda task, r, ref: 3))
    asyncio.run(PointwiseJudge(model="judge", api_base=srv.base_url)({"question": "q"}, "a"))
    asyncio.run(PointwiseJudge(model="judge", api_base=srv.base_url, length_instruction=False)({"question": "q"}, "a"))
    first, second = (r["messages"][0]["content"] for r in srv.requests)
    assert "Length is not quality" in first and "Length is not quality" not in second


def test_trend_adjustment_rules() -> None:
    trend = LengthTrend(window=4, min_samples=3)
    assert trend.adjust("a", 10, 0.2) == (0.2, 0.0)  # too few samples: unchanged
    trend.adjust("b", 100, 0.5)
    adjusted, delta = trend.adjust("c", 1000, 0.8)
    assert trend.slope() > 0 and adjusted < 0.8 and delta < 0
    trend.adjust("c", 1000, 0.8)  # the same judgment again does not count twice
    assert len(trend) == 3
    for i in range(5):
        trend.adjust(f"x{i}", 50, 0.5)
    assert len(trend) == 4  # window

    shorter_is_better = LengthTrend(min_samples=2)
    shorter_is_better.adjust("a", 10, 0.9)
    assert shorter_is_better.adjust("b", 1000, 0.1) == (0.1, 0.0)  # a negative trend is left alone

    fixed = LengthTrend(slope=0.1)
    fixed.adjust("a", 10, 0.5)
    adjusted, delta = fixed.adjust("b", 10_000, 0.5)
    mean_x = (math.log1p(10) + math.log1p(10_000)) / 2
    assert delta == -0.1 * (math.log1p(10_000) - mean_x)
