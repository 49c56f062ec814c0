"""Fixtures: a copy of examples/math to write run files into, jobs built by core, and Trinity's own validation.

Tests that need Trinity-RFT itself use :func:`trinity_resolve` (``pytest.importorskip("trinity")`` inside),
so they skip cleanly where the ``trinity`` extra is not installed; the package's nox session installs it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
MATH = REPO / "examples" / "math"


@pytest.fixture
def math_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """examples/math's workflow, judges and a few rows of its data, in a folder of the test's own (also the cwd)."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "math"
    folder.mkdir()
    for name in ("workflow.py", "judges.py"):
        shutil.copy(MATH / name, folder / name)
    data = folder / "data"
    data.mkdir()
    for split in ("train", "test"):
        rows = (MATH / "data" / f"{split}.jsonl").read_text().splitlines()[:8]
        (data / f"{split}.jsonl").write_text("\n".join(rows) + "\n")
    return folder


def math_run() -> dict[str, Any]:
    """examples/math/run.yaml as a mapping."""
    return yaml.safe_load((MATH / "run.yaml").read_text())


def write_run(folder: Path, data: dict[str, Any], name: str = "run.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def build(path: Path) -> Any:
    """The checked job core builds for ``reinforge tune PATH --backend trinity``."""
    from reinforge import load_run
    from reinforge.job import build_job

    return build_job(load_run(path), backend="trinity", need_backend=True)


def config_of(path: Path) -> dict[str, Any]:
    """The Trinity config (plain data) the backend writes for the run file ``path``."""
    job = build(path)
    try:
        return job.backend.config(job)
    finally:
        job.close()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Hugging Face model folder with a tiny Llama config (Trinity builds its dummy LoRA from the config)."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("tiny-llama")
    transformers.LlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=64,
        max_position_embeddings=4096,
    ).save_pretrained(folder)
    return str(folder)


def trinity_resolve(config: dict[str, Any], folder: Path) -> Any:
    """Trinity's own ``load_config`` + ``check_and_update`` of ``config`` (written as YAML into ``folder``)."""
    pytest.importorskip("trinity")
    from trinity.common.config import load_config

    path = folder / "trinity_config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return load_config(str(path)).check_and_update()
