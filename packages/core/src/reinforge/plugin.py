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
- :class:`ConfigurationError`: a component's permanent error (the run stops).

Plugins add their own hookspecs in ``reinforge_addhooks(pluginmanager)``; a
``@hookimpl`` that matches no specification makes its plugin broken, with a
message naming the plugin and the hook.
"""

from __future__ import annotations

from .backend import Backend, NoSettings
from .components import ComponentPlan, build_component, plan_component
from .errors import ConfigError, ConfigurationError, PluginError, ReinforgeError
from .hookspecs import hookimpl, hookspec
from .job import TuneJob
from .lifecycle import RunContext, RunStatus
from .plugins import BrokenPlugin, PluginManager, collect, get_plugin_manager, plugin_distribution
from .refs import resolve_ref
from .registry import KINDS, Component, Kind, Registry
from .settings import FieldError, Settings, at_least, finite, in_range, one_of
from .settings import load as load_settings

__all__ = [
    "KINDS",
    "Backend",
    "BrokenPlugin",
    "Component",
    "ComponentPlan",
    "ConfigError",
    "ConfigurationError",
    "FieldError",
    "Kind",
    "NoSettings",
    "PluginError",
    "PluginManager",
    "Registry",
    "ReinforgeError",
    "RunContext",
    "RunStatus",
    "Settings",
    "TuneJob",
    "at_least",
    "build_component",
    "collect",
    "finite",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
    "in_range",
    "load_settings",
    "one_of",
    "plan_component",
    "plugin_distribution",
    "resolve_ref",
]
