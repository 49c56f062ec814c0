"""Step metric names: one public module of constants, written by core and read by observers through it."""

from __future__ import annotations

from pathlib import Path

import pytest

from reinforge import AlgorithmConfig, DatasetConfig, JudgeOutput, TunerModelConfig, WorkflowOutput, hookimpl, tune
from reinforge.plugin import Backend, metric_names
from reinforge.plugins import get_plugin_manager
from reinforge.testing import HookRecorder, ScriptedChatModel

mn = metric_names


def test_the_plugin_api_exports_the_metric_names_module() -> None:
    import reinforge.metric_names
    import reinforge.plugin

    assert metric_names is reinforge.metric_names and "metric_names" in reinforge.plugin.__all__


async def workflow(task: dict, model: ScriptedChatModel) -> WorkflowOutput:
    return WorkflowOutput(response=await model.chat([{"role": "user", "content": task["question"]}]))


def exact(task: dict, response: object) -> JudgeOutput:
    return JudgeOutput(reward=float(task["answer"] in str(getattr(response, "content", ""))))


class OneStep(Backend):
    """One batch through the shared runner, its metrics reported through the lifecycle as a backend does."""

    algorithms = {"grpo": None}

    def run(self, job):
        model = ScriptedChatModel(lambda messages, tools, sampling: "4")
        with job.running() as run:
            run.step_end(job.make_runner(model=model).run(job.run.train_dataset.rows()).metrics, step=1)
        return {}

    def dry_run(self, job):
        return {}


@pytest.fixture
def pm():
    class Backends:
        @hookimpl
        def register_backends(self, register):
            register("one-step", OneStep)

    manager = get_plugin_manager(load_entrypoints=False)
    manager.register(Backends(), name="test-backends")
    return manager


def test_a_step_written_by_core_is_read_under_the_constants(pm, tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    data.write_text('{"question": "2 + 2?", "answer": "4"}\n{"question": "3 + 3?", "answer": "6"}\n')
    recorder = HookRecorder.attach(pm)
    tune(
        workflow_func=workflow,
        judge_func=exact,
        train_dataset=DatasetConfig(path=str(data)),
        model=TunerModelConfig(model_path="tiny", max_tokens=8),
        algorithm=AlgorithmConfig(group_size=2, batch_size=2),
        backend="one-step",
        plugin_manager=pm,
    )
    step = recorder.getcall("on_step_end")
    metrics = step["metrics"]
    assert step["kind"] == mn.KIND_TRAIN
    assert metrics[mn.REWARD_MEAN] == 0.5 and metrics[mn.REWARD_STD] == 0.5
    assert metrics[mn.dimension_mean("exact")] == 0.5 and mn.dimension_std("exact") in metrics
    assert mn.dimension_of(mn.dimension_mean("exact")) == "exact"
    assert metrics[mn.RESPONSE_LENGTH_MEAN] == 1.0 and mn.RESPONSE_LENGTH_STD in metrics
    assert metrics[mn.TRUNCATED_RATE] == 0.0 and metrics[mn.COUNT_DISCARDED] == 0.0
