"""reinforge: reinforcement fine-tuning for LLM agents.

Importing this package is cheap: only the contracts and the hook markers load
now; configs, the runner, ``tune`` and extras load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .__about__ import __version__
from .hookspecs import hookimpl
from .models import ChatModel, ChatResponse, ModelCall
from .outputs import GroupRewardOutput, JudgeOutput, TaskStatus, WorkflowOutput
from .text import response_text
from .trajectory import Trajectory

_LAZY = {
    "DatasetConfig": "reinforge.config",
    "ModelConfig": "reinforge.config",
    "TunerModelConfig": "reinforge.config",
    "AlgorithmConfig": "reinforge.config",
    "RunnerConfig": "reinforge.config",
    "RewardConfig": "reinforge.config",
    "ScoreConfig": "reinforge.config",
    "EvalConfig": "reinforge.config",
    "RunConfig": "reinforge.config",
    "load_run": "reinforge.runfile",
    "reward_func": "reinforge.rewards",
    "sub_reward_func": "reinforge.rewards",
    "aggregate_func": "reinforge.rewards",
    "Runner": "reinforge.runner",
    "tune": "reinforge.tuning",
    "TuneJob": "reinforge.job",
    "evaluate": "reinforge.evaluation",
    "LiteLLMChatModel": "reinforge.litellm_model",
    "get_plugin_manager": "reinforge.plugins",
    "ConfigurationError": "reinforge.errors",
    "ReinforgeError": "reinforge.errors",
}

__all__ = [
    "__version__",
    "hookimpl",
    "ChatModel",
    "ChatResponse",
    "ModelCall",
    "GroupRewardOutput",
    "JudgeOutput",
    "TaskStatus",
    "WorkflowOutput",
    "Trajectory",
    "response_text",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'reinforge' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
