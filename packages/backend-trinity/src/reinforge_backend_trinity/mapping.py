"""A reinforge run as a Trinity-RFT config: plain data, written as YAML into the run folder.

:func:`trinity_config` is a pure function of the run, the checked ``backend_args`` and the algorithm:
it imports nothing of Trinity. Three layers make the result, later ones winning:

1. reinforge's values for what the run left at its defaults (and the adapter's needs);
2. the hand-written Trinity YAML of ``config_path``, if any;
3. what the run sets explicitly: keys present in the run file (or, for a run built in Python,
   values that differ from the defaults) and every ``backend_args`` key given.

So a ``config_path`` YAML keeps what it sets unless the run file sets the same thing, and a key
the run does not set is never written over it (AgentScope v1.0.21 reset the YAML's ``total_steps``
whenever a ``train_dataset`` was passed). Values that are ``None`` are never written.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from reinforge.plugin import (
    AlgorithmConfig,
    ConfigError,
    DatasetConfig,
    ModelConfig,
    RunConfig,
    to_dict,
)

from .algorithms import TrinityAlgorithmSettings, trinity_name
from .settings import TrinitySettings

__all__ = [
    "ADAPTER_WORKFLOW",
    "CONFIG_FILE",
    "explicit_keys",
    "load_trinity_yaml",
    "merge",
    "run_folder",
    "trinity_config",
    "workflow_spec",
    "write_config",
]

CONFIG_FILE = "trinity_config.yaml"
# Trinity's workflow class that runs a reinforge workflow, its judges and group reward (see workflow.py).
ADAPTER_WORKFLOW = "reinforge_backend_trinity.workflow.ReinforgeWorkflow"
WORKFLOW_ARGS_KEY = "reinforge"
# the order of the top-level sections in the written YAML (then any others)
_ORDER = ("project", "group", "name", "mode", "checkpoint_root_dir", "cluster", "model", "algorithm", "buffer")


# --------------------------------------------------------------------------- what the run sets


def _paths(data: Any, prefix: str = "") -> set[str]:
    """Every dotted key path of a mapping (``model``, ``model.temperature``, ...)."""
    out: set[str] = set()
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}{key}"
            out.add(path)
            out |= _paths(value, f"{path}.")
    return out


def _differs(section: str, obj: Any, default: Any) -> set[str]:
    if obj is None:
        return set()
    out = {section}
    for name in vars(default):
        if name.startswith("_") or name == "options":
            continue
        if getattr(obj, name, None) != getattr(default, name, None):
            out.add(f"{section}.{name}")
    return out


def explicit_keys(run: RunConfig) -> set[str]:
    """The dotted keys of ``run`` that its author set: those in the run file, plus values off the defaults.

    A run built in Python has no file: there a value equal to reinforge's default counts as unset.
    """
    keys: set[str] = set()
    if run.source and Path(run.source).is_file():
        import yaml

        try:
            data = yaml.safe_load(Path(run.source).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            data = None
        keys |= _paths(data)
    for name in ("project_name", "experiment_name"):
        if getattr(run, name) != getattr(RunConfig, name, None):
            keys.add(name)
    keys |= _differs("model", run.model, ModelConfig(model_path="-"))
    keys |= _differs("algorithm", run.algorithm, AlgorithmConfig())
    keys |= {f"algorithm.{k}" for k in run.algorithm.options}
    for section in ("train_dataset", "eval_dataset"):
        keys |= _differs(section, getattr(run, section), DatasetConfig(path="-"))
    runner_defaults = type(run.runner)()
    keys |= _differs("runner", run.runner, runner_defaults) - {"runner"}
    eval_defaults = type(run.eval)()
    keys |= _differs("eval", run.eval, eval_defaults) - {"eval"}
    keys |= {f"backend_args.{k}" for k in run.backend_args}
    return keys


# --------------------------------------------------------------------------- layers


class _Layers:
    """Two nested dicts: reinforge's defaults (under the YAML) and the run's explicit keys (over it)."""

    def __init__(self, explicit: set[str]) -> None:
        self.explicit = explicit
        self.low: dict[str, Any] = {}
        self.high: dict[str, Any] = {}

    def put(
        self, path: str, value: Any, *, when: str | Iterable[str] | None = None, force: bool = False, null: bool = False
    ) -> None:
        """Set ``path`` (dotted Trinity key) to ``value``; over the YAML when the run set ``when`` (or ``force``).

        ``None`` is not written, unless ``null`` (a key the run turns off, such as LoRA for a full fine-tune).
        """
        if value is None and not null:
            return
        keys = [when] if isinstance(when, str) else list(when or ())
        high = force or any(k in self.explicit for k in keys)
        _set(self.high if high else self.low, path, value)


def _set(target: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        target = target.setdefault(key, {})
    target[last] = value


def _get(data: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` deep-merged onto a copy of ``base``: mappings merge key by key, anything else replaces."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


# --------------------------------------------------------------------------- pieces


def _importable(ref: Any, where: str) -> Any:
    """A component reference as plain data; a callable must be importable by path on the Ray workers."""
    if isinstance(ref, str):
        return ref
    text = to_dict(ref)
    module, _, qualname = str(text).partition(":")
    if module in ("__main__", "?", "builtins") or "<" in qualname:
        raise ConfigError(
            f"{where}: {text} cannot be imported by path on Trinity's Ray workers (the config is sent to "
            "other processes, never a live function); define it at module level in an importable module "
            "and pass it as 'module:attr'"
        )
    return text


def workflow_spec(run: RunConfig) -> dict[str, Any]:
    """What the adapter workflow needs to rebuild the run's components on a worker: references, never callables."""
    where = run.source or "run"

    def spec(obj: Any, key: str) -> dict[str, Any]:
        data = to_dict(obj)
        data["ref"] = _importable(obj.ref, f"{where}: {key}")
        return data

    out: dict[str, Any] = {
        "workflow": spec(run.workflow, "workflow"),
        "judges": [spec(s, f"judges[{i}]") for i, s in enumerate(run.judges)],
        "group_reward": spec(run.group_reward, "group_reward") if run.group_reward is not None else None,
        "reward": to_dict(run.reward),
        "runner": to_dict(run.runner),
        "model_interface": run.model_interface,
        "base_dir": run.base_dir,
        "run_file": run.source,
        "sampling": run.model.sampling() if run.model is not None else None,
        # models outside Trinity (an API: api_base), called through reinforge's LiteLLM model; keys left out
        "auxiliary_models": {name: to_dict(m) for name, m in run.auxiliary_models.items() if m.api_base},
    }
    return out


def _lora(model: ModelConfig) -> list[dict[str, Any]] | None:
    if model.full_finetune:
        return None
    modules = model.lora_target_modules
    # Trinity's LoRAConfig.target_modules is one string: "all-linear", or a regex peft full-matches
    if modules == ["all-linear"] or modules == "all-linear":
        target = "all-linear"
    else:
        target = r".*\.(" + "|".join(modules) + ")"
    return [
        {"name": "reinforge", "lora_rank": model.lora_rank, "lora_alpha": model.lora_alpha, "target_modules": target}
    ]


def _taskset(ds: DatasetConfig, name: str, settings: TrinitySettings, split: str | None = None) -> dict[str, Any]:
    local = Path(ds.path).expanduser()
    out: dict[str, Any] = {"name": name, "storage_type": "file", "path": _abs(ds.path) if local.exists() else ds.path}
    # Trinity reads `load_dataset(path, name=subset_name, split=split)`: one file is its "train" split
    out["split"] = "train" if ds.is_file else (split or ds.split_name)
    if ds.name is not None:
        out["subset_name"] = ds.name
    if ds.shuffle:
        out["data_selector"] = {"selector_type": "shuffle", "seed": ds.seed}
    if settings.format:
        out["format"] = dict(settings.format)
    return out


def _abs(path: str) -> str:
    return str(Path(path).expanduser().absolute())


def run_folder(run: RunConfig, settings: TrinitySettings) -> Path:
    """``<output_dir>/<project_name>/<experiment_name>``: where the run's Trinity config is written."""
    return Path(settings.output_dir).expanduser().absolute() / run.project_name / run.experiment_name


# --------------------------------------------------------------------------- the config


def trinity_config(
    run: RunConfig,
    settings: TrinitySettings,
    algorithm: str,
    algorithm_settings: TrinityAlgorithmSettings | None = None,
    *,
    base: dict[str, Any] | None = None,
    explicit: set[str] | None = None,
) -> dict[str, Any]:
    """The Trinity-RFT config of ``run`` as plain data (what :func:`write_config` writes as YAML).

    :param algorithm: the canonical ``algorithm_type`` (reinforge's or Trinity's name).
    :param base: a hand-written Trinity config (the parsed ``config_path`` YAML), merged under the run's keys.
    :param explicit: the run's explicitly set keys (default :func:`explicit_keys`).
    :raises ConfigError: the run cannot be written as a Trinity config (the message names the key).
    """
    base = base or {}
    where = run.source or "run"
    layers = _Layers(explicit_keys(run) if explicit is None else explicit)
    put = layers.put
    b = "backend_args."

    put("project", run.project_name, when="project_name")
    put("name", run.experiment_name, when="experiment_name")
    put("group", settings.group, force=True)
    put("mode", settings.mode, when=b + "mode")
    checkpoints = settings.checkpoint_root_dir or os.path.join(settings.output_dir, "checkpoints")
    put("checkpoint_root_dir", _abs(checkpoints), when=b + "checkpoint_root_dir")
    put("cluster.ray_address", settings.ray_address, force=True)
    put("cluster.node_num", settings.node_num, force=True)
    put("cluster.gpu_per_node", settings.gpu_per_node, force=True)
    put("monitor.monitor_type", settings.monitor_type, force=True)
    put("synchronizer.sync_method", settings.sync_method, force=True)
    put("synchronizer.sync_interval", settings.sync_interval, force=True)

    # -- the algorithm
    algo = run.algorithm
    put("algorithm.algorithm_type", trinity_name(algorithm), when="algorithm.algorithm_type")
    put("algorithm.repeat_times", algo.group_size, when="algorithm.group_size")
    put("algorithm.optimizer.lr", algo.learning_rate, when="algorithm.learning_rate")
    for key, value in (algorithm_settings.trinity_keys() if algorithm_settings else {}).items():
        if key == "optimizer":
            for opt_key, opt_value in value.items():
                put(f"algorithm.optimizer.{opt_key}", opt_value, force=True)
        else:
            put(f"algorithm.{key}", value, force=True)
    put("buffer.batch_size", algo.batch_size, when="algorithm.batch_size")
    put("trainer.save_interval", algo.save_interval_steps, when="algorithm.save_interval_steps")
    if algo.eval_interval_steps > 0:  # 0 (reinforge: only at the end) keeps Trinity's interval
        put("explorer.eval_interval", algo.eval_interval_steps, when="algorithm.eval_interval_steps")

    # -- the model
    model = run.model
    if model is None and not _get(base, "model.model_path"):
        raise ConfigError(f"{where}: model.model_path: the trinity backend needs the model to train")
    if model is not None:
        put("model.model_path", model.model_path, force=True)
        put("model.max_model_len", model.max_model_len, when="model.max_model_len")
        put("model.max_response_tokens", model.max_tokens, when="model.max_tokens")
        put("model.temperature", model.temperature, when="model.temperature")
        put("model.top_p", model.top_p, when="model.top_p")
        lora_keys = [f"model.{k}" for k in ("full_finetune", "lora_rank", "lora_alpha", "lora_target_modules")]
        lora = _lora(model)
        put("model.lora_configs", lora, when=lora_keys, null=lora is None)
        if "model.dtype" in layers.explicit:
            put("explorer.rollout_model.dtype", model.dtype, force=True)
        put("explorer.rollout_model.seed", model.seed, force=True)
    put("model.enable_thinking", settings.enable_thinking, force=True)

    rollout = "explorer.rollout_model."
    put(rollout + "engine_type", settings.engine_type, force=True)
    put(rollout + "engine_num", settings.engine_num, force=True)
    put(rollout + "tensor_parallel_size", settings.tensor_parallel_size, force=True)
    put(rollout + "gpu_memory_utilization", settings.gpu_memory_utilization, force=True)
    put(rollout + "enforce_eager", settings.enforce_eager, force=True)
    # the sampling params Trinity's engines use (it copies model.* only where these are unset)
    if model is not None:
        put(rollout + "temperature", model.temperature, when="model.temperature")
        put(rollout + "top_p", model.top_p, when="model.top_p")
    put(rollout + "enable_thinking", settings.enable_thinking, force=True)
    uses_adapter = settings.workflow_type is None
    if uses_adapter:  # the adapter records every call through the OpenAI API with token ids
        put(rollout + "enable_openai_api", True)
        put(rollout + "enable_history", True)

    # auxiliary models Trinity serves itself (no api_base): each with its own sampling params
    engines = []
    for name, aux in run.auxiliary_models.items():
        if aux.api_base:
            continue
        entry: dict[str, Any] = {
            "name": name,
            "model_path": aux.model_path,
            "max_model_len": aux.max_model_len,
            "max_response_tokens": aux.max_tokens,
            "temperature": aux.temperature,
            "top_p": aux.top_p,
        }
        for key, value in (
            ("engine_type", settings.engine_type if settings.engine_type != "external" else None),
            ("engine_num", settings.auxiliary_engine_num),
            ("tensor_parallel_size", settings.auxiliary_tensor_parallel_size),
            ("enable_thinking", settings.enable_thinking),
            ("seed", aux.seed),
        ):
            if value is not None:
                entry[key] = value
        engines.append(entry)
    if engines:
        put("explorer.auxiliary_models", engines, force=True)

    put("explorer.runner_per_model", settings.runner_per_model, force=True)
    put("explorer.eval_on_startup", settings.eval_on_startup, force=True)
    put("explorer.max_timeout", int(run.runner.rollout_timeout_s), when="runner.rollout_timeout_s")
    put("explorer.max_retry_times", run.runner.max_retries, when="runner.max_retries")
    if settings.experience_buffer is not None:
        put("buffer.trainer_input.experience_buffer.storage_type", settings.experience_buffer, force=True)
        put("buffer.trainer_input.experience_buffer.name", "experience_buffer")

    # -- data
    inputs = "buffer.explorer_input."
    put(inputs + "default_workflow_type", settings.workflow_type or ADAPTER_WORKFLOW, when=b + "workflow_type")
    put(inputs + "default_reward_fn_type", settings.reward_fn_type, force=True)
    workflow_args = {WORKFLOW_ARGS_KEY: workflow_spec(run)} if uses_adapter else None
    yaml_tasksets = _get(base, inputs + "tasksets")
    train = run.train_dataset
    if train is not None:
        if yaml_tasksets:
            raise ConfigError(
                f"{where}: train_dataset: the config_path YAML sets buffer.explorer_input.tasksets; "
                "set train_dataset or those tasksets, not both"
            )
        put(inputs + "taskset", _taskset(train, "train", settings), force=True)
        if workflow_args is not None:
            put(inputs + "taskset.workflow_args", workflow_args, force=True)
        put("buffer.total_epochs", train.total_epochs, when="train_dataset.total_epochs")
    total_steps = algo.total_steps if algo.total_steps is not None else (train.total_steps if train else None)
    put("buffer.total_steps", total_steps, when=["algorithm.total_steps", "train_dataset.total_steps"])
    if run.eval_dataset is not None:
        eval_set = _taskset(run.eval_dataset, "eval", settings, split=run.eval_dataset.split or run.eval.split)
        eval_set["repeat_times"] = run.eval.group_size
        if workflow_args is not None:
            eval_set["workflow_args"] = workflow_args
        put(inputs + "eval_tasksets", [eval_set], force=True)

    out = merge(merge(layers.low, base), layers.high)
    out = {**{k: out[k] for k in _ORDER if k in out}, **out}
    if workflow_args is not None:
        # tasksets of the YAML that run on the adapter (no workflow of their own) get the run's references too
        for key in ("tasksets", "eval_tasksets"):
            for taskset in _get(out, inputs + key) or []:
                if isinstance(taskset, dict) and not taskset.get("default_workflow_type"):
                    taskset.setdefault("workflow_args", {}).setdefault(
                        WORKFLOW_ARGS_KEY, workflow_args[WORKFLOW_ARGS_KEY]
                    )
    mode = out.get("mode", "both")
    if mode == "train" and not _get(out, "buffer.train_batch_size"):  # Trinity derives it in the other modes only
        repeat = _get(out, "algorithm.repeat_times") or 1
        _set(out, "buffer.train_batch_size", (_get(out, "buffer.batch_size") or 1) * repeat)
    needs_tasks = mode not in ("train", "serve", "bench")
    has_tasks = _get(out, inputs + "taskset") or _get(out, inputs + "tasksets")
    if needs_tasks and not has_tasks:
        raise ConfigError(
            f"{where}: train_dataset: mode {mode!r} explores tasks; set train_dataset "
            "(or buffer.explorer_input.tasksets in the config_path YAML)"
        )
    return out


# --------------------------------------------------------------------------- files


def load_trinity_yaml(path: str, *, where: str = "config_path") -> dict[str, Any]:
    """A hand-written Trinity YAML as a mapping (an error names the file)."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: {path} must hold a mapping (a Trinity config), got {type(data).__name__}")
    return data


def write_config(config: dict[str, Any], folder: Path) -> Path:
    """Write ``config`` as ``folder/trinity_config.yaml`` (``trinity run --config`` reads it); return the path."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CONFIG_FILE
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path
