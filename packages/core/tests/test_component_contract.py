"""Permanent errors, reward checks and per-run components: what a component declares is enforced.

Each test here fails on core 0.2: a configuration error was retried as if transient, a judge could return
7.0 or NaN and training went on, and settings were never checked against a declared settings class.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from reinforge import JudgeOutput, TaskStatus, WorkflowOutput
from reinforge.config import ComponentSpec, RunConfig
from reinforge.errors import ConfigError, ConfigurationError, RewardError
from reinforge.job import build_job
from reinforge.plugin import Settings, at_least, hookimpl
from reinforge.testing import ScriptedChatModel


async def echo(task, model):
    reply = await model.chat([{"role": "user", "content": task["q"]}])
    return WorkflowOutput(response=reply.content)


class Counting:
    """A judge plugin whose judges count their calls (per test, never at module level)."""

    def __init__(self):
        self.calls = {"schema": 0, "seven": 0, "nan": 0}

    @hookimpl
    def register_judges(self, register):
        async def schema(task, response):
            self.calls["schema"] += 1
            raise ConfigurationError("schema file schema.json is not valid JSON")

        async def seven(task, response):
            self.calls["seven"] += 1
            return 7.0

        async def nan(task, response):
            self.calls["nan"] += 1
            return float("nan")

        async def permanent(task, response):
            return JudgeOutput(status=TaskStatus.ERROR, error="the rubric names a field the task lacks")

        register("schema", schema)
        register("seven", seven, reward_range=(0, 1))
        register("nan", nan)
        register("permanent", permanent)


def _run(reinforge_pm, judge: str):
    plugin = Counting()
    reinforge_pm.register(plugin, name="counting-judges")
    run = RunConfig(workflow=ComponentSpec(ref=echo), judges=[judge], runner={"max_retries": 2})
    job = build_job(run, reinforge_pm)
    runner = job.make_runner(model=ScriptedChatModel(["4"] * 10), group_size=1)
    return plugin, job, runner


def test_a_configuration_error_is_not_retried_and_stops_the_run_naming_the_judge(reinforge_pm):
    plugin, _, runner = _run(reinforge_pm, "schema")
    with pytest.raises(ConfigurationError, match=r"judge schema: schema file schema\.json is not valid JSON"):
        runner.run([{"q": "2+2"}])
    assert plugin.calls["schema"] == 1  # retried 0 times: retrying cannot fix a bad schema


def test_status_error_is_a_permanent_error_naming_the_judge(reinforge_pm):
    _, _, runner = _run(reinforge_pm, "permanent")
    with pytest.raises(ConfigurationError, match="judge permanent reported a permanent error: the rubric names"):
        runner.run([{"q": "2+2"}])


def test_a_reward_outside_the_declared_range_is_an_error_naming_the_judge(reinforge_pm):
    plugin, _, runner = _run(reinforge_pm, "seven")
    with pytest.raises(RewardError, match=r"judge seven returned reward 7, outside its declared range \[0, 1\]"):
        runner.run([{"q": "2+2"}])
    assert plugin.calls["seven"] == 1


def test_a_non_finite_reward_is_an_error_naming_the_judge(reinforge_pm):
    _, _, runner = _run(reinforge_pm, "nan")
    with pytest.raises(RewardError, match="judge nan returned a non-finite reward: nan"):
        runner.run([{"q": "2+2"}])


def test_a_nan_in_an_output_object_built_by_the_judge_is_an_error_too():
    from reinforge.components import build_component
    from reinforge.rewards import JudgeSlot, RewardComposer

    async def judge(task, response):
        return JudgeOutput(reward=float("nan"))

    bound = build_component(ComponentSpec(ref=judge), "judge")
    composer = RewardComposer([JudgeSlot(name="j", fn=bound)])
    with pytest.raises(RewardError, match=r"judge .*judge.*must be finite"):
        asyncio.run(composer.score({}, "x"))


@dataclass
class Threshold(Settings):
    """Settings of a judge class: checked by core before anything is built."""

    at: float = 0.5
    label: str = "ok"

    def check(self) -> None:
        at_least("at", self.at, 0.0)


class ThresholdJudge:
    """A class component: built once per run with its settings object, closed at the end."""

    built: list[ThresholdJudge] = []  # what was built, read by the test

    def __init__(self, settings: Threshold):
        self.settings = settings
        self.closed = False
        ThresholdJudge.built.append(self)

    async def __call__(self, task, response):
        return float(len(response) >= self.settings.at)

    def close(self) -> None:
        self.closed = True


class ThresholdPlugin:
    @hookimpl
    def register_judges(self, register):
        register("threshold", ThresholdJudge, settings=Threshold, reward_range=(0, 1))


def test_declared_settings_are_type_checked_naming_the_key(reinforge_pm):
    reinforge_pm.register(ThresholdPlugin(), name="threshold-judges")
    bad = RunConfig(workflow=ComponentSpec(ref=echo), judges=[{"name": "threshold", "args": {"at": "high"}}])
    with pytest.raises(ConfigError, match=r"judges\[0\]: args\.at: expected a number, got str 'high'"):
        build_job(bad, reinforge_pm)
    typo = RunConfig(workflow=ComponentSpec(ref=echo), judges=[{"name": "threshold", "args": {"att": 1}}])
    with pytest.raises(ConfigError, match=r"unknown key 'args\.att' \(did you mean 'at'\?\)"):
        build_job(typo, reinforge_pm)


def test_a_class_component_is_built_per_job_and_closed_when_the_run_ends(reinforge_pm):
    reinforge_pm.register(ThresholdPlugin(), name="threshold-judges")
    ThresholdJudge.built.clear()
    run = RunConfig(workflow=ComponentSpec(ref=echo), judges=[{"name": "threshold", "args": {"at": 2}}])
    first, second = build_job(run, reinforge_pm), build_job(run, reinforge_pm)
    assert len(ThresholdJudge.built) == 2 and ThresholdJudge.built[0] is not ThresholdJudge.built[1]
    with first.running("eval"):
        result = first.make_runner(model=ScriptedChatModel(["42"]), group_size=1).run([{"q": "x"}])
    assert result.trajectories[0].reward == 1.0
    assert ThresholdJudge.built[0].closed and not ThresholdJudge.built[1].closed
    second.close()
    assert ThresholdJudge.built[1].closed
