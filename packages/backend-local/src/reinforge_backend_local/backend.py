"""The ``local`` backend: rollouts through the shared runner, GRPO-family updates with torch + peft.

What a run file may set is declared elsewhere and checked by core before any
model loads: :class:`~.settings.LocalSettings` is ``backend_args``; each
``algorithm_type`` is an :class:`~.training.algorithms.Algorithm` record whose settings
class holds the keys under ``algorithm:`` besides core's ``learning_rate``,
``group_size``, ``batch_size``, ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from reinforge.plugin import Backend

from .settings import LocalSettings
from .training.algorithms import ALGORITHM_ALIASES, ALGORITHMS

if TYPE_CHECKING:
    from reinforge.plugin import ModelConfig, TuneJob

__all__ = ["LocalBackend", "LocalSettings"]


class LocalBackend(Backend):
    """Registered as ``local``: one machine, CPU or one GPU."""

    name = "local"
    settings = LocalSettings
    algorithms = {name: record.settings for name, record in ALGORITHMS.items()}  # core checks the keys with these
    algorithm_aliases = ALGORITHM_ALIASES

    def run(self, job: TuneJob) -> dict[str, Any]:
        from .training.session import TrainingSession

        return TrainingSession(job).train()

    def chat_model(self, model_config: ModelConfig) -> Any:
        """The base (or given) model for ``reinforge eval``, batched across concurrent calls."""
        from .rollouts.standalone import standalone_model

        return standalone_model(model_config)

    def dry_run(self, job: TuneJob) -> dict[str, Any]:
        """The resolved run, after the checks :meth:`run` makes before loading a model (a train set, the accuracy key)."""
        from reinforge.plugin import ConfigError, check_accuracy_key, to_dict

        from .model.modeling import DEFAULT_MODEL

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
