"""Trinity's ``Workflow`` adapter: a reinforge workflow, its judges and group reward inside Trinity's explorer.

The mapping (:func:`reinforge_backend_trinity.mapping.workflow_spec`) writes the run's components into every
taskset's ``workflow_args.reinforge`` as references (``module:attr`` or registered names, never live
functions: the config travels to Ray workers). :class:`ReinforgeWorkflow` rebuilds them on the worker with
core's own ``build_job``, runs all repeats of a task as one group through core's runner (timeouts, retries,
judges, group reward, FAILED handling), and turns every recorded model call into a Trinity ``Experience``.

Each rollout attempt talks to its own ``clone_with_isolated_history()`` of the explorer's model wrapper, through
the wrapper's OpenAI client: with ``enable_history`` Trinity asks the server for token ids and logprobs and
records each call as an ``Experience`` (its own ``experience_extraction``), so a retried attempt's calls never
mix with the kept one's, and concurrent repeats never mix with each other.
A workflow written for AgentScope's tuner gets core's AgentScope model over the same recorded model (its client
calls ``chat``: ``reinforge.agentscope_model.ChatModelClient``), so the agent's calls are recorded the same way.

Importing this module imports Trinity (``trinity.common.workflows``); it is the dotted
``default_workflow_type`` of the written config, loaded only where Trinity runs.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
from typing import TYPE_CHECKING, Any

from reinforge.plugin import (
    ConfigError,
    ConfigurationError,
    RecordingChatModel,
    RunConfig,
    load_settings,
)

from .extra import require_trinity
from .mapping import WORKFLOW_ARGS_KEY

require_trinity("trinity.common.workflows.workflow")  # a MissingExtraError naming the extra, not a bare ImportError

from trinity.common.workflows.workflow import Task, Workflow  # noqa: E402

if TYPE_CHECKING:
    from reinforge import ChatResponse, Trajectory
    from reinforge.plugin import BatchResult, TuneJob

__all__ = ["OpenAIClientChatModel", "ReinforgeWorkflow", "job_from_spec"]

log = logging.getLogger("reinforge.trinity")

# chat.completions.create keywords of the OpenAI client; any other sampling key goes in extra_body
_OPENAI_KEYS = frozenset(
    {
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "top_logprobs",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "user",
    }
)
# the spec's keys that are run-file keys (the rest: base_dir, run_file, sampling are the adapter's own)
_RUN_KEYS = ("workflow", "judges", "group_reward", "reward", "runner", "model_interface", "auxiliary_models")
_PREFIX = "reinforge/"  # Trinity metric names of the task-level counts


# --------------------------------------------------------------------------- the model a workflow sees


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


class OpenAIClientChatModel:
    """A reinforge ``ChatModel`` over an ``openai.AsyncOpenAI`` client (Trinity's recording client).

    The response keeps what the server returned for RL (vLLM-style ``prompt_token_ids``,
    ``choices[0].token_ids``, logprobs), so core's trajectory carries the same tokens as Trinity's record.
    """

    def __init__(self, client: Any, model_name: str, *, api_key: str | None = None) -> None:
        self.client = client
        self.model_name = model_name
        self.api_key = api_key
        # no public ``base_url``: a call sent straight to the server would bypass Trinity's recording client, so
        # core hands an AgentScope workflow a model whose client calls ``chat`` (reinforge.agentscope_model)

    def __repr__(self) -> str:
        return f"OpenAIClientChatModel({self.model_name!r}, server={str(getattr(self.client, 'base_url', ''))!r})"

    async def chat(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, **sampling: Any
    ) -> ChatResponse:
        from reinforge import ChatResponse

        params: dict[str, Any] = {}
        extra: dict[str, Any] = dict(sampling.pop("extra_body", None) or {})
        for key, value in sampling.items():
            if value is None:
                continue
            (params if key in _OPENAI_KEYS else extra)[key] = value
        if tools:
            params["tools"] = tools
        if extra:
            params["extra_body"] = extra
        response = await self.client.chat.completions.create(model=self.model_name, messages=messages, **params)
        choice = response.choices[0]
        raw = choice.message
        message: dict[str, Any] = {"role": _get(raw, "role") or "assistant", "content": _get(raw, "content")}
        calls = _get(raw, "tool_calls")
        if calls:
            message["tool_calls"] = [
                {
                    "id": _get(c, "id"),
                    "type": _get(c, "type") or "function",
                    "function": {
                        "name": _get(_get(c, "function"), "name"),
                        "arguments": _get(_get(c, "function"), "arguments") or "{}",
                    },
                }
                for c in calls
            ]
        content = _get(_get(choice, "logprobs"), "content")
        usage = _get(response, "usage")
        prompt_ids = _get(response, "prompt_token_ids")
        completion_ids = _get(choice, "token_ids")
        return ChatResponse(
            message=message,
            finish_reason=_get(choice, "finish_reason"),
            usage={k: int(_get(usage, k) or 0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
            if usage is not None
            else {},
            prompt_token_ids=list(prompt_ids) if prompt_ids is not None else None,
            completion_token_ids=list(completion_ids) if completion_ids is not None else None,
            logprobs=[float(_get(item, "logprob", 0.0)) for item in content] if content else None,
            model=_get(response, "model"),
        )


# --------------------------------------------------------------------------- the run's components


def job_from_spec(spec: dict[str, Any], *, group_size: int) -> TuneJob:
    """Core's job (built workflow, judges, group reward, composer) from the mapping's ``workflow_args.reinforge``.

    References resolve against the installed plugins and the run file's folder (``base_dir``), as core
    resolves them for every backend. The caller closes the job.

    :raises ConfigError: the spec is not one the mapping wrote (the message names the key).
    """
    from reinforge.plugin import build_job  # core's one builder of a run's components

    where = spec.get("run_file") or f"workflow_args.{WORKFLOW_ARGS_KEY}"
    if not isinstance(spec.get("workflow"), dict) or not spec["workflow"].get("ref"):
        raise ConfigError(
            f"{where}: workflow_args.{WORKFLOW_ARGS_KEY}.workflow: missing; ReinforgeWorkflow runs tasksets "
            "written by reinforge-backend-trinity (reinforge tune --backend trinity --dry-run)"
        )
    data = {key: spec[key] for key in _RUN_KEYS if spec.get(key) is not None}
    runner = dict(data.get("runner") or {})
    # core checks runner.min_group_size against the run's group size: the size of this group is what matters
    data["algorithm"] = {"group_size": max(group_size, int(runner.get("min_group_size", 1)))}
    run: RunConfig = load_settings(RunConfig, data, where=where, prefix=f"workflow_args.{WORKFLOW_ARGS_KEY}")
    run.source = spec.get("run_file")
    run.base_dir = spec.get("base_dir")
    return build_job(run, need_backend=False)


def _spec_of(task: Task) -> dict[str, Any]:
    args = task.workflow_args or {}
    spec = args.get(WORKFLOW_ARGS_KEY)
    if not isinstance(spec, dict):
        raise ConfigError(
            f"ReinforgeWorkflow: the task's workflow_args has no {WORKFLOW_ARGS_KEY!r} mapping (keys: "
            f"{sorted(args) or 'none'}); the taskset must be written by reinforge-backend-trinity, which puts the "
            "run's workflow, judges and group reward there as references"
        )
    return spec


def _close(job: TuneJob) -> None:
    """Close a job's components; from a thread, since a component's ``aclose`` cannot run inside a running loop."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(job.close).result()


# --------------------------------------------------------------------------- the workflow


class ReinforgeWorkflow(Workflow):
    """Runs a reinforge workflow, its judges and group reward on all repeats of one Trinity task.

    ``can_repeat``: Trinity hands the whole group to one instance (``set_repeat_times``), so a group
    reward ranks every repeat together. ``can_reset``: the runner keeps the instance across tasks, and the
    run's components are built once per runner (rebuilt only when a task names other components).
    """

    is_async = True
    can_repeat = True
    can_reset = True

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list[Any] | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        if not getattr(model, "enable_history", False):
            raise ConfigurationError(
                "ReinforgeWorkflow: the rollout model records no calls; set explorer.rollout_model.enable_history "
                "and enable_openai_api to true (reinforge's written config does)"
            )
        self.repeat_times = max(1, int(task.rollout_args.n or 1))
        self._job: TuneJob | None = None
        self._key: str | None = None
        self.reset(task)

    # -- Trinity's API ----------------------------------------------------------------------

    def reset(self, task: Task) -> None:
        """A new task for the same instance: keep the built components unless the task names others."""
        self.task = task
        spec = _spec_of(task)
        key = json.dumps(spec, sort_keys=True, default=str)
        if key != self._key:
            if self._job is not None:
                _close(self._job)
            self._job = None
            self._spec, self._key = spec, key

    def set_repeat_times(self, repeat_times: int, run_id_base: int) -> None:
        self.repeat_times = int(repeat_times)
        self.run_id_base = int(run_id_base)
        whole = self.task.repeat_times
        if whole and repeat_times < whole:
            log.warning(
                "ReinforgeWorkflow: %d of the task's %d repeats run here (explorer.max_repeat_times_per_runner): "
                "the group reward and group statistics see only these",
                repeat_times,
                whole,
            )

    async def run_async(self) -> list[Any]:
        """All repeats through core's runner; one ``Experience`` per model call of every kept rollout."""
        job = self._built()
        clones: dict[int, Any] = {}
        clients: list[Any] = []
        defaults = self._sampling()
        name = self.model.model_path

        def provide(trajectory: Trajectory) -> RecordingChatModel:
            clone = self.model.clone_with_isolated_history()  # per attempt: a retried attempt's calls are gone
            client = clone.get_openai_async_client()
            clones[id(trajectory)] = clone
            clients.append(client)
            chat = OpenAIClientChatModel(client, name, api_key=self.model.api_key)
            return RecordingChatModel(chat, trajectory, defaults)

        saved = dict(job.auxiliary_models)
        job.auxiliary_models.update(self._trinity_auxiliary_models())
        try:
            runner = job.make_runner(model_provider=provide, group_size=self.repeat_times, sampling=defaults)
            result = await runner.run_batch([dict(self.task.raw_task or {})])
        finally:
            job.auxiliary_models.clear()
            job.auxiliary_models.update(saved)
            for client in clients:
                await client.close()
        return self._experiences(result, clones)

    # -- pieces -----------------------------------------------------------------------------

    def _built(self) -> TuneJob:
        if self._job is None:
            self._job = job_from_spec(self._spec, group_size=self.repeat_times)
        return self._job

    def _sampling(self) -> dict[str, Any]:
        """The run's sampling, under the taskset's ``rollout_args`` (Trinity's per-taskset knob, e.g. for eval)."""
        out = dict(self._spec.get("sampling") or {})
        rollout = self.task.rollout_args
        for key in ("temperature", "top_p", "max_tokens"):
            value = getattr(rollout, key, None)
            if value is not None:
                out[key] = value
        return out

    def _trinity_auxiliary_models(self) -> dict[str, Any]:
        """Auxiliary engines Trinity serves (``explorer.auxiliary_models``), by their ``name``, as ChatModels."""
        out: dict[str, Any] = {}
        for index, wrapper in enumerate(self.auxiliary_model_wrappers or []):
            config = wrapper.config
            key = getattr(config, "name", None) or f"auxiliary_{index}"
            out[key] = OpenAIClientChatModel(wrapper.get_openai_async_client(), config.model_path)
        return out

    def _experiences(self, result: BatchResult, clones: dict[int, Any]) -> list[Any]:
        group = result.groups[0]
        counts = {
            f"{_PREFIX}{k.removeprefix('count/')}:sum": float(v)
            for k, v in result.metrics.items()
            if k.startswith("count/")
        }
        exps: list[Any] = []
        for t in group.kept:
            recorded = clones[id(t)].extract_experience_from_history()
            if len(recorded) != len(t.calls):
                raise RuntimeError(
                    f"ReinforgeWorkflow: rollout {t.rollout_index} made {len(t.calls)} model calls but Trinity's model "
                    f"wrapper recorded {len(recorded)}; a workflow must call the model it is given (not another client)"
                )
            metrics = {k: float(v) for k, v in t.rewards.items()}
            for key, value in t.metrics.items():
                metrics[key if key.startswith("boundary/") else f"workflow/{key}"] = float(value)
            metrics[f"{_PREFIX}turns"] = float(len(t.calls))
            for step, (exp, call) in enumerate(zip(recorded, t.calls)):
                # a call the workflow rewarded itself (WorkflowOutput.call_rewards) keeps its own reward
                exp.reward = call.reward if call.reward is not None else t.reward
                exp.eid.run = self.run_id_base + t.rollout_index
                exp.eid.step = step
                exp.metrics = dict(metrics)
                exp.info = {
                    **(exp.info or {}),
                    "reinforge_rewards": dict(t.rewards),
                    "trajectory_reward": t.reward,
                    "group_id": group.group_id,
                    "rollout_index": t.rollout_index,
                    "attempts": t.attempts,
                    "finish_reason": call.response.finish_reason,
                }
                exps.append(exp)
        if exps:
            exps[0].metrics.update(counts)  # once per task, so Trinity's `:sum` over a batch counts each rollout once
        elif group.discarded:
            errors = "; ".join(sorted({t.error or "unknown" for t in group.discarded}))
            raise RuntimeError(
                f"ReinforgeWorkflow: every rollout of task {self.task.task_id!r} was discarded "
                f"({len(group.discarded)} after core's retries; never scored 0): {errors}"
            )
        return exps
