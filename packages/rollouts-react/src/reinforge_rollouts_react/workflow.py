"""The registered ``react`` workflow: a :class:`ReActAgent` episode per task.

From a run file::

    workflow:
      name: react
      args:
        tools: [calculator]
        max_turns: 4
        sys_prompt: "Solve the arithmetic problem."

``react`` is :class:`ReactWorkflow`, registered with :class:`ReactSettings`:
core checks ``args`` when the run loads (an unknown key, a wrong type, a tool
that does not resolve fail ``reinforge tune --dry-run`` naming
``workflow: args.<key>``), builds one workflow per run (which resolves its
tools once, against a tool registry built for that run) and calls it per task.

From Python, build one (``ReactWorkflow(tools=[calculator], max_turns=4)`` or
``ReactWorkflow(ReactSettings(...))``), bind the settings of :func:`react_workflow`
with :func:`functools.partial`, or call :func:`react_workflow` inside your own
workflow; all of them take the keys of :class:`ReactSettings` and nothing else::

    tune(ReactWorkflow(tools=[calculator], max_turns=4), judge, ...)
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from reinforge import ChatModel, WorkflowOutput
from reinforge.plugin import ComponentContext, ConfigError, load_settings

from .agent import ReActAgent
from .registry import resolve_tools, tool_registry
from .settings import ReactSettings, react_settings

__all__ = ["ReactSettings", "ReactWorkflow", "check_settings", "react_workflow", "task_question"]

WHERE = "react workflow"


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
    settings: ReactSettings | None = None,
    **options: Any,
) -> WorkflowOutput:
    """Run one ReAct episode on ``task[question_field]``.

    :param settings: a :class:`ReactSettings`, or give its keys as keywords
        (``react_workflow(task, model, tools=["calculator"], max_turns=4)``);
        they are checked, and tool names resolved, on every call.

    The response is the episode (a :class:`ReActResult` whose text is the final
    answer, "" when there is none); the metrics are turns, tool_call_count,
    invalid_action_count, unknown_tool_count, tool_error_count,
    tool_timeout_count, used_tool, unmarked_answer, latency, model_latency,
    tool_latency and ``finish_reason/<answer|max_turns|model_error>``. A
    failed model call is ``TaskStatus.FAILED``; a wrong or missing answer is
    SUCCESS (the judges decide). Bad settings raise :class:`ConfigError`.
    """
    checked = react_settings(settings, options, where=WHERE, prefix="args")
    agent = ReActAgent(model, checked, logger=logger)
    result = await agent.run(task_question(task, checked.question_field))
    return result.to_workflow_output()


class ReactWorkflow:
    """The registered ``react`` workflow: built once per run with its checked :class:`ReactSettings`.

    :param settings: what core passes (checked settings), or a mapping; or
        give the settings as keywords (``ReactWorkflow(tools=["calculator"])``).
    :raises ConfigError: a bad setting, ``react workflow: args.max_turns: must be at least 1, got 0``.

    The tools are resolved here, once (names against a tool registry built
    now); each call runs one episode with them. The instance holds nothing
    that needs closing.
    """

    def __init__(
        self,
        settings: ReactSettings | Mapping[str, Any] | None = None,
        /,
        *,
        context: ComponentContext | None = None,
        **options: Any,
    ) -> None:
        self.settings = react_settings(settings, options, where=WHERE, prefix="args")
        # built by core: tool names are looked up with the run's plugins, module:attr tools next to the run file
        pm = context.plugin_manager if context is not None else None
        registry = tool_registry(pm) if pm is not None and hasattr(pm.hook, "register_tools") else None
        base_dir = context.base_dir if context is not None else None
        where = f"{context.where}: args.tools" if context is not None else f"{WHERE}: args.tools"
        self.tools = resolve_tools(self.settings.tools, registry, where=where, base_dir=base_dir)
        # what each episode's agent gets: the same settings with the tools resolved above
        self._episode_settings = dataclasses.replace(self.settings, tools=list(self.tools))

    def __repr__(self) -> str:
        return f"ReactWorkflow(tools={[t.name for t in self.tools]}, max_turns={self.settings.max_turns})"

    async def __call__(
        self,
        task: dict[str, Any],
        model: ChatModel,
        auxiliary_models: dict[str, ChatModel] | None = None,
        logger: logging.Logger | None = None,
    ) -> WorkflowOutput:
        """Run one ReAct episode on ``task[question_field]``; see :func:`react_workflow`."""
        agent = ReActAgent(model, self._episode_settings, logger=logger)
        result = await agent.run(task_question(task, self.settings.question_field))
        return result.to_workflow_output()


def check_settings(settings: Mapping[str, Any]) -> ReactSettings:
    """Check ``workflow.args`` of ``react`` without a model, tool names included (with the installed plugins).

    Core checks the settings when a run loads and resolves the tools when it
    builds the workflow for the run (``build_job``, before any model loads).

    :return: the checked :class:`ReactSettings`.
    :raises ConfigError: naming the key, e.g. ``react workflow: args.tools[0]: no tool named ...``.
    """
    checked = load_settings(ReactSettings, dict(settings), where=WHERE, prefix="args")
    resolve_tools(checked.tools, where=f"{WHERE}: args.tools")
    return checked
