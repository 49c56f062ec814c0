"""Turning a run config into a job: checked settings, built components, the backend, the lifecycle.

:func:`build_job` does every check a run can fail before any model loads:
references resolve, every component's settings (types included), the
backend's ``backend_args`` and the algorithm's keys. The job then owns what it
built: ``with job.running() as run:`` emits the lifecycle hooks and closes the
components when the run ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .agentscope_model import agentscope_adapter, agentscope_available, wants_agentscope
from .errors import ConfigError, PluginError
from .lifecycle import RunContext, RunStatus
from .rewards import JudgeSlot, RewardComposer
from .runner import Runner, RunnerSettings
from .signatures import BoundFunction

if TYPE_CHECKING:
    import pluggy

    from .backend import Backend
    from .config import ModelConfig, RunConfig
    from .models import ChatModel
    from .registry import Registry

__all__ = ["DEFAULT_BACKEND", "TuneJob", "build_composer", "build_job", "get_backend", "make_chat_model"]

DEFAULT_BACKEND = "local"


def build_composer(
    run: RunConfig, judges: list[BoundFunction], group_reward: BoundFunction | None = None
) -> RewardComposer:
    """Wire the run's built judges and group reward into a composer (weights warnings name the run file)."""
    slots = []
    for spec, bound in zip(run.judges, judges):
        slots.append(
            JudgeSlot(
                name=bound.metric_name or bound.name,
                fn=bound,
                weight=spec.weight,
                gate=spec.gate,
                kind=bound.judge_kind or "rule",
                metric_weights=dict(spec.metric_weights) if spec.metric_weights else None,
            )
        )
    if (group_reward is None) != (run.group_reward is None):
        raise ValueError("build_composer: give the built group reward exactly when the run has one")
    return RewardComposer(
        slots,
        group_reward=group_reward,
        scores=run.reward.scores,
        group_reward_weight=run.group_reward.weight if run.group_reward is not None else None,
        strict_weights=run.reward.strict_weights,
        judge_timeout_s=run.runner.judge_timeout_s,
        max_retries=run.runner.max_retries,
        source=run.source,
    )


def get_backend(name: str | None, registry: Registry) -> Backend:
    """Instantiate a registered backend; a missing one says which package to install."""
    from .backend import Backend

    name = name or DEFAULT_BACKEND
    comp = registry.get("backends", name)
    if comp is None:
        installed = ", ".join(registry.names("backends")) or "none"
        raise PluginError(
            f"backend {name!r} is not installed (installed: {installed}); "
            f"install it with: pip install reinforge-backend-{name}{registry.broken_note()}"
        )
    if not (isinstance(comp.obj, type) and issubclass(comp.obj, Backend)):
        raise PluginError(
            f"backend {name!r} registered by {comp.owner!r} is {comp.obj!r}, not a subclass of reinforge.plugin.Backend"
        )
    impl = comp.obj()
    if not impl.name:
        impl.name = name  # type: ignore[misc]  # a subclass that left the class attribute empty
    return impl


@dataclass
class TuneJob:
    """Everything a backend needs, resolved and checked: configs, built components, its own settings.

    :ivar backend_settings: ``backend_args`` as the backend's settings object.
    :ivar algorithm_settings: the keys under ``algorithm:`` as the selected
        algorithm's settings object (None when it declares none).
    :ivar algorithm_name: the canonical ``algorithm_type`` (aliases resolved).

    A backend calls :meth:`make_runner` with its own model (or a provider that
    hands each trajectory a recording model) and trains on the kept
    trajectories of each batch. A workflow written for AgentScope's tuner gets
    an AgentScope model over each rollout's ``model.base_url`` instead (see
    :mod:`reinforge.agentscope_model`).
    """

    run: RunConfig
    workflow: BoundFunction
    composer: RewardComposer
    registry: Registry
    plugin_manager: pluggy.PluginManager | None = None
    auxiliary_models: dict[str, ChatModel] = field(default_factory=dict)
    backend: Backend | None = None
    backend_settings: Any = None
    algorithm_settings: Any = None
    algorithm_name: str | None = None
    context: RunContext | None = field(default=None, repr=False)
    _closed: bool = field(default=False, repr=False)

    @property
    def hook(self) -> Any:
        """The hook relay, for core's run lifecycle; backends use :meth:`running`."""
        return self.plugin_manager.hook if self.plugin_manager is not None else None

    @property
    def components(self) -> list[BoundFunction]:
        """The run's workflow, judges and group reward, as built for this run."""
        return [self.workflow, *self.composer.components]

    # -- lifecycle --------------------------------------------------------------------------

    @contextlib.contextmanager
    def running(self, kind: str = "tune") -> Iterator[RunContext]:
        """The run lifecycle: ``on_run_start`` now, ``on_run_end`` from a ``finally``, then the components close.

        Entering it again inside (a backend that enters it while core already
        did) yields the same context. Ctrl-C asks the run to stop after the
        current step (``run.stop_requested``); a second Ctrl-C aborts.
        """
        if self.context is not None:
            yield self.context
            return
        ctx = RunContext(config=self.run, kind=kind, hook=self.hook)
        ctx.on_close(self.close)
        self.context = ctx
        try:
            with _sigint_requests_stop(ctx), ctx._lifecycle():
                yield ctx
        finally:
            self.context = None

    def close(self) -> None:
        """Close the components built for this job (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for bound in self.components:
            bound.close()

    # -- for backends ----------------------------------------------------------------------

    def make_runner(
        self,
        *,
        model: ChatModel | None = None,
        model_provider: Any = None,
        group_size: int | None = None,
        sampling: dict[str, Any] | None = None,
    ) -> Runner:
        """The shared runner over this job's components (one per batch or per evaluation).

        Made inside :meth:`running`, its trajectories reach the observers (``on_trajectory``).
        """
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
            settings=settings,
            auxiliary_models=self.auxiliary_models or None,
            sampling=sampling,
            run=self.context,
            logger=logging.getLogger(f"reinforge.workflow.{self.run.experiment_name}"),
            model_adapter=adapter,
        )

    def describe(self) -> dict[str, Any]:
        """The resolved run as plain data (what ``tune --dry-run`` prints by default)."""
        from .runfile import to_dict

        return {
            "backend": self.backend.name if self.backend is not None else self.run.backend,
            "algorithm": self.algorithm_name or self.run.algorithm.algorithm_type,
            "algorithm_settings": to_dict(self.algorithm_settings) if self.algorithm_settings is not None else {},
            "backend_settings": to_dict(self.backend_settings) if self.backend_settings is not None else {},
            "workflow": self.workflow.name,
            "judges": [{"name": s.fn.name, "metric": s.name, "kind": s.kind} for s in self.composer.judges],
            "group_reward": self.composer.group_reward.name if self.composer.group_reward else None,
        }


@contextlib.contextmanager
def _sigint_requests_stop(ctx: RunContext) -> Iterator[None]:
    """First Ctrl-C: stop after this step (status ``interrupted``); second: abort with KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if ctx.stop_requested and ctx.summary.get("status") == RunStatus.INTERRUPTED:
            raise KeyboardInterrupt
        ctx.summary["status"] = RunStatus.INTERRUPTED
        ctx.request_stop("interrupted (Ctrl-C); press it again to abort now")

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def build_job(
    run: RunConfig,
    plugin_manager: pluggy.PluginManager | None = None,
    *,
    backend: str | None = None,
    need_backend: bool | None = None,
) -> TuneJob:
    """Resolve and check a run against the installed plugins, and build its components for one run.

    The plugins are ``plugin_manager``'s, else those of the registry the run
    was loaded with (``load_run(path, registry=...)``), else every installed one.

    :param backend: overrides ``run.backend`` (``--backend``).
    :param need_backend: True (``tune``): the backend must be installed and is
        checked; False (an evaluation of an API model): none is looked up;
        None: checked when the named (or default) backend is installed.
    :raises ConfigError, ResolveError, SignatureError, PluginError: naming the
        file and key, before any model loads.
    """
    from .components import plan_component
    from .plugins import build_registry, get_plugin_manager
    from .runfile import check_sections

    pm: pluggy.PluginManager | None
    if plugin_manager is None and run.registry is not None:
        registry: Registry = run.registry  # the one load_run checked the run against
        pm = registry.plugin_manager
    else:
        pm = plugin_manager or get_plugin_manager()
        registry = build_registry(pm)
    check_sections(run, registry)
    base = run.base_dir
    plans = [plan_component(run.workflow, "workflow", registry, where=run.where("workflow"), base_dir=base)]
    for i, spec in enumerate(run.judges):
        plans.append(plan_component(spec, "judge", registry, where=run.where(f"judges[{i}]"), base_dir=base))
    if run.group_reward is not None:
        where = run.where("group_reward")
        plans.append(plan_component(run.group_reward, "group_reward", registry, where=where, base_dir=base))
    impl = None
    backend_settings = algorithm_settings = algorithm_name = None
    wanted = backend or run.backend
    if need_backend is None:
        need_backend = registry.components["backends"].get(wanted or DEFAULT_BACKEND) is not None
    built: list[BoundFunction] = []
    try:
        # components first (a component resolves what it names, e.g. its tools, when built), then the backend
        for plan in plans:
            built.append(plan.build())
        if need_backend:
            impl = get_backend(wanted, registry)
            where = run.source or "run"
            backend_settings = impl.check_settings(run, where=where)
            algorithm_name = impl.algorithm_name(run.algorithm, where=where)
            algorithm_settings = impl.check_algorithm(run.algorithm, where=where)
        workflow = built[0]
        if wants_agentscope(workflow, run.model_interface):
            agentscope_available()  # a missing reinforge[agentscope] fails before any model loads
        n = len(run.judges)
        composer = build_composer(run, built[1 : 1 + n], built[1 + n] if run.group_reward is not None else None)
        aux = {
            name: make_chat_model(cfg, where=run.where(f"auxiliary_models.{name}"))
            for name, cfg in run.auxiliary_models.items()
        }
    except BaseException:
        for bound in built:
            bound.close()
        raise
    job = TuneJob(
        run,
        workflow,
        composer,
        registry,
        pm,
        aux,
        backend=impl,
        backend_settings=backend_settings,
        algorithm_settings=algorithm_settings,
        algorithm_name=algorithm_name,
    )
    if impl is not None:
        try:
            impl.check(job)
        except BaseException:
            job.close()
            raise
    return job


def make_chat_model(model_cfg: ModelConfig, *, where: str = "") -> ChatModel:
    """A LiteLLM model for a config that names an API (``api_base`` or a provider prefix)."""
    from .litellm_model import LiteLLMChatModel

    try:
        api_key = model_cfg.resolved_api_key()
    except ConfigError as exc:
        raise ConfigError(f"{where}.{exc}" if where else str(exc)) from None
    return LiteLLMChatModel(model_cfg.model_path, api_base=model_cfg.api_base, api_key=api_key)
