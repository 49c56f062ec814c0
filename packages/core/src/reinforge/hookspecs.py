"""Hook specifications: what a reinforge plugin can implement.

A plugin is a module (or object) with functions decorated by ``@hookimpl``,
published under the ``reinforge`` entry-point group. Registration hooks receive
a ``register`` callable, in the style of simonw/llm::

    from reinforge import hookimpl

    @hookimpl
    def register_judges(register):
        register("my_judge", my_judge)

Names are global per kind: two plugins registering the same judge name is an
error naming both distributions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .trajectory import Trajectory

PROJECT_NAME = "reinforge"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def register_workflows(register: Any) -> None:
    """Register workflow functions by name.

    :param register: ``register(name, func)``. ``func`` follows the workflow
        contract ``(task, model, auxiliary_models=None, logger=None) ->
        WorkflowOutput``; extra parameters with defaults are settable from a run
        file's ``workflow_args``.
    :return: nothing; call ``register`` once per workflow.
    """


@hookspec
def register_judges(register: Any) -> None:
    """Register judge functions by name.

    :param register: ``register(name, func)``. ``func`` follows the judge
        contract ``(task, response, auxiliary_models=None, logger=None) ->
        JudgeOutput``; parameters with defaults are settable from ``args``. A
        judge that calls a model should set ``func.reinforge_kind = "model"`` so
        the rule gate skips it for responses that fail the gate.
    :return: nothing.
    """


@hookspec
def register_group_rewards(register: Any) -> None:
    """Register group reward functions by name.

    :param register: ``register(name, func)``. ``func`` follows the contract
        ``(task, responses, auxiliary_models=None, logger=None) ->
        GroupRewardOutput`` and must return exactly one reward per response.
    :return: nothing.
    """


@hookspec
def register_backends(register: Any) -> None:
    """Register training backends by name.

    :param register: ``register(name, factory)``. ``factory()`` returns an
        object with ``run(job: reinforge.TuneJob) -> Any``; it may also offer
        ``chat_model(model_config) -> ChatModel`` so ``reinforge eval`` can
        evaluate the backend's policy.
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
def on_trajectory(trajectory: Trajectory) -> None:
    """Called once for every finished rollout, kept or discarded.

    Observers must not mutate the trajectory. Exceptions propagate: a broken
    monitoring plugin should be noticed, not silently ignored.

    :param trajectory: the scored (or failed) rollout; ``trajectory.ok`` tells
        whether it is used for training.
    """


@hookspec
def on_step_end(step: int, metrics: dict[str, float]) -> None:
    """Called after each training step (and after each evaluation batch).

    :param step: the 1-based global step.
    :param metrics: the step's metrics under their stable names.
    """


@hookspec
def on_run_end(summary: dict[str, Any]) -> None:
    """Called once when a run (tune or eval) ends, also when it fails.

    :param summary: final metrics, counters and ``run_dir`` when there is one.
    """
