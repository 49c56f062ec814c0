"""reinforge-report's live sentinels on the real local backend: a firing detector stops training after that step.

The detector runs on the trainer's real metrics; the run file's thresholds make the entropy-collapse
check fire as soon as it can judge (a baseline of one point plus one more: step 2; any entropy is below
a floor of 1e6), the way a collapsing run would.
"""

import json
from pathlib import Path

from reinforge import JudgeOutput, WorkflowOutput, tune
from reinforge.plugin import AlgorithmConfig, DatasetConfig, ModelConfig, get_plugin_manager


async def workflow(task, model):
    return WorkflowOutput(response=await model.chat([{"role": "user", "content": task["question"]}]))


def judge(task, response):
    return JudgeOutput(reward=float(len(response.content)) / 40.0)


def test_a_halting_sentinel_stops_after_the_step_saves_evaluates_reports_and_names_the_warning(
    model_folder, tmp_path, capsys
):
    pm = get_plugin_manager()
    assert pm.get_plugin("reinforge-report") is not None, "reinforge-report must be installed for this test"
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + {i}?"}) + "\n" for i in range(8)))
    held_out = tmp_path / "eval.jsonl"
    held_out.write_text("".join(json.dumps({"question": f"What is {i} * 2?"}) + "\n" for i in range(2)))
    out = tmp_path / "out"
    summary = tune(
        workflow_func=workflow,
        judge_func=judge,
        train_dataset=DatasetConfig(path=str(data), total_steps=4),
        eval_dataset=DatasetConfig(path=str(held_out)),
        model=ModelConfig(model_path=str(model_folder), max_tokens=6, lora_rank=8, lora_alpha=16),
        algorithm=AlgorithmConfig(group_size=2, batch_size=2, learning_rate=1e-3, save_interval_steps=0, seed=3),
        backend="local",
        backend_args={"output_dir": str(out), "progress": False, "tensorboard": False},
        sentinels={
            "halt": True,
            "thresholds": {"entropy_floor": 1e6, "min_consecutive": 1, "entropy_baseline_points": 1},
        },
        plugin_manager=pm,
    )
    assert summary["status"] == "stopped" and summary["steps"] == 2  # stopped after the step it fired on, of 4
    assert summary["stop_reason"].startswith("sentinel entropy_collapse")
    run_dir = Path(summary["run_dir"])
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-2"]  # saved
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    kinds = [(r["kind"], r["step"]) for r in records]
    assert kinds == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2)]  # evaluated after the stop
    assert Path(summary["report"]).is_file()  # and reported, by reinforge-report's on_run_end observer
    err = capsys.readouterr().err
    assert "sentinel: entropy_collapse" in err and "stopped at step 2: sentinel entropy_collapse" in err
