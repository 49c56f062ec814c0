"""Hook specifications this package adds to reinforge's plugin manager (through ``reinforge_addhooks``).

A plugin publishes a selection strategy by name, so ``online.yaml`` can say
``selection: {strategy: my_strategy, args: {...}}``::

    from reinforge import hookimpl

    class EveryOther:
        def __init__(self, start: int = 0) -> None:
            self.n = start

        def select(self, request) -> bool:
            self.n += 1
            return self.n % 2 == 0

    @hookimpl
    def register_selection_strategies(register):
        register("every_other", EveryOther)

and a committer by name, so ``online.yaml`` can say ``committer: {kind: my_committer, args: {...}}``::

    @hookimpl
    def register_committers(register):
        register("my_committer", MyCommitter.from_settings, settings=MySettings)

A package that works without reinforge-online marks its implementation
``@hookimpl(optionalhook=True)``: without this package there is no such hook, and nothing breaks.
"""

from __future__ import annotations

from typing import Any

from reinforge.plugin import hookspec


@hookspec
def register_selection_strategies(register: Any) -> None:
    """Register selection strategies the gateway can be configured with by name.

    :param register: ``register(name, factory, *, settings=None, description="")``.
        ``factory`` builds the strategy once per gateway: ``factory(settings)`` when a
        :class:`reinforge.plugin.Settings` class is given (``selection.args`` checked
        against it), else ``factory(**args)``. The strategy has
        ``select(request: SelectionRequest) -> bool``, called on the event loop for
        every request of a route with a mode: keep it fast and never block.
    :return: nothing; call ``register`` once per strategy.
    """


@hookspec
def register_committers(register: Any) -> None:
    """Register committers: where rewarded batches go, named by ``committer.kind``.

    Called by reinforge-online while it builds a gateway (``reinforge online serve``) or an
    ``OnlineTrainer``, before anything binds or starts: one plugin at a time, so each name has an
    owner. Two plugins registering one name is an error naming both when the name is used.

    :param register: ``register(name, factory, *, settings=None, description="")``.
        ``settings`` is a :class:`reinforge.plugin.Settings` dataclass; ``committer.args`` is checked
        against it when the file is loaded (errors name the file and ``committer.args.<key>``);
        without one, ``committer.args`` must be empty. ``factory(settings, context)`` is called once
        per gateway or trainer with the checked settings and a
        :class:`reinforge_online.CommitterContext` (the file's name and folder, ``policy.url``,
        ``secret(env_name, key)``), and returns the committer: an object with
        ``send(batch_id: str, rows: list[dict]) -> None``, called on the outbox's thread with each
        rewarded batch and again with the same ``batch_id`` after a failure (so it must accept an
        id twice), and optionally ``close()``, called once at shutdown.
    :return: nothing; call ``register`` once per committer.
    """
