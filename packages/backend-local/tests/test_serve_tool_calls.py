"""Tool calls parsed out of generated text (serve's ``tool_calls``), the formats small open models emit."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from reinforge_backend_local.serve.tool_calls import (
    ParsedTools,
    ToolCallStream,
    fallback_messages,
    parse_tool_calls,
    template_renders_tools,
    tool_names,
    tools_prompt,
)


def _tool(name: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    return {"type": "function", "function": {"name": name, "description": f"{name} two numbers", "parameters": schema}}


TOOLS = [_tool("add"), _tool("get_weather")]


def _calls(parsed: ParsedTools) -> list[tuple[str, dict[str, Any]]]:
    """(name, decoded arguments) of each call, after checking each has the OpenAI shape."""
    out = []
    for call in parsed.tool_calls:
        assert set(call) == {"id", "type", "function"} and call["type"] == "function"
        assert re.fullmatch(r"call_[0-9a-f]{24}", call["id"])
        assert set(call["function"]) == {"name", "arguments"}
        assert isinstance(call["function"]["arguments"], str)
        out.append((call["function"]["name"], json.loads(call["function"]["arguments"])))
    return out


# -- recognised formats ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',  # Qwen2.5's layout
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}',  # stopped before the closing tag
        '{"name": "add", "parameters": {"a": 1, "b": 2}}',  # Llama-3.x
        '  {"name": "add", "arguments": {"a": 1, "b": 2}}\n',
        '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}',
        '{"type": "function", "name": "add", "parameters": {"a": 1, "b": 2}}',  # Llama-3.2
        '```json\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```',
        '```\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n```',
        '[{"name": "add", "arguments": {"a": 1, "b": 2}}]',
        '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}]',  # Mistral
        '{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}',  # arguments already encoded
        '{"type": "function", "function": {"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}}',  # OpenAI's shape
        '<tool_call>{"name": "ADD", "arguments": {"a": 1, "b": 2}}</tool_call>',  # a unique case-insensitive match
    ],
)
def test_one_call_only(text: str) -> None:
    parsed = parse_tool_calls(text, TOOLS)
    assert _calls(parsed) == [("add", {"a": 1, "b": 2})]
    assert parsed.content is None


def test_several_hermes_calls_with_unique_ids() -> None:
    text = (
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
        '<tool_call>{"name": "get_weather", "arguments": {"a": 3}}</tool_call>\n'
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    )
    parsed = parse_tool_calls(text, TOOLS)
    assert _calls(parsed) == [("add", {"a": 1, "b": 2}), ("get_weather", {"a": 3}), ("add", {"a": 1, "b": 2})]
    assert parsed.content is None
    assert len({c["id"] for c in parsed.tool_calls}) == 3


def test_ids_differ_between_replies() -> None:
    text = '{"name": "add", "arguments": {}}'
    ids = {parse_tool_calls(text, TOOLS).tool_calls[0]["id"] for _ in range(50)}
    assert len(ids) == 50


def test_json_list_of_calls() -> None:
    text = '[{"name": "add", "parameters": {"a": 1}}, {"name": "get_weather", "arguments": {"b": 2}}]'
    assert _calls(parse_tool_calls(text, TOOLS)) == [("add", {"a": 1}), ("get_weather", {"b": 2})]


def test_text_around_calls_is_the_content() -> None:
    text = (
        "I will add them.\n"
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
        "Then check the weather.\n"
        '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    )
    parsed = parse_tool_calls(text, TOOLS)
    assert _calls(parsed) == [("add", {"a": 1, "b": 2}), ("get_weather", {})]
    assert parsed.content == "I will add them.\nThen check the weather."


def test_text_around_a_fenced_call() -> None:
    text = 'Sure, let me compute that.\n```json\n{"name": "add", "arguments": {"a": 4, "b": 5}}\n```\n'
    parsed = parse_tool_calls(text, TOOLS)
    assert _calls(parsed) == [("add", {"a": 4, "b": 5})]
    assert parsed.content == "Sure, let me compute that."


def test_missing_or_null_arguments_are_an_empty_object() -> None:
    for text in ('{"name": "add"}', '<tool_call>{"name": "add", "arguments": null}</tool_call>'):
        assert _calls(parse_tool_calls(text, TOOLS)) == [("add", {})]


def test_arguments_keep_unicode() -> None:
    parsed = parse_tool_calls('<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich"}}</tool_call>', TOOLS)
    assert parsed.tool_calls[0]["function"]["arguments"] == '{"city": "Zürich"}'


def test_flat_tools_entries_count_too() -> None:
    assert tool_names([{"name": "add"}, _tool("sub"), {"type": "function"}, "junk"]) == ["add", "sub"]  # type: ignore[list-item]
    assert _calls(parse_tool_calls('{"name": "add", "arguments": {}}', [{"name": "add"}])) == [("add", {})]


# -- what stays text ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 3.",
        "",
        '<tool_call>{"name": "subtract", "arguments": {"a": 1}}</tool_call>',  # not an offered tool
        '{"name": "subtract", "parameters": {"a": 1}}',
        '[{"name": "add", "arguments": {}}, {"name": "nope", "arguments": {}}]',  # one unknown: the list is text
        '<tool_call>{"name": "add", "arguments": {"a": 1, </tool_call>',  # malformed JSON
        '<tool_call>{"name": "add" "arguments": {}}</tool_call>',
        '{"name": "add", "arguments": {"a": 1}',  # cut off
        '```json\n{"name": "add", "arguments": {"a": 1\n```',
        '<tool_call>{"name": "add", "arguments": "not json"}</tool_call>',
        '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>',  # arguments must be an object
        '<tool_call>{"arguments": {"a": 1}}</tool_call>',  # no name
        '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
        '<tool_call>"add"</tool_call>',
        "<tool_call></tool_call>",
        "[]",
        '{"name": "add", "result": 3}',  # an answer that has a name, not a call
        'The call would be {"name": "add", "arguments": {"a": 1}} if I made one.',  # prose mentioning JSON
        "[" * 5000 + "]" * 5000,  # deep nesting
        "{" * 5000,
    ],
)
def test_stays_text(text: str) -> None:
    parsed = parse_tool_calls(text, TOOLS)
    assert parsed.tool_calls == [] and parsed.content == text


def test_no_tools_offered_means_no_calls() -> None:
    text = '<tool_call>{"name": "add", "arguments": {}}</tool_call>'
    for tools in (None, [], [{"type": "function"}]):
        assert parse_tool_calls(text, tools) == ParsedTools(text, [])


def test_an_ambiguous_case_insensitive_name_stays_text() -> None:
    tools = [_tool("Add"), _tool("ADD")]
    text = '<tool_call>{"name": "add", "arguments": {}}</tool_call>'
    assert parse_tool_calls(text, tools).tool_calls == []
    assert _calls(parse_tool_calls(text.replace('"add"', '"ADD"'), tools)) == [("ADD", {})]


def test_a_bad_block_stays_text_next_to_a_good_one() -> None:
    bad = '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
    text = f'{bad}\n<tool_call>{{"name": "add", "arguments": {{"a": 1}}}}</tool_call>'
    parsed = parse_tool_calls(text, TOOLS)
    assert _calls(parsed) == [("add", {"a": 1})]
    assert parsed.content == bad


# -- templates without tool support ------------------------------------------------------------


class _Tokenizer:
    """A stand-in with a fixed chat template: renders the tools' names, or not, or fails."""

    def __init__(self, template: str | None, mode: str = "plain") -> None:
        self.chat_template = template
        self.mode = mode

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: Any = None, **kwargs: Any) -> str:
        if self.mode == "raises":
            raise ValueError("no tools here")
        names = " ".join(t["function"]["name"] for t in tools or []) if self.mode == "tools" else ""
        return f"{names}{messages[-1]['content']}"


def test_template_renders_tools() -> None:
    assert template_renders_tools(_Tokenizer("{{ tools }}", "tools"))
    assert not template_renders_tools(_Tokenizer("{# tools are not supported #}"))  # mentions the word only
    assert not template_renders_tools(_Tokenizer("{{ tools }}", "raises"))
    assert not template_renders_tools(_Tokenizer(None, "tools"))


def test_template_renders_tools_on_real_tokenizers(model_folder: Any) -> None:
    transformers = pytest.importorskip("transformers")
    smol = transformers.AutoTokenizer.from_pretrained(str(model_folder))
    assert not template_renders_tools(smol)  # SmolLM2's template has no tools: the fallback is needed
    smol.chat_template = (
        "{% for t in tools or [] %}{{ t.function.name }}\n{% endfor %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    assert template_renders_tools(smol)


def test_tools_prompt_lists_schemas_and_the_hermes_format() -> None:
    text = tools_prompt(TOOLS)
    for tool in TOOLS:
        assert json.dumps(tool) in text
    assert "<tool_call>" in text and "</tool_call>" in text
    example = re.search(r"<tool_call>(\{.*\})</tool_call>", text)
    assert example is not None and '"name"' in example.group(1) and '"arguments"' in example.group(1)


def test_fallback_messages_round_trip_through_the_parser() -> None:
    """A reply in the format the prompt asks for parses; a past call renders back in that format."""
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
    messages = [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "1+2?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
        {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
    ]
    out = fallback_messages(messages, TOOLS)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "user"]
    assert out[0]["content"].startswith("You are a calculator.\n\n") and tools_prompt(TOOLS) in out[0]["content"]
    assert _calls(parse_tool_calls(out[2]["content"], TOOLS)) == [("add", {"a": 1, "b": 2})]
    assert out[3]["content"] == "<tool_response>\n3\n</tool_response>"
    assert out[4] == messages[4] and out[4] is not messages[4]
    assert messages[0]["content"] == "You are a calculator."  # the request's own messages are left alone


def test_fallback_messages_adds_a_system_message() -> None:
    out = fallback_messages([{"role": "user", "content": "hi"}], TOOLS)
    assert out == [{"role": "system", "content": tools_prompt(TOOLS)}, {"role": "user", "content": "hi"}]


def test_fallback_keeps_text_next_to_past_calls() -> None:
    call = {"function": {"name": "add", "arguments": {"a": 1}}}  # arguments as an object: tolerated
    out = fallback_messages([{"role": "assistant", "content": "Adding.", "tool_calls": [call]}], TOOLS)
    parsed = parse_tool_calls(out[1]["content"], TOOLS)
    assert parsed.content == "Adding." and _calls(parsed) == [("add", {"a": 1})]


# -- streaming ---------------------------------------------------------------------------------

STREAMED = [
    '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>',
    '  I will add them.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\nDone.  ',
    'Two calls: <tool_call>{"name": "add", "arguments": {}}</tool_call> and '
    '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>',
    '\n{"name": "add", "parameters": {"a": 1, "b": 2}}',
    '[{"name": "add", "arguments": {}}]',
    '<|python_tag|>{"name": "add", "parameters": {}}',
    'Sure:\n```json\n{"name": "add", "arguments": {"a": 4}}\n```\n',
    "Plain text, no call at all.",
    "  Leading blanks and a backtick ` and a < sign, <tool_ but no call.\n",
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call> unknown tool',
    '{"answer": 3}',
    "```python\nprint(1)\n```",
    "Text that ends in a partial marker <tool_c",
    "",
]


def _stream(text: str, cuts: list[int], tools: Any = TOOLS) -> tuple[list[str], str, list[dict[str, Any]]]:
    stream = ToolCallStream(tools)
    bounds = [0, *cuts, len(text)]
    deltas = [stream.push(text[a:b]) for a, b in zip(bounds, bounds[1:])]
    rest, calls = stream.finish()
    return deltas, rest, calls


@pytest.mark.parametrize("text", STREAMED)
def test_stream_deltas_join_to_the_parsed_content(text: str) -> None:
    """Split anywhere (one character at a time, or in two pieces at every point), the same content and calls."""
    parsed = parse_tool_calls(text, TOOLS)
    expected = parsed.content or ""
    splits = [list(range(1, len(text)))] + [[k] for k in range(1, len(text))] + [[]]
    for cuts in splits:
        deltas, rest, calls = _stream(text, cuts)
        assert "".join(deltas) + rest == expected, cuts
        assert [c["function"] for c in calls] == [c["function"] for c in parsed.tool_calls]


def test_stream_never_sends_a_calls_text() -> None:
    text = 'Adding.\n<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    deltas, rest, calls = _stream(text, list(range(1, len(text))))
    assert "".join(deltas) == "Adding." and rest == "" and len(calls) == 1


def test_stream_sends_plain_text_as_it_comes() -> None:
    stream = ToolCallStream(TOOLS)
    assert stream.push("Hello") == "Hello"
    assert stream.push(" there ") == " there"  # the blank waits: a call may follow it
    assert stream.push("friend.") == " friend."
    assert stream.finish() == ("", [])


def test_stream_holds_a_reply_that_opens_like_json_until_the_end() -> None:
    stream = ToolCallStream(TOOLS)
    assert stream.push('{"answer"') == "" and stream.push(": 3}") == ""
    assert stream.finish() == ('{"answer": 3}', [])


def test_stream_without_tools_passes_everything_through() -> None:
    stream = ToolCallStream(None)
    text = '<tool_call>{"name": "add", "arguments": {}}</tool_call> '
    assert stream.push(text) == text and stream.finish() == ("", [])
