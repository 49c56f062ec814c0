"""The tolerant text-action parser: what small models actually write."""

import pytest

from reinforge_rollouts_react import parse_action
from reinforge_rollouts_react.parsing import parse_input

CALC = {"expression": "347 * 28"}


@pytest.mark.parametrize(
    ("text", "tool", "tool_input"),
    [
        ('Thought: multiply\nAction: calculator\nAction Input: {"expression": "347 * 28"}', "calculator", CALC),
        ('thought: multiply\naction: Calculator\naction input: {"expression": "347 * 28"}', "Calculator", CALC),
        (
            '**Thought:** multiply\n**Action:** `calculator`\n**Action Input:** {"expression": "347 * 28"}',
            "calculator",
            CALC,
        ),
        ('Action: calculator\nAction Input:\n```json\n{"expression": "347 * 28"}\n```', "calculator", CALC),
        ("Action: calculator\nAction Input: {'expression': '347 * 28'}", "calculator", CALC),  # Python dict
        ("Action: calculator\nAction Input: 347 * 28", "calculator", "347 * 28"),
        ('Action: calculator\nAction Input: "347 * 28"', "calculator", "347 * 28"),
        ("Action: calculator[347 * 28]", "calculator", "347 * 28"),
        ('Action: calculator("347 * 28")', "calculator", "347 * 28"),
        ('Thought: x Action: calculator Action Input: {"expression": "347 * 28"}', "calculator", CALC),
        ('Action 1: calculator\nAction Input 1: {"expression": "347 * 28"}', "calculator", CALC),
        ("Action: get_time", "get_time", None),
        # the model wrote its own observation and answer: only the action counts
        (
            'Action: calculator\nAction Input: {"expression": "347 * 28"}\nObservation: 9999\nFinal Answer: 9999',
            "calculator",
            CALC,
        ),
        ('{"action": "calculator", "action_input": {"expression": "347 * 28"}}', "calculator", CALC),
        (
            'Let me compute.\n```json\n{"tool": "calculator", "arguments": {"expression": "347 * 28"}}\n```',
            "calculator",
            CALC,
        ),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "347 * 28"}}</tool_call>', "calculator", CALC),
        ('{"function": {"name": "calculator", "arguments": "{\\"expression\\": \\"347 * 28\\"}"}}', "calculator", CALC),
    ],
)
def test_actions(text, tool, tool_input):
    parsed = parse_action(text)
    assert (parsed.kind, parsed.tool, parsed.tool_input) == ("tool", tool, tool_input)


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("Thought: easy\nFinal Answer: 9716", "9716"),
        ("FINAL ANSWER: 9716", "9716"),
        ("**Final Answer:** 9716", "9716"),
        ("Final Answer: The total is\n9716.", "The total is\n9716."),
        ("Final Answer: 9716\nAction: calculator", "9716"),  # the answer came first
        ('{"final_answer": "9716"}', "9716"),
        ('```json\n{"answer": 9716}\n```', "9716"),
        ('{"action": "Final Answer", "action_input": "9716"}', "9716"),
        ("Action: Final Answer\nAction Input: 9716", "9716"),
    ],
)
def test_final_answers(text, answer):
    parsed = parse_action(text)
    assert (parsed.kind, parsed.answer) == ("final", answer)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "the reply is empty"),
        ("Action:\nAction Input: 3", "'Action:' names no tool"),
        ("Action: use the calculator please\nAction Input: 3", "must be followed by just a tool name"),
        ('```json\n{"action": "calculator", "action_input": \n```', "not valid JSON"),
        ('{"expression": "1 + 1"}', "has no 'action' (a tool name) or 'final_answer' key"),
        ('Action: calculator\nAction Input: {"expression": "347 *', "'Action Input:' is not valid JSON"),  # cut off
    ],
)
def test_invalid_actions_say_why(text, error):
    parsed = parse_action(text)
    assert parsed.kind == "invalid" and error in parsed.error


def test_plain_text_is_neither_action_nor_answer():
    parsed = parse_action("The answer is 42 {probably}.")
    assert parsed.kind == "none" and parsed.thought == "The answer is 42 {probably}."


def test_thoughts_are_kept_without_markup():
    assert parse_action("Thought: **I need** to add.\nAction: calculator[1+1]").thought == "**I need** to add."
    assert parse_action('I will add.\n```json\n{"action": "calculator", "action_input": "1+1"}\n```').thought == (
        "I will add."
    )


def test_parse_input():
    assert parse_input(' {"a": 1} ') == {"a": 1}
    assert parse_input("12") == 12
    assert parse_input("'quoted'") == "quoted"
    assert parse_input("") is None
    assert parse_input("1+2j") == "1+2j"  # a Python literal that is not JSON-like stays text
    assert parse_input({"a": 1}) == {"a": 1}
