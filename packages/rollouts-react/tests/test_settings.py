"""`react` is registered with ReactSettings: bad workflow.args fail when the run loads, before any model call."""

import json
from pathlib import Path

import pytest
import yaml

from reinforge.plugin import ConfigError, build_job, get_plugin_manager, load_run
from reinforge.testing import cli_main, plugin_registry
from reinforge.testing.openai_server import OpenAIServer
from reinforge_rollouts_react import ReactSettings, ReactWorkflow, calculator


def never_called(body):
    raise AssertionError("no model call is made while a run loads")


def write_run(tmp_path: Path, args: dict, api_base: str) -> Path:
    (tmp_path / "tasks.jsonl").write_text(json.dumps({"question": "What is 2 + 2?", "answer": "4"}) + "\n")
    run = {
        "workflow": {"name": "react", "args": args},
        "judges": [{"name": "last_number", "metric": "correct"}],
        "train_dataset": {"path": "tasks.jsonl"},
        "eval_dataset": {"path": "tasks.jsonl"},
        "model": {"model_path": "scripted", "api_base": api_base},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run, sort_keys=False))
    return path


def test_react_is_registered_as_a_class_with_its_settings():
    component = plugin_registry(get_plugin_manager()).get("workflows", "react")
    assert component.obj is ReactWorkflow and component.settings is ReactSettings
    assert component.owner == "reinforge-rollouts-react"


BAD = [
    ({"max_turns": 0}, "workflow: args.max_turns: must be at least 1, got 0"),
    ({"max_turns": "4"}, "workflow: args.max_turns: expected an integer, got str '4'"),
    ({"tools": ["nosuchtool"]}, "workflow: args.tools[0]: no tool named 'nosuchtool' is registered"),
    ({"tools": ["calculater"]}, "workflow: args.tools[0]: no tool named 'calculater' is registered (did you mean"),
    ({"tools": ["calculator", "calculator"]}, "workflow: args.tools[1]: tool 'calculator' is already given as"),
    ({"tools": [{"name": "calculator", "retries": 2}]}, "workflow: args.tools[0]: unknown key(s) ['retries']"),
    ({"max_turn": 3}, "workflow: unknown key 'args.max_turn' (did you mean 'max_turns'?)"),
    ({"action_format": "xml"}, "workflow: args.action_format: must be one of auto, native, text, json"),
    ({"tool_timeout": 0}, "workflow: args.tool_timeout: must be greater than 0"),
    ({"stop": [1]}, "workflow: args.stop[0]: expected a string, got int 1"),
]


@pytest.mark.parametrize(("args", "message"), BAD)
def test_bad_react_settings_fail_build_job_naming_the_key(tmp_path, args, message):
    with OpenAIServer(never_called) as server:
        run = load_run(write_run(tmp_path, args, server.base_url))
        with pytest.raises(ConfigError) as info:
            build_job(run, need_backend=False)
        assert server.requests == []
    assert f"{run.source}: {message}" in str(info.value)


@pytest.mark.parametrize(("args", "message"), BAD[:3])
def test_bad_react_settings_fail_tune_dry_run_and_eval(tmp_path, capsys, args, message):
    with OpenAIServer(never_called) as server:
        run_file = write_run(tmp_path, args, server.base_url)
        assert cli_main(["tune", str(run_file), "--dry-run"]) == 1
        assert f"{run_file.resolve()}: {message}" in capsys.readouterr().err
        assert cli_main(["eval", str(run_file)]) == 1
        assert f"{run_file.resolve()}: {message}" in capsys.readouterr().err
        assert server.requests == []


def test_each_run_builds_its_own_workflow_and_resolves_its_tools_once(tmp_path):
    with OpenAIServer(never_called) as server:
        run = load_run(write_run(tmp_path, {"tools": ["calculator"], "max_turns": 3}, server.base_url))
        jobs = [build_job(run, need_backend=False) for _ in range(2)]
    workflows = [job.workflow.func for job in jobs]
    assert all(isinstance(w, ReactWorkflow) for w in workflows) and workflows[0] is not workflows[1]
    assert [t.name for t in workflows[0].tools] == ["calculator"] and workflows[0].tools[0] is calculator
    assert workflows[0].settings.max_turns == 3 and isinstance(workflows[0].settings, ReactSettings)
    for job in jobs:
        job.close()


def test_react_workflow_from_python_takes_keywords_or_settings():
    assert ReactWorkflow(tools=["calculator"]).tools == [calculator]
    settings = ReactSettings(tools=[calculator], max_turns=2)
    assert ReactWorkflow(settings).settings is settings
    with pytest.raises(ConfigError, match=r"react workflow: args.max_turns: must be at least 1, got 0"):
        ReactWorkflow(max_turns=0)
    assert ReactSettings(tools=["nope"]).tools == ["nope"]  # names resolve when the workflow is built
    with pytest.raises(ConfigError, match=r"react workflow: args.tools\[0\]: no tool named 'nope'"):
        ReactWorkflow(tools=["nope"])
    with pytest.raises(ConfigError, match=r"ReactSettings: tools\[1\]: tool 'calculator' is already given"):
        ReactSettings(tools=["calculator", "calculator"])
    with pytest.raises(TypeError, match="not both"):
        ReactWorkflow(settings, max_turns=3)
