"""Findings of the core 0.3 issue on the command line and datasets: eval output, try, result shape, datasets.

Each test fails on the core before 0.3 (commit 5195295).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reinforge import hookimpl
from reinforge.cli import main
from reinforge.config import DatasetConfig
from reinforge.errors import ConfigError
from reinforge.evaluation import evaluate
from reinforge.plugin import Backend
from reinforge.plugins import get_plugin_manager
from reinforge.runfile import load_run
from reinforge.testing.openai_server import OpenAIServer

WORKFLOWS = """
from reinforge import TaskStatus, WorkflowOutput


async def echo(task, model):
    if task.get("fail"):
        return WorkflowOutput(status=TaskStatus.FAILED, error="the tool service returned 503")
    return WorkflowOutput(response=task["text"])
"""

JUDGES = """
import math

from reinforge import JudgeOutput, TaskStatus


def flaky(task, response):
    return JudgeOutput(status=TaskStatus.FAILED, error="rate limited")


def permanent(task, response):
    return JudgeOutput(status=TaskStatus.ERROR, error="the rubric file does not parse")


def raises(task, response):
    raise ValueError("the judge has a bug")


def nan_number(task, response):
    return math.nan


def nan_output(task, response):
    return JudgeOutput(reward=float("nan"))


class Keyword:
    closed = []

    def __init__(self, keyword="please"):
        self.keyword = keyword

    def __call__(self, task, response):
        return 1.0 if self.keyword in str(response) else 0.0

    def close(self):
        Keyword.closed.append(self.keyword)
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "wf.py").write_text(WORKFLOWS)
    (tmp_path / "jd.py").write_text(JUDGES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("wf", "jd"):
        monkeypatch.delitem(__import__("sys").modules, name, raising=False)
    return tmp_path


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [{"text": "please"}, {"text": "no", "fail": True}, {"text": "please do"}]


def eval_run(project: Path, server: OpenAIServer, dataset: str = "{path: data.jsonl}", extra: str = "") -> Path:
    run = project / "run.yaml"
    run.write_text(
        "workflow: wf:echo\n"
        "judges: [{name: contains, args: {field: text}}]\n"
        f"eval_dataset: {dataset}\n"
        f'model: {{model_path: scripted, api_base: "{server.base_url}"}}\n'
        "runner: {max_retries: 0}\n" + extra
    )
    return run


# -- 1. eval --output holds every trajectory, the discarded ones with status and reason ----------------


def test_eval_output_holds_discarded_trajectories_with_status_and_reason(project: Path, capsys) -> None:
    write_rows(project / "data.jsonl", ROWS)
    with OpenAIServer(lambda body: "unused") as server:
        run = eval_run(project, server)
        assert main(["eval", str(run), "--output", str(project / "out.json")]) == 0
    data = json.loads((project / "out.json").read_text())
    trajs = data["trajectories"]
    assert [t["task"]["text"] for t in trajs] == ["please", "no", "please do"]
    assert [t["kept"] for t in trajs] == [True, False, True]
    failed = trajs[1]
    assert failed["status"] == "failed"
    assert "the tool service returned 503" in failed["error"]
    assert "the tool service returned 503" in failed["discard_reason"]
    assert data["summary"]["discarded"] == 1 and data["summary"]["kept"] == 2
    assert "3 trajectories, 1 discarded" in capsys.readouterr().out


# -- 2. try names the function by its registered name, builds classes, exits 1 when it failed -------------


def judge_input(project: Path, response: str = "please help") -> str:
    path = project / "in.json"
    path.write_text(json.dumps({"task": {"answer": "please"}, "response": response}))
    return str(path)


def test_try_names_a_builtin_by_its_registered_name(project: Path, capsys) -> None:
    assert main(["try", "judge", "contains", "--input", judge_input(project)]) == 0
    out = capsys.readouterr().out
    assert "judge contains: reward 1.0, status success" in out
    assert "reinforge.judges" not in out  # not the Python path


def test_try_builds_a_class_component_with_args_and_closes_it(project: Path, capsys) -> None:
    import jd

    code = main(["try", "judge", "jd:Keyword", "--args", '{"keyword": "help"}', "--input", judge_input(project)])
    assert code == 0
    assert "judge jd:Keyword: reward 1.0" in capsys.readouterr().out
    assert jd.Keyword.closed == ["help"]


def test_try_uses_a_plugins_registered_name(project: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    import jd

    class Plugin:
        @hookimpl
        def register_judges(self, register):
            register("polite", jd.Keyword)

    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(Plugin(), name="polite-plugin")
    monkeypatch.setattr("reinforge.plugins.get_plugin_manager", lambda **kw: pm)
    assert main(["try", "judge", "polite", "--args", '{"keyword": "nope"}', "--input", judge_input(project)]) == 0
    assert "judge polite: reward 0.0" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("jd:flaky", "judge jd:flaky returned FAILED: rate limited"),
        ("jd:permanent", "judge jd:permanent reported a permanent error: the rubric file does not parse"),
    ],
)
def test_try_exits_non_zero_when_the_judge_failed(project: Path, capsys, ref: str, message: str) -> None:
    assert main(["try", "judge", ref, "--input", judge_input(project)]) == 1
    assert message in capsys.readouterr().err


def test_try_workflow_that_failed_exits_non_zero_and_skips_judges(project: Path, capsys) -> None:
    inp = project / "wf.json"
    inp.write_text(json.dumps({"task": {"text": "x", "fail": True}}))
    with OpenAIServer(lambda body: "unused") as server:
        code = main(
            ["try", "workflow", "wf:echo", "--input", str(inp), "--api-base", server.base_url, "--judge", "contains"]
        )
    captured = capsys.readouterr()
    assert code == 1
    assert "workflow wf:echo returned FAILED: the tool service returned 503" in captured.err
    assert "judges not called" in captured.out


# -- 3. a judge that raises or returns NaN: an error naming it, no traceback, exit 1 -----------------------


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("jd:raises", "judge jd:raises raised ValueError: the judge has a bug"),
        ("jd:nan_number", "judge jd:nan_number returned a non-finite reward: nan"),
        ("jd:nan_output", "judge jd:nan_output: JudgeOutput.reward must be finite"),
    ],
)
def test_try_judge_that_raises_or_returns_nan_names_it(project: Path, capsys, ref: str, message: str) -> None:
    assert main(["try", "judge", ref, "--input", judge_input(project)]) == 1
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err


def test_try_judge_that_raises_points_at_the_line(project: Path, capsys) -> None:
    assert main(["try", "judge", "jd:raises", "--input", judge_input(project)]) == 1
    assert f"(at {project / 'jd.py'}:" in capsys.readouterr().err


# -- 4. one result shape: EvalReport and the CLI JSON -------------------------------------------------------


def test_eval_report_and_cli_json_have_one_shape(project: Path, capsys) -> None:
    write_rows(project / "data.jsonl", ROWS)
    with OpenAIServer(lambda body: "unused") as server:
        run = eval_run(project, server)
        report = evaluate(load_run(run))
        assert main(["eval", str(run), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    summary = report.summary()
    assert set(printed) == set(summary)
    for key, value in summary.items():
        if key != "seconds":
            assert value == getattr(report, key), key  # every key of the JSON is the report's field
    assert set(printed["metrics"]) == set(report.metrics)
    assert printed["dimensions"] == report.dimensions
    assert printed["dimensions"]["reward/contains"] == report.metrics["reward/contains/mean"] == 1.0
    assert "reward/contains/mean" in printed["metrics"] and "reward/contains" not in printed["metrics"]


# -- 5. the split reported is the split read ---------------------------------------------------------------


def test_eval_reports_a_single_file_read_whole_not_split_train(project: Path, capsys) -> None:
    write_rows(project / "data.jsonl", ROWS[:1])
    with OpenAIServer(lambda body: "unused") as server:
        assert main(["eval", str(eval_run(project, server)), "--json"]) == 0
    out = capsys.readouterr().out
    assert "data.jsonl (the whole file)" in out.splitlines()[0]
    assert "split train" not in out
    assert json.loads(out.strip().splitlines()[-1])["split"] is None


def test_eval_reports_the_split_read_from_a_folder(project: Path, capsys) -> None:
    (project / "data").mkdir()
    write_rows(project / "data" / "train.jsonl", ROWS[:1])
    write_rows(project / "data" / "test.jsonl", ROWS[2:])
    with OpenAIServer(lambda body: "unused") as server:
        assert main(["eval", str(eval_run(project, server, "{path: data, split: test}")), "--json"]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["split"] == "test" and summary["tasks"] == 1
        assert main(["eval", str(eval_run(project, server, "{path: data}")), "--json"]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["split"] == "train"  # no split named: datasets reads "train", and says so


# -- 6. a malformed JSONL row is a ConfigError naming the file and line --------------------------------------


def test_malformed_jsonl_row_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"q": 1}\n{"q": 2}\n{"q": 3\n{"q": 4}\n')
    with pytest.raises(ConfigError, match=r"bad\.jsonl:3: invalid JSON"):
        DatasetConfig(path=str(path)).load()


def test_json_row_that_is_not_an_object_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"q": "a"}\n[1, 2]\n')
    with pytest.raises(ConfigError, match=r"rows\.jsonl:2: expected a JSON object, got list"):
        DatasetConfig(path=str(path)).load()


def test_malformed_row_in_a_folder_through_eval(project: Path, capsys) -> None:
    (project / "data").mkdir()
    (project / "data" / "test.jsonl").write_text('{"text": "a"}\nnot json\n')
    with OpenAIServer(lambda body: "unused") as server:
        assert main(["eval", str(eval_run(project, server, "{path: data, split: test}"))]) == 1
    err = capsys.readouterr().err
    assert "test.jsonl:2: invalid JSON" in err and "eval_dataset.path" in err
    assert "Traceback" not in err


# -- 7. tune --dry-run loads the datasets; a missing path fails at once, the Hub is never retried -------------


class DryBackend(Backend):
    name = "dry"
    algorithms = {"grpo": None}

    def run(self, job):  # pragma: no cover - dry runs only
        raise AssertionError("a dry run must not train")


@pytest.fixture
def dry_backend(monkeypatch: pytest.MonkeyPatch):
    class Plugin:
        @hookimpl
        def register_backends(self, register):
            register("dry", DryBackend)

    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(Plugin(), name="dry-backend")
    monkeypatch.setattr("reinforge.plugins.get_plugin_manager", lambda **kw: pm)
    return pm


def tune_run(project: Path, train: str, eval_: str | None = None) -> str:
    run = project / "run.yaml"
    text = f"workflow: wf:echo\njudges: [contains]\nbackend: dry\ntrain_dataset: {train}\n"
    if eval_:
        text += f"eval_dataset: {eval_}\n"
    run.write_text(text)
    return str(run)


def test_tune_dry_run_loads_the_datasets_and_counts_rows(project: Path, dry_backend, capsys) -> None:
    write_rows(project / "train.jsonl", ROWS)
    write_rows(project / "test.jsonl", ROWS[:2])
    assert main(["tune", tune_run(project, "{path: train.jsonl}", "{path: test.jsonl}"), "--dry-run"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["datasets"]["train_dataset"]["rows"] == 3
    assert printed["datasets"]["eval_dataset"]["rows"] == 2
    assert printed["backend"] == "dry"


def _no_load(*args, **kwargs):
    raise AssertionError("datasets.load_dataset must not be called")


def test_tune_dry_run_fails_at_once_on_a_missing_path(
    project: Path, dry_backend, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets, "load_dataset", _no_load)
    assert main(["tune", tune_run(project, "{path: nosuchdata}"), "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "train_dataset.path: 'nosuchdata' does not exist" in err
    assert "not a Hugging Face Hub dataset id" in err


def test_hub_id_with_no_network_fails_without_asking_the_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    datasets = pytest.importorskip("datasets")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    attempts = []

    def refuse(address, timeout=None):
        attempts.append((address, timeout))
        raise OSError(101, "Network is unreachable")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(datasets, "load_dataset", _no_load)
    with pytest.raises(ConfigError, match="the Hugging Face Hub cannot be reached.*Network is unreachable"):
        DatasetConfig(path="someorg/nosuch-dataset").load()
    assert len(attempts) == 1  # one connection attempt, no retries with backoff


def test_hub_id_offline_asks_the_cache_once_with_no_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    calls = []

    def fake(path, name=None, split=None, download_config=None, **kwargs):
        calls.append(download_config)
        raise ConnectionError(f"Couldn't reach {path!r} on the Hub (OfflineModeIsEnabled)")

    monkeypatch.setattr(datasets, "load_dataset", fake)
    monkeypatch.setattr("reinforge.dataset_io._hub_unreachable", _no_load)  # offline: no connection is tried
    with pytest.raises(ConfigError, match="offline: only the local cache was searched"):
        DatasetConfig(path="someorg/nosuch-dataset").load()
    assert len(calls) == 1 and calls[0].max_retries == 0
