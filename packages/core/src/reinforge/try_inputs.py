"""Reading ``reinforge try`` input files: our own shape and DashScope's test inputs.

Ours: ``{"task": {...}, "model": {...}}`` for a workflow, ``{"task", "response"}``
for a judge, ``{"task", "responses"}`` for a group reward. DashScope's
``rollout_input.json`` / ``reward_input.json`` (``func_type`` set) are mapped
onto the same: ``ground_truth`` becomes ``task["ground_truth"]`` and, unless
the task has one, ``task["answer"]``; ``rollout_extra`` fields join the task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .text import response_text

DASHSCOPE_ROLES = {"rollout": "workflow", "reward": "judge", "group_reward": "group_reward"}


@dataclass
class TryInput:
    task: dict[str, Any]
    response: Any = None
    responses: list[Any] | None = None
    model: dict[str, Any] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    rollout_seconds: float | None = None
    preset_reward: float | None = None
    notes: list[str] = field(default_factory=list)
    source: str = "dashscope"


def _dashscope_task(data: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    task: dict[str, Any] = dict(data.get("rollout_extra") or {})
    if messages:
        task["messages"] = messages
        users = [m for m in messages if m.get("role") == "user"]
        if users:
            task.setdefault("question", response_text(users[0]))
    if data.get("ground_truth") is not None:
        task["ground_truth"] = data["ground_truth"]
        task.setdefault("answer", data["ground_truth"])
    return task


def _agent_output(out: Any, path: str, where: str) -> tuple[str, list[dict[str, Any]]]:
    if not isinstance(out, dict):
        raise ConfigError(f"{path}: {where} must be an object with 'messages'")
    messages = out.get("messages") or []
    assistants = [m for m in messages if isinstance(m, dict) and m.get("role") == "assistant"]
    return (response_text(assistants[-1]) if assistants else ""), messages


def read_try_input(path: str | Path, role: str) -> TryInput:
    """Parse ``path`` for ``role`` (workflow, judge, group_reward); errors name the file and key."""
    path = str(path)
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"--input {path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    if "func_type" in data:
        return _from_dashscope(data, path, role)
    if "task" not in data:
        raise ConfigError(f"{path}: expected a 'task' key (or a DashScope input with 'func_type')")
    if not isinstance(data["task"], dict):
        raise ConfigError(f"{path}: 'task' must be an object")
    out = TryInput(
        task=data["task"], model=data.get("model"), sampling=dict(data.get("sampling") or {}), source="reinforge"
    )
    if role == "judge":
        if "response" not in data:
            raise ConfigError(f"{path}: a judge input needs 'response'")
        out.response = data["response"]
    if role == "group_reward":
        if not isinstance(data.get("responses"), list):
            raise ConfigError(f"{path}: a group-reward input needs a 'responses' list")
        out.responses = data["responses"]
    out.rollout_seconds = data.get("rollout_seconds")
    return out


def _from_dashscope(data: dict[str, Any], path: str, role: str) -> TryInput:
    kind = DASHSCOPE_ROLES.get(str(data["func_type"]).replace("-", "_"))
    if kind != role:
        raise ConfigError(f"{path}: func_type is {data['func_type']!r}, but you are trying a {role.replace('_', ' ')}")
    if role == "workflow":
        res = data.get("model_resource") or {}
        model = None
        if res:
            model = {
                "model_path": res.get("model_name"),
                "api_base": res.get("base_url"),
                "api_key": res.get("api_key"),
            }
        sampling = {k: v for k, v in (data.get("sampling_params") or {}).items() if k not in ("max_turns", "timeout")}
        return TryInput(task=_dashscope_task(data, data.get("messages") or []), model=model, sampling=sampling)
    if role == "judge":
        text, messages = _agent_output(data.get("agent_output"), path, "agent_output")
        out = TryInput(task=_dashscope_task(data, messages), response=text)
        agent = data.get("agent_output") or {}
        out.preset_reward = agent.get("reward_score")
        latency = (agent.get("rollout_metrics") or {}).get("latency")
        out.rollout_seconds = float(latency) if isinstance(latency, (int, float)) else None
        if not any(m.get("role") == "assistant" for m in messages if isinstance(m, dict)):
            out.notes.append("agent_output has no assistant message: the response is empty")
        if out.preset_reward is not None:
            out.notes.append(
                f"agent_output.reward_score is {out.preset_reward}: in training the judges would be skipped"
            )
        return out
    outputs = data.get("agent_outputs")
    if not isinstance(outputs, list):
        raise ConfigError(f"{path}: a group_reward input needs an 'agent_outputs' list")
    texts = [_agent_output(o, path, f"agent_outputs[{i}]")[0] for i, o in enumerate(outputs)]
    return TryInput(task=_dashscope_task(data, []), responses=texts)
