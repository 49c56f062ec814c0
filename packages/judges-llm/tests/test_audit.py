"""reinforge judge audit: position-flip rate and length correlation on a sample."""

from __future__ import annotations

import json
import math

import pytest
from judges_llm_testlib import JudgeScript, quality

from reinforge.testing import cli_main
from reinforge_judges_llm import audit


def better(task, a, b):
    qa, qb = quality(a), quality(b)
    return "A" if qa > qb else "B" if qb > qa else "tie"


def length_loving(task, response, reference):
    return min(5, 1 + int(math.log10(len(response))))


def write_sample(path, *, reference: bool = False) -> None:
    lines = []
    for i in range(20):  # quality 1-5 crossed with 4 lengths: no true length-quality correlation
        t, q, pad = i // 2, i % 5 + 1, [0, 3, 30, 300][i // 5]
        text = f"answer {i:02d} quality={q} " + "more words " * pad
        task = {"question": f"question {t}"}  # two responses per task, so pairs can be compared
        if reference:
            task["reference"] = f"reference {t} quality=3"
        lines.append(json.dumps({"task": task, "response": text}))
    path.write_text("\n".join(lines) + "\n")


def _report(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_audit_catches_a_position_biased_pairwise_judge(openai_server, tmp_path, capsys) -> None:
    sample = tmp_path / "sample.jsonl"
    write_sample(sample, reference=True)
    srv = openai_server(JudgeScript(pairwise=lambda task, a, b: "A"))
    args = json.dumps({"model": "judge", "api_base": srv.base_url})
    code = cli_main(["judge", "audit", "--judge", "llm-pairwise", "--sample", str(sample), "--args", args, "--json"])
    report = _report(capsys)
    assert code == 1
    assert report["flip_rate"] == 1.0 and report["comparisons"] == 20
    assert report["flip_source"] == "the judge's own position_flip metric"


def test_audit_catches_length_bias_and_position_bias_of_a_pointwise_judge(openai_server, tmp_path, capsys) -> None:
    sample = tmp_path / "sample.jsonl"
    write_sample(sample)
    srv = openai_server(JudgeScript(pointwise=length_loving, pairwise=lambda task, a, b: "B"))
    args = json.dumps({"model": "judge", "api_base": srv.base_url})
    code = cli_main(["judge", "audit", "--judge", "llm-pointwise", "--sample", str(sample), "--args", args, "--json"])
    out_report = _report(capsys)
    assert code == 1
    assert out_report["length_spearman"] > 0.8 and out_report["length_slope"] > 0
    assert out_report["flip_rate"] == 1.0 and out_report["comparisons"] == 10  # one pair per task
    assert "pairs of sample responses sharing a task" in out_report["flip_source"]


def test_audit_passes_a_fair_judge(openai_server, tmp_path) -> None:
    sample = tmp_path / "sample.jsonl"
    write_sample(sample)
    srv = openai_server(JudgeScript(pointwise=lambda t, r, ref: quality(r), pairwise=better))
    report = audit("llm-pointwise", sample, args={"model": "judge", "api_base": srv.base_url})
    assert report.passed, report.table()
    assert report.flip_rate == 0.0 and abs(report.length_spearman) <= 0.3
    assert "position-flip rate" in report.table()


def test_audit_of_a_judge_without_a_model_measures_length_only(tmp_path) -> None:
    sample = tmp_path / "sample.jsonl"
    write_sample(sample)
    report = audit("length_penalty", sample, args={"target": 30, "limit": 3000})
    assert report.flip_rate is None and "not measurable" in report.flip_source
    assert report.length_spearman == pytest.approx(-1.0, abs=0.1)  # longer is worse for this rule
    assert not report.passed
