"""tune() on the local backend, end to end: run folder, checkpoints, exact resume, clear config errors."""

import json
from pathlib import Path

import pytest

from reinforge import JudgeOutput, WorkflowOutput, hookimpl, tune
from reinforge.plugin import AlgorithmConfig, ConfigError, DatasetConfig, ModelConfig, get_plugin_manager


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
    def on_trajectory(self, trajectory, run):
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
        backend_args={"output_dir": str(out), "progress": False, "tensorboard": False, **backend_args},
        report={"enabled": False},  # reinforge-report's own section
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


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"algorithm": AlgorithmConfig(algorithm_type="dpo")},
            r"algorithm_type: backend 'local' has no algorithm 'dpo'.*grpo",
        ),
        (
            {"backend_args": {"micro_bacth": 4}},
            r"unknown key 'backend_args.micro_bacth' \(did you mean 'micro_batch'\?\)",
        ),
        (
            {"backend_args": {"matmul_dtype": "bf16"}},
            r"matmul_dtype: must be one of auto, float32, bfloat16; got 'bf16'",
        ),
        (
            {"backend_args": {"matmul_dtype": "bfloat16", "prepacked_weights": False}},
            r"matmul_dtype: bfloat16 runs on the prepacked",
        ),
        ({"backend_args": {"keep_free_mb": -1}}, r"keep_free_mb: must be at least 0"),
    ],
)
def test_unknown_algorithm_and_bad_backend_args_are_clear_errors(model_folder, data, options, message):
    with pytest.raises(ConfigError, match=message):
        tune(
            workflow_func=workflow,
            judge_func=judge,
            train_dataset=DatasetConfig(path=data),
            model=ModelConfig(model_path=str(model_folder)),
            backend="local",
            **options,
        )


RUN_YAML = """
workflow: flow:workflow
judges: [flow:judge]
train_dataset: {{path: {data}, total_steps: 6}}
model: {{model_path: {model}, max_tokens: 8, lora_rank: 8, lora_alpha: 16}}
algorithm: {{group_size: 2, batch_size: 2, learning_rate: 1.0e-3, save_interval_steps: 1, seed: 5}}
backend: local
backend_args: {{output_dir: {out}, progress: false, tensorboard: false}}
report: {{enabled: false}}
"""


def test_resume_after_a_kill_between_steps_reproduces_the_next_step(model_folder, data, tmp_path):
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time

    from reinforge.plugin import load_run

    (tmp_path / "flow.py").write_text(
        "from reinforge import JudgeOutput, WorkflowOutput\n"
        "async def workflow(task, model):\n"
        "    return WorkflowOutput(response=await model.chat([{'role': 'user', 'content': task['question']}]))\n"
        "def judge(task, response):\n"
        "    return JudgeOutput(reward=float(len(response.content)) / 40.0)\n"
    )

    def run_file(out):
        path = tmp_path / f"{out}.yaml"
        path.write_text(RUN_YAML.format(data=data, model=model_folder, out=tmp_path / out))
        return path

    def tune_in_process(path, recorder, **backend_args):
        pm = get_plugin_manager()
        pm.register(recorder, name="recorder")
        run = load_run(path)
        run.backend_args = {**run.backend_args, **backend_args}
        return tune(run=run, plugin_manager=pm)

    reference = Recorder()
    tune_in_process(run_file("reference"), reference)

    killed = run_file("killed")
    proc = subprocess.Popen(
        [sys.executable, "-m", "reinforge", "tune", str(killed)],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ},
    )
    deadline = time.monotonic() + 300
    try:
        while not list((tmp_path / "killed").glob("*/*/checkpoints/step-1/state.json")):
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.05)  # waiting for a file to appear, not for a duration
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    (run_dir,) = (tmp_path / "killed").glob("*/*")
    shutil.rmtree(run_dir / "checkpoints" / "step-6", ignore_errors=True)  # in case it got that far
    done = max(
        int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*") if (p / "state.json").exists()
    )
    assert done < 6, "the run finished before the kill; nothing to resume"

    resumed = Recorder()
    summary = tune_in_process(killed, resumed, resume=str(run_dir))
    step = done + 1
    assert summary["steps"] == 6 and min(resumed.steps) == step
    assert resumed.steps[step]["loss"] == reference.steps[step]["loss"]
    sampled = {k: v for k, v in reference.tokens.items() if k[0] == step - 1}
    assert sampled and {k: v for k, v in resumed.tokens.items() if k[0] == step - 1} == sampled


def test_the_tensor_work_of_a_run_happens_on_one_thread(model_folder, data, tmp_path, monkeypatch):
    """Loading, decoding, the LoRA merge, training and saving: all on the compute thread (see compute.py: a
    second thread running torch's OpenMP kernels slowed every parallel region of the other)."""
    import threading

    from peft.tuners.lora.layer import Linear as LoraLinear

    from reinforge_backend_local.inference.engine import Engine
    from reinforge_backend_local.model import checkpoint
    from reinforge_backend_local.rollouts import runtime
    from reinforge_backend_local.training.trainer import Trainer

    seen: dict[str, set[str]] = {}

    def spy(owner, name):
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):
            seen.setdefault(name, set()).add(threading.current_thread().name)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapped)

    for owner, name in [
        (runtime, "load_policy"),
        (LoraLinear, "get_delta_weight"),  # the LoRA merge before decoding
        (Engine, "generate"),
        (Trainer, "step"),
        (checkpoint, "save"),
    ]:
        spy(owner, name)
    summary = _tune(model_folder, data, tmp_path / "run", 1, Recorder(), threads=2)
    assert summary["status"] == "finished" and summary["steps"] == 1
    assert set(seen) == {"load_policy", "get_delta_weight", "generate", "step", "save"}
    names = set().union(*seen.values())
    assert len(names) == 1 and names.pop().startswith("reinforge-compute"), seen
