"""The plugin API of reinforge: everything a plugin package imports from core, in one module.

A plugin is a module published under the ``reinforge`` entry-point group
(entry-point name = distribution name) whose functions implement the hooks of
:mod:`reinforge.hookspecs`::

    from reinforge.plugin import Backend, Settings, hookimpl

    @hookimpl
    def register_judges(register):
        register("schema", SchemaJudge, settings=SchemaSettings, kind="rule", reward_range=(0, 1))

    @hookimpl
    def register_backends(register):
        register("my-backend", MyBackend)

What is here:

- :data:`hookimpl` / :data:`hookspec`: pluggy markers for the ``reinforge`` project.
- :class:`Backend`: the typed base class of a training backend (settings,
  algorithms with their own settings, ``run``/``dry_run``/``chat_model``).
- :class:`TuneJob`: what a backend receives (built components, checked
  settings); :class:`RunContext`: the run lifecycle core owns
  (``with job.running() as run:``, ``run.step_end(metrics)``,
  ``run.eval_end(metrics)``, ``run.request_stop(reason)``).
- :class:`Settings`, :func:`load_settings`, :class:`FieldError` and the value
  checks: the one settings checker, for backends and components alike.
- :class:`Registry`, :class:`Component`, :class:`Kind`, :func:`collect`:
  registries of named things, also for a package's own kinds (tools).
- :func:`resolve_ref`: a registered name, ``module:attr`` or a callable to the object.
- :func:`load_run`, :func:`build_job`, :func:`build_composer`, :class:`RewardComposer`,
  :func:`wants_agentscope`, :func:`agentscope_chat_model`: a run file to its built components, for packages that run a
  run's workflow and judges outside ``reinforge tune`` (another engine's workers, a gateway).
- :func:`eval_dataset`, :func:`accuracy_of`, :func:`dimension_means`: what ``reinforge eval``
  reads and reports, for packages that score a policy on a run's eval set themselves.
- :mod:`metric_names <reinforge.metric_names>`: the step metrics' names, for backends that write them
  and observers that read them (``from reinforge.plugin import metric_names as mn``; ``mn.REWARD_MEAN``).
- :class:`ConfigurationError`: a component's permanent error (the run stops); :class:`RunnerError`: a batch
  the runner could not run (every rollout failed); :class:`BatchResult`, :class:`GroupResult`: what it returns.
- :class:`ApiError`, :func:`check_bearer`, :func:`bearer_matches`, :class:`CountResponses`: what the
  family's OpenAI-compatible servers share (``reinforge serve``, the online gateway): OpenAI-style
  errors, constant-time bearer keys, a response counter (:mod:`reinforge.serving`).

Plugins add their own hookspecs in ``reinforge_addhooks(pluginmanager)``; a
``@hookimpl`` that matches no specification makes its plugin broken, with a
message naming the plugin and the hook.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import metric_names
from .hookspecs import hookimpl, hookspec

if TYPE_CHECKING:  # the names below load on first use: a plugin module that imports hookimpl stays cheap
    from .agentscope_model import agentscope_chat_model, wants_agentscope
    from .backend import Backend, NoSettings
    from .components import ComponentContext, ComponentPlan, build_component, plan_component
    from .config import AlgorithmConfig, ComponentSpec, DatasetConfig, ModelConfig, RunConfig
    from .errors import (
        ConfigError,
        ConfigurationError,
        MissingExtraError,
        PluginError,
        ReinforgeError,
        ResolveError,
        RewardError,
        RunnerError,
        require,
    )
    from .evaluation import accuracy_of, check_accuracy_key, dimension_means, eval_dataset, tool_use_of
    from .job import TuneJob, build_composer, build_job
    from .lifecycle import RunContext, RunStatus
    from .litellm_model import LiteLLMChatModel
    from .models import RecordingChatModel
    from .plugins import BrokenPlugin, PluginManager, build_registry, collect, get_plugin_manager, plugin_distribution
    from .refs import resolve_ref
    from .registry import KINDS, Component, Kind, Registry
    from .rewards import RewardComposer
    from .runfile import load_run, to_dict
    from .runner import BatchResult, GroupResult, Runner
    from .serving import ApiError, CountResponses, bearer, bearer_matches, check_bearer
    from .settings import FieldError, Settings, at_least, finite, in_range, one_of, suggest
    from .settings import load as load_settings

_LAZY = {
    "agentscope_chat_model": ("agentscope_model", "agentscope_chat_model"),
    "wants_agentscope": ("agentscope_model", "wants_agentscope"),
    "Backend": ("backend", "Backend"),
    "NoSettings": ("backend", "NoSettings"),
    "ComponentContext": ("components", "ComponentContext"),
    "ComponentPlan": ("components", "ComponentPlan"),
    "build_component": ("components", "build_component"),
    "plan_component": ("components", "plan_component"),
    "AlgorithmConfig": ("config", "AlgorithmConfig"),
    "ComponentSpec": ("config", "ComponentSpec"),
    "DatasetConfig": ("config", "DatasetConfig"),
    "ModelConfig": ("config", "ModelConfig"),
    "RunConfig": ("config", "RunConfig"),
    "load_run": ("runfile", "load_run"),
    "to_dict": ("runfile", "to_dict"),
    "ConfigError": ("errors", "ConfigError"),
    "ConfigurationError": ("errors", "ConfigurationError"),
    "MissingExtraError": ("errors", "MissingExtraError"),
    "PluginError": ("errors", "PluginError"),
    "ReinforgeError": ("errors", "ReinforgeError"),
    "ResolveError": ("errors", "ResolveError"),
    "RewardError": ("errors", "RewardError"),
    "RunnerError": ("errors", "RunnerError"),
    "require": ("errors", "require"),
    "accuracy_of": ("evaluation", "accuracy_of"),
    "tool_use_of": ("evaluation", "tool_use_of"),
    "check_accuracy_key": ("evaluation", "check_accuracy_key"),
    "dimension_means": ("evaluation", "dimension_means"),
    "eval_dataset": ("evaluation", "eval_dataset"),
    "LiteLLMChatModel": ("litellm_model", "LiteLLMChatModel"),
    "RecordingChatModel": ("models", "RecordingChatModel"),
    "BatchResult": ("runner", "BatchResult"),
    "GroupResult": ("runner", "GroupResult"),
    "Runner": ("runner", "Runner"),
    "TuneJob": ("job", "TuneJob"),
    "build_composer": ("job", "build_composer"),
    "build_job": ("job", "build_job"),
    "RunContext": ("lifecycle", "RunContext"),
    "RunStatus": ("lifecycle", "RunStatus"),
    "BrokenPlugin": ("plugins", "BrokenPlugin"),
    "PluginManager": ("plugins", "PluginManager"),
    "collect": ("plugins", "collect"),
    "get_plugin_manager": ("plugins", "get_plugin_manager"),
    "build_registry": ("plugins", "build_registry"),
    "plugin_distribution": ("plugins", "plugin_distribution"),
    "resolve_ref": ("refs", "resolve_ref"),
    "KINDS": ("registry", "KINDS"),
    "Component": ("registry", "Component"),
    "Kind": ("registry", "Kind"),
    "Registry": ("registry", "Registry"),
    "RewardComposer": ("rewards", "RewardComposer"),
    "ApiError": ("serving", "ApiError"),
    "CountResponses": ("serving", "CountResponses"),
    "bearer": ("serving", "bearer"),
    "bearer_matches": ("serving", "bearer_matches"),
    "check_bearer": ("serving", "check_bearer"),
    "FieldError": ("settings", "FieldError"),
    "Settings": ("settings", "Settings"),
    "at_least": ("settings", "at_least"),
    "finite": ("settings", "finite"),
    "in_range": ("settings", "in_range"),
    "one_of": ("settings", "one_of"),
    "suggest": ("settings", "suggest"),
    "load_settings": ("settings", "load"),
}


if not TYPE_CHECKING:  # hidden from type checkers: they see the imports above, so a name dropped from the API
    # is an error in every plugin that uses it (a module __getattr__ would make any name look present)

    def __getattr__(name: str) -> Any:
        """Load the API's names on first use."""
        found = _LAZY.get(name)
        if found is None:
            raise AttributeError(f"module 'reinforge.plugin' has no attribute {name!r}")
        module, attr = found
        value = getattr(importlib.import_module(f"reinforge.{module}"), attr)
        globals()[name] = value
        return value


__all__ = [
    "KINDS",
    "AlgorithmConfig",
    "ApiError",
    "Backend",
    "BatchResult",
    "BrokenPlugin",
    "Component",
    "ComponentContext",
    "ComponentPlan",
    "ComponentSpec",
    "ConfigError",
    "ConfigurationError",
    "DatasetConfig",
    "CountResponses",
    "FieldError",
    "GroupResult",
    "Kind",
    "LiteLLMChatModel",
    "MissingExtraError",
    "ModelConfig",
    "NoSettings",
    "PluginError",
    "PluginManager",
    "RecordingChatModel",
    "Registry",
    "ReinforgeError",
    "ResolveError",
    "RewardComposer",
    "RewardError",
    "RunConfig",
    "RunContext",
    "RunnerError",
    "RunStatus",
    "Runner",
    "Settings",
    "TuneJob",
    "accuracy_of",
    "agentscope_chat_model",
    "tool_use_of",
    "at_least",
    "bearer",
    "bearer_matches",
    "build_component",
    "build_composer",
    "build_registry",
    "build_job",
    "check_accuracy_key",
    "check_bearer",
    "collect",
    "dimension_means",
    "eval_dataset",
    "finite",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
    "in_range",
    "load_run",
    "load_settings",
    "metric_names",
    "one_of",
    "plan_component",
    "plugin_distribution",
    "require",
    "resolve_ref",
    "suggest",
    "to_dict",
    "wants_agentscope",
]
