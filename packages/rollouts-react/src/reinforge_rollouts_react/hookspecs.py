"""Hook specifications this package adds to reinforge's plugin manager (through ``reinforge_addhooks``).

A plugin package publishes tools by name, so a run file can say
``workflow: {name: react, args: {tools: [my_tool]}}``::

    from reinforge import hookimpl
    from reinforge_rollouts_react import tool

    @tool
    def word_count(text: str) -> int:
        \"\"\"Count the words of a text.

        Args:
            text: The text to count.
        \"\"\"
        return len(text.split())

    @hookimpl
    def register_tools(register):
        register(word_count)

Tool names are global: two plugins registering the same name make it a
conflict, and using it is an error naming both distributions. The spec is
added by this package's plugin in ``reinforge_addhooks``, so a plugin needs no
``optionalhook`` to implement it; without this package installed (or
selected) a ``register_tools`` hook matches no spec and its plugin is reported
broken.
"""

from __future__ import annotations

from typing import Any

from reinforge.plugin import hookspec


@hookspec
def register_tools(register: Any) -> None:
    """Register tools an agent can be given by name.

    :param register: ``register(tool)`` with a :class:`~reinforge_rollouts_react.Tool`
        (or a function, which is made into one with ``@tool``), or
        ``register(name, tool_or_function, *, description="")`` to publish it
        under another name. A hook that raises (a function that cannot be a
        tool) makes its plugin broken; other plugins' tools keep working.
        Do not register tools that reach the network or a shell unless a user
        asks for them by name: nothing here is enabled unless a run lists it.
    :return: nothing; call ``register`` once per tool.
    """
