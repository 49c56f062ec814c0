"""Plugin-owned run-file sections (``register_run_sections``): checked like core's keys, owned by the plugin.

Before core 0.4, ``sentinels:`` was a core key typed ``dict`` for one plugin and any other plugin had no way
to declare its own section; these tests fail there (no hook, no ``run.sections``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from reinforge import hookimpl
from reinforge.cli import main
from reinforge.plugin import ConfigError, PluginError, Settings, at_least, load_run
from reinforge.runfile import dump_run
from reinforge.testing import plugin_registry

WORKFLOW = """
def workflow(task, model):
    return {"response": "4"}
"""


@dataclass
class AuditSettings(Settings):
    every: int = 10
    tag: str = "audit"

    def check(self) -> None:
        at_least("every", self.every, 1)


def audit_plugin(register_as: str = "audit", obj: Any = AuditSettings) -> Any:
    @hookimpl
    def register_run_sections(register: Any) -> None:
        register(register_as, obj, description="an audit log")

    plugin = ModuleType("reinforge_audit")
    plugin.register_run_sections = register_run_sections  # type: ignore[attr-defined]
    return plugin


def write_run(tmp_path: Path, extra: str) -> Path:
    (tmp_path / "flows.py").write_text(WORKFLOW)
    (tmp_path / "train.jsonl").write_text('{"question": "2 + 2?", "answer": "4"}\n')
    run = tmp_path / "run.yaml"
    run.write_text(f"workflow: flows:workflow\ntrain_dataset: {{path: train.jsonl}}\n{extra}")
    return run


def test_a_registered_section_is_checked_and_handed_to_the_run(reinforge_pm, tmp_path):
    registry = plugin_registry(reinforge_pm, {"reinforge-audit": audit_plugin()})
    run = load_run(write_run(tmp_path, "audit: {every: 5}\n"), registry=registry)
    section = run.section("audit")
    assert isinstance(section, AuditSettings) and (section.every, section.tag) == (5, "audit")
    assert registry.get("run_sections", "audit").owner == "reinforge-audit"


def test_a_typo_or_a_bad_value_in_a_section_names_the_file_and_the_dotted_key(reinforge_pm, tmp_path):
    registry = plugin_registry(reinforge_pm, {"reinforge-audit": audit_plugin()})
    path = write_run(tmp_path, "audit: {evrey: 5}\n")
    with pytest.raises(ConfigError, match=r"run\.yaml: unknown key 'audit\.evrey' \(did you mean 'every'\?\)"):
        load_run(path, registry=registry)
    path.write_text(path.read_text().replace("evrey: 5", "every: 0"))
    with pytest.raises(ConfigError, match=r"run\.yaml: audit\.every: must be at least 1, got 0"):
        load_run(path, registry=registry)


def test_a_key_no_plugin_registered_is_unknown_with_a_suggestion(reinforge_pm, tmp_path):
    registry = plugin_registry(reinforge_pm, {"reinforge-audit": audit_plugin()})
    with pytest.raises(ConfigError, match=r"unknown key 'audti' \(did you mean 'audit'\?\)"):
        load_run(write_run(tmp_path, "audti: {every: 5}\n"), registry=registry)
    with pytest.raises(ConfigError, match=r"unknown key 'sentinels'"):  # reinforge-report is not registered here
        load_run(write_run(tmp_path, "sentinels: {halt: true}\n"), registry=plugin_registry(reinforge_pm))


def test_tune_dry_run_checks_the_sections_of_the_installed_plugins(reinforge_pm, tmp_path, monkeypatch, capsys):
    plugin_registry(reinforge_pm, {"reinforge-audit": audit_plugin()})
    monkeypatch.setattr("reinforge.plugins.get_plugin_manager", lambda *a, **k: reinforge_pm)
    path = write_run(tmp_path, "audit: {tag: 3}\n")
    assert main(["tune", str(path), "--dry-run"]) != 0
    assert "audit.tag" in capsys.readouterr().err


def test_sections_round_trip_through_dump_run(reinforge_pm, tmp_path):
    registry = plugin_registry(reinforge_pm, {"reinforge-audit": audit_plugin()})
    run = load_run(write_run(tmp_path, "audit: {every: 7}\n"), registry=registry)
    out = tmp_path / "again.yaml"
    dump_run(run, out)
    assert "audit:" in out.read_text()
    assert load_run(out, registry=registry).section("audit").every == 7


def test_without_the_registry_a_section_stays_unchecked_and_says_so(reinforge_pm, tmp_path):
    run = load_run(write_run(tmp_path, "audit: {every: 5}\n"))
    assert run.sections == {"audit": {"every": 5}}
    with pytest.raises(ConfigError, match="not checked yet"):
        run.section("audit")
    assert run.section("absent") is None


@pytest.mark.parametrize(
    ("name", "obj", "message"),
    [
        ("judges", AuditSettings, "'judges' is a key of core's run file"),
        ("audit", dict, "expected a reinforge.plugin.Settings dataclass"),
        ("audit", 42, "expected a reinforge.plugin.Settings dataclass"),
    ],
)
def test_a_section_must_be_a_settings_class_under_a_key_core_does_not_use(reinforge_pm, name, obj, message):
    registry = plugin_registry(reinforge_pm, {"reinforge-audit": audit_plugin(name, obj)})
    assert "reinforge-audit" in registry.broken and message in registry.broken["reinforge-audit"]
    with pytest.raises(PluginError, match=message):
        registry.registrar("run_sections", "reinforge-audit")(name, obj)


def test_tune_from_python_checks_its_extra_keys_before_anything_is_built(reinforge_pm, tmp_path):
    from reinforge import tune

    (tmp_path / "train.jsonl").write_text('{"question": "2 + 2?", "answer": "4"}\n')
    with pytest.raises(ConfigError, match=r"tune\(\): unknown key 'runer' \(did you mean 'runner'\?\)"):
        tune(
            workflow_func="reinforge.testing:run_command",
            train_dataset={"path": str(tmp_path / "train.jsonl")},
            runer={"max_retries": 0},
            plugin_manager=reinforge_pm,
        )
