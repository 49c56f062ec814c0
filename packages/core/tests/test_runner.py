import asyncio
from collections import Counter

import pytest

from reinforge import ChatResponse, GroupRewardOutput, JudgeOutput, TaskStatus, WorkflowOutput, hookimpl
from reinforge.config import ComponentSpec, RunConfig, ScoreConfig
from reinforge.errors import RewardError, RunnerError
from reinforge.lifecycle import RunContext
from reinforge.plugins import get_plugin_manager
from reinforge.rewards import JudgeSlot, RewardComposer
from reinforge.runner import Runner, RunnerSettings
from reinforge.signatures import bind


class EchoModel:
    """Answers with the task's ``say`` field so each rollout is identifiable."""

    async def chat(self, messages, tools=None, **sampling):
        return ChatResponse({"role": "assistant", "content": messages[-1]["content"]}, completion_token_ids=[1, 2])


async def ask(task, model):
    reply = await model.chat([{"role": "user", "content": task["say"]}])
    return WorkflowOutput(response=reply, metrics={"turns": 1})


def correct(task, response):
    return JudgeOutput(reward=float(response.content == task["answer"]))


def make_runner(judges=None, workflow=ask, group_reward=None, group_weight=None, **settings):
    composer = RewardComposer(
        judges if judges is not None else [JudgeSlot("correct", bind(correct, "judge"))],
        group_reward=bind(group_reward, "group_reward") if group_reward else None,
        group_reward_weight=group_weight,
        judge_timeout_s=settings.pop("judge_timeout_s", 5.0),
        max_retries=settings.get("max_retries", 2),
        scores=settings.pop("scores", None),
    )
    return Runner(bind(workflow, "workflow"), composer, model=EchoModel(), settings=RunnerSettings(**settings))


def tasks(n):
    return [{"say": str(i), "answer": str(i)} for i in range(n)]


def test_runs_group_size_rollouts_per_task_and_records_calls():
    result = make_runner(group_size=3).run(tasks(4))
    assert [len(g.kept) for g in result.groups] == [3, 3, 3, 3]
    t = result.groups[2].kept[1]
    assert (t.task_index, t.rollout_index, t.reward) == (2, 1, 1.0)
    assert t.calls[0].messages == [{"role": "user", "content": "2"}]
    assert t.calls[0].completion_token_ids == [1, 2]
    assert result.metrics["reward/mean"] == 1.0
    assert result.metrics["reward/correct/mean"] == 1.0
    assert result.metrics["workflow/turns/mean"] == 1.0
    assert result.counters["rollouts"] == 12


def test_bounded_concurrency():
    live, peak = 0, 0

    async def wf(task, model):
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        await asyncio.sleep(0)  # yield so other rollouts can start
        await asyncio.sleep(0)
        live -= 1
        return WorkflowOutput(response=task["answer"])

    def j(task, response):
        return 1.0

    make_runner([JudgeSlot("j", bind(j, "judge"))], workflow=wf, max_concurrency=3, group_size=4).run(tasks(5))
    assert peak == 3


def test_flaky_judge_is_retried_and_then_discarded_never_zero():
    calls = Counter()

    def flaky(task, response):
        calls[task["say"]] += 1
        if task["say"] == "1":
            raise ConnectionError("judge backend down")  # always fails for task 1
        if task["say"] == "2" and calls["2"] == 1:
            raise ConnectionError("blip")  # fails once for task 2
        return JudgeOutput(reward=1.0)

    result = make_runner([JudgeSlot("j", bind(flaky, "judge"))], group_size=1, max_retries=2).run(tasks(3))
    kept = result.trajectories
    assert sorted(t.task["say"] for t in kept) == ["0", "2"]
    assert all(t.reward == 1.0 for t in kept)
    bad = result.groups[1].discarded[0]
    assert bad.status is TaskStatus.FAILED and bad.reward is None and "judge backend down" in bad.error
    assert calls["1"] == 3  # 1 + max_retries
    assert result.counters["failed/judge"] == 1
    assert result.counters["discarded"] == 1
    assert result.metrics["count/discarded"] == 1.0


def test_judge_that_hangs_times_out_and_is_discarded():
    async def hangs(task, response):
        if task["say"] == "0":
            await asyncio.Event().wait()
        return 1.0

    result = make_runner([JudgeSlot("j", bind(hangs, "judge"))], judge_timeout_s=0.01, max_retries=1).run(tasks(2))
    assert [t.task["say"] for t in result.trajectories] == ["1"]
    assert "timed out" in result.groups[0].discarded[0].error


def test_workflow_failures_are_retried_then_discarded():
    attempts = Counter()

    async def wf(task, model):
        attempts[task["say"]] += 1
        if task["say"] == "0":
            return WorkflowOutput(status=TaskStatus.FAILED, error="tool server 503")
        if attempts[task["say"]] == 1:
            raise TimeoutError("llm call timed out")
        return WorkflowOutput(response=task["answer"])

    def j(task, response):
        return 1.0

    result = make_runner([JudgeSlot("j", bind(j, "judge"))], workflow=wf, max_retries=1).run(tasks(2))
    assert attempts == {"0": 2, "1": 2}
    assert [t.task["say"] for t in result.trajectories] == ["1"]
    assert result.groups[0].discarded[0].error.endswith("tool server 503")
    assert result.counters["failed/workflow"] == 1
    assert result.counters["retries"] == 2


def test_workflow_timeout_is_scored_with_the_timeout_score():
    async def loops(task, model):
        await model.chat([{"role": "user", "content": "again"}])
        await asyncio.Event().wait()

    result = make_runner(workflow=loops, rollout_timeout_s=0.05, scores=ScoreConfig(timeout=-1.0)).run(tasks(1))
    (t,) = result.trajectories
    assert t.timed_out and t.reward == -1.0 and len(t.calls) == 1
    assert result.counters["timeouts"] == 1


def test_group_keeps_successful_members_and_group_reward_sees_only_them():
    seen = []

    async def wf(task, model):
        rollout = len(seen_workflows)
        seen_workflows.append(rollout)
        if rollout == 0:
            return WorkflowOutput(status=TaskStatus.FAILED, error="down")
        return WorkflowOutput(response=f"r{rollout}")

    seen_workflows: list[int] = []

    def rank(task, responses):
        seen.append(list(responses))
        return GroupRewardOutput(rewards=[float(i) for i in range(len(responses))])

    r = make_runner([], workflow=wf, group_reward=rank, group_weight=1.0, group_size=4, max_retries=0)
    result = r.run([{"say": "x"}])
    (group,) = result.groups
    assert len(group.kept) == 3 and len(group.discarded) == 1
    assert seen == [["r1", "r2", "r3"]]
    assert sorted(t.reward for t in group.kept) == [0.0, 1.0, 2.0]
    assert all(t.rewards["reward/group"] == t.reward for t in group.kept)


def test_incomplete_group_dropped_whole_when_configured_or_too_small():
    async def wf(task, model):
        if task.setdefault("n", 0) == 0:
            task["n"] = 1
            return WorkflowOutput(status=TaskStatus.FAILED, error="down")
        return WorkflowOutput(response="ok")

    def j(task, response):
        return 1.0

    slots = [JudgeSlot("j", bind(j, "judge"))]
    result = make_runner(slots, workflow=wf, group_size=4, max_retries=0, drop_incomplete_groups=True).run([{}])
    assert result.groups[0].dropped and not result.trajectories and len(result.groups[0].discarded) == 4
    assert result.counters["dropped_groups"] == 1
    # a group of 2 with 1 failure keeps fewer than min_group_size=2 members: dropped too
    result = make_runner(slots, workflow=wf, group_size=2, max_retries=0).run([{}, {"n": 1}])
    assert result.groups[0].dropped and len(result.groups[1].kept) == 2


def test_group_reward_with_wrong_length_is_an_error_naming_the_function():
    def short(task, responses):
        return GroupRewardOutput(rewards=[1.0])

    r = make_runner([], group_reward=short, group_weight=1.0, group_size=3)
    with pytest.raises(RewardError, match=r"test_runner:.*short.*1 rewards for a group of 3"):
        r.run(tasks(1))


def test_every_rollout_failing_stops_with_the_first_error():
    async def broken(task, model):
        raise KeyError("question")

    with pytest.raises(RunnerError, match="KeyError"):
        make_runner(workflow=broken, max_retries=0).run(tasks(2))


def test_observer_hooks_see_every_trajectory():
    seen = []

    class Observer:
        @hookimpl
        def on_trajectory(self, trajectory, run):
            assert run is r.run_context
            seen.append((trajectory.task["say"], trajectory.ok))

    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(Observer(), name="observer")
    r = make_runner(group_size=2)
    r.run_context = RunContext(config=RunConfig(workflow=ComponentSpec(ref=ask)), hook=pm.hook)
    r.run(tasks(2))
    assert sorted(seen) == [("0", True), ("0", True), ("1", True), ("1", True)]


async def two_calls_rewarded(task, model):
    """Two model calls; the workflow rewards the first one only."""
    await model.chat([{"role": "user", "content": "first"}])
    reply = await model.chat([{"role": "user", "content": task["say"]}])
    return WorkflowOutput(response=reply, call_rewards=[0.25, None])


def test_call_rewards_land_on_their_recorded_calls():
    result = make_runner(workflow=two_calls_rewarded).run(tasks(2))
    t = result.groups[1].kept[0]
    assert [c.messages[0]["content"] for c in t.calls] == ["first", "1"]
    assert [c.reward for c in t.calls] == [0.25, None]
    assert t.calls[0].to_dict()["reward"] == 0.25
    assert t.reward == 1.0  # the trajectory's own reward is the judges', untouched


def test_call_rewards_that_do_not_match_the_calls_stop_the_run_naming_the_workflow():
    async def one_call_two_rewards(task, model):
        reply = await model.chat([{"role": "user", "content": task["say"]}])
        return WorkflowOutput(response=reply, call_rewards=[1.0, 0.0])

    with pytest.raises(RewardError, match=r"one_call_two_rewards: call_rewards has 2 entries but the rollout made 1"):
        make_runner(workflow=one_call_two_rewards).run(tasks(1))


def test_call_rewards_must_be_finite_numbers():
    with pytest.raises(RewardError, match=r"call_rewards\[1\] must be finite"):
        WorkflowOutput(call_rewards=[0.0, float("nan")])
