"""``reinforge report``: synthetic runs that show each reward-hacking pattern, and bad inputs."""

import argparse
import json
import re

import pytest
from report_testlib import STEPS, divergence, entropy_collapse, healthy, length_explosion, make_run

from reinforge.plugin import ConfigError, MissingExtraError
from reinforge_report import (
    DIVERGENCE,
    ENTROPY,
    LENGTH,
    Thresholds,
    detect_warnings,
    load_metrics,
    write_report,
)
from reinforge_report.command import add_arguments, run


def kinds(run_dir):
    notes = []
    return sorted({w.kind for w in detect_warnings(load_metrics(run_dir), notes=notes)})


@pytest.mark.parametrize("noise", [0.0, 0.01])
def test_healthy_run_has_no_warning(tmp_path, noise):
    assert kinds(make_run(tmp_path, healthy, noise=noise)) == []


def test_training_up_validation_down_is_flagged(tmp_path):
    warnings = detect_warnings(load_metrics(make_run(tmp_path, divergence)))
    assert [w.kind for w in warnings] == [DIVERGENCE]
    w = warnings[0]
    assert 15 <= w.start_step <= 25 and w.end_step == STEPS  # the span where validation falls
    assert "validation accuracy/greedy" in w.metrics
    assert w.values["train reward/mean change"] > 0 > w.values["validation accuracy/greedy change"]


def test_length_growth_with_flat_reward_is_flagged(tmp_path):
    warnings = detect_warnings(load_metrics(make_run(tmp_path, length_explosion)))
    assert [w.kind for w in warnings] == [LENGTH]
    assert warnings[0].start_step == 1 and warnings[0].end_step == STEPS
    assert warnings[0].values["length growth"] > 0.2


def test_length_growth_with_rising_reward_is_not_flagged(tmp_path):
    def longer_and_better(step):
        row = healthy(step)
        row["length"] = 100 * 1.04**step
        return row

    assert kinds(make_run(tmp_path, longer_and_better)) == []


def test_length_growth_with_training_reward_up_but_validation_flat_is_flagged(tmp_path):
    def verbose_judge(step):  # the judge pays for length, held-out accuracy does not move
        row = length_explosion(step)
        row["reward/mean"] = 0.2 + 0.5 * step / STEPS
        return row

    warnings = detect_warnings(load_metrics(make_run(tmp_path, verbose_judge)))
    assert LENGTH in {w.kind for w in warnings}
    assert any(m.startswith("validation") for w in warnings if w.kind == LENGTH for m in w.metrics)


def test_entropy_collapse_is_flagged(tmp_path):
    warnings = detect_warnings(load_metrics(make_run(tmp_path, entropy_collapse)))
    assert [w.kind for w in warnings] == [ENTROPY]
    w = warnings[0]
    # 1.2 * exp(-t/6) < 0.15 * initial (about 0.92) first holds at step 14
    assert 12 <= w.start_step <= 16 and w.end_step == STEPS
    assert w.values["min"] < w.values["threshold"]


def test_thresholds_are_configurable(tmp_path):
    run_dir = make_run(tmp_path, entropy_collapse)
    assert kinds(run_dir) == [ENTROPY]
    loose = Thresholds(entropy_collapse_frac=0.0, entropy_floor=0.0)
    assert detect_warnings(load_metrics(run_dir), loose) == []
    assert Thresholds.parse(["entropy_collapse_frac=0.05", "length-window=6"]) == Thresholds(
        entropy_collapse_frac=0.05, length_window=6
    )
    with pytest.raises(ConfigError, match="entropy_collapse_frac"):
        Thresholds.parse(["nope=1"])
    with pytest.raises(ConfigError, match="not a number"):
        Thresholds.parse(["entropy_floor=abc"])
    with pytest.raises(ConfigError, match="length_window"):
        Thresholds(length_window=1)


def test_checks_without_data_are_skipped_with_a_note(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps({"kind": "train", "step": s, "loss": 1.0 / s}) + "\n" for s in range(1, 4))
    )
    notes = []
    assert detect_warnings(load_metrics(run_dir), notes=notes) == []
    assert any("divergence" in n for n in notes) and any("entropy" in n for n in notes)
    result = write_report(run_dir)  # a run with only a loss still gets a report
    assert result.png.stat().st_size > 0 and result.warnings == []


def test_report_files_are_written_and_html_is_self_contained(tmp_path):
    run_dir = make_run(tmp_path, divergence, noise=0.01)
    result = write_report(run_dir)
    assert result.out_dir == run_dir / "report"
    assert result.png == run_dir / "report" / "report.png"
    assert result.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [w.kind for w in result.warnings] == [DIVERGENCE]
    page = result.html.read_text()
    assert "data:image/png;base64," in page
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "<link" not in page and "<script" not in page
    assert "http" not in page
    assert "Training reward up, validation down" in page
    assert "demo / divergence" in page and "smollm2-135m-instruct" in page and "grpo" in page
    assert "accuracy/greedy" in page  # the metrics table
    summary = json.loads(result.json.read_text())
    assert summary["warnings"][0]["kind"] == DIVERGENCE
    assert {row["metric"] for row in summary["metrics"]} >= {"reward/mean", "accuracy/greedy", "entropy"}


def test_out_dir_and_no_config(tmp_path):
    run_dir = make_run(tmp_path, healthy, config=False)
    result = write_report(run_dir, tmp_path / "elsewhere")
    assert result.html.parent == tmp_path / "elsewhere" and result.png.exists()
    assert "No warnings" in result.html.read_text()


def test_unreadable_config_is_a_note_not_an_error(tmp_path):
    run_dir = make_run(tmp_path, healthy)
    (run_dir / "config.json").write_text("{not json")
    result = write_report(run_dir)
    assert any("config.json" in n for n in result.notes)


def test_tolerates_missing_keys_unknown_kinds_and_repeated_steps(tmp_path):
    extra = [
        {"kind": "checkpoint", "step": 5, "path": "ckpt"},
        {"kind": "train", "step": 3, "reward/mean": 0.99},  # a resumed run logs step 3 again: the later line wins
        {"kind": "train", "reward/mean": 0.5},  # no step: skipped and noted
        {"kind": "train", "step": 41, "reward/mean": float("nan")},
    ]
    run_dir = make_run(tmp_path, healthy, extra_lines=extra)
    data = load_metrics(run_dir)
    assert data.train[3] == {"reward/mean": 0.99}
    assert 41 in data.train and "reward/mean" not in data.train[41]
    assert data.dimensions() == ["correct", "format"]
    result = write_report(run_dir)
    assert any("no numeric step" in n for n in result.notes)


def test_missing_folder_and_file_name_the_path(tmp_path):
    with pytest.raises(ConfigError, match=re.escape(str(tmp_path / "absent"))):
        write_report(tmp_path / "absent")
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(ConfigError, match=re.escape(str(tmp_path / "empty_run" / "metrics.jsonl"))):
        write_report(tmp_path / "empty_run")


@pytest.mark.parametrize("bad", ["{not json", "[1, 2]"])
def test_malformed_line_names_file_and_line(tmp_path, bad):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    good = json.dumps({"kind": "train", "step": 1, "reward/mean": 0.1})
    (run_dir / "metrics.jsonl").write_text(f"{good}\n\n{bad}\n")
    with pytest.raises(ConfigError, match=re.escape(str(run_dir / "metrics.jsonl")) + ":3:"):
        write_report(run_dir)


def test_empty_metrics_file_is_an_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("\n")
    with pytest.raises(ConfigError, match="no train or eval lines"):
        load_metrics(tmp_path)


def test_missing_matplotlib_says_what_to_install(tmp_path, monkeypatch):
    import sys

    for name in ("matplotlib", "matplotlib.pyplot"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import matplotlib` fail
    with pytest.raises(MissingExtraError, match=re.escape("pip install 'matplotlib>=3.7'")):
        write_report(make_run(tmp_path, healthy))


def test_cli_entry_points(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    run_dir = make_run(tmp_path, entropy_collapse)
    assert run(parser.parse_args([str(run_dir)])) == 0
    out = capsys.readouterr().out
    assert str(run_dir / "report" / "report.html") in out and "Entropy collapse" in out
    args = parser.parse_args([str(run_dir), "--fail-on-warning", "--json", "--out", str(tmp_path / "o")])
    assert run(args) == 2
    printed = json.loads(capsys.readouterr().out)
    assert printed["warnings"][0]["kind"] == ENTROPY and printed["html"] == str(tmp_path / "o" / "report.html")
    quiet = parser.parse_args(
        [str(run_dir), "--threshold", "entropy_collapse_frac=0", "--threshold", "entropy_floor=0"]
    )
    assert run(quiet) == 0


def test_many_reward_dimensions_share_one_panel(tmp_path):
    run_dir = tmp_path / "many"
    run_dir.mkdir()
    rows = [
        {"kind": "train", "step": s, "reward/mean": 0.1 * s, **{f"reward/judge/d{i}/mean": 0.1 * i for i in range(9)}}
        for s in range(1, 6)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load_metrics(run_dir)
    assert data.dimensions() == [f"judge/d{i}" for i in range(9)]
    result = write_report(run_dir)
    assert result.png.stat().st_size > 0
