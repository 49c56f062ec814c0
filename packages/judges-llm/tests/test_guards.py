"""Settings errors name the judge and the key; the self-preference guard; model families."""

from __future__ import annotations

import asyncio
import warnings

import pytest
from judges_llm_testlib import JudgeScript

from reinforge import ChatResponse
from reinforge.plugin import ComponentSpec, ConfigError, plan_component
from reinforge_judges_llm import ListwiseJudge, PairwiseJudge, PointwiseConfig, PointwiseJudge, model_family

TASK = {"question": "q"}


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"scale": [5, 1]}, r"args.scale: must be \[low, high\]"),
        ({"scale": "five"}, r"args.scale: expected a list, got str 'five'"),
        ({"temperature": -1}, r"args.temperature: must be at least 0"),
        ({"temperature": "0.2"}, r"args.temperature: expected a number, got str '0.2'"),
        ({"self_preference": "maybe"}, r"args.self_preference: must be one of error, warn, off"),
        ({"max_retries": 1.5}, r"args.max_retries: expected an integer, got float 1.5"),
        ({"empty_score": 2}, r"args.empty_score: must be between 0.0 and 1.0, got 2"),
        ({"anchors": {"9": "too high"}}, r"args.anchors\['9'\]: must describe a score in \[1, 5\]"),
        ({"anchors": [{"response": "x"}]}, r"args.anchors\[0\]: must be a mapping with 'response' and 'score'"),
        ({"api_base": "http://x/v1"}, r"args.api_base: needs args.model"),
        ({"length_window": 1}, r"args.length_window: must be at least 2"),
        ({"require_calibration": ""}, r"args.require_calibration: must be the path"),
        ({"colour": "red"}, r"unknown key 'args.colour'"),
        ({"temperatur": 0.5}, r"unknown key 'args.temperatur' \(did you mean 'temperature'\?\)"),
    ],
)
def test_bad_settings_name_the_judge_and_key(settings, message) -> None:
    with pytest.raises(ConfigError, match=rf"judge 'llm-pointwise': {message}"):
        PointwiseJudge(**settings)


def test_kind_specific_settings() -> None:
    with pytest.raises(ConfigError, match=r"judge 'llm-listwise': args.permutations: must be at least 1"):
        ListwiseJudge(permutations=0)
    with pytest.raises(ConfigError, match=r"judge 'llm-pairwise': args.reference_field: must name"):
        PairwiseJudge(reference_field=None)
    with pytest.raises(ConfigError, match=r"unknown key 'args.length_normalization'"):
        PairwiseJudge(length_normalization=True)


def test_settings_objects_are_checked_and_accepted_as_core_passes_them() -> None:
    config = PointwiseConfig(model="m", rubric="r", scale=[1, 7])
    assert config.scale == (1, 7) and PointwiseConfig(scale=10).scale == (1, 10)  # `scale: N` means 1..N
    with PointwiseJudge(config) as judge:  # what core does: cls(settings)
        assert judge.config is config and judge.config.high == 7
    assert judge.closed
    with pytest.raises(ConfigError, match=r"PointwiseConfig: temperature: must be at least 0"):
        PointwiseConfig(temperature=-0.5)
    with pytest.raises(TypeError, match="not both"):
        PointwiseJudge(config, rubric="other")


def test_core_checks_settings_against_the_registered_settings_class(reinforge_pm) -> None:
    from reinforge.testing import plugin_registry
    from reinforge_judges_llm import plugin

    reinforge_pm.register(plugin, name="reinforge-judges-llm")
    registry = plugin_registry(reinforge_pm)
    plan = plan_component(
        ComponentSpec(ref="llm-pointwise", args={"model": "m", "scale": [1, 7]}), "judge", registry, where="run.yaml"
    )
    assert isinstance(plan.settings, PointwiseConfig) and plan.settings.scale == (1, 7)
    bad = ComponentSpec(ref="llm-pointwise", args={"rubrik": "typo"})
    with pytest.raises(ConfigError, match=r"run.yaml: unknown key 'args.rubrik' \(did you mean 'rubric'\?\)"):
        plan_component(bad, "judge", registry, where="run.yaml")


def test_missing_key_variable_and_unusable_cache_path(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("NO_SUCH_JUDGE_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"'llm-pointwise': args.api_key_env .*'NO_SUCH_JUDGE_KEY', which is not set"):
        PointwiseJudge(model="gpt-4o-mini", api_key_env="NO_SUCH_JUDGE_KEY")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=r"judge 'llm-pointwise': args.cache_path .*cannot open"):
        PointwiseJudge(model="m", cache_path=str(blocker / "cache.sqlite"))


def test_same_family_judge_and_policy_is_an_error_by_default(openai_server) -> None:
    srv = openai_server(JudgeScript(pointwise=lambda t, r, ref: 4), model_name="gpt-4o-mini")
    judge = PointwiseJudge(model="gpt-4o-mini", api_base=srv.base_url, policy_model="openai/gpt-4.1-nano")
    with pytest.raises(ConfigError, match=r"'gpt-4o-mini' and the policy model 'openai/gpt-4.1-nano' are both openai"):
        run(judge(TASK, "a"))
    assert srv.call_count == 0

    warn = PointwiseJudge(model="gpt-4o-mini", api_base=srv.base_url, policy_model="gpt-4.1", self_preference="warn")
    with pytest.warns(UserWarning, match="self-preference bias"):
        out = run(warn(TASK, "a"))
    assert out.reward == 0.75 and out.metrics["self_preference_risk"] == 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per judge/policy pair
        assert run(warn(TASK, "b")).metrics["self_preference_risk"] == 1.0
    off = PointwiseJudge(model="gpt-4o-mini", api_base=srv.base_url, policy_model="gpt-4.1", self_preference="off")
    assert run(off(TASK, "a")).metrics["self_preference_risk"] == 0.0


def test_policy_family_is_read_from_the_response_when_not_configured(openai_server) -> None:
    srv = openai_server(JudgeScript(pointwise=lambda t, r, ref: 4, listwise=lambda t, texts: [3] * len(texts)))
    qwen = ChatResponse(message={"role": "assistant", "content": "answer"}, model="Qwen/Qwen2.5-7B-Instruct")
    with pytest.raises(ConfigError, match="both qwen models"):
        run(PointwiseJudge(model="qwen2.5-72b-instruct", api_base=srv.base_url)(TASK, qwen))
    with pytest.raises(ConfigError, match="both qwen models"):
        run(ListwiseJudge(model="openrouter/qwen/qwq-32b", api_base=srv.base_url)(TASK, [qwen, qwen]))
    other = run(PointwiseJudge(model="claude-3-5-haiku-latest", api_base=srv.base_url)(TASK, qwen))
    assert other.reward == 0.75 and other.metrics["self_preference_risk"] == 0.0


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("gpt-4o-mini", "openai"),
        ("openai/o3-mini", "openai"),
        ("ft:gpt-4o-mini-2024-07-18:acme::abc", "openai"),
        ("anthropic/claude-3-5-sonnet-latest", "anthropic"),
        ("gemini/gemini-1.5-flash", "google"),
        ("meta-llama/Llama-3.1-8B-Instruct", "meta"),
        ("hosted_vllm/Qwen/Qwen2.5-0.5B-Instruct", "qwen"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mistral"),
        ("deepseek-ai/DeepSeek-R1", "deepseek"),
        ("HuggingFaceTB/SmolLM2-135M-Instruct", "huggingface"),
        ("smollm2-135m-instruct", "huggingface"),
        ("microsoft/phi-4", "microsoft"),
        ("scripted", None),
        ("judge", None),
        (None, None),
    ],
)
def test_model_families(name, family) -> None:
    assert model_family(name) == family
