"""Calibration against the committed gold set: hand-checked rho/tau/kappa, pass/fail, and requiring a pass."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
from judges_llm_testlib import GOLD_JUDGE_SCORES, JudgeScript, gold_score, inverted_gold_score

from reinforge.plugin import ConfigError
from reinforge.testing import cli_main
from reinforge_judges_llm import CalibrationError, PointwiseJudge, calibrate, load_examples, require_calibration

GOLD = Path(__file__).parent / "data" / "gold.jsonl"
# worked out by hand in test_stats.py: labels [1,2,2,3,4,4,5,5], judge scores [1,3,2,3,3,5,4,5]
RHO = 34.5 / math.sqrt(40.5 * 39.5)  # 0.8626
TAU = 19 / math.sqrt(600)  # 0.7757
KAPPA = 5 / 13  # 0.3846


def _last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def test_cli_calibrate_an_llm_judge_gives_the_hand_checked_values(openai_server, capsys) -> None:
    srv = openai_server(JudgeScript(pointwise=gold_score))
    args = json.dumps({"model": "judge", "api_base": srv.base_url})
    code = cli_main(["judge", "calibrate", "--judge", "llm-pointwise", "--gold", str(GOLD), "--args", args, "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    report = _last_json(out)
    assert report["spearman"] == pytest.approx(RHO)
    assert report["kendall"] == pytest.approx(TAU)
    assert report["kappa"] == pytest.approx(KAPPA)
    assert report["passed"] is True and report["items"] == 8 and report["failed"] == 0
    assert "Spearman rho" in out and "0.8626" in out and "PASS: Spearman rho 0.863 >= 0.6" in out
    assert srv.call_count == 8


def test_cli_calibrate_any_judge_reference(capsys) -> None:
    code = cli_main(["judge", "calibrate", "--judge", "judges_llm_testlib:table_judge", "--gold", str(GOLD), "--json"])
    report = _last_json(capsys.readouterr().out)
    assert code == 0
    assert (report["spearman"], report["kendall"], report["kappa"]) == pytest.approx((RHO, TAU, KAPPA))


def test_cli_calibrate_fails_below_a_threshold(capsys) -> None:
    ref = "judges_llm_testlib:table_judge"
    code = cli_main(["judge", "calibrate", "--judge", ref, "--gold", str(GOLD), "--min-kappa", "0.5"])
    out = capsys.readouterr().out
    assert code == 1 and "FAIL" in out and "Cohen's kappa 0.385 < 0.5" in out
    code = cli_main(["judge", "calibrate", "--judge", ref, "--gold", str(GOLD), "--min-spearman", "0.9"])
    assert code == 1 and "Spearman rho 0.863 < 0.9" in capsys.readouterr().out
    code = cli_main(["judge", "calibrate", "--judge", "judges_llm_testlib:inverted_table_judge", "--gold", str(GOLD)])
    out = capsys.readouterr().out
    assert code == 1 and "Spearman rho -0.863 < 0.6" in out


def test_cli_calibrate_user_errors_name_the_file_or_judge(tmp_path, capsys) -> None:
    bad = tmp_path / "gold.jsonl"
    bad.write_text('{"response": "x", "label": 3}\n{"response": "y"}\n')
    assert cli_main(["judge", "calibrate", "--judge", "judges_llm_testlib:table_judge", "--gold", str(bad)]) == 1
    assert f"{bad}:2: missing the human label" in capsys.readouterr().err
    assert cli_main(["judge", "calibrate", "--judge", "no-such-judge", "--gold", str(GOLD)]) == 1
    assert "no judge named 'no-such-judge'" in capsys.readouterr().err
    assert cli_main(["judge", "calibrate", "--judge", "llm-pointwise", "--gold", str(GOLD), "--args", "[1]"]) == 1
    assert "--args must be a JSON object" in capsys.readouterr().err


def test_failed_judgments_are_counted_not_scored(openai_server) -> None:
    srv = openai_server(lambda body: "never valid json")
    report = calibrate(
        "llm-pointwise", GOLD, args={"model": "judge", "api_base": srv.base_url, "max_retries": 0, "backoff_s": 0}
    )
    assert report.failed == 8 and report.scored == 0 and report.passed is False
    assert "8 of 8 judgments FAILED" in report.verdict()


def test_labels_can_be_binary_and_weighted_kappa_is_available() -> None:
    report = calibrate("judges_llm_testlib:table_judge", GOLD, kappa_weights="quadratic")
    assert report.kappa_weights == "quadratic" and report.kappa > KAPPA  # near misses count partly
    assert report.categories == [1, 2, 3, 4, 5]


def test_load_examples_accepts_flat_rows_and_aliases(tmp_path) -> None:
    path = tmp_path / "flat.jsonl"
    path.write_text(
        '{"question": "q", "response": "r", "score": 2}\n\n{"task": {"a": 1}, "response": "s", "human_label": 1}\n'
    )
    rows = load_examples(path)
    assert rows[0].task == {"question": "q"} and rows[0].label == 2 and rows[1].task == {"a": 1}
    with pytest.raises(ConfigError, match="no such file"):
        load_examples(tmp_path / "missing.jsonl")


def test_require_calibration_api_passes_or_raises() -> None:
    report = require_calibration("judges_llm_testlib:table_judge", GOLD)
    assert report.passed and report.spearman == pytest.approx(RHO)
    with pytest.raises(CalibrationError, match=r"failed calibration.*Spearman rho -0.863 < 0.6"):
        require_calibration("judges_llm_testlib:inverted_table_judge", GOLD)


def test_require_calibration_setting_checks_on_first_use(openai_server) -> None:
    srv = openai_server(JudgeScript(pointwise=lambda task, r, ref: GOLD_JUDGE_SCORES.get(r, 4)))
    judge = PointwiseJudge(model="judge", api_base=srv.base_url, require_calibration=str(GOLD))
    out = asyncio.run(judge({"question": "What is 12 * 12?"}, "144"))
    assert out.reward == 0.75
    assert judge.calibration.passed and judge.calibration.spearman == pytest.approx(RHO)
    assert srv.call_count == 8 + 1
    again = asyncio.run(judge({"question": "What is 12 * 12?"}, "144."))
    assert again.reward == 1.0 and again.metrics["usage/cache_hits"] == 1.0
    assert srv.call_count == 9  # a gold item's verdict is cached; calibration does not run twice


def test_a_judge_failing_its_required_calibration_refuses_to_score(openai_server) -> None:
    srv = openai_server(JudgeScript(pointwise=inverted_gold_score))
    judge = PointwiseJudge(model="judge", api_base=srv.base_url, require_calibration=str(GOLD))
    with pytest.raises(CalibrationError, match=r"'llm-pointwise': args.require_calibration failed.*-0.863 < 0.6"):
        asyncio.run(judge({"question": "q"}, "an answer"))
    with pytest.raises(CalibrationError):
        asyncio.run(judge({"question": "q"}, "another answer"))
    assert srv.call_count == 8  # only the gold set was judged, once


def test_calibrate_and_audit_close_the_judges_they_build(openai_server, tmp_path, monkeypatch) -> None:
    from reinforge_judges_llm import PairwiseJudge, audit
    from reinforge_judges_llm.judges import LLMJudge

    closed: list[LLMJudge] = []
    original = LLMJudge.close

    def spy(self) -> None:
        closed.append(self)
        original(self)

    monkeypatch.setattr(LLMJudge, "close", spy)
    srv = openai_server(JudgeScript(pointwise=gold_score, pairwise=lambda task, a, b: "A"))
    args = {"model": "judge", "api_base": srv.base_url}
    assert calibrate("llm-pointwise", GOLD, args=args).passed
    assert len(closed) == 1 and isinstance(closed[0], PointwiseJudge)  # built as for a run, closed when done

    sample = tmp_path / "sample.jsonl"
    sample.write_text("".join(json.dumps({"task": {"q": 1}, "response": f"answer {i}"}) + "\n" for i in range(3)))
    audit("llm-pointwise", sample, args=args, pairs=2)
    assert len(closed) == 3  # the audited judge and the pairwise comparer it asked
    assert {type(j) for j in closed[1:]} == {PointwiseJudge, PairwiseJudge}
