"""The docs of core 0.3 (issue findings 8 and 10): the README documents what the code has, and its examples run.

Each test fails on the core before 0.3 (commit 5195295).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import sys
import types
from pathlib import Path

import pytest

from reinforge import GroupRewardOutput, JudgeOutput, WorkflowOutput, plugin
from reinforge.config import (
    AlgorithmConfig,
    ComponentSpec,
    DatasetConfig,
    EvalConfig,
    ModelConfig,
    RewardConfig,
    RunConfig,
    RunnerConfig,
    ScoreConfig,
)
from reinforge.settings import settings_keys

CORE = Path(__file__).resolve().parents[1]
REPO = CORE.parents[1]
README = (CORE / "README.md").read_text()
CHANGELOG = (CORE / "CHANGELOG.md").read_text()


def section(text: str, title: str) -> str:
    """The text of one ``##`` section (with its ``###`` subsections)."""
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


# -- finding 10: every run-file key, the plugin API, outputs and statuses, the testing kit ---------------


@pytest.mark.parametrize(
    "cls",
    [
        RunConfig,
        ComponentSpec,
        DatasetConfig,
        ModelConfig,
        AlgorithmConfig,
        RunnerConfig,
        RewardConfig,
        ScoreConfig,
        EvalConfig,
    ],
)
def test_readme_documents_every_run_file_key(cls: type) -> None:
    keys = section(README, "A run file")
    missing = [k for k in settings_keys(cls) if f"`{k}`" not in keys]
    assert not missing, f"{cls.__name__}: keys not in the README's run-file section: {missing}"


def test_readme_names_no_run_file_key_that_does_not_exist() -> None:
    assert "workflow_args" not in settings_keys(RunConfig)
    for line in README.splitlines():
        if "workflow_args" in line:
            assert "no `workflow_args` key" in line, line


def test_readme_documents_every_name_of_the_plugin_api() -> None:
    api = section(README, "Writing a plugin")
    missing = [name for name in plugin.__all__ if f"`{name}" not in api]
    assert not missing, f"reinforge.plugin exports not in 'Writing a plugin': {missing}"
    for word in ("reinforge_addhooks", "check_hookimpls", "on_run_start", "on_step_end", "on_run_end", "[broken]"):
        assert word in api, word


def test_readme_documents_the_outputs_and_statuses() -> None:
    outputs = section(README, "Outputs and statuses")
    for cls in (WorkflowOutput, JudgeOutput, GroupRewardOutput):
        row = next(line for line in outputs.splitlines() if line.startswith(f"| `{cls.__name__}`"))
        for f in dataclasses.fields(cls):
            assert f"`{f.name}`" in row, (cls.__name__, f.name)
    for word in ("`SUCCESS`", "`FAILED`", "`ERROR`", "ConfigurationError", "reward_range"):
        assert word in outputs, word


def test_readme_documents_the_testing_kit() -> None:
    kit = section(README, "Writing a plugin")
    for name in (
        "-p reinforge.testing",
        "pytest_plugins",
        "`reinforge_pm`",
        "`hook_recorder`",
        "`scripted_model`",
        "`openai_server`",
        "`OpenAIServer",
        "`Reply`",
        "`ScriptedChatModel`",
        "`check_entry_point",
    ):
        assert name in kit, name


@pytest.fixture
def readme_plugin(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The README's plugin module (the first Python block of 'Registering components'), importable."""
    source = code_blocks(section(README, "Writing a plugin").split("### Registering components")[1], "python")[0]
    module = types.ModuleType("reinforge_judge_polite.plugin")
    package = types.ModuleType("reinforge_judge_polite")
    package.plugin = module
    monkeypatch.setitem(sys.modules, "reinforge_judge_polite", package)
    monkeypatch.setitem(sys.modules, "reinforge_judge_polite.plugin", module)
    exec(compile(source, "README.md", "exec"), module.__dict__)
    return module


def test_readme_plugin_and_testing_examples_run(readme_plugin, reinforge_pm, hook_recorder) -> None:
    tests_source = code_blocks(section(README, "Writing a plugin").split("### Testing a plugin")[1], "python")[0]
    namespace: dict = {}
    exec(compile(tests_source, "README.md", "exec"), namespace)
    namespace["test_polite_is_built_per_run"](reinforge_pm, hook_recorder)


def test_readme_plugin_settings_are_checked(readme_plugin, reinforge_pm) -> None:
    from reinforge.errors import ConfigError
    from reinforge.plugin import plan_component
    from reinforge.plugins import build_registry

    reinforge_pm.register(readme_plugin, name="reinforge-judge-polite")
    registry = build_registry(reinforge_pm)
    with pytest.raises(ConfigError, match=r"run\.yaml: judges\[0\]: args\.max_words: expected an integer"):
        plan_component(
            ComponentSpec(ref="polite", args={"max_words": "8"}), "judge", registry, where="run.yaml: judges[0]"
        )


def test_readme_backend_example_declares_what_core_checks() -> None:
    source = code_blocks(section(README, "Writing a plugin").split("### A backend")[1], "python")[0]
    namespace: dict = {}
    exec(compile(source, "README.md", "exec"), namespace)
    backend = namespace["MyBackend"]()
    algo = AlgorithmConfig(algorithm_type="GRPO", kl_coef=0.1)
    assert backend.algorithm_name(algo, where="run.yaml") == "grpo"
    assert backend.check_algorithm(algo, where="run.yaml").kl_coef == 0.1
    with pytest.raises(Exception, match="kl_cof"):
        backend.check_algorithm(AlgorithmConfig(algorithm_type="grpo", kl_cof=0.1), where="run.yaml")


def test_changelog_has_the_0_3_entry() -> None:
    from reinforge.__about__ import __version__

    entries = CHANGELOG.split("\n## ")[1:]
    newest = entries[0].split("\n", 1)[0]
    assert newest.startswith(__version__ + " "), "the newest CHANGELOG entry is the current version"
    entry = next(e for e in entries if e.startswith("0.3.0"))
    for word in (
        "reinforge.plugin",
        "reinforge.settings",
        "Backend",
        "on_run_end",
        "broken",
        "ConfigurationError",
        "TaskStatus.ERROR",
        "reward_range",
        "NaN",
        "reinforge-report",
        "AlgorithmConfig",
        "sentinels",
        "--output",
        "--dry-run",
        "dimensions",
    ):
        assert word in entry, word


# -- finding 8: the react-calculator README installs what its commands need, and its commands parse ---------

REACT_README = (REPO / "examples" / "react-calculator" / "README.md").read_text()


def readme_commands(text: str) -> list[list[str]]:
    commands = []
    for block in code_blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if line:
                commands.append(shlex.split(line))
    return commands


def test_react_calculator_readme_installs_the_extras_its_commands_need() -> None:
    commands = readme_commands(REACT_README)
    pip = next(c for c in commands if c[:2] == ["pip", "install"])
    core = next(arg for arg in pip if arg.startswith("packages/core"))
    extras = set(re.findall(r"\[(.*)\]", core)[0].split(","))
    assert "datasets" in extras  # run files and datasets
    if any(c[0] == "reinforge" and "--api-base" in c for c in commands):
        assert "litellm" in extras, f"--api-base talks to the server through litellm: {core}"


def test_react_calculator_readme_commands_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from reinforge.cli import _parser

    commands = [c for c in readme_commands(REACT_README) if c[0] == "reinforge"]
    assert {c[1] for c in commands} >= {"eval", "tune", "try"}
    from reinforge.plugin import plan_component
    from reinforge.plugins import build_registry, get_plugin_manager
    from reinforge.runfile import load_run

    registry = build_registry(get_plugin_manager())
    has_react = "react" in registry.names("workflows")  # reinforge-rollouts-react installed
    for command in commands:
        args = _parser(None).parse_args(command[1:])  # SystemExit on an option the CLI does not have
        if args.command in ("eval", "tune"):
            assert (REPO / args.run_file).is_file(), args.run_file
            if has_react:
                # examples/math has a judges.py too: import this example's, and restore whatever was there after
                monkeypatch.setitem(sys.modules, "judges", None)
                monkeypatch.delitem(sys.modules, "judges")
                load_run(REPO / args.run_file, registry=registry)  # every key and component setting checked
        if args.command == "try":
            settings = json.loads(args.args)
            assert isinstance(settings, dict)
            if has_react:
                plan_component(ComponentSpec(ref=args.ref, args=settings), "workflow", registry, where="README")
                for judge in args.judge:
                    plan_component(ComponentSpec(ref=judge), "judge", registry, where="README")
