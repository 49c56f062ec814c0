"""A real ``explore`` stage: ``TrinityBackend.run`` -> Trinity's ``check_and_update`` and ``run_stage`` on a local Ray.

What is real: the backend's launch (preflight, a local Ray head it starts, the run folder shipped as the job's
``working_dir``), trinity-rft 0.6.0's explorer, scheduler, workflow runners and SQL experience buffer (sqlite),
the Workflow adapter running examples/math's workflow and judges, and ``reinforge serve`` with SmolLM2 as the
``external`` engine. What is not: vLLM (the test-only stand-ins of conftest, on PYTHONPATH so Ray's workers get
them too). The named model actor for Trinity 0.6.0's external-engine bug is the package's own (external.py).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest
from conftest import build, math_run, write_run

pytest.importorskip("trinity")
pytest.importorskip("reinforge_backend_local")

STEPS, TASKS, REPEATS = 2, 2, 2


def read_experiences(db: Path) -> list[Any]:
    """Every experience of a sqlite experience buffer, through Trinity's own ``Experience.deserialize``."""
    from trinity.common.experience import Experience

    with sqlite3.connect(db) as conn:
        blobs = [b for (b,) in conn.execute("SELECT experience_bytes FROM experience_buffer_blob ORDER BY id")]
    return [Experience.deserialize(b) for b in blobs]


def test_explore_stage_writes_experiences_with_tokens_and_logprobs(
    math_dir: Path, smollm2: Path, served_url: str, vllm_stand_in_on_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray
    from transformers import AutoTokenizer

    from reinforge.plugin import get_plugin_manager, resolve_ref
    from reinforge.testing import plugin_registry

    last_number = resolve_ref("last_number", "judges", plugin_registry(get_plugin_manager(load_entrypoints=False)))
    ray_tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # Ray's sockets must fit AF_UNIX's 107 bytes
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    data = math_run()
    data.pop("eval_dataset")
    data["train_dataset"]["total_steps"] = STEPS
    data["model"] = {
        "model_path": str(smollm2),
        "max_tokens": 12,
        "temperature": 1.0,
        "max_model_len": 1024,
        "full_finetune": True,
    }
    data["algorithm"].update(group_size=REPEATS, batch_size=TASKS)
    data["backend_args"] = {
        "mode": "explore",
        "engine_type": "external",
        "external_url": served_url + "/v1",  # the root is what Trinity wants: the trailing /v1 is dropped
        "experience_buffer": "sql",
        "runner_per_model": 2,
        "eval_on_startup": False,
        "sync_method": "checkpoint",
        "ray_num_cpus": 2,
        "output_dir": str(math_dir.parent / "runs"),
    }
    job = build(write_run(math_dir, data))
    try:
        summary = job.backend.run(job)
    finally:
        job.close()
        shutil.rmtree(ray_tmp, ignore_errors=True)

    stage = summary["trinity_stage"]
    assert stage["stage"] == "explore" and stage["success"], stage["error"]
    assert not ray.is_initialized()  # run_stage shut the Ray head down
    # buffer.trainer_input.experience_buffer, named by the mapping, under Trinity's job folder
    exps = read_experiences(Path(stage["checkpoint_job_dir"]) / "buffer" / "experience_buffer.db")
    assert len(exps) == STEPS * TASKS * REPEATS  # one model call per rollout of examples/math's workflow

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2))
    lines = (math_dir / "data" / "train.jsonl").read_text().splitlines()
    rows = {r["question"]: r for r in map(json.loads, lines)}
    groups: dict[tuple[Any, Any], list[Any]] = {}
    for exp in exps:
        tokens = exp.tokens.tolist()
        completion = tokens[exp.prompt_length :]
        assert 0 < exp.prompt_length < len(tokens) and len(completion) <= 12
        assert len(exp.logprobs) == len(completion) and all(lp <= 0 for lp in exp.logprobs.tolist())
        text = tokenizer.decode(completion, skip_special_tokens=True)
        assert text == exp.response_text
        prompt = tokenizer.decode(tokens[: exp.prompt_length])
        question = next(q for q in rows if q in prompt)  # the prompt holds the task's question
        # examples/math's judges, recomputed: the gate (last number right) times 0.7 right + 0.2 format + 0.1 concise
        correct = last_number(rows[question], text).reward
        assert exp.metrics["reward/correct"] == exp.metrics["gate/correct_gate"] == correct
        parts = 0.7 * correct + 0.2 * exp.metrics["reward/format"] + 0.1 * exp.metrics["reward/concise"]
        assert exp.reward == pytest.approx(correct * parts)
        assert exp.eid.step == 0 and exp.info["model_version"] == 0
        groups.setdefault((exp.eid.batch, exp.eid.task), []).append((exp, question))
    assert len(groups) == STEPS * TASKS
    assert {int(batch) for batch, _ in groups} == {1, 2}  # Trinity's explore steps 1 and 2
    for members in groups.values():
        assert sorted(exp.eid.run for exp, _ in members) == list(range(REPEATS))
        assert len({question for _, question in members}) == 1  # a group is one task's repeats
