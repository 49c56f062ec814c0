"""The plugin's tests, with reinforge's testing kit (``-p reinforge.testing``, set in pyproject.toml)."""

import asyncio

import pytest

from reinforge import JudgeOutput
from reinforge.plugin import ComponentSpec, ConfigurationError, build_component, plan_component
from reinforge.testing import check_entry_point, plugin_registry
from reinforge_judge_example import plugin
from reinforge_judge_example.plugin import keyword_judge


def test_entry_point_registers_the_judges():
    # the installed distribution's entry point loads and registers exactly what it claims
    check_entry_point("reinforge-judge-example", judges=["example_keyword", "example_polite"])


def test_keyword_judge_is_a_setting_and_reads_any_response():
    out = asyncio.run(keyword_judge({"text": "x"}, "could you please help"))
    assert isinstance(out, JudgeOutput)
    assert out.reward == 1.0 and out.metrics == {"keyword_found": 1.0}
    assert asyncio.run(keyword_judge({}, "help me")).reward == 0.0  # a wrong answer: reward 0, not a failure
    message = {"role": "assistant", "content": "thanks a lot"}
    assert asyncio.run(keyword_judge({}, message, keyword="thanks")).reward == 1.0
    assert asyncio.run(keyword_judge({}, None)).reward == 0.0


@pytest.fixture
def registry(reinforge_pm):
    # the kit's plugin manager has only core's built-ins; register this plugin as its entry point would
    return plugin_registry(reinforge_pm, {"reinforge-judge-example": plugin})


def test_polite_judge_is_built_per_run_with_its_args(registry):
    spec = ComponentSpec(ref="example_polite", args={"keyword": "thanks", "max_words": 2})
    judge = build_component(spec, "judge", registry, where="test")  # what a run does with its `args`
    try:
        polite = asyncio.run(judge.call({}, "Thanks, that helps"))
        rude = asyncio.run(judge.call({}, "that does not help at all"))
    finally:
        judge.close()
    assert judge.name == "example_polite" and judge.reward_range == (0.0, 1.0)
    assert polite.reward == pytest.approx(0.7)  # the keyword, but three words > max_words
    assert polite.metrics == {"keyword": 1.0, "brevity": 0.0}
    assert rude.reward == 0.0


def test_a_misspelt_setting_fails_before_anything_runs(registry):
    with pytest.raises(Exception, match="max_wrds"):
        plan_component(ComponentSpec(ref="example_polite", args={"max_wrds": 3}), "judge", registry, where="run.yaml")


def test_a_setting_no_run_can_use_is_a_permanent_error(registry):
    spec = ComponentSpec(ref="example_polite", args={"max_words": 0})
    with pytest.raises(ConfigurationError, match="example_polite: max_words must be >= 1, got 0"):
        build_component(spec, "judge", registry, where="run.yaml")  # the run stops, nothing is retried
