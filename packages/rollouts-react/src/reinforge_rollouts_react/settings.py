"""The settings of the ``react`` workflow, checked by core's settings checker before any model call.

``react`` is registered with :class:`ReactSettings`, so a run file's
``workflow.args`` are checked when the run loads (``reinforge tune --dry-run``,
``reinforge eval``, ``build_job``): an unknown key, a wrong type
(``max_turns: "4"``), a bad value (``max_turns: 0``) or a tool that does not
resolve (``tools: [nosuchtool]``) is an error naming the file and the key::

    run.yaml: workflow: args.tools[0]: no tool named 'nosuchtool' is registered (did you mean ...?); ...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reinforge.plugin import FieldError, Settings, at_least, finite, load_settings, one_of

from .prompts import DEFAULT_SYS_PROMPT

__all__ = ["ACTION_FORMATS", "DEFAULT_STOP", "STEP_KINDS", "ReactSettings", "check_few_shot", "react_settings"]

ACTION_FORMATS = ("auto", "native", "text", "json")
DEFAULT_STOP: tuple[str, ...] = ("\nObservation:",)
# what one action of an episode came to (``Step.kind``): the keys of ``turn_rewards``
STEP_KINDS = ("tool", "tool_error", "tool_timeout", "unknown_tool", "invalid", "final")


@dataclass
class ReactSettings(Settings):
    """``workflow.args`` of ``react``: the one definition of ReAct's settings and their defaults.

    :class:`~reinforge_rollouts_react.ReActAgent`, :class:`~reinforge_rollouts_react.ReactWorkflow`
    and :func:`~reinforge_rollouts_react.react_workflow` all take one of these
    (or its fields as keywords); the package README's table says what each key means.

    ``tools`` entries are registered tool names, ``module:attr`` references,
    ``{name: <tool>, timeout: <s>, description: <text>}`` mappings, or (from
    Python) functions and :class:`~reinforge_rollouts_react.Tool` objects. The
    check looks at their shape; :class:`~reinforge_rollouts_react.ReactWorkflow`
    resolves them against the run's plugins when core builds it.
    """

    tools: list[Any] = field(default_factory=list)
    max_turns: int = 4
    sys_prompt: str = DEFAULT_SYS_PROMPT
    action_format: str = "auto"
    question_field: str = "question"
    tool_timeout: float | None = 10.0
    max_observation_chars: int = 2000
    strict_format: bool = False
    protocol_prompt: str | None = None
    stop: list[str] | None = field(default_factory=lambda: list(DEFAULT_STOP))
    sampling: dict[str, Any] | None = None
    few_shot: list[dict[str, Any]] = field(default_factory=list)
    turn_rewards: dict[str, float] | None = None

    def _prepare(self) -> None:
        from .tools import Tool

        if self.tools is None:
            self.tools = []
        if self.few_shot is None:
            self.few_shot = []
        elif isinstance(self.tools, (str, Mapping, Tool)) or callable(self.tools):
            self.tools = [self.tools]  # one tool given on its own
        if isinstance(self.stop, str):
            self.stop = [self.stop]

    def check(self) -> None:
        at_least("max_turns", self.max_turns, 1)
        one_of("action_format", self.action_format, ACTION_FORMATS)
        if not self.question_field.strip():
            raise FieldError("question_field", f"must be a non-empty string, got {self.question_field!r}")
        finite("tool_timeout", self.tool_timeout)
        at_least("tool_timeout", self.tool_timeout, 0, strict=True)
        at_least("max_observation_chars", self.max_observation_chars, 1)
        check_few_shot(self.few_shot)
        for kind, value in (self.turn_rewards or {}).items():
            one_of(f"turn_rewards.{kind}", kind, STEP_KINDS)
            finite(f"turn_rewards.{kind}", value)
        if self.tools:
            from .registry import check_tool_entries

            # the shape of each entry; names and references resolve when the workflow is built for a run
            # (core builds it in build_job, before any model loads), with that run's plugins and folder
            check_tool_entries(self.tools, key="tools")


def react_settings(
    settings: ReactSettings | Mapping[str, Any] | None, options: Mapping[str, Any], *, where: str, prefix: str = ""
) -> ReactSettings:
    """One checked :class:`ReactSettings` from a settings object, a mapping or keyword options.

    The agent, the workflow class and the workflow function all build theirs
    here, so the keys, defaults and checks are those of the run file.

    :raises ConfigError: a bad or unknown key, ``<where>: <prefix>.max_turns: must be at least 1, got 0``.
    :raises TypeError: both a settings object and keyword options, or neither a mapping nor settings.
    """
    if settings is None or isinstance(settings, Mapping):
        return load_settings(ReactSettings, {**dict(settings or {}), **options}, where=where, prefix=prefix)
    if not isinstance(settings, ReactSettings):
        raise TypeError(f"{where} takes ReactSettings (or keyword settings), got {type(settings).__name__}")
    if options:
        raise TypeError(f"{where}: give a settings object or keyword settings, not both")
    return settings


FEW_SHOT_ROLES = ("user", "assistant", "tool")


def check_few_shot(messages: Any, key: str = "few_shot") -> None:
    """Demonstration turns are chat messages: ``{"role": user|assistant|tool, "content": "<text>"}``, ...

    They are the conversation a small model copies, so the list must end with
    an assistant turn (the question that follows is the user's).
    """
    if not isinstance(messages, list):
        raise FieldError(key, f"must be a list of chat messages, got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or m.get("role") not in FEW_SHOT_ROLES:
            raise FieldError(
                f"{key}[{i}]", f"must be a message with role one of {', '.join(FEW_SHOT_ROLES)}, got {m!r}"
            )
        content = m.get("content")
        if not isinstance(content, str) and not (m.get("role") == "assistant" and m.get("tool_calls")):
            raise FieldError(f"{key}[{i}].content", f"must be text, got {type(content).__name__}")
    if messages and messages[-1].get("role") != "assistant":
        raise FieldError(key, "must end with an assistant message (the real question comes next, as the user's)")
