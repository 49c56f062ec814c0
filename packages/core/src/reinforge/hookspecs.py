"""Hook specifications: what a reinforge plugin can implement.

A plugin is a module (or object) with functions decorated by ``@hookimpl``,
published under the ``reinforge`` entry-point group (entry-point name = the
distribution's name). Registration hooks receive a ``register`` callable, in
the style of simonw/llm::

    from reinforge.plugin import hookimpl

    @hookimpl
    def register_judges(register):
        register("my_judge", my_judge, kind="rule", reward_range=(0, 1))

Names are global per kind: two plugins registering the same judge name is an
error naming both distributions when the name is used. ``register`` checks
what it gets (a judge must take ``(task, response, ...)``, a backend must be a
class) and refuses core's built-in names (``json_valid``, ...): either is a
``PluginError`` naming the distribution, kind and name. A ``@hookimpl`` whose
name matches no specification (a typo) makes its plugin broken, with a message
naming the plugin and the hook. Packages add hooks of their own through
:func:`reinforge_addhooks`.

Who calls what, and when:

- ``reinforge_addhooks``: the plugin manager, when each plugin registers.
- ``register_*``: :func:`reinforge.plugins.build_registry`, once per command
  (or ``tune()``/``evaluate()`` call), one plugin at a time.
- ``register_commands``: the ``reinforge`` command line, at start.
- ``on_run_start``, ``on_step_end``, ``on_run_end``: core's run lifecycle
  (:class:`reinforge.plugin.RunContext`), never a backend directly.
- ``on_trajectory``: the shared runner, after each group is scored, through
  the run's :class:`reinforge.plugin.RunContext` (only for runners of a run:
  ``job.make_runner`` inside ``job.running()``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .lifecycle import RunContext
    from .trajectory import Trajectory

PROJECT_NAME = "reinforge"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec(historic=True)
def reinforge_addhooks(pluginmanager: pluggy.PluginManager) -> None:
    """Add hook specifications of a plugin's own (called for every plugin as it registers).

    Historic: a plugin registered later still gets the call. Use it instead of
    patching the manager late, so other plugins can implement your hooks and a
    typo in theirs is still caught::

        @hookimpl
        def reinforge_addhooks(pluginmanager):
            from . import hookspecs
            pluginmanager.add_hookspecs(hookspecs)

    :param pluginmanager: the :class:`pluggy.PluginManager` being built.
    :return: nothing.
    """


@hookspec
def register_workflows(register: Any) -> None:
    """Register workflow functions by name.

    :param register: ``register(name, obj, *, settings=None, description="")``.
        ``obj`` is a function following the workflow contract ``(task, model,
        auxiliary_models=None, logger=None) -> WorkflowOutput`` (its extra
        keyword parameters with defaults are settable from the run file's
        ``workflow: {args: ...}``), or a class built once per run with those
        settings whose instances are such callables (closed at the end of the
        run through ``close()``/``aclose()``). ``settings`` is a
        :class:`reinforge.settings.Settings` dataclass the ``args`` are checked
        against before any model loads; a class then receives the checked
        settings object as its one argument, a function its fields as keywords.
    :return: nothing; call ``register`` once per workflow.
    """


@hookspec
def register_judges(register: Any) -> None:
    """Register judge functions by name.

    :param register: ``register(name, obj, *, settings=None, kind=None,
        reward_range=None, description="")``. ``obj`` follows the judge
        contract ``(task, response, auxiliary_models=None, logger=None) ->
        JudgeOutput`` (or a number); a function, or a class built once per run
        (see :func:`register_workflows` for ``settings`` and classes; a
        ``@reward_func`` class works too). ``kind="model"`` marks a judge that
        calls a model: the rule gate skips it for responses that fail the gate.
        ``reward_range=(low, high)``: a reward outside it stops the run with an
        error naming the judge (a 7.0 from a 0..1 judge is a bug, not a score).
    :return: nothing.
    """


@hookspec
def register_group_rewards(register: Any) -> None:
    """Register group reward functions by name.

    :param register: ``register(name, obj, *, settings=None,
        reward_range=None, description="")`` as for judges; ``obj`` follows
        ``(task, responses, auxiliary_models=None, logger=None) ->
        GroupRewardOutput`` and must return exactly one reward per response.
    :return: nothing.
    """


@hookspec
def register_backends(register: Any) -> None:
    """Register training backends by name.

    :param register: ``register(name, backend_class)`` with a subclass of
        :class:`reinforge.plugin.Backend`: it declares its ``settings`` (the
        run file's ``backend_args``) and its ``algorithms`` (each name with its
        own settings: the keys under ``algorithm:``), and implements
        ``run(job)``; ``dry_run(job)`` and ``chat_model(model_config)`` have
        defaults.
    :return: nothing.
    """


@hookspec
def register_run_sections(register: Any) -> None:
    """Declare the plugin's own top-level section of the run file (``sentinels:``, ``report:``).

    Core checks a registered section like its own keys: when ``load_run`` is
    given the run's registry (``reinforge tune``, ``--dry-run``, ``eval``) and
    when a job is built (``tune()`` from Python), a typo in it is a
    ``ConfigError`` naming the file and the dotted key. A top-level key that
    no installed plugin registered is an unknown key, with a did-you-mean over
    core's keys and the registered sections.

    :param register: ``register(name, settings_class, description="")``:
        ``settings_class`` is a :class:`reinforge.plugin.Settings` dataclass;
        ``name`` must not be one of core's run-file keys. The checked instance
        is ``run.sections[name]`` (``run.section(name)``), read by the
        plugin's observer hooks (``run.config.section(name)``); a run file
        without the key gets the class's defaults.
    :return: nothing.
    """


@hookspec
def register_commands(register: Any) -> None:
    """Add subcommands to the ``reinforge`` command line.

    :param register: ``register(name, run, *, help="", arguments=None)``.
        ``name`` is the command path, e.g. ``"judge audit"`` (a group is
        created for the first word when needed); ``arguments(parser)`` adds
        argparse arguments; ``run(args) -> int`` executes it and returns the
        exit code. Raise ``ReinforgeError`` for user errors: the CLI prints
        them without a traceback.
    :return: nothing.
    """


@hookspec
def on_trajectory(trajectory: Trajectory, run: RunContext) -> None:
    """Called by the runner once for every finished rollout of a run, kept or discarded.

    Observers must not mutate the trajectory. Exceptions propagate: a broken
    monitoring plugin should be noticed, not silently ignored. Keep what you
    collect in ``run.state[<your distribution name>]``, as for the other
    observer hooks.

    :param trajectory: the scored (or failed) rollout; ``trajectory.ok`` tells
        whether it is used for training.
    :param run: the run's :class:`~reinforge.plugin.RunContext`.
    """


@hookspec
def on_run_start(run: RunContext) -> None:
    """Called once when a run (``tune`` or ``eval``) starts, before any model loads.

    Read your own run-file section here (``run.config.section(name)``, see
    :func:`register_run_sections`) and keep
    per-run state in ``run.state[<your distribution name>]``, never at module
    level: one process may run many runs. Raising stops the run (``on_run_end``
    is still called).

    :param run: the run's :class:`~reinforge.plugin.RunContext`.
    """


@hookspec
def on_step_end(step: int, metrics: dict[str, float], kind: str, run: RunContext) -> None:
    """Called after each training step and after each evaluation.

    An observer may ask the run to stop with ``run.request_stop(reason)``: the
    backend finishes the step, evaluates, saves and reports, and the summary
    names the reason.

    :param step: the 1-based global step (0 for an evaluation of the base model).
    :param metrics: the step's metrics under their stable names
        (:mod:`reinforge.metric_names`).
    :param kind: ``"train"`` or ``"eval"``.
    :param run: the run's :class:`~reinforge.plugin.RunContext`.
    """


@hookspec
def on_run_end(summary: dict[str, Any], run: RunContext) -> None:
    """Called exactly once when a run ends: finished, failed, interrupted or stopped by an observer.

    Core calls it from a ``finally``, so it also runs when every rollout of a
    batch failed, a step raised, or the user pressed Ctrl-C.

    :param summary: ``status`` (``finished``, ``stopped``, ``interrupted``,
        ``failed``, ``diverged``), ``error`` when it failed, ``stop_reason``
        when an observer stopped it, ``run_dir`` when there is one, and the
        backend's final metrics. Observers may add keys (``report``); the dict
        is what ``tune()`` returns.
    :param run: the run's :class:`~reinforge.plugin.RunContext`.
    """
