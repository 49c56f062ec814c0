"""The registered ``react`` workflow: a :class:`ReActAgent` episode per task.

From a run file::

    workflow:
      name: react
      args:
        tools: [calculator]
        max_turns: 4
        sys_prompt: "Solve the arithmetic problem."

From Python, bind the settings with :func:`functools.partial` (or call
:func:`react_workflow` inside your own workflow)::

    tune(functools.partial(react_workflow, tools=[calculator], max_turns=4), judge, ...)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from reinforge import ChatModel, WorkflowOutput
from reinforge.errors import ConfigError

from .agent import DEFAULT_STOP, ReActAgent
from .prompts import DEFAULT_SYS_PROMPT

__all__ = ["check_settings", "react_workflow", "task_question"]


def task_question(task: dict[str, Any], question_field: str = "question") -> str | list[dict[str, Any]]:
    """The question of a task: ``task[question_field]`` (text or OpenAI messages), else ``task["messages"]``."""
    value = task.get(question_field)
    if value is None and question_field != "messages":
        value = task.get("messages")
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m for m in value):
        return value
    keys = ", ".join(sorted(map(str, task))) or "none"
    raise ConfigError(
        f"react workflow: task field {question_field!r} is missing or not a question (text or a list of messages); "
        f"the task has keys: {keys}. Set question_field in the workflow args"
    )


async def react_workflow(
    task: dict[str, Any],
    model: ChatModel,
    auxiliary_models: dict[str, ChatModel] | None = None,
    logger: logging.Logger | None = None,
    *,
    tools: Sequence[Any] | None = None,
    max_turns: int = 4,
    sys_prompt: str = DEFAULT_SYS_PROMPT,
    action_format: str = "auto",
    question_field: str = "question",
    tool_timeout: float | None = 10.0,
    max_observation_chars: int = 2000,
    strict_format: bool = False,
    protocol_prompt: str | None = None,
    stop: Sequence[str] | None = DEFAULT_STOP,
    sampling: dict[str, Any] | None = None,
) -> WorkflowOutput:
    """Run one ReAct episode on ``task[question_field]``.

    The response is the episode (a :class:`ReActResult` whose text is the final
    answer, "" when there is none); the metrics are turns, tool_call_count,
    invalid_action_count, unknown_tool_count, tool_error_count,
    tool_timeout_count, used_tool, unmarked_answer, latency, model_latency,
    tool_latency and ``finish_reason/<answer|max_turns|model_error>``. A
    failed model call is ``TaskStatus.FAILED``; a wrong or missing answer is
    SUCCESS (the judges decide). Bad settings raise :class:`ConfigError`.
    """
    agent = ReActAgent(
        model,
        tools=tools,
        sys_prompt=sys_prompt,
        max_turns=max_turns,
        action_format=action_format,
        tool_timeout=tool_timeout,
        max_observation_chars=max_observation_chars,
        strict_format=strict_format,
        protocol_prompt=protocol_prompt,
        stop=stop,
        sampling=sampling,
        logger=logger,
    )
    result = await agent.run(task_question(task, question_field))
    return result.to_workflow_output()


def check_settings(settings: dict[str, Any]) -> None:
    """Check a run file's ``workflow.args`` for ``react`` before any rollout; raises :class:`ConfigError`.

    Unknown keys are the signature check's job (core's ``bind``); this checks
    the values: the tools resolve, ``max_turns`` and the timeouts make sense.
    """
    options = dict(settings)
    field = options.pop("question_field", "question")
    if not isinstance(field, str) or not field:
        raise ConfigError(f"question_field must be a non-empty string, got {field!r}")
    ReActAgent(None, **options)  # type: ignore[arg-type] - no model is called while checking


# Read by a loader that checks settings early (see the package README); harmless otherwise.
react_workflow.reinforge_check_settings = check_settings  # type: ignore[attr-defined]
