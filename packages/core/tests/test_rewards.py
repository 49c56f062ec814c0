import asyncio

import pytest

from reinforge import JudgeOutput, TaskStatus
from reinforge.components import build_component
from reinforge.config import ComponentSpec, ScoreConfig
from reinforge.errors import ConfigError, RewardError, SignatureError
from reinforge.rewards import (
    JudgeSlot,
    RewardComposer,
    aggregate_func,
    reward_func,
    sub_reward_func,
)


def slot(name, fn, **kw):
    return JudgeSlot(name=name, fn=build_component(ComponentSpec(ref=fn), "judge"), **kw)


def score(composer, response="42", task=None, **kw):
    return asyncio.run(composer.score(task or {"answer": "42"}, response, **kw))


def const(value, calls=None, metrics=None):
    async def judge(task, response):
        if calls is not None:
            calls.append(response)
        return JudgeOutput(reward=value, metrics=metrics or {})

    return judge


def test_weighted_sum_and_per_dimension_names():
    c = RewardComposer([slot("a", const(1.0), weight=0.7), slot("b", const(0.5), weight=0.3)])
    s = score(c)
    assert s.reward == pytest.approx(0.7 + 0.15)
    assert s.rewards == {"reward/a": 1.0, "reward/b": 0.5}


def test_weights_not_summing_to_one_are_normalized_with_warning_or_rejected():
    with pytest.warns(UserWarning, match="sum to 2"):
        c = RewardComposer([slot("a", const(1.0), weight=1), slot("b", const(0.0), weight=1)])
    assert score(c).reward == pytest.approx(0.5)
    with pytest.raises(ConfigError, match="strict_weights"):
        RewardComposer([slot("a", const(1.0), weight=1), slot("b", const(0.0), weight=1)], strict_weights=True)


def test_gate_failure_skips_model_judges_and_uses_gate_fail_score():
    model_calls = []
    gate = slot("format", const(0.0), gate=True)
    rule = slot("rule", const(1.0), weight=0.5)
    model = slot("model", const(1.0, model_calls), weight=0.5, kind="model")
    c = RewardComposer([gate, rule, model], scores=ScoreConfig(gate_fail=-0.5))
    s = score(c)
    assert s.reward == -0.5
    assert model_calls == []
    assert s.rewards["gate/format"] == 0.0
    assert s.rewards["reward/rule"] == 1.0  # rules still reported


def test_gate_pass_multiplies_weighted_rule_and_model_scores():
    model_calls = []
    c = RewardComposer(
        [
            slot("format", const(1.0), gate=True),
            slot("rule", const(1.0), weight=0.25),
            slot("model", const(0.5, model_calls), weight=0.75, kind="model"),
        ]
    )
    assert score(c).reward == pytest.approx(0.25 + 0.375)
    assert model_calls == ["42"]


def test_metric_weights_combine_a_judges_metrics():
    j = const(0.0, metrics={"precision": 1.0, "recall": 0.5})
    c = RewardComposer([slot("pr", j, metric_weights={"precision": 0.4, "recall": 0.6})])
    s = score(c)
    assert s.reward == pytest.approx(0.4 + 0.3)
    assert s.rewards["reward/pr/recall"] == 0.5
    bad = RewardComposer([slot("pr", j, metric_weights={"f1": 1.0})])
    with pytest.raises(RewardError, match="f1"):
        score(bad)


@reward_func("safety")
class Safety:
    BANNED = {"hack"}

    @sub_reward_func("toxicity", sub_weight=0.7)
    def toxicity(self, task, response):
        return 0.0 if any(w in response for w in self.BANNED) else 1.0

    @sub_reward_func("refusal", sub_weight=0.3)
    async def refusal(self, task, response):
        return JudgeOutput(reward=0.5 if response.startswith("I cannot") else 1.0, metrics={"len": len(response)})


def test_reward_func_class_combines_sub_dimensions():
    c = RewardComposer([slot("safety", Safety)])
    s = score(c, response="I cannot hack")
    assert s.reward == pytest.approx(0.7 * 0.0 + 0.3 * 0.5)
    assert s.rewards["reward/safety/toxicity"] == 0.0
    assert s.rewards["reward/safety/refusal"] == 0.5
    assert s.rewards["reward/safety/refusal/len"] == len("I cannot hack")


@reward_func("strictness")
class Strict:
    """A class judge with settings: the run file's args are its constructor's keywords."""

    def __init__(self, limit: int = 10):
        self.limit = limit
        self.closed = False

    @sub_reward_func("short")
    def short(self, task, response):
        return float(len(response) <= self.limit)

    def close(self):
        self.closed = True


def test_reward_func_class_takes_args_and_its_name_is_the_metric_name():
    bound = build_component(ComponentSpec(ref=Strict, args={"limit": 2}), "judge")
    assert bound.metric_name == "strictness"  # not "Strict", not "module:Strict"
    c = RewardComposer([JudgeSlot(name=bound.metric_name, fn=bound)])
    assert score(c, response="42").reward == 1.0 and score(c, response="420").reward == 0.0
    instance = bound.func.instance
    bound.close()
    assert instance.closed  # built for the run, closed at its end
    with pytest.raises(SignatureError, match="limt"):
        build_component(ComponentSpec(ref=Strict, args={"limt": 2}), "judge")


def test_aggregate_func_in_both_styles():
    @reward_func("explicit")
    class Explicit:
        @sub_reward_func("a", sub_weight=1)
        def a(self, task, response):
            return 0.2

        @sub_reward_func("b", sub_weight=1)
        def b(self, task, response):
            return 0.8

        @aggregate_func
        def agg(self, scores, weights, metrics):
            return max(scores.values())

    @reward_func("dashscope")
    class DashScopeStyle:
        @sub_reward_func("a", sub_weight=0.25)
        def a(self, task, response):
            return 1.0

        @sub_reward_func("b", sub_weight=0.75)
        def b(self, task, response):
            return 0.0

        @aggregate_func
        async def aggregate(self):
            w, s = self.get_weights(), self.get_scores()
            return JudgeOutput(reward=sum(s[k] * w[k] for k in s), metrics=self.get_reward_metrics())

    assert score(RewardComposer([slot("e", Explicit)])).reward == 0.8
    assert score(RewardComposer([slot("d", DashScopeStyle)])).reward == 0.25


def test_sub_dimension_failure_fails_the_judge_not_zero():
    @reward_func("flaky")
    class Flaky:
        @sub_reward_func("ok")
        def ok(self, task, response):
            return 1.0

        @sub_reward_func("down")
        def down(self, task, response):
            return JudgeOutput(status=TaskStatus.FAILED, error="service unavailable")

    s = score(RewardComposer([slot("f", Flaky)], max_retries=1))
    assert s.status is TaskStatus.FAILED
    assert s.reward is None
    assert "service unavailable" in s.error


@pytest.mark.parametrize(
    ("response", "kw", "expected", "flag"),
    [
        ("   ", {}, -1.0, "boundary/empty"),
        ("x" * 50, {}, -2.0, "boundary/oversized"),
        ("42", {"truncated": True}, -3.0, "boundary/truncated"),
        ("42", {"timed_out": True}, -4.0, "boundary/timeout"),
    ],
)
def test_boundary_scores_are_explicit_and_skip_judges(response, kw, expected, flag):
    calls = []
    b = ScoreConfig(empty=-1.0, oversized=-2.0, max_response_chars=10, truncated=-3.0, timeout=-4.0)
    s = score(RewardComposer([slot("j", const(1.0, calls))], scores=b), response=response, **kw)
    assert s.reward == expected
    assert s.flags[flag] == 1.0
    assert calls == []


def test_truncated_is_judged_normally_by_default():
    s = score(RewardComposer([slot("j", const(1.0))]), truncated=True)
    assert s.reward == 1.0
    assert s.flags["boundary/truncated"] == 1.0


def test_workflow_reward_skips_judges():
    calls = []
    s = score(RewardComposer([slot("j", const(1.0, calls))]), preset=0.3)
    assert s.reward == 0.3 and calls == []


def test_judge_timeout_is_transient_failure():
    async def hangs(task, response):
        await asyncio.Event().wait()

    s = score(RewardComposer([slot("j", hangs)], judge_timeout_s=0.01, max_retries=1))
    assert s.status is TaskStatus.FAILED
    assert "timed out" in s.error
    assert s.retries == 1


def test_duplicate_metric_names_are_rejected():
    with pytest.raises(ConfigError, match="used twice"):
        RewardComposer([slot("j", const(1.0)), slot("j", const(0.0))])
