"""Turning a run config into callables: the fully resolved job a backend receives."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .agentscope_model import agentscope_adapter, agentscope_available, wants_agentscope
from .errors import ConfigError
from .rewards import JudgeSlot, RewardComposer
from .runner import Runner, RunnerSettings
from .signatures import BoundFunction

if TYPE_CHECKING:
    import pluggy

    from .config import RunConfig
    from .models import ChatModel
    from .plugins import Registry


def build_composer(run: RunConfig, registry: Registry) -> RewardComposer:
    """Resolve every judge of the run and wire them into a composer."""
    from .refs import resolve_component

    slots = []
    for i, spec in enumerate(run.judges):
        bound = resolve_component(spec, "judge", registry, where=run.where(f"judges[{i}]"), base_dir=run.base_dir)
        kind = spec.kind or getattr(bound.func, "reinforge_kind", None) or "rule"
        if kind not in ("rule", "model"):
            raise ConfigError(f"{run.where(f'judges[{i}]')}: kind must be 'rule' or 'model', got {kind!r}")
        slots.append(
            JudgeSlot(
                name=spec.metric_name,
                fn=bound,
                weight=spec.weight,
                gate=spec.gate,
                kind=kind,
                metric_weights=dict(spec.metric_weights) if spec.metric_weights else None,
            )
        )
    group_weight = run.group_reward.weight if run.group_reward is not None else None
    return RewardComposer(
        slots,
        scores=run.reward.scores,
        group_reward_weight=group_weight,
        strict_weights=run.reward.strict_weights,
        judge_timeout_s=run.runner.judge_timeout_s,
        max_retries=run.runner.max_retries,
    )


@dataclass
class TuneJob:
    """Everything a backend needs, resolved: configs plus checked callables.

    A backend calls :meth:`make_runner` with its own model (or a provider that
    hands each trajectory a recording model) and trains on the kept
    trajectories of each batch. A workflow written for AgentScope's tuner gets
    an AgentScope model over each rollout's ``model.base_url`` instead (see
    :mod:`reinforge.agentscope_model`).
    """

    run: RunConfig
    workflow: BoundFunction
    composer: RewardComposer
    group_reward: BoundFunction | None
    registry: Registry
    plugin_manager: pluggy.PluginManager | None = None
    auxiliary_models: dict[str, ChatModel] = field(default_factory=dict)

    @property
    def hook(self) -> Any:
        return self.plugin_manager.hook if self.plugin_manager is not None else None

    def make_runner(
        self,
        *,
        model: ChatModel | None = None,
        model_provider: Any = None,
        group_size: int | None = None,
        sampling: dict[str, Any] | None = None,
    ) -> Runner:
        rc = self.run.runner
        size = group_size if group_size is not None else self.run.algorithm.group_size
        settings = RunnerSettings(group_size=size, **dataclasses.asdict(rc))
        if sampling is None and self.run.model is not None:
            sampling = self.run.model.sampling()
        adapter = None
        if wants_agentscope(self.workflow, self.run.model_interface):
            adapter = agentscope_adapter(sampling)  # the workflow was written for AgentScope's tuner
        return Runner(
            self.workflow,
            self.composer,
            model=model,
            model_provider=model_provider,
            group_reward=self.group_reward,
            settings=settings,
            auxiliary_models=self.auxiliary_models or None,
            sampling=sampling,
            hook=self.hook,
            logger=logging.getLogger(f"reinforge.workflow.{self.run.experiment_name}"),
            model_adapter=adapter,
        )


def build_job(run: RunConfig, plugin_manager: pluggy.PluginManager | None = None) -> TuneJob:
    """Resolve a run's references against the installed plugins."""
    from .plugins import build_registry, get_plugin_manager
    from .refs import resolve_component

    pm = plugin_manager or get_plugin_manager()
    registry = build_registry(pm)
    base = run.base_dir
    workflow = resolve_component(run.workflow, "workflow", registry, where=run.where("workflow"), base_dir=base)
    if wants_agentscope(workflow, run.model_interface):
        agentscope_available()  # a missing reinforge[agentscope] fails before any model loads
    group_reward = None
    if run.group_reward is not None:
        where = run.where("group_reward")
        group_reward = resolve_component(run.group_reward, "group_reward", registry, where=where, base_dir=base)
    composer = build_composer(run, registry)
    aux = {name: make_chat_model(cfg) for name, cfg in run.auxiliary_models.items()}
    return TuneJob(run, workflow, composer, group_reward, registry, pm, aux)


def make_chat_model(model_cfg: Any) -> ChatModel:
    """A LiteLLM model for a config that names an API (``api_base`` or a provider prefix)."""
    from .litellm_model import LiteLLMChatModel

    api_key = model_cfg.api_key
    if api_key is None and getattr(model_cfg, "api_key_env", None):
        import os

        api_key = os.environ.get(model_cfg.api_key_env)
    return LiteLLMChatModel(model_cfg.model_path, api_base=model_cfg.api_base, api_key=api_key)
