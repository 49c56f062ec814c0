"""The ``local`` backend: rollouts through the shared runner, GRPO-family updates with torch + peft.

What a run file may set is declared here and checked by core before any model
loads: :class:`LocalSettings` is ``backend_args``; :data:`ALGORITHMS` maps each
``algorithm_type`` to the settings of its loss (the keys under ``algorithm:``
besides core's ``learning_rate``, ``group_size``, ``batch_size``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reinforge.plugin import Backend, FieldError, Settings, at_least, finite, one_of

from .algorithms import ALGORITHM_ALIASES, ALGORITHMS
from .modeling import device_problem

MATMUL_DTYPES = ("auto", "float32", "bfloat16")  # resolved by packing.resolve_matmul_dtype

if TYPE_CHECKING:
    from reinforge.plugin import ModelConfig, TuneJob

__all__ = ["LocalBackend", "LocalSettings"]


@dataclass
class LocalSettings(Settings):
    """``backend_args`` of a run file (see the README's table)."""

    output_dir: str = "runs"  # runs/<project>/<experiment>-<timestamp>/
    resume: str | None = None  # a run folder (its latest checkpoint) or a checkpoint folder
    micro_batch: int = 8  # padded layout: sequences per forward/backward (8 is faster than 16 there, ~1 GB smaller)
    micro_batch_tokens: int | None = 1024  # token positions per forward/backward (long multi-turn samples)
    packed_batches: bool = True  # a group's shared prompt once, samples packed without padding (layout.py)
    max_batch: int = 64  # rows per decode batch
    window_s: float = 0.05  # micro-batching window for calls that arrive apart
    fast_decode: bool = True  # the hand-written decoder for Llama-family models (else HF's forward)
    kv_cache_mb: float = 1024  # a decode batch whose KV cache would be larger runs in parts
    prepacked_weights: bool = True  # frozen weights in oneDNN's packed layout, for decode and training
    keep_free_mb: float = 2048  # freed memory kept for reuse (memory.py); 0: back to the system at once
    # bfloat16: the frozen (and merged) weights' matmuls in bf16, sampler corrected; auto: bf16 on CPUs with native
    # bf16. float32 by default: bf16 cost the math example ~5 points of held-out accuracy (README)
    matmul_dtype: str = "float32"
    threads: int | None = None  # torch threads (default: torch's)
    tensorboard: bool = True
    progress: bool = True
    report: bool = True  # the end-of-run report (reinforge-report), through summary["write_report"]
    max_minutes: float | None = None  # stop training after this much wall time (then evaluate and save)
    eval_sampled: bool = True  # evaluations also sample at the run's temperature (accuracy/sampled); false: greedy only
    device: str = "auto"  # auto (the first GPU when CUDA is available, else the CPU), cpu, cuda or cuda:N

    def check(self) -> None:
        if not self.output_dir:
            raise FieldError("output_dir", "must not be empty")
        at_least("micro_batch", self.micro_batch, 1)
        at_least("micro_batch_tokens", self.micro_batch_tokens, 1)
        at_least("max_batch", self.max_batch, 1)
        at_least("window_s", self.window_s, 0.0)
        finite("window_s", self.window_s)
        at_least("kv_cache_mb", self.kv_cache_mb, 0.0, strict=True)
        finite("kv_cache_mb", self.kv_cache_mb)
        one_of("matmul_dtype", self.matmul_dtype, MATMUL_DTYPES)
        if self.matmul_dtype == "bfloat16" and not self.prepacked_weights:
            raise FieldError("matmul_dtype", "bfloat16 runs on the prepacked weights: set prepacked_weights: true")
        at_least("keep_free_mb", self.keep_free_mb, 0.0)
        finite("keep_free_mb", self.keep_free_mb)
        at_least("threads", self.threads, 1)
        at_least("max_minutes", self.max_minutes, 0.0, strict=True)
        finite("max_minutes", self.max_minutes)
        problem = device_problem(self.device)  # a GPU asked for but absent fails here, before any model loads
        if problem is not None:
            raise FieldError("device", problem)


class LocalBackend(Backend):
    """Registered as ``local``: one machine, CPU or one GPU."""

    name = "local"
    settings = LocalSettings
    algorithms = ALGORITHMS
    algorithm_aliases = ALGORITHM_ALIASES

    def run(self, job: TuneJob) -> dict[str, Any]:
        from .session import TrainingSession

        return TrainingSession(job).train()

    def chat_model(self, model_config: ModelConfig) -> Any:
        """The base (or given) model for ``reinforge eval``, batched across concurrent calls."""
        from .session import standalone_model

        return standalone_model(model_config)

    def dry_run(self, job: TuneJob) -> dict[str, Any]:
        """The resolved run, after the checks :meth:`run` makes before loading a model (a train set, the accuracy key)."""
        from reinforge.plugin import ConfigError, check_accuracy_key, to_dict

        from .modeling import DEFAULT_MODEL

        run = job.run
        if run.train_dataset is None:  # what TrainingSession refuses
            raise ConfigError(f"{run.where('train_dataset')}: the local backend needs a train_dataset")
        check_accuracy_key(job)
        opts = job.backend_settings if job.backend_settings is not None else LocalSettings()
        return {
            **job.describe(),
            "model": run.model.model_path if run.model and run.model.model_path else DEFAULT_MODEL,
            "algorithm_config": to_dict(run.algorithm),
            "output_dir": opts.output_dir,
            "device": opts.device,
        }
