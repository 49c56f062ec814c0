"""Core builds one judge per run and closes it at the end: two runs in one process share no judge state.

Through core's ``evaluate`` (and ``build_job``), with the judge model behind a real OpenAI-compatible
server on 127.0.0.1: a verdict cached in the first run is not a cache hit in the second, the length
trend of the second run starts empty, and the judge's ``close()`` ran at the end of each run. Bad
judge settings fail ``reinforge tune --dry-run`` naming the file, ``judges[i]`` and the key, before
any model call.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from judges_llm_testlib import JudgeScript

from reinforge import RunnerConfig, WorkflowOutput, evaluate, tune
from reinforge.plugin import Backend, ComponentSpec, DatasetConfig, RunConfig, build_job, get_plugin_manager, hookimpl
from reinforge.testing import ScriptedChatModel, cli_main
from reinforge_judges_llm import PointwiseJudge

N = 6
ANSWERS = {f"question {i}": "answer " + "and more " * (3**i % 97) for i in range(N)}


def length_loving(task: str, response: str, reference: str | None) -> int:
    """A judge that likes long answers: 1 to 5 by length."""
    return min(5, 1 + int(math.log10(len(response))))


def student(messages, tools, sampling) -> str:
    return ANSWERS[messages[-1]["content"]]


async def answer(task, model):
    reply = await model.chat([{"role": "user", "content": task["question"]}])
    return WorkflowOutput(response=reply.content)


def make_run(tmp_path: Path, grader_url: str) -> RunConfig:
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps({"question": q}) + "\n" for q in ANSWERS))
    args = {
        "model": "grader",
        "api_base": grader_url,
        "length_normalization": True,
        "length_min_samples": 2,
        "max_retries": 0,
        "backoff_s": 0,
    }
    return RunConfig(
        workflow=ComponentSpec(ref=answer),
        judges=[ComponentSpec(ref="llm-pointwise", name="quality", args=args)],
        eval_dataset=DatasetConfig(path=str(data)),
        runner=RunnerConfig(max_concurrency=1),  # one judgment after the other: the trend sees them in order
    )


@pytest.fixture
def closed(monkeypatch) -> list[dict]:
    """What every PointwiseJudge held when it was closed."""
    seen: list[dict] = []
    original = PointwiseJudge.close

    def spy(self) -> None:
        seen.append({"judge": self, "trend": len(self.length_trend), "cached": len(self.client.cache)})
        original(self)

    monkeypatch.setattr(PointwiseJudge, "close", spy)
    return seen


def test_two_evaluations_in_one_process_share_no_judge_state(openai_server, tmp_path, closed) -> None:
    grader = openai_server(JudgeScript(pointwise=length_loving), model_name="grader")
    run = make_run(tmp_path, grader.base_url)

    first = evaluate(run, model=ScriptedChatModel(student))
    assert first.kept == N and grader.call_count == N
    assert len(closed) == 1 and closed[0]["judge"].closed  # closed when the first run ended
    assert closed[0]["trend"] == N and closed[0]["cached"] == N

    second = evaluate(run, model=ScriptedChatModel(student))
    assert second.kept == N
    assert grader.call_count == 2 * N  # nothing the first run cached was a hit in the second
    assert all(t.rewards["reward/quality/usage/cache_hits"] == 0.0 for t in second.trajectories)
    assert len(closed) == 2 and closed[1]["judge"] is not closed[0]["judge"]  # a new judge for the new run
    assert closed[1]["trend"] == N and closed[1]["cached"] == N  # its length trend started empty

    def adjustments(report) -> list[float]:
        return [t.rewards["reward/quality/length_adjustment"] for t in report.trajectories]

    # the trend adjusts once it has length_min_samples (2) points, and in each run the first judgment,
    # made with an empty trend, is left alone: a trend carried over would have adjusted it
    for report in (first, second):
        assert any(a < 0.0 for a in adjustments(report)) and 0.0 in adjustments(report)


class OneBatch(Backend):
    """A backend that trains on one batch of the scripted student (enough to be a tune run)."""

    name = "one-batch"
    algorithms = {"grpo": None}

    def run(self, job):
        with job.running() as run:
            rows = [dict(r) for r in job.run.train_dataset.rows()]
            result = job.make_runner(model=ScriptedChatModel(student), group_size=1).run(rows)
            run.step_end(result.metrics, step=1)
        return {"steps": 1, "trajectories": result.trajectories}


class OneBatchPlugin:
    @hookimpl
    def register_backends(self, register):
        register("one-batch", OneBatch)


def test_an_eval_then_a_tune_in_one_process_share_no_judge_state(openai_server, tmp_path, closed) -> None:
    grader = openai_server(JudgeScript(pointwise=length_loving), model_name="grader")
    run = make_run(tmp_path, grader.base_url)
    run.train_dataset = run.eval_dataset
    evaluate(run, model=ScriptedChatModel(student))
    assert grader.call_count == N and len(closed) == 1
    pm = get_plugin_manager()
    pm.register(OneBatchPlugin(), name="one-batch-backend")
    summary = tune(run=run, backend="one-batch", plugin_manager=pm)
    assert summary["status"] == "finished"
    assert grader.call_count == 2 * N  # the tune's judge asked again: the eval's verdicts were not shared
    assert all(t.rewards["reward/quality/usage/cache_hits"] == 0.0 for t in summary["trajectories"])
    assert len(closed) == 2 and closed[1]["judge"] is not closed[0]["judge"]
    assert closed[1]["trend"] == N  # the tune's length trend started empty


def test_each_built_job_owns_its_judge_and_closing_the_job_closes_it(openai_server, tmp_path, closed) -> None:
    grader = openai_server(JudgeScript(pointwise=length_loving), model_name="grader")
    run = make_run(tmp_path, grader.base_url)
    jobs = [build_job(run, need_backend=False) for _ in range(2)]
    judges = [job.composer.judges[0].fn.func for job in jobs]
    assert all(isinstance(j, PointwiseJudge) for j in judges) and judges[0] is not judges[1]
    assert judges[0].client is not judges[1].client and judges[0].client.cache is not judges[1].client.cache
    for job in jobs:
        job.close()
        job.close()  # idempotent
    assert [c["judge"] for c in closed] == judges
    assert grader.call_count == 0  # building a judge calls no model


def write_run_file(tmp_path: Path, judge_args: dict) -> Path:
    data = tmp_path / "tasks.jsonl"
    data.write_text(json.dumps({"question": "question 0"}) + "\n")
    run = {
        "workflow": {"name": f"{Path(__file__).stem}:answer"},
        "judges": [
            {"name": "last_number", "metric": "correct"},
            {"name": "llm-pointwise", "metric": "quality", "args": judge_args},
        ],
        "train_dataset": {"path": "tasks.jsonl"},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"temperatur": 0.0}, "judges[1]: unknown key 'args.temperatur' (did you mean 'temperature'?)"),
        ({"max_retries": "3"}, "judges[1]: args.max_retries: expected an integer, got str '3'"),
        ({"scale": [5, 1]}, "judges[1]: args.scale: must be [low, high] integers with low < high"),
        ({"self_preference": "never"}, "judges[1]: args.self_preference: must be one of error, warn, off"),
    ],
)
def test_bad_judge_settings_fail_tune_dry_run_naming_the_file_and_key(
    openai_server, tmp_path, capsys, monkeypatch, bad, message
) -> None:
    grader = openai_server(JudgeScript(pointwise=length_loving), model_name="grader")
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    run_file = write_run_file(tmp_path, {"model": "grader", "api_base": grader.base_url, **bad})
    assert cli_main(["tune", str(run_file), "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert f"{run_file.resolve()}: {message}" in err
    assert grader.call_count == 0
