"""register_tools: the hook, owners, duplicates, and tools lists from run files."""

import sys
import textwrap

import pytest

from reinforge import hookimpl
from reinforge.errors import ConfigError, PluginError
from reinforge.plugins import get_plugin_manager
from reinforge.testing import check_entry_point
from reinforge_rollouts_react import Tool, calculator, resolve_tools, tool, tool_registry
from reinforge_rollouts_react.registry import installed_tools


@tool
def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: The text.
    """
    return len(text.split())


class WordsPlugin:
    @hookimpl
    def register_tools(self, register):
        register(word_count)
        register("shout", lambda text: text.upper())


class OtherCalculatorPlugin:
    @hookimpl
    def register_tools(self, register):
        register("calculator", lambda expression: "0")


def test_the_entry_point_registers_the_react_workflow():
    check_entry_point("reinforge-rollouts-react", workflows=["react"])


def test_installed_tools_are_the_safe_builtins_only():
    registry = tool_registry()
    assert registry.get("calculator") is calculator
    assert registry.owner("calculator") == "reinforge-rollouts-react"
    assert set(registry.names()) == {"calculator"}  # no shell or network tool is registered by default


def test_plugins_publish_tools_with_their_owner():
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(WordsPlugin(), name="reinforge-words")
    registry = tool_registry(pm)
    assert registry.names() == ["shout", "word_count"]
    assert registry.owner("word_count") == "reinforge-words"
    assert isinstance(registry.get("shout"), Tool) and registry.get("shout")("hey") == "HEY"
    assert tool_registry(pm).names() == ["shout", "word_count"]  # the hookspec is added once


def test_two_plugins_registering_one_tool_name_is_an_error_naming_both():
    pm = get_plugin_manager(load_entrypoints=False)
    import reinforge_rollouts_react.plugin as ours

    pm.register(ours, name="reinforge-rollouts-react")
    pm.register(OtherCalculatorPlugin(), name="reinforge-other-calc")
    with pytest.raises(PluginError) as info:
        tool_registry(pm)
    message = str(info.value)
    assert "tool 'calculator' is registered twice" in message
    assert "'reinforge-rollouts-react'" in message and "'reinforge-other-calc'" in message
    assert "REINFORGE_LOAD_PLUGINS" in message


def test_tools_lists_accept_names_references_functions_and_overrides(tmp_path, monkeypatch):
    (tmp_path / "my_tools.py").write_text(
        textwrap.dedent(
            '''
            def reverse(text: str) -> str:
                """Reverse a text.

                Args:
                    text: What to reverse.
                """
                return text[::-1]
            '''
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    tools = resolve_tools(["calculator", "my_tools:reverse", word_count])
    assert [t.name for t in tools] == ["calculator", "reverse", "word_count"]
    assert tools[1].parameters["properties"]["text"]["description"] == "What to reverse."
    (overridden,) = resolve_tools([{"name": "calculator", "timeout": 1.5, "description": "Math."}])
    assert overridden.timeout == 1.5 and overridden.description == "Math." and calculator.timeout is None
    sys.modules.pop("my_tools", None)


@pytest.mark.parametrize(
    ("specs", "message"),
    [
        (["calculater"], "tools[0]: no tool named 'calculater' is registered (did you mean 'calculator'?)"),
        (["calculator", "calculator"], "tools[1]: tool 'calculator' is already given as tools[0]"),
        (["no_such_module:fn"], "tools[0]: cannot import module 'no_such_module'"),
        (["reinforge_rollouts_react:nothing_here"], "has no attribute 'nothing_here'"),
        ([{"timeout": 3}], "tools[0]: missing 'name'"),
        ([{"name": "calculator", "retries": 3}], "unknown key(s) ['retries']"),
        ([{"name": "calculator", "timeout": -1}], "timeout must be a positive number"),
        ([42], "a tool is a name, 'module:attr', a function or a Tool, got 42"),
    ],
)
def test_bad_tools_lists_name_the_entry(specs, message):
    with pytest.raises(ConfigError) as info:
        resolve_tools(specs)
    assert message in str(info.value)


def test_plugin_selection_applies_to_tools(monkeypatch):
    monkeypatch.setenv("REINFORGE_LOAD_PLUGINS", "")
    assert installed_tools().names() == []
    monkeypatch.setenv("REINFORGE_LOAD_PLUGINS", "reinforge-rollouts-react")
    assert installed_tools().names() == ["calculator"]
