"""The local backend inside core's run lifecycle: every way a run ends sends on_run_end exactly once.

Each test trains the real default model for a step or two and records every
hook call through the plugin manager (``reinforge.testing.HookRecorder``).
"""

import json
import os
import signal
from pathlib import Path

import pytest

from reinforge import JudgeOutput, WorkflowOutput, hookimpl, tune
from reinforge.plugin import AlgorithmConfig, DatasetConfig, ModelConfig, RunnerError, get_plugin_manager
from reinforge.testing import HookRecorder


async def workflow(task, model):
    return WorkflowOutput(response=await model.chat([{"role": "user", "content": task["question"]}]))


def judge(task, response):
    return JudgeOutput(reward=float(len(response.content)) / 40.0)


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"question": f"What is {i} + {i}?"}) + "\n" for i in range(8)))
    return str(path)


@pytest.fixture
def recorded():
    pm = get_plugin_manager()
    recorder = HookRecorder.attach(pm)
    yield pm, recorder
    recorder.detach()


def _tune(model_folder, data, out, pm, *, steps=2, flow=workflow, eval_data=None, backend_args=None, **options):
    return tune(
        workflow_func=flow,
        judge_func=judge,
        train_dataset=DatasetConfig(path=data, total_steps=steps),
        eval_dataset=DatasetConfig(path=eval_data) if eval_data else None,
        model=ModelConfig(model_path=str(model_folder), max_tokens=6, lora_rank=8, lora_alpha=16),
        algorithm=AlgorithmConfig(group_size=2, batch_size=2, learning_rate=1e-3, save_interval_steps=0, seed=3),
        backend="local",
        backend_args={"output_dir": str(out), "progress": False, "tensorboard": False} | (backend_args or {}),
        plugin_manager=pm,
        **({"report": {"enabled": False}} | options),
    )


def _steps(recorder, kind):
    return [call["step"] for call in recorder.calls("on_step_end") if call["kind"] == kind]


def _checkpoints(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("*/*/checkpoints/*"))


def _once_around(recorder):
    """on_run_start first and on_run_end last, once each; returns on_run_end's summary."""
    names = recorder.names()
    assert names.count("on_run_start") == 1 and names.count("on_run_end") == 1, names
    lifecycle = [n for n in names if n in ("on_run_start", "on_step_end", "on_run_end")]
    assert lifecycle[0] == "on_run_start" and lifecycle[-1] == "on_run_end", names
    return recorder.getcall("on_run_end")["summary"]


def test_a_batch_where_every_rollout_fails_ends_the_run_once_as_failed(model_folder, data, tmp_path, recorded):
    pm, recorder = recorded

    async def broken(task, model):
        raise RuntimeError("the tool server is down")

    with pytest.raises(RunnerError, match="every rollout of the batch failed"):
        _tune(model_folder, data, tmp_path / "out", pm, flow=broken, runner={"max_retries": 0})
    summary = _once_around(recorder)
    assert summary["status"] == "failed" and "every rollout of the batch failed" in summary["error"]
    assert summary["steps"] == 0 and Path(summary["run_dir"]).is_dir()
    assert _steps(recorder, "train") == []


def test_an_exception_inside_a_step_ends_the_run_once_as_failed(model_folder, data, tmp_path, recorded, monkeypatch):
    from reinforge_backend_local.training.trainer import Trainer

    pm, recorder = recorded
    real_step, calls = Trainer.step, []

    def step_then_fail(self, samples, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("boom in step 2")
        return real_step(self, samples, **kwargs)

    monkeypatch.setattr(Trainer, "step", step_then_fail)
    with pytest.raises(RuntimeError, match="boom in step 2"):
        _tune(model_folder, data, tmp_path / "out", pm, steps=3)
    summary = _once_around(recorder)
    assert summary["status"] == "failed" and summary["error"] == "RuntimeError: boom in step 2"
    assert summary["steps"] == 1 and _steps(recorder, "train") == [1]
    assert Path(summary["run_dir"], "metrics.jsonl").read_text().count('"kind": "train"') == 1


def test_ctrl_c_during_step_1_finishes_the_step_saves_and_ends_interrupted(model_folder, data, tmp_path, recorded):
    pm, recorder = recorded
    sent = []

    async def interrupting(task, model):
        if not sent:  # the first rollout of step 1
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)
        return await workflow(task, model)

    before = signal.getsignal(signal.SIGINT)
    out = tmp_path / "out"
    summary = _tune(model_folder, data, out, pm, steps=3, flow=interrupting)
    assert sent and signal.getsignal(signal.SIGINT) is before  # core's handler is gone again
    assert summary["status"] == "interrupted" and summary["steps"] == 1
    assert "Ctrl-C" in summary["stop_reason"]
    assert _checkpoints(out) == ["step-1"]
    assert _once_around(recorder)["status"] == "interrupted"
    assert _steps(recorder, "train") == [1]
    saved = json.loads(Path(summary["run_dir"], "summary.json").read_text())
    assert saved["status"] == "interrupted" and saved["steps"] == 1


class StopAfterStep1:
    @hookimpl
    def on_step_end(self, step, metrics, kind, run):
        if kind == "train" and step == 1:
            run.request_stop("reward/mean looks hacked")


def test_an_observer_stop_finishes_the_step_then_saves_and_evaluates(model_folder, data, tmp_path, recorded, capsys):
    pm, recorder = recorded
    pm.register(StopAfterStep1(), name="stopper")
    eval_data = tmp_path / "eval.jsonl"
    eval_data.write_text("".join(json.dumps({"question": f"What is {i} * 2?"}) + "\n" for i in range(2)))
    out = tmp_path / "out"

    summary = _tune(model_folder, data, out, pm, steps=3, eval_data=str(eval_data))
    assert summary["status"] == "stopped" and summary["steps"] == 1
    assert summary["stop_reason"] == "reward/mean looks hacked"
    assert "report" not in summary and not (Path(summary["run_dir"]) / "report").exists()  # report: {enabled: false}
    assert summary["accuracy_before"] is not None and summary["accuracy_after"] is not None
    assert _checkpoints(out) == ["step-1"]
    ended = _once_around(recorder)
    assert ended["status"] == "stopped" and ended["stop_reason"] == "reward/mean looks hacked"
    # evaluations reach observers too, as kind="eval": the base model (step 0), then after the stop
    steps = [(c["kind"], c["step"]) for c in recorder.calls("on_step_end")]
    assert steps == [("eval", 0), ("train", 1), ("eval", 1)]
    evals = [c["metrics"] for c in recorder.calls("on_step_end") if c["kind"] == "eval"]
    assert all("accuracy/greedy" in m and "accuracy/sampled" in m for m in evals)
    lines = [json.loads(line) for line in Path(summary["run_dir"], "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in lines] == steps
    assert "stopped at step 1: reward/mean looks hacked" in capsys.readouterr().err


def test_a_finished_run_reports_every_step_and_starts_and_ends_once(model_folder, data, tmp_path, recorded):
    pm, recorder = recorded
    summary = _tune(model_folder, data, tmp_path / "out", pm, steps=2)
    assert summary["status"] == "finished" and summary["steps"] == 2 and "stop_reason" not in summary
    ended = _once_around(recorder)
    assert ended["status"] == "finished" and ended["run_dir"] == summary["run_dir"]
    start = recorder.getcall("on_run_start")["run"]
    assert start.run_dir == summary["run_dir"] and start.step == 2
    assert _steps(recorder, "train") == [1, 2]
    metrics = recorder.calls("on_step_end")[0]["metrics"]
    assert "loss" in metrics and "kind" not in metrics  # observers get the numbers
    # matmul_dtype float32 (the default): recorded, and no sampler correction
    config = json.loads((Path(summary["run_dir"]) / "config.json").read_text())
    assert config["backend_args"]["matmul_dtype"] == "float32"
    assert "train/sampler_weight" not in metrics, sorted(metrics)


@pytest.mark.parametrize("native", [True, False])
def test_matmul_dtype_auto_is_resolved_for_the_cpu_and_recorded(
    model_folder, data, tmp_path, recorded, monkeypatch, native
):
    from reinforge_backend_local.model import packing

    if native and not packing.bf16_packable():
        pytest.skip("oneDNN packs no bf16 weights on this CPU (AVX2 only): auto resolves to float32 here")
    monkeypatch.setattr(packing, "native_bf16", lambda: native)
    pm, recorder = recorded
    summary = _tune(model_folder, data, tmp_path / "out", pm, steps=1, backend_args={"matmul_dtype": "auto"})
    resolved = "bfloat16" if native else "float32"
    config = json.loads((Path(summary["run_dir"]) / "config.json").read_text())
    assert config["backend_args"]["matmul_dtype"] == resolved
    metrics = recorder.calls("on_step_end")[0]["metrics"]
    assert ("train/sampler_weight" in metrics) == native, sorted(metrics)  # the sampler corrected exactly in bf16


def test_train_state_round_trips_and_reads_the_0_2_state_json():
    from reinforge_backend_local.training.state import TrainState

    state = TrainState(step=3, epoch=1, offset=2)
    assert TrainState.from_json(json.loads(json.dumps(state.to_json()))) == state
    # 0.2 wrote the same keys as a plain dict; keys a later version adds are ignored
    assert TrainState.from_json({"step": 5, "epoch": 0, "offset": 4, "future": "x"}) == TrainState(5, 0, 4)


class SlowEvaluation:
    """Moves the run's budget clock 10 minutes on at each evaluation after step 0 (no sleeping)."""

    def __init__(self, monkeypatch):
        import reinforge_backend_local.training.session as session

        self.offset = 0.0
        real = session._clock
        monkeypatch.setattr(session, "_clock", lambda: real() + self.offset)

    @hookimpl
    def on_step_end(self, step, kind):
        if kind == "eval" and step > 0:
            self.offset += 600.0


def test_max_minutes_budgets_training_only_evaluations_come_on_top(model_folder, data, tmp_path, recorded, monkeypatch):
    pm, recorder = recorded
    pm.register(SlowEvaluation(monkeypatch), name="slow-eval")
    eval_data = tmp_path / "eval.jsonl"
    eval_data.write_text(json.dumps({"question": "What is 2 * 2?"}) + "\n")
    summary = tune(
        workflow_func=workflow,
        judge_func=judge,
        train_dataset=DatasetConfig(path=data, total_steps=3),
        eval_dataset=DatasetConfig(path=str(eval_data)),
        model=ModelConfig(model_path=str(model_folder), max_tokens=6, lora_rank=8, lora_alpha=16),
        algorithm=AlgorithmConfig(group_size=2, batch_size=2, save_interval_steps=0, eval_interval_steps=1, seed=3),
        backend="local",
        backend_args={
            "output_dir": str(tmp_path / "out"),
            "progress": False,
            "tensorboard": False,
            "max_minutes": 5,  # each evaluation "takes" 10: were they counted, the run would stop after step 1
            "eval_sampled": False,
        },
        report={"enabled": False},
        plugin_manager=pm,
    )
    assert summary["status"] == "finished" and summary["steps"] == 3
    every_step = [("eval", 0)] + [(kind, step) for step in (1, 2, 3) for kind in ("train", "eval")]
    assert [(c["kind"], c["step"]) for c in recorder.calls("on_step_end")] == every_step
