import asyncio

from reinforge import JudgeOutput
from reinforge.testing import check_entry_point
from reinforge_judge_example.plugin import keyword_judge


def test_entry_point_registers_the_judge():
    # the installed distribution's entry point loads and registers what it claims
    check_entry_point("reinforge-judge-example", judges=["example_keyword"])


def test_keyword_present_scores_one():
    out = asyncio.run(keyword_judge({"text": "x"}, "could you please help"))
    assert isinstance(out, JudgeOutput)
    assert out.reward == 1.0
    assert out.metrics == {"keyword_found": 1.0}


def test_keyword_absent_scores_zero():
    out = asyncio.run(keyword_judge({"text": "x"}, "help me"))
    assert out.reward == 0.0


def test_keyword_is_a_setting_and_message_dicts_work():
    message = {"role": "assistant", "content": "thanks a lot"}
    assert asyncio.run(keyword_judge({}, message, keyword="thanks")).reward == 1.0
    assert asyncio.run(keyword_judge({}, None)).reward == 0.0
