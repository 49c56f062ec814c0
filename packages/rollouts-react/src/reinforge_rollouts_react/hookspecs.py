"""Hook specifications this package adds to reinforge's plugin manager.

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

Tool names are global: two plugins registering the same name is an error
naming both distributions.
"""

from __future__ import annotations

from typing import Any

import pluggy

from reinforge.hookspecs import PROJECT_NAME

hookspec = pluggy.HookspecMarker(PROJECT_NAME)


@hookspec
def register_tools(register: Any) -> None:
    """Register tools an agent can be given by name.

    :param register: ``register(tool)`` with a :class:`~reinforge_rollouts_react.Tool`
        (or a function, which is made into one with ``@tool``), or
        ``register(name, tool_or_function)`` to publish it under another name.
        Do not register tools that reach the network or a shell unless a user
        asks for them by name: nothing here is enabled unless a run lists it.
    :return: nothing; call ``register`` once per tool.
    """
