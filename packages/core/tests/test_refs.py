"""Resolving references: callables, ``module:attr`` and registered names."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from reinforge.components import build_component as resolve_component
from reinforge.config import ComponentSpec
from reinforge.errors import ResolveError, SignatureError
from reinforge.plugins import Component, Registry
from reinforge.refs import resolve, resolve_ref
from reinforge.runfile import load_run


def write_module(directory: Path, source: str) -> str:
    name = f"refmod_{uuid.uuid4().hex[:10]}"
    (directory / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
    return name


FUNCS = """
async def judge(task, response, scale=1.0):
    return scale * float(response == task["answer"])

def sync_judge(task, response):
    return 0.5

class Judges:
    class Inner:
        @staticmethod
        def exact(task, response):
            return 1.0
"""


def registry_with(**by_kind: dict) -> Registry:
    registry = Registry()
    for kind, items in by_kind.items():
        for name, obj in items.items():
            registry.components[kind][name] = Component(kind, name, obj, "test-plugin")
    return registry


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.syspath_prepend(str(tmp_path))
    return write_module(tmp_path, FUNCS)


def test_callable_passes_through() -> None:
    def fn(task, response):
        return 1.0

    assert resolve(fn, "judges", None) is fn


def test_module_attr_and_dotted_attr(module: str) -> None:
    judge = resolve(f"{module}:judge", "judges", None)
    assert judge.__name__ == "judge" and judge.__module__ == module
    assert resolve(f"{module}:Judges.Inner.exact", "judge", None)(None, None) == 1.0


def test_module_that_does_not_exist() -> None:
    with pytest.raises(ResolveError) as info:
        resolve("no_such_module_abc:judge", "judges", None, where="run.yaml: judges[0]")
    msg = str(info.value)
    assert msg.startswith("run.yaml: judges[0]: ")
    assert "'no_such_module_abc'" in msg and "'no_such_module_abc:judge'" in msg


def test_module_whose_import_fails_reports_original_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    broken = write_module(tmp_path, "import a_dependency_that_is_not_installed\n")
    with pytest.raises(ResolveError) as info:
        resolve(f"{broken}:judge", "judges", None)
    msg = str(info.value)
    assert repr(broken) in msg and "a_dependency_that_is_not_installed" in msg and "ModuleNotFoundError" in msg

    raising = write_module(tmp_path, "raise RuntimeError('boom at import')\n")
    with pytest.raises(ResolveError, match=rf"'{raising}'.*RuntimeError: boom at import"):
        resolve(f"{raising}:judge", "judges", None)


def test_missing_attribute_names_module_and_attr(module: str) -> None:
    with pytest.raises(ResolveError) as info:
        resolve(f"{module}:jduge", "judges", None)
    msg = str(info.value)
    assert repr(module) in msg and "'jduge'" in msg and "did you mean 'judge'" in msg

    with pytest.raises(ResolveError, match=r"Judges\.Inner' has no attribute 'exakt' \(did you mean 'exact'\?\)"):
        resolve(f"{module}:Judges.Inner.exakt", "judges", None)


@pytest.mark.parametrize("ref", ["mod:", ":attr", "", 42])
def test_malformed_references(ref: object) -> None:
    with pytest.raises(ResolveError):
        resolve(ref, "judges", None)


def test_registered_name() -> None:
    def math_judge(task, response):
        return 1.0

    registry = registry_with(judges={"math_judge": math_judge})
    assert resolve("math_judge", "judges", registry) is math_judge
    assert resolve("math_judge", "judge", registry) is math_judge


def test_unknown_registered_name_lists_names_and_hints() -> None:
    registry = registry_with(judges={"math_judge": len, "llm_judge": len}, workflows={"react": len})
    with pytest.raises(ResolveError) as info:
        resolve("math_judg", "judges", registry, where="run.yaml: judges[0]")
    msg = str(info.value)
    assert msg.startswith("run.yaml: judges[0]: ") and "'math_judg'" in msg
    assert "llm_judge, math_judge" in msg and "react" not in msg
    assert "did you mean 'math_judge'" in msg and "module:function" in msg


def test_unknown_name_with_nothing_registered() -> None:
    with pytest.raises(ResolveError, match="no group rewards are registered"):
        resolve("rank", "group_rewards", Registry())


def test_unknown_kind() -> None:
    with pytest.raises(ValueError, match="kind"):
        resolve("x", "scorers", Registry())


def test_base_dir_is_on_sys_path_only_while_importing(tmp_path: Path) -> None:
    name = write_module(tmp_path, FUNCS)
    with pytest.raises(ResolveError):
        resolve(f"{name}:judge", "judges", None)
    before = list(sys.path)
    assert resolve(f"{name}:judge", "judges", None, base_dir=str(tmp_path)).__name__ == "judge"
    assert sys.path == before


def test_resolve_component_binds_settings(module: str) -> None:
    bound = resolve_component(ComponentSpec(ref=f"{module}:judge", args={"scale": 2.0}), "judge")
    assert bound.name == f"{module}:judge" and bound.settings == {"scale": 2.0}
    assert asyncio.run(bound.call({"answer": "4"}, "4")) == 2.0

    named = resolve_component(ComponentSpec(ref=f"{module}:sync_judge", name="half"), "judge")
    assert named.name == f"{module}:sync_judge" and asyncio.run(named.call({}, "x")) == 0.5


def test_resolve_component_registered_name_keeps_it_as_metric_name() -> None:
    def judge_impl(task, response):
        return 1.0

    spec = ComponentSpec(ref="math")
    bound = resolve_component(spec, "judge", registry_with(judges={"math": judge_impl}))
    assert spec.metric_name == "math" and bound.func is judge_impl


def test_resolve_component_bad_setting_names_function_and_place(module: str) -> None:
    with pytest.raises(SignatureError) as info:
        resolve_component(ComponentSpec(ref=f"{module}:judge", args={"scael": 2}), "judge", where="run.yaml: judges[0]")
    msg = str(info.value)
    assert msg.startswith("run.yaml: judges[0]: ") and "'scael'" in msg and f"{module}:judge" in msg


def test_resolve_component_wrong_contract(module: str) -> None:
    with pytest.raises(SignatureError, match="workflow"):
        resolve_component(ComponentSpec(ref=f"{module}:judge"), "workflow")


def test_resolve_component_unknown_role(module: str) -> None:
    with pytest.raises(ValueError, match="role"):
        resolve_component(ComponentSpec(ref=f"{module}:judge"), "scorer")


def test_build_job_resolves_every_function_of_a_run(tmp_path: Path) -> None:
    from reinforge import hookimpl
    from reinforge.job import build_job
    from reinforge.plugins import get_plugin_manager

    name = write_module(
        tmp_path,
        """
        async def workflow(task, model):
            return None

        def judge(task, response):
            return 1.0

        def rank(task, responses):
            return [0.0] * len(responses)
        """,
    )

    class Plugin:
        @hookimpl
        def register_judges(self, register):
            register("registered", lambda task, response: 0.0)

    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(Plugin(), name="test-plugin")
    path = tmp_path / "run.yaml"
    path.write_text(f"workflow: {name}:workflow\njudges: [{name}:judge, registered]\ngroup_reward: {name}:rank\n")
    job = build_job(load_run(path), pm)
    assert job.workflow.role == "workflow" and job.workflow.name.endswith(":workflow")
    assert [j.name for j in job.composer.judges] == ["judge", "registered"]
    assert job.composer.group_reward is not None and job.composer.group_reward.name.endswith(":rank")

    path.write_text(f"workflow: {name}:workflow\njudges: [missing_one]\n")
    with pytest.raises(ResolveError, match=rf"{path.resolve()}: judges\[0\]: no judge named 'missing_one'"):
        build_job(load_run(path), pm)


def test_two_run_folders_each_get_their_own_same_named_module(tmp_path: Path) -> None:
    name = f"judges_{uuid.uuid4().hex[:8]}"
    for folder, body in (
        ("a", "def only_in_a(task, response):\n    return 1.0\n"),
        ("b", "def only_in_b(t, r):\n    return 0.0\n"),
    ):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"{name}.py").write_text(body)
    try:
        first = resolve(f"{name}:only_in_a", "judges", None, base_dir=str(tmp_path / "a"))
        second = resolve(f"{name}:only_in_b", "judges", None, base_dir=str(tmp_path / "b"))  # not a's module again
        again = resolve(f"{name}:only_in_a", "judges", None, base_dir=str(tmp_path / "a"))
        assert first.__name__ == again.__name__ == "only_in_a" and second.__name__ == "only_in_b"
        assert Path(sys.modules[name].__file__).parent == tmp_path / "a"
    finally:
        sys.modules.pop(name, None)


def test_a_run_folder_file_never_replaces_a_module_imported_otherwise(tmp_path: Path) -> None:
    (tmp_path / "textwrap.py").write_text("def dedent(text):\n    return 'shadowed'\n")
    assert resolve("textwrap:dedent", "judges", None, base_dir=str(tmp_path)) is textwrap.dedent
    assert sys.modules["textwrap"] is textwrap


def test_a_registered_name_needs_the_runs_registry_and_never_the_installed_plugins() -> None:
    # before 0.4 a None registry quietly built a plugin manager of every installed plugin
    with pytest.raises(TypeError, match=r"run.yaml: judges\[0\]: judge 'json_valid' is a registered name.*registry"):
        resolve_ref("json_valid", "judges", None, where="run.yaml: judges[0]")
    with pytest.raises(TypeError, match="registry"):
        resolve_ref("json_valid", "judges")  # type: ignore[call-arg]  # the registry is a required argument
