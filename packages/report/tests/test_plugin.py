"""The entry point: the ``reinforge report`` command and the end-of-run report written by ``on_run_end``."""

import json
from types import SimpleNamespace

import pytest
from report_testlib import entropy_collapse, healthy, make_run

import reinforge_report.plugin
from reinforge.plugin import RunContext
from reinforge.testing import check_entry_point, cli_main
from reinforge_report import ENTROPY, __version__
from reinforge_report.observers import STATE_KEY


@pytest.fixture
def pm(reinforge_pm):
    reinforge_pm.register(reinforge_report.plugin, name="reinforge-report")
    return reinforge_pm


def new_run(sentinels=None, report=None):
    sections = {"sentinels": sentinels, "report": report}
    return RunContext(config=SimpleNamespace(sections=sections, source="run.yaml"), kind="tune")


def end(pm, summary, sentinels=None, report=None):
    run = new_run(sentinels, report)
    pm.hook.on_run_start(run=run)
    pm.hook.on_run_end(summary=summary, run=run)
    return run


def test_entry_point_loads_and_registers_only_its_run_file_sections():
    # imports the module, registers it; fails on a broken hook or on anything else it registers
    found = check_entry_point("reinforge-report", run_sections=["report", "sentinels"])
    assert found["run_sections"] == ["report", "sentinels"]
    assert not any(names for kind, names in found.items() if kind != "run_sections")


def test_plugins_command_lists_the_package_and_its_hooks(capsys, monkeypatch):
    monkeypatch.setenv("REINFORGE_LOAD_PLUGINS", "reinforge-report")
    assert cli_main(["plugins", "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    row = rows["reinforge-report"]
    assert row["version"] == __version__
    assert {"register_commands", "on_run_start", "on_step_end", "on_run_end"} <= set(row["hooks"])


def test_report_command_end_to_end_writes_png_html_and_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("REINFORGE_LOAD_PLUGINS", "reinforge-report")  # through the entry point, as a user runs it
    run_dir = make_run(tmp_path, entropy_collapse)
    assert cli_main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    report = run_dir / "report"
    assert f"report:    {report / 'report.html'}" in out and "Entropy collapse" in out
    assert (report / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "data:image/png;base64," in (report / "report.html").read_text()
    assert json.loads((report / "report.json").read_text())["warnings"][0]["kind"] == ENTROPY
    # the same arguments as before the move: --out, --threshold, --json, --fail-on-warning
    args = ["report", str(run_dir), "--out", str(tmp_path / "o"), "--json", "--fail-on-warning"]
    assert cli_main(args) == 2
    assert json.loads(capsys.readouterr().out)["html"] == str(tmp_path / "o" / "report.html")
    assert (
        cli_main(["report", str(run_dir), "--threshold", "entropy_floor=0", "--threshold", "entropy_collapse_frac=0"])
        == 0
    )
    assert cli_main(["report", str(tmp_path / "absent")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_run_end_writes_the_report_into_the_run_folder(pm, tmp_path, capsys):
    run_dir = make_run(tmp_path, entropy_collapse)
    summary = {"status": "finished", "run_dir": str(run_dir)}
    run = end(pm, summary)
    assert summary["report"] == str(run_dir / "report" / "report.html")
    assert (run_dir / "report" / "report.png").is_file() and (run_dir / "report" / "report.json").is_file()
    assert f"reinforge: report {run_dir / 'report' / 'report.html'}" in capsys.readouterr().err
    assert STATE_KEY not in run.state  # the run's state is dropped at its end


def test_run_end_uses_the_run_files_thresholds(pm, tmp_path):
    run_dir = make_run(tmp_path, entropy_collapse)
    end(
        pm,
        {"status": "stopped", "run_dir": str(run_dir)},
        {"thresholds": {"entropy_floor": 0, "entropy_collapse_frac": 0}},
    )
    data = json.loads((run_dir / "report" / "report.json").read_text())
    assert data["warnings"] == [] and data["thresholds"]["entropy_floor"] == 0


@pytest.mark.parametrize(
    ("summary", "report"),
    [
        ({"status": "diverged"}, None),  # the metrics of a diverged run hold NaNs; its summary says what happened
        ({"status": "finished"}, {"enabled": False}),  # the run file's report: section says not to
    ],
)
def test_run_end_writes_no_report_when_told_not_to(pm, tmp_path, capsys, summary, report):
    run_dir = make_run(tmp_path, healthy)
    summary = {**summary, "run_dir": str(run_dir)}
    end(pm, summary, report=report)
    assert "report" not in summary and not (run_dir / "report").exists()
    assert capsys.readouterr().err == ""


def test_run_end_without_a_run_folder_does_nothing(pm, capsys):
    summary = {"status": "finished", "accuracy": 0.5}  # an eval run, say
    end(pm, summary)
    assert summary == {"status": "finished", "accuracy": 0.5} and capsys.readouterr().err == ""


def test_a_report_failure_is_printed_never_raised(pm, tmp_path, capsys):
    summary = {"status": "failed", "run_dir": str(tmp_path)}  # failed before any metrics were written
    end(pm, summary)
    assert "report" not in summary
    err = capsys.readouterr().err
    assert "reinforge: could not write the report: " in err and "metrics.jsonl" in err


def test_run_end_after_a_failed_start_still_reports(pm, tmp_path, capsys):
    run_dir = make_run(tmp_path, healthy)
    run = new_run({"hlat": True})
    with pytest.raises(Exception, match="sentinels.hlat"):
        pm.hook.on_run_start(run=run)
    summary = {"status": "failed", "run_dir": str(run_dir)}
    pm.hook.on_run_end(summary=summary, run=run)  # core calls it from a finally
    assert summary["report"].endswith("report.html")


def test_loading_the_plugin_imports_nothing_heavy():
    import subprocess
    import sys

    code = "import json, sys, reinforge_report.plugin, reinforge_report; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = {m.split(".")[0] for m in json.loads(out.stdout)}
    assert not loaded & {"matplotlib", "numpy", "PIL"}  # every `reinforge` command loads the plugin
