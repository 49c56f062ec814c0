"""The instructions that teach a model the text protocols, and how tools are described to it.

Templates use ``{tools}`` (one entry per tool) and ``{tool_names}``; they are
filled with ``str.replace``, so other braces (JSON examples) are left alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .tools import Tool

__all__ = ["DEFAULT_SYS_PROMPT", "JSON_PROTOCOL", "TEXT_PROTOCOL", "describe_tools", "render_protocol"]

DEFAULT_SYS_PROMPT = "You are a helpful assistant. Use a tool when it helps, then give the final answer."

TEXT_PROTOCOL = """You can use these tools:
{tools}

To use a tool, reply in exactly this format, then stop and wait:
Thought: <what to do next>
Action: <one of: {tool_names}>
Action Input: <the arguments as a JSON object>

You will get back "Observation: <the result>". When you know the answer, reply:
Thought: <short reasoning>
Final Answer: <the answer>"""

JSON_PROTOCOL = """You can use these tools:
{tools}

To use a tool, reply with only this JSON object, then stop and wait:
{"action": "<one of: {tool_names}>", "action_input": {<the arguments>}}

You will get back "Observation: <the result>". When you know the answer, reply with only:
{"final_answer": "<the answer>"}"""

NO_TOOLS_TEXT = "Reply in this format:\nThought: <short reasoning>\nFinal Answer: <the answer>"
NO_TOOLS_JSON = 'Reply with only this JSON object: {"final_answer": "<the answer>"}'


def _argument(name: str, schema: dict, required: bool) -> str:
    kind = schema.get("type") or ("one of " + "/".join(map(str, schema["enum"])) if "enum" in schema else "any")
    note = schema.get("description", "")
    optional = "" if required else ", optional"
    return f"{kind}{optional}" + (f", {note}" if note else "")


def describe_tools(tools: Sequence[Tool]) -> str:
    """One entry per tool: name, description and its arguments as the JSON object to send."""
    lines = []
    for t in tools:
        props = t.parameters.get("properties", {})
        required = set(t.required)
        args = {name: _argument(name, schema, name in required) for name, schema in props.items()}
        lines.append(f"- {t.name}: {t.description}")
        lines.append(f"  arguments: {json.dumps(args, ensure_ascii=False)}")
    return "\n".join(lines)


def render_protocol(template: str, tools: Sequence[Tool], action_format: str) -> str:
    """The protocol instructions for ``tools``; without tools, just how to give the final answer."""
    if not tools:
        return NO_TOOLS_JSON if action_format == "json" else NO_TOOLS_TEXT
    return template.replace("{tools}", describe_tools(tools)).replace("{tool_names}", ", ".join(t.name for t in tools))
