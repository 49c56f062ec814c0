"""The ``local`` backend: rollouts through the shared runner, GRPO-family updates with torch + peft."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from reinforge.errors import ConfigError


@dataclass
class Options:
    """``backend_args`` of a run file."""

    output_dir: str = "runs"  # runs/<project>/<experiment>-<timestamp>/
    resume: str | None = None  # a run folder (its latest checkpoint) or a checkpoint folder
    micro_batch: int = 8  # sequences per forward/backward (8 is faster than 16 here, and ~1 GB smaller)
    micro_batch_tokens: int | None = 1024  # and at most this many padded tokens (long multi-turn samples)
    max_batch: int = 64  # rows per decode batch
    window_s: float = 0.05  # micro-batching window for calls that arrive apart
    fast_decode: bool = True  # the hand-written decoder for Llama-family models (else HF's forward)
    kv_cache_mb: float = 1024  # a decode batch whose KV cache would be larger runs in parts
    prepacked_weights: bool = True  # frozen weights in oneDNN's packed layout, for decode and training
    threads: int | None = None  # torch threads (default: torch's)
    tensorboard: bool = True
    progress: bool = True
    report: bool = True  # write the report at the end
    max_minutes: float | None = None  # stop training after this much wall time (then evaluate and save)

    @classmethod
    def from_run(cls, run: Any) -> Options:
        args = dict(run.backend_args or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(args) - known)
        if unknown:
            raise ConfigError(
                f"{run.where('backend_args')}: unknown key(s) {unknown} for the local backend; known: {sorted(known)}"
            )
        return cls(**args)


class LocalBackend:
    """Registered as ``local``."""

    def run(self, job: Any) -> dict[str, Any]:
        from .session import TrainingSession

        return TrainingSession(job, Options.from_run(job.run)).train()

    def chat_model(self, model_cfg: Any) -> Any:
        """The base (or given) model for ``reinforge eval``, batched across concurrent calls."""
        from .session import standalone_model

        return standalone_model(model_cfg)

    def dry_run(self, job: Any) -> dict[str, Any]:
        from .modeling import DEFAULT_MODEL

        run = job.run
        opts = Options.from_run(run)
        algo = run.algorithm
        model = run.model.model_path if run.model else DEFAULT_MODEL
        return {
            "backend": "local",
            "model": model,
            "algorithm": asdict(algo),
            "workflow": job.workflow.name,
            "judges": [j.name for j in job.composer.judges],
            "group_reward": job.group_reward.name if job.group_reward else None,
            "output_dir": opts.output_dir,
        }
