"""The held-out tool-use rate of an evaluation (``eval.tool_use_metric``/``tool_use_field``)."""

from collections import Counter

from reinforge.evaluation import EvalReport, tool_use_of
from reinforge.runner import BatchResult, GroupResult
from reinforge.trajectory import Trajectory


def result(*rollouts):
    """One group per (task, metrics) pair, each with one kept trajectory."""
    groups = []
    for task, metrics in rollouts:
        t = Trajectory(task=task, reward=1.0, metrics=dict(metrics))
        groups.append(GroupResult(task=task, task_index=len(groups), group_id=str(len(groups)), kept=[t]))
    return BatchResult(groups=groups, counters=Counter(), metrics={}, seconds=0.0)


def test_counts_only_the_tasks_that_need_a_tool():
    r = result(
        ({"needs_tool": True}, {"used_tool": 1.0}),
        ({"needs_tool": True}, {"used_tool": 0.0}),
        ({"needs_tool": True}, {"used_tool": 1.0}),
        ({"needs_tool": False}, {"used_tool": 0.0}),  # answered in its head, as it should: not counted
        ({}, {"used_tool": 1.0}),  # a task without the field counts
    )
    assert tool_use_of(r, "used_tool", "needs_tool") == 3 / 4
    assert tool_use_of(r, "used_tool", None) == 3 / 5


def test_none_when_the_workflow_reports_no_such_metric_or_no_task_needs_a_tool():
    assert tool_use_of(result(({"needs_tool": True}, {"turns": 1.0})), "used_tool", "needs_tool") is None
    assert tool_use_of(result(({"needs_tool": False}, {"used_tool": 1.0})), "used_tool", "needs_tool") is None
    assert tool_use_of(result(({}, {"used_tool": 1.0})), None) is None


def test_the_eval_summary_reports_it():
    report = EvalReport(0.5, "reward", 1.0, 2, 2, {}, {}, 1.0, "test", tool_use=0.75)
    assert report.summary()["tool_use"] == 0.75
