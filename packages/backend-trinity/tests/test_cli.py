"""``reinforge tune examples/math/run.yaml --backend trinity --dry-run`` and ``tune`` (which does not launch yet)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import yaml
from conftest import MATH, build, math_run, write_run

from reinforge.plugin import ConfigurationError


def test_dry_run_of_examples_math_writes_the_config_and_prints_its_path(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "reinforge", "tune", str(MATH / "run.yaml"), "--backend", "trinity", "--dry-run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    path = tmp_path / "runs" / "math" / "addition" / "trinity_config.yaml"
    assert out["trinity_config"] == str(path)
    assert f"wrote the Trinity-RFT config: {path}" in proc.stderr
    assert (out["backend"], out["trinity_algorithm"], out["mode"]) == ("trinity", "grpo", "both")
    assert out["launch"] == f"trinity run --config {path}"
    assert out["datasets"]["train_dataset"]["rows"] == 2000
    config = yaml.safe_load(path.read_text())
    assert config["algorithm"]["repeat_times"] == 8  # the run's group_size
    assert (config["project"], config["name"]) == ("math", "addition")
    assert config["buffer"]["explorer_input"]["taskset"]["path"] == str(MATH / "data")
    if importlib.util.find_spec("trinity") is not None:  # the YAML loads with Trinity's own loader
        from trinity.common.config import load_config

        cfg = load_config(str(path))
        assert cfg.algorithm.repeat_times == 8
        assert cfg.buffer.batch_size == 4
        assert cfg.buffer.explorer_input.taskset.path == str(MATH / "data")


def test_tune_writes_the_config_and_says_launching_comes_later(math_dir) -> None:
    pytest.importorskip("trinity")
    job = build(write_run(math_dir, math_run()))
    try:
        with pytest.raises(ConfigurationError) as info:
            job.backend.run(job)
    finally:
        job.close()
    path = math_dir.parent / "runs" / "math" / "addition" / "trinity_config.yaml"
    text = str(info.value)
    assert "does not launch it yet: launching" in text and "lands in a later version" in text
    assert "reinforge_backend_trinity.workflow.ReinforgeWorkflow" in text  # what its tasksets run on
    assert f"trinity run --config {path}" in text
    assert "ray start --head" in text
    assert yaml.safe_load(path.read_text())["name"] == "addition"


def test_reinforge_tune_without_dry_run_exits_with_the_message(math_dir) -> None:
    pytest.importorskip("trinity")
    path = write_run(math_dir, math_run())
    proc = subprocess.run(
        [sys.executable, "-m", "reinforge", "tune", str(path), "--backend", "trinity"],
        cwd=math_dir.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    assert "error: reinforge-backend-trinity 0.1.0 writes the run as a Trinity-RFT config" in proc.stderr
