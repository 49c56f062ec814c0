"""register_tools: the hook (added through reinforge_addhooks), owners, conflicts, and tools lists from run files."""

import sys
import textwrap

import pytest

import reinforge_rollouts_react.plugin as ours
from reinforge import hookimpl
from reinforge.plugin import ConfigError, PluginError, Registry, get_plugin_manager
from reinforge.testing import check_entry_point, check_hookimpls
from reinforge_rollouts_react import TOOLS, Tool, calculator, resolve_tools, tool, tool_registry


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


class BrokenToolsPlugin:
    @hookimpl
    def register_tools(self, register):
        register(word_count)
        register(42)  # not a function: this plugin is broken, the others keep working


def with_plugins(*plugins):
    """A plugin manager with this package's plugin (which adds the register_tools hookspec) and ``plugins``."""
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(ours, name="reinforge-rollouts-react")
    for plugin in plugins:
        pm.register(plugin, name=f"reinforge-{type(plugin).__name__.lower()}")
    return pm


def test_the_entry_point_registers_the_react_workflow():
    check_entry_point("reinforge-rollouts-react", workflows=["react"])


def test_installed_tools_are_the_safe_builtins_only():
    registry = tool_registry()
    assert registry.get("calculator") is calculator
    assert registry.owner("calculator") == "reinforge-rollouts-react"
    assert set(registry.names()) == {"calculator"}  # no shell or network tool is registered by default
    assert isinstance(registry.registry, Registry) and registry.registry.names(TOOLS) == ["calculator"]


def test_the_hookspec_comes_through_reinforge_addhooks_and_a_tools_plugin_is_not_broken():
    pm = with_plugins(WordsPlugin())
    assert pm.hook.register_tools.has_spec()
    assert pm.broken == []  # no optionalhook needed: the spec was added as our plugin registered
    registry = tool_registry(pm)
    assert registry.names() == ["calculator", "shout", "word_count"]
    assert registry.owner("word_count") == "reinforge-wordsplugin"
    assert isinstance(registry.get("shout"), Tool) and registry.get("shout")("hey") == "HEY"
    assert tool_registry(pm).names() == registry.names()  # a new registry each time, the same tools
    assert tool_registry(pm).registry is not registry.registry


def test_a_tools_hook_without_this_package_matches_no_spec_and_its_plugin_is_broken():
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(WordsPlugin(), name="reinforge-words")
    problems = check_hookimpls(pm)  # what core runs after loading the installed plugins
    assert len(problems) == 1 and "'register_tools'" in problems[0][1] and "no plugin specifies" in problems[0][1]


def test_two_plugins_registering_one_tool_name_is_an_error_naming_both_when_used():
    registry = tool_registry(with_plugins(OtherCalculatorPlugin()))
    assert registry.conflicts == {"calculator": ["reinforge-rollouts-react", "reinforge-othercalculatorplugin"]}
    assert "calculator" not in registry.names()
    with pytest.raises(PluginError) as info:
        registry.get("calculator")
    message = str(info.value)
    assert "tool 'calculator' is registered twice" in message
    assert "'reinforge-rollouts-react'" in message and "'reinforge-othercalculatorplugin'" in message
    assert "REINFORGE_LOAD_PLUGINS" in message
    with pytest.raises(ConfigError, match=r"tools\[0\]: tool 'calculator' is registered twice"):
        resolve_tools(["calculator"], registry)


def test_a_plugin_whose_tools_hook_raises_is_broken_and_the_others_keep_working():
    pm = with_plugins(BrokenToolsPlugin())
    registry = tool_registry(pm)
    assert "calculator" in registry.names()
    assert "reinforge-brokentoolsplugin" in registry.broken
    assert "register_tools raised ToolDefinitionError" in registry.broken["reinforge-brokentoolsplugin"]


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


def test_plugin_selection_applies_to_tools_and_nothing_is_cached(monkeypatch):
    monkeypatch.setenv("REINFORGE_LOAD_PLUGINS", "")
    assert tool_registry().names() == []
    with pytest.raises(ConfigError, match=r"tools\[0\]: no tool named 'calculator' is registered"):
        resolve_tools(["calculator"])
    monkeypatch.setenv("REINFORGE_LOAD_PLUGINS", "reinforge-rollouts-react")
    assert tool_registry().names() == ["calculator"]
    assert resolve_tools(["calculator"]) == [calculator]
