"""The ReAct agent: think, act with a tool, observe, repeat, answer.

Every turn is exactly one ``model.chat`` call, so a recording model (the
runner's) holds one call per turn and ``multi_step_grpo`` credits each one.
Observations are never completions: they are prompt tokens of the next call
(a ``tool`` message with native tool calls, a ``user`` message
``Observation: ...`` with the text protocols).

A tool error, a timeout, an unknown tool or a malformed action becomes an
observation the model reads and a counted metric; only a failed model call
(transport error, timeout) fails the episode, as ``TaskStatus.FAILED``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from reinforge import ChatModel, ChatResponse, TaskStatus, WorkflowOutput

from .parsing import ParsedAction, parse_action
from .prompts import JSON_PROTOCOL, TEXT_PROTOCOL, render_protocol
from .registry import ToolRegistry, resolve_tools
from .settings import ACTION_FORMATS, DEFAULT_STOP, ReactSettings, react_settings
from .tools import Tool, ToolArgumentError, ToolTimeoutError, format_result

__all__ = [
    "ACTION_FORMATS",
    "DEFAULT_STOP",
    "FINISH_ANSWER",
    "FINISH_MAX_TURNS",
    "FINISH_MODEL_ERROR",
    "ReActAgent",
    "ReActResult",
    "Step",
    "model_supports_tools",
]

FINISH_ANSWER = "answer"
FINISH_MAX_TURNS = "max_turns"
FINISH_MODEL_ERROR = "model_error"
FINISH_REASONS = (FINISH_ANSWER, FINISH_MAX_TURNS, FINISH_MODEL_ERROR)
COUNTERS = (
    "tool_call_count",
    "invalid_action_count",
    "unknown_tool_count",
    "tool_error_count",
    "tool_timeout_count",
)
_REMINDER = {
    "text": "Reply with 'Action: <tool>' and 'Action Input: <JSON arguments>', or with 'Final Answer: <answer>'.",
    "json": 'Reply with {"action": "<tool>", "action_input": {...}} or with {"final_answer": "<answer>"}.',
}


@dataclass
class Step:
    """One action of an episode and what came of it.

    ``kind``: ``tool`` (ran), ``tool_error`` (raised), ``tool_timeout``,
    ``unknown_tool``, ``invalid`` (malformed action or arguments) or ``final``.
    """

    turn: int
    kind: str
    thought: str = ""
    tool: str | None = None
    arguments: Any = None
    observation: str | None = None
    error: str | None = None
    seconds: float = 0.0


@dataclass
class ReActResult:
    """One episode. Its text (``get_text_content()``, ``str()``) is the final answer, "" when there is none.

    Hand it to judges as the response: text judges read the final answer,
    and a judge can look at ``steps`` and ``metrics`` (did it use the tool?).
    """

    final_answer: str | None
    finish_reason: str
    action_format: str
    messages: list[dict[str, Any]] = field(default_factory=list, repr=False)
    steps: list[Step] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    status: TaskStatus = TaskStatus.SUCCESS
    error: str | None = None
    call_rewards: list[float | None] | None = None  # one per model call, from ``turn_rewards``

    def get_text_content(self) -> str:
        return self.final_answer or ""

    def __str__(self) -> str:
        return self.get_text_content()

    @property
    def tool_steps(self) -> list[Step]:
        """The actions that ran a tool (successfully or not)."""
        return [s for s in self.steps if s.kind in ("tool", "tool_error", "tool_timeout")]

    @property
    def used_tool(self) -> bool:
        return bool(self.tool_steps)

    def to_workflow_output(self) -> WorkflowOutput:
        """``WorkflowOutput(response=self, metrics=..., call_rewards=...)``; FAILED only when a model call failed."""
        return WorkflowOutput(
            response=self,
            metrics=dict(self.metrics),
            status=self.status,
            error=self.error,
            call_rewards=self.call_rewards,
        )

    def transcript(self, max_chars: int = 2000) -> str:
        """The conversation, one message per block, for reading."""
        blocks = []
        for m in self.messages:
            content = str(m.get("content") or "")
            if len(content) > max_chars:
                content = content[:max_chars] + f"... [{len(content) - max_chars} more chars]"
            head = f"[{m.get('role')}]"
            if m.get("role") == "tool":
                head = f"[tool {m.get('name') or m.get('tool_call_id')}]"
            lines = [f"{head} {content}".rstrip()]
            for call in m.get("tool_calls") or []:
                fn = call.get("function") or {}
                lines.append(f"  -> {fn.get('name')}({fn.get('arguments')})")
            blocks.append("\n".join(lines))
        blocks.append(f"[finish] {self.finish_reason}: {self.final_answer!r}")
        return "\n".join(blocks)


def model_supports_tools(model: Any) -> bool:
    """True when the model says it takes native tool calls (a ``supports_tools`` attribute or method)."""
    flag = getattr(model, "supports_tools", None)
    if callable(flag):
        flag = flag()
    return flag is True


class ReActAgent:
    """A ReAct loop over any reinforge :class:`~reinforge.ChatModel`.

    :param model: the model; each turn is one ``model.chat`` call.
    :param settings: a :class:`ReactSettings` (the ``workflow.args`` of a run
        file, one definition of every key and default), a mapping of its keys,
        or give its keys as keywords: ``ReActAgent(model, tools=[calculator], max_turns=4)``.
        ``tools`` are :class:`Tool` objects, functions, registered tool names or
        ``module:attr`` references (see :func:`resolve_tools`).
    :param registry: where tool names are looked up (when None and ``tools``
        names one, the installed plugins' tools, in a registry built for this agent).
    :param base_dir: a folder put on ``sys.path`` while ``module:attr`` tools import.
    :raises ConfigError: a bad setting, checked as the run file's ``workflow.args``
        are, e.g. ``ReActAgent: max_turns: must be at least 1, got 0``.
    :raises TypeError: a settings object and keyword settings both.

    The meaning of each setting is in the package README's ``workflow.args`` table.
    """

    def __init__(
        self,
        model: ChatModel,
        settings: ReactSettings | Mapping[str, Any] | None = None,
        /,
        *,
        registry: ToolRegistry | None = None,
        base_dir: str | None = None,
        logger: logging.Logger | None = None,
        **options: Any,
    ) -> None:
        self.settings = react_settings(settings, options, where="ReActAgent")
        self.model = model
        self.tools: list[Tool] = resolve_tools(self.settings.tools, registry, base_dir=base_dir)
        self.requested_format = self.settings.action_format
        self.action_format = self.settings.action_format
        if self.action_format == "auto":
            self.action_format = "native" if model_supports_tools(model) else "text"
        self.logger = logger or logging.getLogger("reinforge_rollouts_react")

    # -- prompts -------------------------------------------------------------------------------

    @property
    def native(self) -> bool:
        return self.action_format == "native"

    def system_prompt(self) -> str:
        """The system message: the instructions, plus the protocol for the text formats."""
        if self.native:
            return self.settings.sys_prompt
        if self.settings.protocol_prompt is not None:
            template = self.settings.protocol_prompt
        else:
            template = JSON_PROTOCOL if self.action_format == "json" else TEXT_PROTOCOL
        protocol = render_protocol(template, self.tools, self.action_format) if template else ""
        return "\n\n".join(p for p in (self.settings.sys_prompt.strip(), protocol) if p)

    def initial_messages(self, question: str | Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """System message, the few-shot turns, then the question (text or OpenAI messages; their system text joins ours)."""
        system = self.system_prompt()
        if isinstance(question, str):
            rest = [{"role": "user", "content": question}]
        else:
            rest = [dict(m) for m in question]
            extra = [str(m.get("content") or "") for m in rest if m.get("role") == "system"]
            rest = [m for m in rest if m.get("role") != "system"]
            system = "\n\n".join(p for p in (system, *extra) if p)
        shots = [dict(m) for m in self.settings.few_shot]
        return ([{"role": "system", "content": system}] if system else []) + shots + rest

    def tool_schemas(self) -> list[dict[str, Any]] | None:
        return [t.schema() for t in self.tools] if self.native and self.tools else None

    def _sampling(self) -> dict[str, Any]:
        params = dict(self.settings.sampling or {})
        stop = self.settings.stop
        if not self.native and stop and "stop" not in params:
            params["stop"] = list(stop)
        return params

    # -- the loop ------------------------------------------------------------------------------

    async def run(self, question: str | Sequence[dict[str, Any]]) -> ReActResult:
        """Run one episode; never raises for the model's mistakes or a failed model call."""
        start = time.perf_counter()
        messages = self.initial_messages(question)
        result = ReActResult(None, FINISH_MAX_TURNS, self.action_format, messages)
        counts = dict.fromkeys(COUNTERS, 0)
        timing = {"model": 0.0, "tool": 0.0}
        unmarked = False
        turn = 0
        while turn < self.settings.max_turns:
            turn += 1
            call_start = time.perf_counter()
            try:
                response = await self.model.chat(messages, tools=self.tool_schemas(), **self._sampling())
            except Exception as exc:
                timing["model"] += time.perf_counter() - call_start
                result.status = TaskStatus.FAILED
                result.finish_reason = FINISH_MODEL_ERROR
                result.error = f"model call on turn {turn} failed: {type(exc).__name__}: {exc}"
                self.logger.warning("react: %s", result.error)
                break
            timing["model"] += time.perf_counter() - call_start
            if self.native:
                done = await self._native_turn(turn, response, result, counts, timing)
            else:
                done, unmarked = await self._text_turn(turn, response, result, counts, timing)
            if done:
                result.finish_reason = FINISH_ANSWER
                break
        result.metrics = {
            "turns": float(turn),
            **{k: float(v) for k, v in counts.items()},
            "used_tool": float(counts["tool_call_count"] > 0),
            "unmarked_answer": float(unmarked),
            "latency": time.perf_counter() - start,
            "model_latency": timing["model"],
            "tool_latency": timing["tool"],
            **{f"finish_reason/{r}": float(result.finish_reason == r) for r in FINISH_REASONS},
        }
        if self.settings.turn_rewards and result.status is TaskStatus.SUCCESS:
            result.call_rewards = self._call_rewards(result, turn)
        return result

    def _call_rewards(self, result: ReActResult, turns: int) -> list[float | None]:
        """The reward of each turn's model call: the ``turn_rewards`` of the actions it took, summed."""
        rewards: list[float | None] = [None] * turns
        for step in result.steps:
            value = (self.settings.turn_rewards or {}).get(step.kind)
            if value is not None and 1 <= step.turn <= turns:
                rewards[step.turn - 1] = (rewards[step.turn - 1] or 0.0) + value
        return rewards

    async def _text_turn(
        self, turn: int, response: ChatResponse, result: ReActResult, counts: dict[str, int], timing: dict[str, float]
    ) -> tuple[bool, bool]:
        """One text-protocol turn: (episode done, answer given without a marker)."""
        content = response.content
        result.messages.append({"role": "assistant", "content": content})
        parsed: ParsedAction = parse_action(content)
        if parsed.kind == "none" and not self.settings.strict_format:
            result.final_answer = content.strip()
            result.steps.append(Step(turn, "final", observation=None))
            return True, True
        if parsed.kind == "final":
            result.final_answer = parsed.answer or ""
            result.steps.append(Step(turn, "final", thought=parsed.thought))
            return True, False
        if parsed.kind == "tool":
            step = await self._act(turn, parsed.tool or "", parsed.tool_input, parsed.thought, counts, timing)
        else:
            error = parsed.error or "the reply has no action and no final answer"
            counts["invalid_action_count"] += 1
            step = Step(turn, "invalid", thought=parsed.thought, error=error, observation=f"Invalid action: {error}.")
        if step.kind in ("invalid", "unknown_tool"):
            step.observation = f"{step.observation} {_REMINDER.get(self.action_format, _REMINDER['text'])}"
        result.steps.append(step)
        result.messages.append({"role": "user", "content": f"Observation: {step.observation}"})
        self.logger.debug("react turn %d: %s %s -> %s", turn, step.kind, step.tool, step.observation)
        return False, False

    async def _native_turn(
        self, turn: int, response: ChatResponse, result: ReActResult, counts: dict[str, int], timing: dict[str, float]
    ) -> bool:
        message = {"role": "assistant", "content": response.message.get("content")}
        calls = []
        for i, call in enumerate(response.tool_calls):
            call = dict(call)
            call.setdefault("type", "function")
            call["id"] = call.get("id") or f"call_{turn}_{i}"
            calls.append(call)
        if calls:
            message["tool_calls"] = calls
        result.messages.append(message)
        if not calls:
            parsed = parse_action(response.content)
            answer = parsed.answer if parsed.kind == "final" else response.content.strip()
            result.final_answer = answer or ""
            result.steps.append(Step(turn, "final", thought=parsed.thought if parsed.kind == "final" else ""))
            return True
        thought = (response.content or "").strip()

        async def one(call: dict[str, Any]) -> Step:
            fn = call.get("function") or {}
            raw = fn.get("arguments")
            if isinstance(raw, str):
                try:
                    raw = json.loads(raw) if raw.strip() else {}
                except json.JSONDecodeError as exc:
                    counts["invalid_action_count"] += 1
                    error = f"the arguments of {fn.get('name')!r} are not valid JSON: {exc.msg}"
                    return Step(turn, "invalid", thought, fn.get("name"), raw, f"Invalid action: {error}.", error)
            return await self._act(turn, str(fn.get("name") or ""), raw, thought, counts, timing)

        steps = await asyncio.gather(*(one(c) for c in calls))
        for call, step in zip(calls, steps):
            result.steps.append(step)
            result.messages.append(
                {"role": "tool", "tool_call_id": call["id"], "name": step.tool, "content": step.observation}
            )
        return False

    # -- acting --------------------------------------------------------------------------------

    def find_tool(self, name: str) -> Tool | None:
        """The tool called ``name``; a unique case-insensitive match also counts (small models)."""
        for t in self.tools:
            if t.name == name:
                return t
        folded = [t for t in self.tools if t.name.lower() == name.lower()]
        return folded[0] if len(folded) == 1 else None

    def _clip(self, text: str) -> str:
        limit = self.settings.max_observation_chars
        if len(text) <= limit:
            return text
        return f"{text[:limit]}... [cut {len(text) - limit} chars]"

    async def _act(
        self, turn: int, name: str, raw: Any, thought: str, counts: dict[str, int], timing: dict[str, float]
    ) -> Step:
        found = self.find_tool(name)
        if found is None:
            counts["invalid_action_count"] += 1
            counts["unknown_tool_count"] += 1
            available = ", ".join(t.name for t in self.tools) or "none"
            observation = f"Unknown tool {name!r}. Available tools: {available}."
            return Step(turn, "unknown_tool", thought, name, raw, observation, f"unknown tool {name!r}")
        try:
            arguments = found.arguments(raw)
        except ToolArgumentError as exc:
            counts["invalid_action_count"] += 1
            return Step(turn, "invalid", thought, found.name, raw, f"Invalid action: {exc}.", str(exc))
        counts["tool_call_count"] += 1
        start = time.perf_counter()
        try:
            value = await found.run(arguments, self.settings.tool_timeout)
        except ToolTimeoutError as exc:
            counts["tool_error_count"] += 1
            counts["tool_timeout_count"] += 1
            error: str | None
            kind, observation, error = "tool_timeout", f"Error: {exc}.", str(exc)
        except Exception as exc:
            counts["tool_error_count"] += 1
            error = f"tool {found.name!r} raised {type(exc).__name__}: {exc}"
            kind, observation = "tool_error", f"Error: {error}"
        else:
            kind, observation, error = "tool", format_result(value), None
        seconds = time.perf_counter() - start
        timing["tool"] += seconds
        return Step(turn, kind, thought, found.name, arguments, self._clip(observation), error, seconds)
