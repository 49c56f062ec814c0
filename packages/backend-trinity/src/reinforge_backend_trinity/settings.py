"""``backend_args`` of the ``trinity`` backend: what a run file may set, checked before anything loads.

Every key maps to one place of the Trinity-RFT config (the README's table says where). A key left
unset (``None``) is not written, so Trinity's own default, or the value of a hand-written Trinity
YAML given as ``config_path``, stays.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reinforge.plugin import FieldError, Settings, at_least, one_of

__all__ = [
    "ENGINE_TYPES",
    "FORMAT_KEYS",
    "MODES",
    "MONITOR_TYPES",
    "STORAGE_TYPES",
    "SYNC_METHODS",
    "TrinitySettings",
]

# Trinity-RFT 0.6.0's values (trinity/common/config.py, config_validator.py); the tests hold them to Trinity's.
MODES = ("explore", "train", "both", "serve", "bench", "colocate")
ENGINE_TYPES = ("vllm", "sglang", "tinker", "external")
MONITOR_TYPES = ("tensorboard", "wandb", "mlflow", "swanlab")
STORAGE_TYPES = ("queue", "sql", "file")
SYNC_METHODS = ("nccl", "checkpoint", "memory")
# keys of Trinity's FormatConfig a run may set for its tasksets (how Trinity's own workflows read a row)
FORMAT_KEYS = (
    "prompt_type",
    "prompt_key",
    "response_key",
    "system_prompt_key",
    "system_prompt",
    "messages_key",
    "tools_key",
    "image_key",
    "video_key",
    "reply_prefix",
    "workflow_key",
    "reward_fn_key",
    "chat_template",
    "enable_thinking",
)


@dataclass
class TrinitySettings(Settings):
    """``backend_args`` of a run file for ``--backend trinity`` (see the README's table)."""

    # where the run folder goes: <output_dir>/<project_name>/<experiment_name>/trinity_config.yaml
    output_dir: str = "runs"
    # Trinity's checkpoint_root_dir (checkpoints, buffer, logs, monitor); default <output_dir>/checkpoints
    checkpoint_root_dir: str | None = None
    group: str | None = None  # Trinity's `group` (the job folder is <checkpoint_root_dir>/<project>/<group>/<name>)
    # a hand-written Trinity YAML merged under the run's keys (same as the run file's top-level config_path)
    config_path: str | None = None

    mode: str = "both"  # explore | train | both | serve | bench | colocate
    ray_address: str | None = None  # "auto" (Trinity's default), "ray://head:10001", an address
    node_num: int | None = None  # cluster.node_num
    gpu_per_node: int | None = None  # cluster.gpu_per_node (0 on a CPU-only explorer)
    # CPUs of the local Ray head `tune` starts when ray_address is unset (default: all of this machine's)
    ray_num_cpus: int | None = None
    # engine_type external: the OpenAI-compatible server's root URL (default: $OPENAI_BASE_URL, Trinity's variable)
    external_url: str | None = None

    # the rollout model (explorer.rollout_model): its GPUs are engine_num * tensor_parallel_size; the trainer
    # gets the rest of node_num * gpu_per_node (Trinity computes it)
    engine_type: str | None = None  # vllm (Trinity's default) | sglang | tinker | external
    engine_num: int | None = None
    tensor_parallel_size: int | None = None
    gpu_memory_utilization: float | None = None
    enforce_eager: bool | None = None
    enable_thinking: bool | None = None  # Qwen3-style thinking: rollout and auxiliary models alike
    # auxiliary models Trinity serves on its own engines (those without api_base): GPUs per engine and count
    auxiliary_engine_num: int | None = None
    auxiliary_tensor_parallel_size: int | None = None

    runner_per_model: int | None = None  # explorer.runner_per_model
    eval_on_startup: bool | None = None  # explorer.eval_on_startup
    sync_method: str | None = None  # nccl | checkpoint | memory
    sync_interval: int | None = None  # synchronizer.sync_interval
    monitor_type: str | None = None  # tensorboard (Trinity's default) | wandb | mlflow | swanlab
    experience_buffer: str | None = None  # queue (Trinity's default) | sql | file: buffer.trainer_input
    # Trinity's FormatConfig keys for the train and eval tasksets (prompt_key, response_key, ...)
    format: dict[str, Any] = field(default_factory=dict)
    # a Trinity workflow for the tasksets instead of reinforge's adapter (a registered name such as
    # math_workflow, or a dotted path to a trinity Workflow subclass)
    workflow_type: str | None = None
    reward_fn_type: str | None = None  # Trinity's default_reward_fn_type (with a Trinity workflow)

    def check(self) -> None:
        if not self.output_dir:
            raise FieldError("output_dir", "must not be empty")
        one_of("mode", self.mode, MODES)
        if self.engine_type is not None:
            one_of("engine_type", self.engine_type, ENGINE_TYPES)
        if self.monitor_type is not None:
            one_of("monitor_type", self.monitor_type, MONITOR_TYPES)
        if self.experience_buffer is not None:
            one_of("experience_buffer", self.experience_buffer, STORAGE_TYPES)
        if self.sync_method is not None:
            one_of("sync_method", self.sync_method, SYNC_METHODS)
        at_least("node_num", self.node_num, 1)
        at_least("gpu_per_node", self.gpu_per_node, 0)
        for key in ("engine_num", "tensor_parallel_size", "auxiliary_engine_num", "auxiliary_tensor_parallel_size"):
            at_least(key, getattr(self, key), 1)
        at_least("runner_per_model", self.runner_per_model, 1)
        at_least("ray_num_cpus", self.ray_num_cpus, 1)
        if self.external_url is not None and not self.external_url.startswith(("http://", "https://")):
            raise FieldError("external_url", f"must be an http(s) URL, got {self.external_url!r}")
        at_least("sync_interval", self.sync_interval, 1)
        if self.gpu_memory_utilization is not None and not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise FieldError("gpu_memory_utilization", f"must be in (0, 1], got {self.gpu_memory_utilization}")
        for key in self.format:
            one_of(f"format.{key}", key, FORMAT_KEYS)
        for key in ("ray_address", "config_path", "workflow_type", "reward_fn_type", "group", "checkpoint_root_dir"):
            value = getattr(self, key)
            if value is not None and not value.strip():
                raise FieldError(key, "must not be empty (leave it out instead)")
        needs_gpu = self.mode in ("train", "both", "colocate")
        if needs_gpu and self.gpu_per_node == 0:
            raise FieldError("gpu_per_node", f"mode {self.mode!r} trains on GPUs; 0 GPUs per node cannot run it")
