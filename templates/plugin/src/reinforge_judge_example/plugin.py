"""The plugin module named by the ``reinforge`` entry point in pyproject.toml.

reinforge imports this module and calls its ``@hookimpl`` functions. Two
judges are registered, so a run file can say::

    judges:
      - name: example_keyword
        args: {keyword: "please"}
      - name: example_polite
        args: {keyword: "please", max_words: 20}

``example_keyword`` is a function: its keyword parameters with defaults are
its settings. ``example_polite`` is a ``@reward_func`` class: built once per
run with the run file's ``args`` as constructor arguments, scored by its
``@sub_reward_func`` methods (each one a reported dimension), closed when the
run ends. Both are checked (names, types, settings) before any model loads.
"""

from __future__ import annotations

from typing import Any

from reinforge import JudgeOutput, hookimpl, response_text, reward_func, sub_reward_func
from reinforge.plugin import ConfigurationError


async def keyword_judge(task: dict, response: Any, keyword: str = "please") -> JudgeOutput:
    """Reward 1.0 when ``keyword`` appears in the response text, else 0.0.

    ``keyword`` is a setting: a run file passes it under the judge's ``args``.
    A missing keyword is a wrong answer (reward 0, status SUCCESS), not a failure.
    """
    found = keyword in response_text(response)
    return JudgeOutput(reward=1.0 if found else 0.0, metrics={"keyword_found": float(found)})


@reward_func("example_polite")
class PoliteJudge:
    """Polite and short: 0.7 for the keyword, 0.3 for staying within ``max_words``.

    Reported dimensions: ``reward/example_polite``, ``reward/example_polite/keyword``
    and ``reward/example_polite/brevity``.
    """

    def __init__(self, keyword: str = "please", max_words: int = 20) -> None:
        if max_words < 1:
            # a permanent error (retrying cannot help): ConfigurationError stops the run, naming the judge
            raise ConfigurationError(f"example_polite: max_words must be >= 1, got {max_words}")
        self.keyword = keyword
        self.max_words = max_words

    @sub_reward_func("keyword", sub_weight=0.7)
    def has_keyword(self, task: dict, response: Any) -> float:
        return float(self.keyword.lower() in response_text(response).lower())

    @sub_reward_func("brevity", sub_weight=0.3)
    def is_brief(self, task: dict, response: Any) -> float:
        return float(len(response_text(response).split()) <= self.max_words)


@hookimpl
def register_judges(register):
    # metadata is declared here: kind "rule" (no model call), and the rewards' range, checked on every output
    register("example_keyword", keyword_judge, kind="rule", reward_range=(0, 1), description="keyword in the answer")
    register("example_polite", PoliteJudge, kind="rule", reward_range=(0, 1), description="polite and short")
