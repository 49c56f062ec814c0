import pytest

from reinforge import ChatResponse
from reinforge.errors import RewardError
from reinforge.judges import rules


def r(judge, response, task=None, **kw):
    return judge(task if task is not None else {"answer": "42"}, response, **kw).reward


@pytest.mark.parametrize(
    ("response", "expected"),
    [("42", 1.0), ("The answer is 42.", 1.0), ("41 or 42", 1.0), ("42 then 43", 0.0), ("no number", 0.0), ("4,2", 1.0)],
)
def test_last_number(response, expected):
    assert r(rules.last_number, response) == expected


def test_last_number_reads_chat_responses_and_message_lists():
    assert r(rules.last_number, ChatResponse({"role": "assistant", "content": "= 42"})) == 1.0
    msgs = [{"role": "user", "content": "7?"}, {"role": "assistant", "content": "42"}]
    assert r(rules.last_number, msgs) == 1.0


def test_numeric_equal_is_stricter():
    assert r(rules.numeric_equal, " 42.0 ") == 1.0
    assert r(rules.numeric_equal, "It is 42") == 0.0


def test_exact_match_and_contains():
    assert r(rules.exact_match, "  42 ") == 1.0
    assert r(rules.exact_match, "42!") == 0.0
    assert r(rules.contains, "yes, 42!") == 1.0
    assert r(rules.contains, "Paris", task={"city": "paris"}, field="city") == 1.0


def test_missing_field_names_the_judge_and_field():
    with pytest.raises(RewardError, match=r"last_number.*'answer'.*\['question'\]"):
        rules.last_number({"question": "?"}, "1")


def test_regex_and_json():
    assert r(rules.regex, "ID-123", pattern=r"ID-\d+") == 1.0
    assert r(rules.regex, "xID-123", pattern=r"ID-\d+", fullmatch=True) == 0.0
    assert r(rules.json_valid, '{"a": 1}', required_keys=["a"]) == 1.0
    assert r(rules.json_valid, '```json\n{"a": 1}\n```') == 1.0
    assert r(rules.json_valid, "{a: 1}") == 0.0
    assert r(rules.json_valid, '{"b": 1}', required_keys=["a"]) == 0.0


def test_length_penalty_decays_linearly():
    assert r(rules.length_penalty, "x" * 8, target=8, limit=16) == 1.0
    assert r(rules.length_penalty, "x" * 12, target=8, limit=16) == pytest.approx(0.5)
    assert r(rules.length_penalty, "x" * 40, target=8, limit=16) == 0.0
    with pytest.raises(RewardError, match="limit"):
        rules.length_penalty({}, "x", target=10, limit=5)
