"""Through core's real lifecycle: ``tune(..., sentinels=...)`` on a backend that replays a synthetic run."""

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from report_testlib import entropy_collapse, healthy

import reinforge_report.plugin
from reinforge import DatasetConfig, JudgeOutput, WorkflowOutput, tune
from reinforge.plugin import Backend, ConfigError, Settings, hookimpl

PATTERNS = {"healthy": healthy, "entropy_collapse": entropy_collapse}


@dataclass
class ReplaySettings(Settings):
    out_dir: str = ""
    pattern: str = "healthy"


class ReplayBackend(Backend):
    """Writes a synthetic run's records to metrics.jsonl and reports each through the lifecycle, as a backend does."""

    name = "replay"
    settings = ReplaySettings
    algorithms = {"grpo": None}

    def run(self, job):
        from report_testlib import records

        opts = job.backend_settings
        run_dir = Path(opts.out_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        steps = 0
        with job.running() as run, (run_dir / "metrics.jsonl").open("w") as log:
            run.set_run_dir(run_dir)
            for record in records(PATTERNS[opts.pattern]):
                if run.stop_requested:
                    break  # a real backend also evaluates and saves here
                log.write(json.dumps(record) + "\n")
                log.flush()
                metrics = {k: v for k, v in record.items() if k not in ("kind", "step")}
                if record["kind"] == "train":
                    run.step_end(metrics, step=record["step"])
                    steps = record["step"]
                else:
                    run.eval_end(metrics, step=record["step"])
        return {"steps": steps}


async def workflow(task, model, auxiliary_models=None):
    return WorkflowOutput(response="4")


async def judge(task, response, auxiliary_models=None):
    return JudgeOutput(reward=1.0)


@pytest.fixture
def pm(reinforge_pm):
    class Backends:
        @hookimpl
        def register_backends(self, register):
            register("replay", ReplayBackend)

    reinforge_pm.register(Backends(), name="test-backends")
    reinforge_pm.register(reinforge_report.plugin, name="reinforge-report")
    return reinforge_pm


def run_tune(pm, tmp_path, pattern, **options):
    (tmp_path / "train.jsonl").write_text('{"question": "2 + 2?", "answer": "4"}\n')
    return tune(
        workflow_func=workflow,
        judge_func=judge,
        train_dataset=DatasetConfig(path=str(tmp_path / "train.jsonl")),
        backend="replay",
        backend_args={"out_dir": str(tmp_path / "run"), "pattern": pattern},
        plugin_manager=pm,
        **options,
    )


def test_halting_sentinel_stops_tune_and_the_summary_says_why(pm, tmp_path, capsys):
    summary = run_tune(pm, tmp_path, "entropy_collapse", sentinels={"halt": True})
    assert summary["status"] == "stopped" and summary["steps"] < 40
    assert summary["stop_reason"].startswith("sentinel entropy_collapse: entropy fell to ")
    assert summary["report"] == str(tmp_path / "run" / "report" / "report.html")  # what tune() returns
    assert (tmp_path / "run" / "report" / "report.png").is_file()
    err = capsys.readouterr().err
    assert "reinforge: sentinel: entropy_collapse at steps " in err and "reinforge: report " in err


def test_without_halt_the_run_finishes_with_its_report(pm, tmp_path, capsys):
    summary = run_tune(pm, tmp_path, "entropy_collapse")
    assert summary["status"] == "finished" and summary["steps"] == 40 and "stop_reason" not in summary
    report = json.loads((tmp_path / "run" / "report" / "report.json").read_text())
    assert [w["kind"] for w in report["warnings"]] == ["entropy_collapse"]
    assert capsys.readouterr().err.count("reinforge: sentinel: ") == 1


def test_a_typo_in_sentinels_fails_before_the_backend_runs(pm, tmp_path):
    with pytest.raises(ConfigError, match=r"sentinels\.hlat"):
        run_tune(pm, tmp_path, "healthy", sentinels={"hlat": True})
    assert not (tmp_path / "run").exists()


def test_the_report_section_switches_the_report_off(pm, tmp_path):
    summary = run_tune(pm, tmp_path, "healthy", report={"enabled": False})
    assert summary["status"] == "finished" and "report" not in summary
    assert not (tmp_path / "run" / "report").exists()


def test_a_typo_in_the_report_section_fails_before_the_backend_runs(pm, tmp_path):
    with pytest.raises(ConfigError, match=r"unknown key 'report\.enabeld' \(did you mean 'enabled'\?\)"):
        run_tune(pm, tmp_path, "healthy", report={"enabeld": False})
    assert not (tmp_path / "run").exists()
