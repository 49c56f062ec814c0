"""examples/math with llm-pointwise as one judge dimension, end to end through `reinforge eval`.

The policy is served by one OpenAI-compatible test server (a scripted student), the judge model by
another; both are called through LiteLLM. A second run adds a rule gate: responses that fail it never
reach the model judge.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from judges_llm_testlib import JudgeScript

from reinforge.testing import cli_main

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "math"
N = 12


def student(body: dict) -> str:
    """Right and terse, right and chatty, or wrong, depending on the numbers asked."""
    a, b = map(int, re.findall(r"-?\d+", body["messages"][-1]["content"])[:2])
    kind = (a + b) % 3
    if kind == 0:
        return str(a + b)
    if kind == 1:
        return f"Let me think. {a} plus {b} is {a + b}."
    return str(a + b + 1)


def judge_says(task: str, response: str, reference: str | None) -> int:
    """A grader model: 5 for the right bare number, 3 for right but chatty, 1 for wrong."""
    right = re.findall(r"-?\d+", response)[-1:] == [reference]
    if not right:
        return 1
    return 5 if response.strip() == reference else 3


def copy_example(tmp_path: Path, judge_url: str, *, gate: bool = False) -> Path:
    if not EXAMPLE.is_dir():
        pytest.skip(f"{EXAMPLE} is not in this checkout")
    folder = tmp_path / "math"
    shutil.copytree(EXAMPLE, folder)
    run = yaml.safe_load((folder / "run.yaml").read_text())
    weights = {"correct": 0.6, "format": 0.1, "concise": 0.1}
    run["judges"] = [spec for spec in run["judges"] if not spec.get("gate")]  # this test adds its own gate
    for spec in run["judges"]:
        spec["weight"] = weights[spec["metric"]]
    run["judges"].append(
        {
            "name": "llm-pointwise",
            "metric": "quality",
            "weight": 0.2,
            "args": {
                "model": "grader",
                "api_base": judge_url,
                "rubric": "Is the sum right, and is the reply just the number as asked?",
                "reference_field": "answer",
                "max_retries": 1,
                "backoff_s": 0,
            },
        }
    )
    if gate:
        run["judges"].append({"name": "regex", "gate": True, "args": {"pattern": r"-?\d+", "fullmatch": True}})
    (folder / "run.yaml").write_text(yaml.safe_dump(run, sort_keys=False))
    return folder / "run.yaml"


def evaluate(run_file: Path, student_url: str, out_file: Path, capsys) -> tuple[dict, list[dict]]:
    argv = ["eval", str(run_file), "--api-base", student_url, "--model", "scripted-student", "--limit", str(N)]
    code = cli_main([*argv, "--json", "--output", str(out_file)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    summary = json.loads(printed.out.strip().splitlines()[-1])
    return summary, json.loads(out_file.read_text())["trajectories"]


def test_math_eval_with_llm_pointwise_as_one_dimension(openai_server, tmp_path, capsys) -> None:
    policy = openai_server(student, model_name="scripted-student")
    grader = openai_server(JudgeScript(pointwise=judge_says), model_name="grader")
    summary, trajectories = evaluate(
        copy_example(tmp_path, grader.base_url), policy.base_url, tmp_path / "o.json", capsys
    )

    assert summary["tasks"] == N and summary["kept"] == N and summary["counters"].get("failed", 0) == 0
    assert "reward/quality" in summary["dimensions"]
    assert grader.call_count == N and policy.call_count == N
    for t in trajectories:
        r = t["rewards"]
        expected_quality = (judge_says("", t["response"], t["task"]["answer"]) - 1) / 4
        assert r["reward/quality"] == pytest.approx(expected_quality)
        assert r["reward/quality/verdict"] == judge_says("", t["response"], t["task"]["answer"])
        composed = 0.6 * r["reward/correct"] + 0.1 * r["reward/format"] + 0.1 * r["reward/concise"]
        assert t["reward"] == pytest.approx(composed + 0.2 * r["reward/quality"])
    mean_quality = sum(t["rewards"]["reward/quality"] for t in trajectories) / N
    assert summary["dimensions"]["reward/quality"] == pytest.approx(mean_quality)
    # every grader request was deterministic and carried the task's reference answer
    assert all(req["temperature"] == 0.0 and "<reference>" in req["messages"][-1]["content"] for req in grader.requests)


def test_responses_failing_the_rule_gate_never_reach_the_llm_judge(openai_server, tmp_path, capsys) -> None:
    policy = openai_server(student, model_name="scripted-student")
    grader = openai_server(JudgeScript(pointwise=judge_says), model_name="grader")
    run_file = copy_example(tmp_path, grader.base_url, gate=True)
    summary, trajectories = evaluate(run_file, policy.base_url, tmp_path / "o.json", capsys)
    passed = [t for t in trajectories if t["rewards"]["gate/regex"] == 1.0]
    failed = [t for t in trajectories if t["rewards"]["gate/regex"] == 0.0]
    assert passed and failed  # the chatty answers fail the gate
    assert grader.call_count == len(passed)
    judged = {
        m["content"].split("<response>\n")[1].split("\n</response>")[0]
        for r in grader.requests
        for m in r["messages"][-1:]
    }
    assert judged == {t["response"] for t in passed}
    assert all(t["reward"] == 0.0 and "reward/quality" not in t["rewards"] for t in failed)


def test_a_run_requiring_calibration_stops_before_scoring_when_the_judge_fails_it(openai_server, tmp_path, capsys):
    gold = Path(__file__).parent / "data" / "gold.jsonl"
    policy = openai_server(student, model_name="scripted-student")
    grader = openai_server(JudgeScript(pointwise=lambda task, response, reference: 3), model_name="grader")
    run_file = copy_example(tmp_path, grader.base_url)
    run = yaml.safe_load(run_file.read_text())
    run["judges"][-1]["args"]["require_calibration"] = str(gold)
    run_file.write_text(yaml.safe_dump(run, sort_keys=False))
    code = cli_main(
        ["eval", str(run_file), "--api-base", policy.base_url, "--model", "scripted-student", "--limit", "4"]
    )
    err = capsys.readouterr().err
    assert code == 1
    assert "judge 'llm-pointwise': args.require_calibration failed" in err
    assert "Spearman rho is undefined" in err  # a judge that gives every answer a 3 agrees with nobody
    assert grader.call_count == 8  # the gold set only: no response of the run was scored
