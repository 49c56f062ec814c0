"""``reinforge tune examples/math/run.yaml --backend trinity --dry-run``, and ``tune`` refusing what this machine cannot run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import MATH, math_run, write_run


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


def test_tune_of_examples_math_here_stops_before_anything_starts(math_dir) -> None:
    """examples/math unchanged is mode ``both`` on a vLLM engine: this CPU machine cannot launch it, and says why."""
    pytest.importorskip("trinity")
    from reinforge_backend_trinity.launch import Probes

    has_vllm = importlib.util.find_spec("vllm") is not None and importlib.util.find_spec("vllm").origin is not None
    if has_vllm and Probes().local_gpus() > 0:
        pytest.skip("this machine has vLLM and a GPU: tune would launch for real")
    path = write_run(math_dir, math_run())
    proc = subprocess.run(
        [sys.executable, "-m", "reinforge", "tune", str(path), "--backend", "trinity"],
        cwd=math_dir.parent,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # never the launch test's vLLM stand-ins
        capture_output=True,
        text=True,
        timeout=300,
    )
    written = math_dir.parent / "runs" / "math" / "addition" / "trinity_config.yaml"
    assert proc.returncode == 1, proc.stderr
    assert f"wrote the Trinity-RFT config: {written}" in proc.stderr
    assert yaml.safe_load(written.read_text())["name"] == "addition"
    assert "launching Trinity-RFT" not in proc.stderr and "Started a local Ray" not in proc.stderr
    if not has_vllm:  # the subprocess has no vLLM (the tests' stand-ins live in this process, and PYTHONPATH)
        assert "vllm is not installed: pip install 'trinity-rft[vllm]==0.6.0'" in proc.stderr
    else:
        assert "none is visible" in proc.stderr
