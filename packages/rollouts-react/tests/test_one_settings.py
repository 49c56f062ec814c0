"""ReAct's settings have one definition, `ReactSettings`: the agent, the workflow class and function take it."""

import asyncio
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from reinforge import response_text
from reinforge.plugin import ConfigError
from reinforge.testing import ScriptedChatModel
from reinforge_rollouts_react import ReActAgent, ReactSettings, ReactWorkflow, calculator, react_workflow

README = Path(__file__).resolve().parents[1] / "README.md"
KEYS = [f.name for f in dataclasses.fields(ReactSettings)]


@pytest.mark.parametrize("func", [ReActAgent, ReactWorkflow, react_workflow], ids=lambda f: f.__name__)
def test_no_setting_is_a_parameter_with_a_default_of_its_own(func):
    params = inspect.signature(func).parameters
    assert not set(KEYS) & set(params), "settings are ReactSettings fields, not parameters with their own defaults"
    assert "settings" in params


def test_the_agent_takes_a_settings_object_and_its_defaults_are_the_settings_defaults():
    settings = ReactSettings(tools=[calculator], max_turns=2, strict_format=True)
    agent = ReActAgent(ScriptedChatModel([]), settings)
    assert agent.settings is settings and agent.tools == [calculator]
    assert ReActAgent(ScriptedChatModel([])).settings == ReactSettings()
    with pytest.raises(TypeError, match="not both"):
        ReActAgent(ScriptedChatModel([]), settings, max_turns=3)


def test_an_unknown_agent_keyword_is_a_config_error_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"ReActAgent: unknown key 'max_turn' \(did you mean 'max_turns'\?\)"):
        ReActAgent(ScriptedChatModel([]), max_turn=3)


def test_the_workflow_function_takes_a_settings_object_or_keywords():
    settings = ReactSettings(tools=[calculator], question_field="prompt", max_turns=1)
    out = asyncio.run(react_workflow({"prompt": "2+2?"}, ScriptedChatModel(["Final Answer: 4"]), settings=settings))
    assert response_text(out.response) == "4" and out.metrics["turns"] == 1
    with pytest.raises(ConfigError, match=r"react workflow: args.max_turns: must be at least 1, got 0"):
        asyncio.run(react_workflow({"question": "2+2?"}, ScriptedChatModel([]), max_turns=0))


def test_the_workflow_class_hands_its_resolved_tools_and_settings_to_each_episode():
    model = ScriptedChatModel(["Action: calculator[6 * 7]", "Final Answer: 42"])
    workflow = ReactWorkflow(tools=["calculator"], max_turns=2, sys_prompt="Compute.")
    out = asyncio.run(workflow({"question": "6*7?"}, model))
    assert response_text(out.response) == "42" and out.metrics["tool_call_count"] == 1
    assert model.calls[0].messages[0]["content"].startswith("Compute.")


def test_the_readme_table_lists_every_setting_once():
    rows = re.findall(r"^\| `([a-z_]+)` \|", README.read_text().split("### Workflow settings", 1)[1], re.M)
    table = rows[: rows.index("turns")] if "turns" in rows else rows  # the next table lists metrics
    assert sorted(table) == sorted(KEYS) and len(table) == len(set(table))
