"""Tool calls read out of generated text, so ``reinforge serve`` can answer with OpenAI ``tool_calls``.

A local model writes its calls as text; clients (AgentScope, the openai SDK, litellm) want them
in ``message.tool_calls``. The formats small open models actually emit are read:

- Hermes / Qwen2.5: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per
  call, text around them allowed (an unterminated last block counts when its JSON is whole);
- Llama-3.x: a bare JSON object ``{"name": ..., "parameters" | "arguments": {...}}`` as the whole
  message (after an optional ``<|python_tag|>``), or in a fenced ```` ```json ```` block;
- a JSON list of such objects (also after Mistral's ``[TOOL_CALLS]``), and OpenAI's own
  ``{"function": {"name": ..., "arguments": ...}}`` shape inside any of these.

Only names among the offered tools count (an exact match, else a unique case-insensitive one,
as the ReAct agent's ``find_tool``); anything else, malformed JSON included, stays text.

For chat templates that do not render ``tools`` (SmolLM2's, for one), :func:`fallback_messages`
describes the tools in a system message and asks for the Hermes format, which is then parsed here:
that is the documented fallback.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ParsedTools",
    "ToolCallStream",
    "fallback_messages",
    "parse_tool_calls",
    "template_renders_tools",
    "tool_names",
    "tools_prompt",
]

_HERMES = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
_FENCE = re.compile(r"```(?:json|JSON|tool_call|tool_code)?[ \t]*\n?(.*?)```", re.S)
_PREFIXES = ("<|python_tag|>", "[TOOL_CALLS]")
_CALL_KEYS = {"name", "arguments", "parameters", "type", "id"}
_PROBE = "reinforge_probe_tool_7c1e"


@dataclass(frozen=True)
class ParsedTools:
    """One reply split: the text left (``None`` when the reply was only calls) and the OpenAI ``tool_calls``."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def tool_names(tools: Sequence[dict[str, Any]] | None) -> list[str]:
    """The function names of OpenAI ``tools`` entries (``{"type": "function", "function": {"name": ...}}``)."""
    names = []
    for tool in tools or ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else tool.get("name") if isinstance(tool, dict) else None
        if isinstance(name, str) and name:
            names.append(name)
    return names


def _match_name(name: Any, names: Sequence[str]) -> str | None:
    if not isinstance(name, str):
        return None
    if name in names:
        return name
    folded = [n for n in names if n.lower() == name.strip().lower()]
    return folded[0] if len(folded) == 1 else None


def _arguments(obj: dict[str, Any]) -> str | None:
    """The call's arguments as a JSON object string; ``None`` when they are not an object."""
    raw = obj.get("arguments", obj.get("parameters", {}))
    if raw is None:
        raw = {}
    if isinstance(raw, str):  # some models (and OpenAI's own shape) give the arguments already encoded
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError):
            return None
    if not isinstance(raw, dict):
        return None
    return json.dumps(raw, ensure_ascii=False)


def _call(obj: Any, names: Sequence[str], *, tagged: bool) -> dict[str, Any] | None:
    """An OpenAI tool call from one decoded object, or ``None`` when it is not a call of an offered tool.

    Outside ``<tool_call>`` tags an object must look like nothing but a call (no other keys), so a
    JSON answer that happens to have a ``name`` is not taken for one.
    """
    if not isinstance(obj, dict):
        return None
    nested = obj.get("function")
    if isinstance(nested, dict) and "name" not in obj:  # {"type": "function", "function": {...}}
        obj = nested
    elif not tagged and not set(obj) <= _CALL_KEYS:
        return None
    name = _match_name(obj.get("name"), names)
    arguments = _arguments(obj)
    if name is None or arguments is None:
        return None
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _calls(value: Any, names: Sequence[str], *, tagged: bool) -> list[dict[str, Any]] | None:
    """The calls of one JSON value (an object or a non-empty list of them): all of them, or ``None``."""
    items = value if isinstance(value, list) else [value]
    calls = [_call(item, names, tagged=tagged) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _whole_json(text: str) -> Any:
    """``text`` decoded when it is exactly one JSON value, else ``None`` (never raises)."""
    text = text.strip()
    if not text or text[0] not in "[{":
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _remainder(text: str, spans: list[tuple[int, int]]) -> str | None:
    """``text`` without the call ``spans``: the pieces between them, trimmed only where a call was cut out.

    The text before the first call keeps its start as generated, so what a stream sent of it early
    (:class:`ToolCallStream`) is always a prefix of this.
    """
    cuts = [0, *(i for span in spans for i in span), len(text)]
    pieces = [text[cuts[k] : cuts[k + 1]] for k in range(0, len(cuts), 2)]
    kept = [pieces[0].rstrip(), *(p.strip() for p in pieces[1:])]
    return "\n".join(p for p in kept if p) or None


def _hermes(text: str, names: Sequence[str]) -> ParsedTools | None:
    calls, spans = [], []
    for m in _HERMES.finditer(text):
        found = _calls(_whole_json(m.group(1)), names, tagged=True)
        if found is not None:
            calls.extend(found)
            spans.append(m.span())
    return ParsedTools(_remainder(text, spans), calls) if calls else None


def _fenced(text: str, names: Sequence[str]) -> ParsedTools | None:
    calls, spans = [], []
    for m in _FENCE.finditer(text):
        found = _calls(_whole_json(m.group(1)), names, tagged=False)
        if found is not None:
            calls.extend(found)
            spans.append(m.span())
    return ParsedTools(_remainder(text, spans), calls) if calls else None


def _bare(text: str, names: Sequence[str]) -> ParsedTools | None:
    body = text.strip()
    for prefix in _PREFIXES:
        if body.startswith(prefix):
            body = body[len(prefix) :]
    found = _calls(_whole_json(body), names, tagged=False)
    return ParsedTools(None, found) if found is not None else None


def parse_tool_calls(text: str, tools: Sequence[dict[str, Any]] | None) -> ParsedTools:
    """Split a generated reply into its text and its calls of the offered ``tools``; never raises.

    Without a recognised call the reply is returned whole as ``content`` (unchanged), with no calls.
    """
    names = tool_names(tools)
    if not names or not text:
        return ParsedTools(text, [])
    for reader in (_hermes, _bare, _fenced):
        parsed = reader(text, names)
        if parsed is not None:
            return parsed
    return ParsedTools(text, [])


# -- streaming ------------------------------------------------------------------------------------

_ANYWHERE = ("<tool_call>", "```")  # a call may start here, anywhere in the reply
_AT_START = ("{", "[", *_PREFIXES)  # ... or here, as the reply's first non-blank text


class ToolCallStream:
    """One streamed choice's content deltas, held back from where a tool call may begin.

    Text before any possible call goes out as it comes; from a ``<tool_call>`` or a code fence on
    (or from the start, when the reply opens like JSON) it is held, and :meth:`finish` parses the
    whole reply: the rest of its content, then its calls. The deltas join to exactly
    ``parse_tool_calls(text, tools).content or ""``, so a client never sees a call's text.
    """

    def __init__(self, tools: Sequence[dict[str, Any]] | None) -> None:
        self.tools = list(tools or [])
        self._names = tool_names(self.tools)
        self.text = ""
        self.sent = ""
        self._held = False  # a possible call began: nothing more goes out before finish

    def push(self, delta: str) -> str:
        """The content ``delta`` makes safe to send (often ``""``)."""
        self.text += delta
        if not self._names:  # no tools offered: nothing is a call
            self.sent += delta
            return delta
        if self._held:
            return ""
        body = self.text.lstrip()
        if any(body.startswith(m) for m in _AT_START):
            self._held = True
            return ""
        if any(m.startswith(body) for m in _AT_START):  # blanks so far, or a start marker beginning
            return ""
        safe = len(self.text)
        for marker in _ANYWHERE:
            at = self.text.find(marker)
            if at >= 0:
                safe, self._held = min(safe, at), True
            for k in range(min(len(marker) - 1, len(self.text)), 0, -1):  # a marker may be beginning
                if self.text.endswith(marker[:k]):
                    safe = min(safe, len(self.text) - k)
                    break
        ready = self.text[:safe].rstrip()  # blanks before a call are cut with it
        if len(ready) <= len(self.sent):
            return ""
        out = ready[len(self.sent) :]
        self.sent = ready
        return out

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(the content not yet sent, the reply's tool calls): call once, when the choice is done."""
        parsed = parse_tool_calls(self.text, self.tools)
        content = parsed.content or ""
        rest = content[len(self.sent) :] if content.startswith(self.sent) else ""
        self.sent += rest
        return rest, parsed.tool_calls


# -- templates without tool support --------------------------------------------------------------


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template puts ``tools`` into the prompt (a probe render, not a text search).

    ``"tools" in chat_template`` is fooled by a template that only mentions the word; rendering one
    probe tool and looking for its name is not. Render once per served model and keep the answer.
    """
    if not getattr(tokenizer, "chat_template", None):
        return False
    probe = {"type": "function", "function": {"name": _PROBE, "description": "", "parameters": {"type": "object"}}}
    try:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], tools=[probe], add_generation_prompt=True, tokenize=False
        )
    except Exception:
        return False
    return isinstance(rendered, str) and _PROBE in rendered


def tools_prompt(tools: Sequence[dict[str, Any]]) -> str:
    """System-message text for a template without tool support: the tools' schemas and the Hermes call format."""
    schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "You may call one or more functions to assist with the user query. "
        "The functions, as JSON schemas, are within <tools></tools>:\n"
        f"<tools>\n{schemas}\n</tools>\n"
        "To call a function, write a JSON object with the function's name and arguments within "
        "<tool_call></tool_call> tags, one block per call:\n"
        '<tool_call>{"name": "<function name>", "arguments": {<argument name>: <value>}}</tool_call>'
    )


def _content_text(content: Any) -> str:
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def fallback_messages(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` rewritten for a template without tool support, in the Hermes format the parser reads.

    The tools prompt follows the system message's own text (where Qwen2.5's template puts it; a new
    system message when there is none); an assistant message's ``tool_calls`` become ``<tool_call>``
    blocks in its content, and a ``tool`` message becomes a user message in ``<tool_response>`` tags
    (plain templates often know no ``tool`` role, and Hermes-trained models read these tags).
    """
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            blocks = []
            for call in m["tool_calls"]:
                fn = call.get("function") or {}
                raw = fn.get("arguments")
                try:
                    args = json.loads(raw) if isinstance(raw, str) and raw.strip() else raw or {}
                except (ValueError, RecursionError):
                    args = raw
                blocks.append(
                    f"<tool_call>{json.dumps({'name': fn.get('name'), 'arguments': args}, ensure_ascii=False)}</tool_call>"
                )
            text = "\n".join(b for b in [_content_text(m.get("content")).strip(), *blocks] if b)
            out.append({"role": "assistant", "content": text})
        elif role == "tool":
            out.append(
                {"role": "user", "content": f"<tool_response>\n{_content_text(m.get('content'))}\n</tool_response>"}
            )
        else:
            out.append(dict(m))
    prompt = tools_prompt(tools)
    if out and out[0].get("role") == "system":
        own = _content_text(out[0].get("content")).strip()
        out[0]["content"] = f"{own}\n\n{prompt}" if own else prompt
    else:
        out.insert(0, {"role": "system", "content": prompt})
    return out
