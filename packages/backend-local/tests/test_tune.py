"""tune() on the local backend, end to end: run folder, checkpoints, exact resume, clear config errors."""

import json
from pathlib import Path

import pytest

from reinforge import JudgeOutput, WorkflowOutput, hookimpl, tune
from reinforge.config import AlgorithmConfig, DatasetConfig, ModelConfig
from reinforge.errors import ConfigError
from reinforge.plugins import get_plugin_manager


async def workflow(task, model):
    return WorkflowOutput(response=await model.chat([{"role": "user", "content": task["question"]}]))


def judge(task, response):
    return JudgeOutput(reward=float(len(response.content)) / 40.0)  # any spread gives the group a signal


class Recorder:
    def __init__(self):
        self.steps, self.tokens = {}, {}

    @hookimpl
    def on_step_end(self, step, metrics):
        self.steps[step] = metrics

    @hookimpl
    def on_trajectory(self, trajectory):
        for call in trajectory.calls:
            key = (call.policy_version, trajectory.task_index, trajectory.rollout_index)
            self.tokens[key] = list(call.completion_token_ids)


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"question": f"What is {i} + {i}?"}) + "\n" for i in range(8)))
    return str(path)


def _tune(model_folder, data, out, steps, recorder, **backend_args):
    pm = get_plugin_manager()
    pm.register(recorder, name="recorder")
    return tune(
        workflow_func=workflow,
        judge_func=judge,
        train_dataset=DatasetConfig(path=data, total_steps=steps),
        model=ModelConfig(model_path=str(model_folder), max_tokens=8, lora_rank=8, lora_alpha=16),
        algorithm=AlgorithmConfig(group_size=2, batch_size=2, learning_rate=1e-3, save_interval_steps=1, seed=3),
        backend="local",
        backend_args={"output_dir": str(out), "progress": False, "tensorboard": False, "report": False, **backend_args},
        plugin_manager=pm,
    )


def test_resume_after_a_stop_between_steps_reproduces_the_next_step_exactly(model_folder, data, tmp_path):
    straight = Recorder()
    full = _tune(model_folder, data, tmp_path / "a", 3, straight)
    assert full["status"] == "finished" and full["steps"] == 3

    first = Recorder()
    part = _tune(model_folder, data, tmp_path / "b", 2, first)  # stops after step 2, checkpoint saved
    run_dir = part["run_dir"]
    resumed = Recorder()
    again = _tune(model_folder, data, tmp_path / "b", 3, resumed, resume=run_dir)
    assert again["run_dir"] == run_dir and again["steps"] == 3 and list(resumed.steps) == [3]
    assert resumed.steps[3]["loss"] == straight.steps[3]["loss"]
    assert resumed.steps[3]["reward/mean"] == straight.steps[3]["reward/mean"]
    step3 = {k: v for k, v in straight.tokens.items() if k[0] == 2}
    assert step3 and {k: v for k, v in resumed.tokens.items() if k[0] == 2} == step3

    lines = [json.loads(line) for line in Path(run_dir, "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r["kind"] == "train"] == [1, 2, 3]
    assert sorted(p.name for p in (tmp_path / "b").glob("*/*/checkpoints/*")) == ["step-1", "step-2", "step-3"]
    assert json.loads(Path(run_dir, "config.json").read_text())["algorithm"]["group_size"] == 2


def test_unknown_algorithm_and_backend_args_are_clear_errors(model_folder, data, tmp_path):
    with pytest.raises(ConfigError, match="algorithm_type"):
        tune(
            workflow_func=workflow,
            judge_func=judge,
            train_dataset=DatasetConfig(path=data),
            model=ModelConfig(model_path=str(model_folder)),
            algorithm=AlgorithmConfig(algorithm_type="dpo"),
            backend="local",
        )
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['micro_bacth'\]"):
        tune(
            workflow_func=workflow,
            judge_func=judge,
            train_dataset=DatasetConfig(path=data),
            model=ModelConfig(model_path=str(model_folder)),
            backend="local",
            backend_args={"micro_bacth": 4},
        )
