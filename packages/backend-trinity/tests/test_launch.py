"""What ``TrinityBackend.run`` checks and prepares before it starts anything: preflight, the URL, the runtime_env.

These need no Trinity: :func:`~reinforge_backend_trinity.launch.preflight` reads the mapped config (plain data) and
asks the machine through :class:`~reinforge_backend_trinity.launch.Probes`, which each test answers itself.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import config_of, math_run, write_run

from reinforge.plugin import ConfigurationError
from reinforge_backend_trinity.launch import Probes, external_url, preflight, runtime_env


def probes(*, missing: tuple[str, ...] = (), gpus: int = 0, pyarrow: str | None = None) -> Probes:
    return Probes(module_found=lambda name: name not in missing, local_gpus=lambda: gpus, pyarrow_error=lambda: pyarrow)


def cfg(mode: str = "explore", engine: str | None = "external", address: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"mode": mode, "explorer": {"rollout_model": {}}}
    if engine is not None:
        out["explorer"]["rollout_model"]["engine_type"] = engine
    if address is not None:
        out["cluster"] = {"ray_address": address}
    return out


def test_a_machine_that_can_run_the_config_passes() -> None:
    preflight(cfg(), probes=probes())  # explore on the external engine: no GPU needed
    preflight(cfg("both", "vllm"), probes=probes(gpus=2))
    preflight(cfg("both", "vllm", address="auto"), probes=probes())  # a cluster's GPUs are counted once connected


def test_ray_missing_says_what_to_install() -> None:
    with pytest.raises(
        ConfigurationError, match=r"run: launching on Trinity-RFT needs Ray.*reinforge-backend-trinity\[trinity\]"
    ):
        preflight(cfg(), probes=probes(missing=("ray",)))


def test_vllm_missing_for_a_vllm_engine_says_what_to_install() -> None:
    with pytest.raises(ConfigurationError) as info:
        preflight(cfg("both", None), where="run.yaml", probes=probes(missing=("vllm",), gpus=8))
    text = str(info.value)
    assert text.startswith("run.yaml: mode 'both' runs Trinity's explorer and a vLLM engine")
    assert "pip install 'trinity-rft[vllm]==0.6.0'" in text


def test_vllm_missing_for_the_external_engine_names_trinitys_module_level_import() -> None:
    with pytest.raises(ConfigurationError, match=r"imports vllm at module level \(trinity/common/models/mm_utils.py\)"):
        preflight(cfg("explore", "external"), probes=probes(missing=("vllm",)))
    preflight(cfg("train", None), probes=probes(missing=("vllm",), gpus=8))  # the trainer alone never imports it


@pytest.mark.parametrize("mode", ["train", "both", "colocate"])
def test_a_training_mode_without_a_gpu_is_refused(mode: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        preflight(cfg(mode, "external"), probes=probes())
    text = str(info.value)
    assert f"backend_args.mode {mode!r} trains with verl, which needs CUDA GPUs, and none is visible" in text
    assert "backend_args.ray_address" in text and "mode: explore" in text


def test_a_vllm_engine_without_a_gpu_is_refused_before_trinitys_zero_division() -> None:
    with pytest.raises(ConfigurationError, match=r"a vllm engine needs a CUDA GPU.*engine_type: external"):
        preflight(cfg("explore", "vllm"), probes=probes())


def test_the_numpy_pyarrow_conflict_says_to_install_numpy_2() -> None:
    found = "pyarrow requires NumPy 2.0 or newer, found 1.26.4"
    with pytest.raises(ConfigurationError) as info:
        preflight(cfg(), probes=probes(pyarrow=found))
    assert f"pyarrow does not import ({found})" in str(info.value)
    assert "pip install 'numpy>=2'" in str(info.value)


def test_examples_math_unchanged_is_refused_on_a_machine_without_gpus(math_dir: Path) -> None:
    config = config_of(write_run(math_dir, math_run()))  # mode both, Trinity's vLLM engine
    with pytest.raises(ConfigurationError, match=r"trains with verl"):
        preflight(config, probes=probes())


def _trinity_config(env: str = "OPENAI_BASE_URL") -> Any:
    external = SimpleNamespace(base_url_env=env)
    return SimpleNamespace(explorer=SimpleNamespace(rollout_model=SimpleNamespace(external_model_config=external)))


def test_the_external_url_comes_from_backend_args_or_trinitys_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert external_url(_trinity_config(), "http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    monkeypatch.setenv("MY_URL", "http://10.0.0.2:9000")
    assert external_url(_trinity_config("MY_URL"), None) == "http://10.0.0.2:9000"
    with pytest.raises(
        ConfigurationError, match=r"set backend_args.external_url .* or the OPENAI_BASE_URL environment"
    ):
        external_url(_trinity_config(), None)


def test_the_run_folder_and_outside_modules_travel_to_the_workers(
    math_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "shared_code"
    (elsewhere / "mylib").mkdir(parents=True)
    (elsewhere / "mylib" / "__init__.py").write_text("")
    (elsewhere / "mylib" / "scoring.py").write_text(
        "from reinforge import JudgeOutput\n\ndef score(task, response):\n    return JudgeOutput(reward=1.0)\n"
    )
    monkeypatch.syspath_prepend(str(elsewhere))
    data = math_run()
    data["judges"].append({"name": "mylib.scoring:score", "metric": "mine"})
    # an installed distribution's module (reinforge itself): the workers have it
    data["judges"].append({"name": "reinforge.judges.rules:last_number", "metric": "installed"})
    config = config_of(write_run(math_dir, data))
    env = runtime_env(config, {"A": "1"}, excludes=[math_dir / "runs", tmp_path / "not_inside"])

    assert env["working_dir"] == str(math_dir)  # workflow.py and judges.py live there
    assert env["excludes"] == [".git", "__pycache__", "/runs"]
    assert env["py_modules"] == [str(elsewhere / "mylib")]
    assert env["env_vars"] == {"A": "1"}
    for name in [m for m in sys.modules if m == "mylib" or m.startswith("mylib.")]:  # core's job imported it
        del sys.modules[name]
