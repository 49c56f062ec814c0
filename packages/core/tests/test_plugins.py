import re

import pytest

from reinforge import hookimpl
from reinforge.errors import PluginError
from reinforge.plugins import build_registry, describe_plugins, get_plugin_manager


def plugin_registering(judge_name):
    class Plugin:
        @hookimpl
        def register_judges(self, register):
            register(judge_name, lambda task, response: 1.0)

    return Plugin()


def test_core_registers_its_builtins_through_the_hooks():
    pm = get_plugin_manager(load_entrypoints=False)
    registry = build_registry(pm)
    assert {"exact_match", "last_number", "regex", "json_valid", "length_penalty"} <= set(registry.names("judges"))
    assert registry.get("judges", "last_number").owner == "reinforge"


def test_same_name_twice_names_both_owners():
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(plugin_registering("dup"), name="pkg-one")
    pm.register(plugin_registering("dup"), name="pkg-two")
    registry = build_registry(pm)  # a collision does not take the other plugins down ...
    with pytest.raises(PluginError) as err:  # ... but using the name is an error naming both
        registry.get("judges", "dup")
    assert "'dup'" in str(err.value) and "pkg-one" in str(err.value) and "pkg-two" in str(err.value)
    rows = {r["name"]: r for r in describe_plugins(pm)}
    assert rows["pkg-one"]["conflicts"] == ["judges 'dup' also registered by pkg-two"]


def test_a_plugin_cannot_shadow_a_builtin():
    # the built-in keeps working for every run; the plugin that took its name is refused, naming both
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(plugin_registering("exact_match"), name="sneaky")
    registry = build_registry(pm)
    assert registry.get("judges", "exact_match").owner == "reinforge"
    assert re.search(r"sneaky: judge 'exact_match' is a built-in of 'reinforge'", registry.broken["sneaky"])


def test_env_var_empty_loads_no_entry_points_and_unknown_names_error():
    pm = get_plugin_manager(env={"REINFORGE_LOAD_PLUGINS": ""})
    assert [pm.get_name(p) for p in pm.get_plugins()] == ["reinforge"]
    with pytest.raises(PluginError, match="not-installed"):
        get_plugin_manager(env={"REINFORGE_LOAD_PLUGINS": "not-installed"})


def test_describe_lists_core_first_with_version_and_registrations():
    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(plugin_registering("extra"), name="pkg-extra")
    rows = describe_plugins(pm)
    assert rows[0]["name"] == "reinforge" and rows[0]["version"]
    extra = next(r for r in rows if r["name"] == "pkg-extra")
    assert extra["registers"] == {"judges": ["extra"]}
