"""The entry point registers the judges, the group reward and the commands; `reinforge try` uses them."""

from __future__ import annotations

import json

import pytest
from judges_llm_testlib import JudgeScript

from reinforge.testing import check_entry_point, cli_main, plugin_registry
from reinforge_judges_llm import (
    ListwiseConfig,
    ListwiseJudge,
    PairwiseConfig,
    PairwiseJudge,
    PointwiseConfig,
    PointwiseJudge,
    __version__,
    plugin,
)


def test_entry_point_registers_what_it_claims() -> None:
    found = check_entry_point(
        "reinforge-judges-llm", judges=["llm-pointwise", "llm-pairwise"], group_rewards=["llm-listwise"]
    )
    assert found["judges"] == ["llm-pairwise", "llm-pointwise"]


def test_registered_judges_are_classes_with_settings_and_model_judges(reinforge_pm) -> None:
    reinforge_pm.register(plugin, name="reinforge-judges-llm")
    registry = plugin_registry(reinforge_pm)
    expected = {
        ("judges", "llm-pointwise"): (PointwiseJudge, PointwiseConfig),
        ("judges", "llm-pairwise"): (PairwiseJudge, PairwiseConfig),
        ("group_rewards", "llm-listwise"): (ListwiseJudge, ListwiseConfig),
    }
    for (kind, name), (cls, settings) in expected.items():
        component = registry.get(kind, name)
        assert component.owner == "reinforge-judges-llm"
        assert component.obj is cls and component.settings is settings  # core builds cls(settings) per run
        assert component.judge_kind == "model"  # core's rule gate keeps failing responses away
        assert component.reward_range == (0.0, 1.0)


def test_plugins_command_lists_the_package(capsys) -> None:
    assert cli_main(["plugins", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    row = rows["reinforge-judges-llm"]
    assert row["version"] == __version__
    assert row["registers"] == {"judges": ["llm-pointwise", "llm-pairwise"], "group_rewards": ["llm-listwise"]}
    assert "register_commands" in row["hooks"]


def test_judge_command_group_has_calibrate_and_audit(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        cli_main(["judge", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "calibrate" in out and "audit" in out


def test_try_judge_runs_the_registered_judge(openai_server, tmp_path, capsys) -> None:
    srv = openai_server(JudgeScript(pointwise=lambda t, r, ref: 5))
    example = tmp_path / "input.json"
    example.write_text(json.dumps({"task": {"question": "2+2?", "reference": "4"}, "response": "4"}))
    args = json.dumps({"model": "judge", "api_base": srv.base_url})
    assert cli_main(["try", "judge", "llm-pointwise", "--input", str(example), "--args", args]) == 0
    out = capsys.readouterr().out
    assert "reward 1.0, status success" in out and "verdict: 5.0" in out


def test_a_judge_class_referenced_as_module_attr_is_built_per_run_as_a_model_judge() -> None:
    from reinforge.plugin import ComponentSpec, build_component

    spec = ComponentSpec(ref="reinforge_judges_llm:PointwiseJudge", args={"model": "m", "rubric": "Is it right?"})
    bound = build_component(spec, "judge", where="run.yaml: judges[0]")
    assert isinstance(bound.func, PointwiseJudge) and bound.func.config.rubric == "Is it right?"
    assert bound.judge_kind == "model"  # read from the class: the rule gate keeps failing responses away
    bound.close()
    assert bound.func.closed
