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
