"""tune(): AgentScope argument names in, a resolved job handed to a backend."""

import pytest

from reinforge import AlgorithmConfig, DatasetConfig, JudgeOutput, TunerModelConfig, WorkflowOutput, hookimpl, tune
from reinforge.errors import ConfigError
from reinforge.plugin import Backend
from reinforge.plugins import get_plugin_manager
from reinforge.testing import HookRecorder, ScriptedChatModel


async def workflow(task, model, auxiliary_models=None):
    reply = await model.chat([{"role": "user", "content": task["question"]}])
    return WorkflowOutput(response=reply)


async def judge(task, response, auxiliary_models=None):
    return JudgeOutput(reward=float(task["answer"] in response.get_text_content()))


class OneStepBackend(Backend):
    """The smallest backend: one batch through the shared runner, reported through the lifecycle."""

    algorithms = {"grpo": None}

    def run(self, job):
        model = ScriptedChatModel(lambda messages, tools, sampling: "4" if "2 + 2" in messages[-1]["content"] else "?")
        rows = job.run.train_dataset.rows()[: job.run.algorithm.batch_size]
        with job.running() as run:
            result = job.make_runner(model=model).run(rows)
            run.step_end(result.metrics, step=1)
        return {"steps": 1, "batch": result}

    def dry_run(self, job):
        return {"backend": "one-step", "workflow": job.workflow.name, "judges": [j.name for j in job.composer.judges]}


@pytest.fixture
def pm():
    class Backends:
        @hookimpl
        def register_backends(self, register):
            register("one-step", OneStepBackend)

    manager = get_plugin_manager(load_entrypoints=False)
    manager.register(Backends(), name="test-backends")
    return manager


@pytest.fixture
def dataset(tmp_path):
    (tmp_path / "train.jsonl").write_text(
        '{"question": "What is 2 + 2?", "answer": "4"}\n{"question": "What is 3 + 3?", "answer": "6"}\n'
    )
    return DatasetConfig(path=str(tmp_path / "train.jsonl"))


def test_tune_with_agentscope_arguments_runs_on_the_backend(pm, dataset):
    recorder = HookRecorder.attach(pm)
    result = tune(
        workflow_func=workflow,
        judge_func=judge,
        train_dataset=dataset,
        model=TunerModelConfig(model_path="tiny", max_tokens=8),
        algorithm=AlgorithmConfig(group_size=3, batch_size=2),
        backend="one-step",
        plugin_manager=pm,
    )
    batch = result["batch"]
    assert result["status"] == "finished" and result["steps"] == 1
    assert [len(g.kept) for g in batch.groups] == [3, 3]
    assert [t.reward for t in batch.groups[0].kept] == [1.0, 1.0, 1.0]
    assert [t.reward for t in batch.groups[1].kept] == [0.0, 0.0, 0.0]
    assert batch.groups[0].kept[0].calls[0].sampling["max_tokens"] == 8  # model config reaches every call
    assert len(recorder.calls("on_trajectory")) == 6
    step = recorder.getcall("on_step_end")
    assert step["metrics"]["reward/mean"] == 0.5 and step["kind"] == "train" and step["step"] == 1
    assert recorder.getcall("on_run_start")["run"] is step["run"]
    assert recorder.getcall("on_run_end")["summary"] is result


def test_tune_mixes_registered_names_and_weighted_judges(pm, dataset):
    described = tune(
        workflow_func=workflow,
        train_dataset=dataset,
        judges=[{"name": "contains", "weight": 0.5}, {"name": judge, "weight": 0.5, "metric": "mine"}],
        backend="one-step",
        dry_run=True,
        plugin_manager=pm,
    )
    assert described["judges"] == ["contains", "mine"]


def test_tune_needs_a_workflow():
    with pytest.raises(ConfigError, match="workflow_func"):
        tune(judge_func=judge)
