"""The plugin module named by the ``reinforge`` entry point in pyproject.toml.

reinforge imports this module and calls its ``@hookimpl`` functions. Here one
judge is registered under the name ``example_keyword``, so a run file can say::

    judges:
      - name: example_keyword
        args: {keyword: "please"}
"""

from __future__ import annotations

from typing import Any

from reinforge import JudgeOutput, hookimpl, response_text


async def keyword_judge(task: dict, response: Any, keyword: str = "please") -> JudgeOutput:
    """Reward 1.0 when ``keyword`` appears in the response text, else 0.0.

    ``keyword`` is a setting: a run file passes it under the judge's ``args``.
    A missing keyword is a wrong answer (reward 0), not a failure.
    """
    found = keyword in response_text(response)
    return JudgeOutput(reward=1.0 if found else 0.0, metrics={"keyword_found": float(found)})


@hookimpl
def register_judges(register):
    register("example_keyword", keyword_judge)
