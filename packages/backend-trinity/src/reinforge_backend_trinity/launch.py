"""Launching a written Trinity-RFT config: checks that fail early, Ray, the user's code on the workers, ``run_stage``.

The order, so that a machine that cannot run the stage says why before anything starts:

1. :func:`preflight` on the mapped config (plain data): Ray installed, vLLM importable where Trinity imports it,
   GPUs for a mode that trains, pyarrow importable next to verl's numpy. Each error says what to install or set.
2. Trinity's ``load_config`` of the written YAML. When ``cluster.node_num`` and ``gpu_per_node`` are both set,
   ``check_and_update()`` runs now, before Ray (so Trinity's own environment variables, ``get_envs()``, reach
   the workers); otherwise Trinity's validator detects them from Ray, so it runs once Ray is up.
3. Ray: connect to ``cluster.ray_address`` when the config sets one, else start a local head for this node
   (``ray.init(num_cpus=..., include_dashboard=False)``). The job's ``runtime_env`` ships the run file's folder
   (``working_dir``) and any referenced module from elsewhere (``py_modules``) to the workers.
4. For ``engine_type: external`` only: the named model actor Trinity 0.6.0 forgets (:mod:`.external`).
5. ``trinity.cli.launcher.run_stage`` (which reuses this Ray connection and shuts it down at its end).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reinforge.plugin import ConfigurationError

from .extra import INSTALL_HINT

__all__ = [
    "EXPLORER_MODES",
    "GPU_MODES",
    "Probes",
    "external_url",
    "launch",
    "preflight",
    "referenced_modules",
    "runtime_env",
]

GPU_MODES = ("train", "both", "colocate")  # verl's trainer hard-codes CUDA (trainer/verl/trainer.py) and nccl
EXPLORER_MODES = ("explore", "both", "serve", "bench", "colocate")  # modes that import Trinity's model wrapper
VLLM_HINT = "pip install 'trinity-rft[vllm]==0.6.0' (on a machine with CUDA GPUs)"
NUMPY_HINT = "pip install 'numpy>=2'"


def _module_found(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _local_gpus() -> int:
    """CUDA devices this process sees (0 without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return 0
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def _pyarrow_error() -> str | None:
    """Why pyarrow does not import (verl's numpy<2 under a pyarrow that needs numpy 2), or None."""
    if not _module_found("pyarrow"):
        return None  # nothing to conflict with; Trinity's readers will say it is missing
    try:
        import pyarrow  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


@dataclass
class Probes:
    """What :func:`preflight` asks of the machine (the tests give their own answers)."""

    module_found: Callable[[str], bool] = field(default=_module_found)
    local_gpus: Callable[[], int] = field(default=_local_gpus)
    pyarrow_error: Callable[[], str | None] = field(default=_pyarrow_error)


def _get(config: dict[str, Any], path: str, default: Any = None) -> Any:
    node: Any = config
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def preflight(config: dict[str, Any], *, where: str = "run", probes: Probes | None = None) -> None:
    """Refuse, with what to install or set, a config this machine cannot launch; starts nothing."""
    probes = probes or Probes()
    mode = _get(config, "mode", "both")
    engine = _get(config, "explorer.rollout_model.engine_type", "vllm")
    if not probes.module_found("ray"):
        raise ConfigurationError(f"{where}: launching on Trinity-RFT needs Ray, which is not installed: {INSTALL_HINT}")
    if mode in EXPLORER_MODES and not probes.module_found("vllm"):
        why = (
            "a vLLM engine (backend_args.engine_type: vllm, Trinity's default)"
            if engine.startswith("vllm")
            else f"trinity-rft 0.6.0 imports vllm at module level (trinity/common/models/mm_utils.py) even for "
            f"engine_type {engine!r}"
        )
        raise ConfigurationError(
            f"{where}: mode {mode!r} runs Trinity's explorer and {why}, but vllm is not installed: {VLLM_HINT}"
        )
    local = not _get(config, "cluster.ray_address")
    if local:  # a local Ray head for this machine: its GPUs are the ones this process sees
        gpus = probes.local_gpus()
        if gpus == 0 and mode in GPU_MODES:
            raise ConfigurationError(
                f"{where}: backend_args.mode {mode!r} trains with verl, which needs CUDA GPUs, and none is visible "
                "(torch.cuda.device_count() is 0). Point backend_args.ray_address at a cluster with GPUs, or "
                "explore only here: backend_args.mode: explore with engine_type: external and external_url"
            )
        if gpus == 0 and mode != "train" and engine in ("vllm", "sglang"):
            raise ConfigurationError(
                f"{where}: a {engine} engine needs a CUDA GPU and none is visible (torch.cuda.device_count() is 0). "
                "Point backend_args.ray_address at a cluster with GPUs, or set backend_args.engine_type: external "
                "with external_url (an OpenAI-compatible server that returns token ids, such as `reinforge serve`)"
            )
    problem = probes.pyarrow_error()
    if problem is not None:
        raise ConfigurationError(
            f"{where}: pyarrow does not import ({problem}); verl 0.8.0 pins numpy<2 but pyarrow needs numpy 2, which "
            f"Trinity's dataset readers need: install it over verl's pin with {NUMPY_HINT}"
        )


def external_url(config: Any, given: str | None, *, where: str = "run") -> str:
    """The external server's root URL: ``backend_args.external_url``, else Trinity's ``base_url_env`` variable."""
    env = config.explorer.rollout_model.external_model_config.base_url_env
    url = given or os.environ.get(env)
    if not url:
        raise ConfigurationError(
            f"{where}: engine_type 'external' needs the OpenAI-compatible server's URL: set backend_args.external_url "
            f"(for example http://127.0.0.1:8000, the root: Trinity appends /v1) or the {env} environment variable"
        )
    url = url.rstrip("/")
    return url.removesuffix("/v1")


# --------------------------------------------------------------------------- the user's code on the workers


def _installed(top: str, origin: str) -> bool:
    """True for a distribution's module (pip-installed, editable too) or the standard library's.

    The workers' Python has those already (every node installs the same packages); other modules travel.
    """
    if top in sys.stdlib_module_names or top in importlib.metadata.packages_distributions():
        return True
    try:  # an editable install lists no files: its distribution's name is the module's (reinforge-backend-local)
        importlib.metadata.distribution(top.replace("_", "-"))
        return True
    except importlib.metadata.PackageNotFoundError:
        pass
    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    path = Path(origin).resolve()
    return any(path.is_relative_to(Path(root).resolve()) for root in roots)


def referenced_modules(config: dict[str, Any]) -> tuple[str | None, list[str]]:
    """The run file's folder and the local modules its references name that live outside it.

    References are read from the adapter's ``workflow_args.reinforge`` (``module:attr``; a registered name has
    no module). A module under the run file's folder travels with it; an installed one (a distribution's, or the
    standard library's) is the workers' own.
    """
    specs = [ts.get("workflow_args", {}).get("reinforge") for ts in _tasksets(config)]
    specs = [s for s in specs if isinstance(s, dict)]
    base = next((s.get("base_dir") for s in specs if s.get("base_dir")), None)
    refs: list[str] = []
    for spec in specs:
        items = [spec.get("workflow"), *(spec.get("judges") or []), spec.get("group_reward")]
        refs += [item["ref"] for item in items if isinstance(item, dict) and isinstance(item.get("ref"), str)]
    modules: list[str] = []
    for ref in refs:
        module, sep, _ = ref.partition(":")
        if not sep:
            continue
        top = module.split(".")[0]
        if base and ((Path(base) / top).is_dir() or (Path(base) / f"{top}.py").is_file()):
            continue
        found = importlib.util.find_spec(top)
        if found is None or found.origin in (None, "built-in", "frozen"):
            continue
        location = found.submodule_search_locations
        path = str(Path(list(location)[0])) if location else str(found.origin)
        if not _installed(top, path) and path not in modules:
            modules.append(path)
    return base, modules


def _tasksets(config: dict[str, Any]) -> list[dict[str, Any]]:
    inputs = _get(config, "buffer.explorer_input", {}) or {}
    out = [inputs["taskset"]] if isinstance(inputs.get("taskset"), dict) else []
    out += [t for t in inputs.get("tasksets") or [] if isinstance(t, dict)]
    out += [t for t in inputs.get("eval_tasksets") or [] if isinstance(t, dict)]
    return out


def runtime_env(
    config: dict[str, Any], env_vars: dict[str, str], *, excludes: list[Path] | None = None
) -> dict[str, Any]:
    """The Ray job's runtime_env: the run folder as ``working_dir`` (minus ``excludes``), other modules, variables."""
    base, modules = referenced_modules(config)
    out: dict[str, Any] = {}
    if base and Path(base).is_dir():
        out["working_dir"] = base
        skipped = [str(p.resolve().relative_to(Path(base).resolve())) for p in excludes or [] if _inside(p, Path(base))]
        out["excludes"] = [".git", "__pycache__", *(f"/{p}" for p in skipped if p != ".")]
    if modules:
        out["py_modules"] = modules
    if env_vars:
        out["env_vars"] = dict(env_vars)
    return out


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


# --------------------------------------------------------------------------- the stage


def launch(
    path: Path,
    data: dict[str, Any],
    *,
    where: str = "run",
    url: str | None = None,
    num_cpus: int | None = None,
    excludes: list[Path] | None = None,
    probes: Probes | None = None,
) -> dict[str, Any]:
    """Run the Trinity config written at ``path`` (``data``: the same config as plain data); return the stage's status."""
    preflight(data, where=where, probes=probes)
    import ray
    from trinity.cli.launcher import run_stage
    from trinity.common.config import load_config

    config = load_config(str(path))
    connect = bool(_get(data, "cluster.ray_address"))
    sizes_known = bool(config.cluster.node_num and config.cluster.gpu_per_node)
    env_vars: dict[str, str] = {}
    external = config.explorer.rollout_model.engine_type == "external"
    server = external_url(config, url, where=where) if external and config.mode in EXPLORER_MODES else None
    if server is not None:  # the explorer's own wrapper of an external engine reads the URL from this variable
        env_vars[config.explorer.rollout_model.external_model_config.base_url_env] = server
    if sizes_known:
        config.check_and_update()
        env_vars = {**config.get_envs(), **env_vars}
    env = runtime_env(data, env_vars, excludes=excludes or [])
    if connect:
        ray.init(address=config.cluster.ray_address, runtime_env=env)
        if config.mode in GPU_MODES and not ray.cluster_resources().get("GPU"):
            ray.shutdown()
            raise ConfigurationError(
                f"{where}: backend_args.mode {config.mode!r} trains with verl on CUDA GPUs, and the Ray cluster at "
                f"{config.cluster.ray_address!r} has none (ray.cluster_resources() has no 'GPU')"
            )
    else:
        ray.init(num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False, runtime_env=env)
    actor = None
    try:
        if not sizes_known:
            config.check_and_update()  # detects node_num / gpu_per_node from the Ray cluster just connected
        if server is not None:
            from .external import start_external_model_actor

            actor = start_external_model_actor(config, server)
        print(
            f"launching Trinity-RFT's {config.mode} stage (Ray: {ray.get_runtime_context().gcs_address})",
            file=sys.stderr,
        )
        status = run_stage(config)
    finally:
        if ray.is_initialized():  # run_stage shuts Ray down itself; this covers a failure before it
            if actor is not None:
                ray.kill(actor)
            ray.shutdown()
    error = status.error
    return {
        "stage": status.stage,
        "success": bool(status.success),
        "startup_time_sec": status.startup_time_sec,
        "execution_time_sec": status.execution_time_sec,
        "total_time_sec": status.total_time_sec,
        "error": None if error is None else f"{error.type_name}: {error.message}",
        "checkpoint_job_dir": config.get_checkpoint_job_dir(),
    }
