"""A run folder's versions: step numbers, the checkpoint a batch is in, where a restarted trainer resumes, pruning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reinforge_backend_local.model.run_versions import INITIAL, RunVersions, UnknownVersion, step_of


def checkpoint(run: Path, step: int, batch_id: str, batches: list[str], parent: str = INITIAL) -> Path:
    folder = run / "checkpoints" / f"step-{step}"
    folder.mkdir(parents=True)
    state = {"step": step, "batch_id": batch_id, "batches": batches, "parent": parent, "metrics": {"loss": 0.5}}
    (folder / "state.json").write_text(json.dumps(state))
    return folder


def test_names_are_step_numbers():
    assert [step_of(n) for n in ("step-0", "step-12", "step-1.tmp", "v3", "step-")] == [0, 12, None, None, None]
    with pytest.raises(UnknownVersion, match="'step-0' is not a checkpoint"):
        RunVersions("run").folder(INITIAL)


def test_a_batch_is_found_in_the_checkpoint_that_trained_it_else_the_oldest_that_holds_it(tmp_path):
    versions = RunVersions(tmp_path)
    checkpoint(tmp_path, 2, "b2", ["b1", "b2"], parent="step-1")  # step-1 was pruned
    checkpoint(tmp_path, 3, "b3", ["b1", "b2", "b3"], parent="step-2")
    checkpoint(tmp_path, 5, "b5", ["b1", "b5"], parent="step-1")
    assert versions.recorded("b3") == tmp_path / "checkpoints" / "step-3"
    assert versions.recorded("b1") == tmp_path / "checkpoints" / "step-2"
    assert versions.recorded("b9") is None
    assert versions.answer(tmp_path / "checkpoints" / "step-5", trained=False) == {
        "checkpoint": str(tmp_path / "checkpoints" / "step-5"),
        "trained": False,
        "step": 5,
        "parent": "step-1",
        "metrics": {"loss": 0.5},
    }


def test_a_starting_trainer_resumes_where_training_went_back_to_until_something_newer_is_written(tmp_path):
    versions = RunVersions(tmp_path)
    assert versions.start() == INITIAL and versions.highest() == 0
    checkpoint(tmp_path, 1, "b1", ["b1"])
    checkpoint(tmp_path, 2, "b2", ["b1", "b2"], parent="step-1")
    assert versions.start() == "step-2"
    versions.record_head("step-1", 2)
    assert versions.start() == "step-1" and versions.highest() == 2
    versions.record_head(INITIAL, 2)
    assert versions.start() == INITIAL
    checkpoint(tmp_path, 3, "b3", ["b3"])  # trained on top of step-0 after going back: that is where training stands
    assert versions.start() == "step-3"
    versions.record_head("step-9", 3)  # a head whose checkpoint is gone: the latest
    assert versions.start() == "step-3"


def test_step_numbers_count_on_from_the_highest_ever_written(tmp_path):
    versions = RunVersions(tmp_path)
    checkpoint(tmp_path, 4, "b4", ["b4"])
    versions.record_head("step-4", 7)  # step-5..7 were written and pruned since
    assert versions.highest() == 7


def test_pruning_keeps_served_versions_and_the_head(tmp_path):
    versions = RunVersions(tmp_path)
    for step in range(1, 6):
        checkpoint(tmp_path, step, f"b{step}", [f"b{step}"])
    versions.mark_served("step-1")
    versions.mark_served("step-3")
    versions.mark_served("step-3")
    assert versions.served() == ["step-1", "step-3"]
    assert [p.name for p in versions.prunable(1, head="step-5")] == ["step-2", "step-4"]
    assert [p.name for p in versions.prunable(2, head="step-5")] == ["step-2"]
    assert [p.name for p in versions.prunable(1, head="step-2")] == ["step-4"]
    assert not list(tmp_path.glob(".*.tmp"))  # written aside and renamed
