"""ReAct rollouts with tools for reinforge.

A :class:`ReActAgent` runs think/act/observe episodes over any reinforge
``ChatModel``, with native OpenAI tool calls or a tolerant text protocol for
small models; ``@tool`` makes a function a tool; the ``react`` workflow
(:class:`ReactWorkflow` with :class:`ReactSettings`) runs an agent per task
from a run file; plugins publish tools through the ``register_tools`` hook.
"""

from .__about__ import __version__
from .agent import ACTION_FORMATS, ReActAgent, ReActResult, Step, model_supports_tools
from .calculator import calculator, evaluate_arithmetic
from .parsing import ParsedAction, parse_action
from .registry import TOOLS, ToolRegistry, resolve_tools, tool_registry
from .settings import ReactSettings
from .tools import Tool, ToolArgumentError, ToolDefinitionError, ToolTimeoutError, tool
from .workflow import ReactWorkflow, check_settings, react_workflow, task_question

__all__ = [
    "ACTION_FORMATS",
    "ParsedAction",
    "ReActAgent",
    "ReActResult",
    "ReactSettings",
    "ReactWorkflow",
    "Step",
    "TOOLS",
    "Tool",
    "ToolArgumentError",
    "ToolDefinitionError",
    "ToolRegistry",
    "ToolTimeoutError",
    "__version__",
    "calculator",
    "check_settings",
    "evaluate_arithmetic",
    "model_supports_tools",
    "parse_action",
    "react_workflow",
    "resolve_tools",
    "task_question",
    "tool",
    "tool_registry",
]
