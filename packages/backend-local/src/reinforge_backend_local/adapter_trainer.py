"""Training a served policy's LoRA adapter on recorded calls, one batch at a time.

The online gateway's ``local`` committer records what ``reinforge serve`` answered (prompt and
completion token ids, logprobs under the request's temperature) and attaches advantages; this
module turns each such batch into one PPO-clip update (the local backend's :class:`~.trainer.Trainer`)
and writes a checkpoint in the run-folder layout training uses: ``RUN/config.json`` (the base model)
and ``RUN/checkpoints/step-N/`` (``adapter/``, optimizer, RNG, ``state.json``). So ``reinforge serve
RUN`` and ``reinforge export RUN`` read what online learning wrote, and ``POST /admin/adapter`` takes a
checkpoint folder as it is.

A batch is trained once: each checkpoint's ``state.json`` lists the batch ids trained so far, so a
batch sent again after a crash (the outbox resends it with the same id) finds its checkpoint instead
of training twice. A new trainer resumes from the run folder's latest checkpoint (adapter, optimizer,
RNG and the caller's ``extra`` state, e.g. its baselines).
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from reinforge.plugin import AlgorithmConfig, ConfigError, ModelConfig

from . import checkpoint, packing
from .algorithms import GroupSettings, LossSettings
from .memory import configure_malloc, release_free_memory
from .modeling import DEFAULT_MODEL, load_policy
from .trainer import Sample, Samples, Trainer
from .weights import attach_lora

__all__ = ["AdapterTrainer"]


class AdapterTrainer:
    """Owns the LoRA model and its optimizer; :meth:`train` makes one checkpoint per batch.

    :param run_dir: where checkpoints go (created); an existing one is resumed from its latest.
    :param model_path: the base model ``reinforge serve`` serves (a folder or a built-in name).
    :param adapter: a PEFT adapter folder to start from when ``run_dir`` has no checkpoint yet
        (the adapter the server was started with); None: a fresh LoRA (the base model's outputs).
    :param lora: rank, alpha, dropout and target modules of a fresh adapter (``ModelConfig``'s keys); a
        resumed run keeps the shape its checkpoints have.
    :param loss: the loss settings (PPO clip, KL to the base model, epochs, gradient clipping).
    :param mini_batch_size: samples per optimizer step: a batch larger than this is split, in order, into
        that many PPO mini-batches (each clipped against the served logprobs); None: one step per batch.
    :param keep: checkpoints kept in ``run_dir`` (the oldest go; at least 1).
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        model_path: str | None = None,
        adapter: str | Path | None = None,
        lora: ModelConfig | None = None,
        learning_rate: float = 1e-5,
        loss: LossSettings | None = None,
        micro_batch_tokens: int | None = 1024,
        mini_batch_size: int | None = None,
        dtype: str = "float32",
        device: str = "cpu",
        keep: int = 3,
        seed: int = 0,
    ) -> None:
        configure_malloc()
        torch.manual_seed(seed)
        random.seed(seed)
        self.run_dir = Path(run_dir).expanduser().absolute()
        self.keep = max(1, keep)
        if mini_batch_size is not None and mini_batch_size < 1:
            raise ConfigError(f"mini_batch_size: must be at least 1, got {mini_batch_size}")
        self.mini_batch_size = mini_batch_size
        model, tokenizer, self.folder = load_policy(model_path or DEFAULT_MODEL, dtype=dtype, device=device)
        self.tokenizer = tokenizer
        latest = checkpoint.latest(self.run_dir)
        if latest is not None:  # resuming: the run's own adapter shape (rank, targets), whatever ``lora`` says
            model = _trainable_adapter(model, latest)
        elif adapter is not None:
            model = _trainable_adapter(model, Path(adapter).expanduser())
        else:
            mc = lora or ModelConfig(model_path=model_path or DEFAULT_MODEL)
            model = attach_lora(model, mc)
        if device == "cpu" and packing.available():
            packing.install(model, packing.Packer())  # the frozen layers train on prepacked weights
        self.model = model
        algo = AlgorithmConfig(algorithm_type="grpo", learning_rate=learning_rate)
        self.trainer = Trainer(
            model,
            algo,
            loss or GroupSettings(),
            name="grpo",
            temperature=1.0,  # each sample carries its request's own temperature
            pad_id=_pad_id(tokenizer),
            micro_batch_tokens=micro_batch_tokens,
            peft=True,
        )
        self.state: dict[str, Any] = {"step": 0, "batches": [], "extra": {}}
        if latest is not None:
            self.state = checkpoint.load(latest, model=model, optimizer=self.trainer.optimizer, peft=True)
        self._write_config(dtype)

    # -- what has been trained --------------------------------------------------------------------

    @property
    def step(self) -> int:
        """Batches trained into this run folder."""
        return int(self.state.get("step", 0))

    @property
    def extra(self) -> dict[str, Any]:
        """The caller's state saved with the latest checkpoint (``{}`` before the first)."""
        return dict(self.state.get("extra") or {})

    def latest(self) -> Path | None:
        """The latest checkpoint folder (what a server should serve), or None before the first batch."""
        return checkpoint.latest(self.run_dir)

    def trained(self, batch_id: str) -> bool:
        """Whether ``batch_id`` is already in this run's weights."""
        return batch_id in (self.state.get("batches") or ())

    # -- one batch -------------------------------------------------------------------------------

    def train(
        self, batch_id: str, samples: Sequence[Sample | Mapping[str, Any]], *, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """One update on ``samples``, saved as the next checkpoint with ``extra``; its metrics and folder.

        A sample is a :class:`~.trainer.Sample` or a mapping of its fields (what crosses a process boundary).

        A batch already trained is not trained again: the answer names the latest checkpoint with
        ``"trained": False``. An empty batch saves a checkpoint too (with ``extra``, the same weights),
        so the caller's state and the batch id are recorded.

        :raises FloatingPointError: the loss or gradient was not finite (nothing is saved).
        """
        if self.trained(batch_id):
            return {"checkpoint": str(self.latest()), "trained": False, "step": self.step}
        items = [s if isinstance(s, Sample) else Sample(**s) for s in samples]
        metrics = self._steps(items) if items else {"train/skipped_step": 1.0}
        release_free_memory()
        step = self.step + 1
        state = {
            "step": step,
            "batch_id": batch_id,
            "batches": [*(self.state.get("batches") or ()), batch_id],
            "extra": extra if extra is not None else self.extra,
            "metrics": {k: float(v) for k, v in metrics.items()},
        }
        folder = checkpoint.save(
            self.run_dir / "checkpoints" / f"step-{step}",
            model=self.model,
            optimizer=self.trainer.optimizer,
            state=state,
            peft=True,
        )
        self.state = state
        self._prune()
        return {"checkpoint": str(folder), "trained": True, "step": step, "metrics": state["metrics"]}

    def _steps(self, items: list[Sample]) -> dict[str, float]:
        """One optimizer step per mini-batch; the metrics of each, averaged (sums for counts and times)."""
        size = self.mini_batch_size or len(items)
        steps = [self.trainer.step(Samples(items=items[i : i + size])) for i in range(0, len(items), size)]
        out: dict[str, float] = {}
        for key in steps[0]:
            values = [float(m.get(key, 0.0)) for m in steps]
            summed = key.startswith(("time/", "train/"))
            out[key] = sum(values) if summed else sum(values) / len(values)
        out["train/optimizer_steps"] = float(len(steps))
        return out

    # -- the run folder --------------------------------------------------------------------------

    def _write_config(self, dtype: str) -> None:
        """``config.json``'s model section, which serve and export read for the base model."""
        config = self.run_dir / "config.json"
        if config.exists():
            recorded = (json.loads(config.read_text()).get("model") or {}).get("model_path")
            if recorded and Path(str(recorded)).absolute() != self.folder.absolute():
                raise ConfigError(
                    f"{config}: this run folder trained {recorded}, not {self.folder}; use another folder"
                )
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        body = {"model": {"model_path": str(self.folder), "dtype": dtype}, "trainer": "reinforge AdapterTrainer"}
        tmp = config.with_name(config.name + ".tmp")
        tmp.write_text(json.dumps(body, indent=2))
        tmp.replace(config)

    def _prune(self) -> None:
        for old in checkpoint.steps(self.run_dir)[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)


def _trainable_adapter(model: Any, adapter: Path) -> Any:
    """``model`` with the PEFT adapter at ``adapter`` loaded for training; a bad folder is a config error."""
    from peft import PeftModel

    if not (adapter / "adapter_config.json").exists():
        sub = adapter / "adapter"
        if (sub / "adapter_config.json").exists():  # a checkpoint folder
            adapter = sub
        else:
            raise ConfigError(f"{adapter}: not a PEFT adapter folder (no adapter_config.json)")
    return PeftModel.from_pretrained(model, str(adapter), is_trainable=True)


def _pad_id(tokenizer: Any) -> int:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return int(pad or 0)
