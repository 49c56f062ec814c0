"""Training a served policy's LoRA adapter on recorded calls, one batch at a time, and going back to any version.

The online gateway's ``local`` committer records what ``reinforge serve`` answered (prompt and
completion token ids, logprobs under the request's temperature) and attaches advantages; this
module turns each such batch into one PPO-clip update (the local backend's :class:`~.trainer.Trainer`)
and writes a checkpoint in the run-folder layout training uses: ``RUN/config.json`` (the base model)
and ``RUN/checkpoints/step-N/`` (``adapter/``, optimizer, RNG, ``state.json``). So ``reinforge serve
RUN`` and ``reinforge export RUN`` read what online learning wrote, and ``POST /admin/adapter`` takes a
checkpoint folder as it is.

Each checkpoint is a policy *version* (``step-N``; ``step-0`` is the adapter before any batch, kept in
``RUN/initial/adapter``), and online's promotion gate may refuse one: :meth:`AdapterTrainer.restore`
makes any kept version the trainer's current state again (weights, optimizer, RNG, baselines), and the
next checkpoint still gets a new step number. :meth:`AdapterTrainer.swap_in` lends a version's weights
for a while (a check of that version) and :meth:`AdapterTrainer.put_back` restores the current ones
exactly. The bookkeeping (which batch each checkpoint trained, what was served, where training stands
after a restart) is :mod:`~reinforge_backend_local.model.run_versions`.

A batch is trained once: each checkpoint's ``state.json`` names the batch it trained, so a batch sent
again after a crash (the outbox resends it with the same id) finds its checkpoint instead of training
twice, also after training went back to an older version. A new trainer resumes from where training
stood (``run_versions.RunVersions.start``): adapter, optimizer, RNG and the caller's ``extra`` state.
"""

from __future__ import annotations

import copy
import json
import math
import random
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from reinforge.plugin import ConfigError, ModelConfig

from ..model import checkpoint, packing
from ..model.memory import configure_malloc, release_free_memory
from ..model.modeling import DEFAULT_MODEL, load_policy
from ..model.run_versions import INITIAL, RunVersions, step_name
from ..model.weights import attach_lora
from .algorithms import ALGORITHMS, GroupSettings, LossSettings
from .trainer import Sample, Samples, Trainer

__all__ = ["AdapterTrainer"]

Weights = dict[str, torch.Tensor]  # a LoRA adapter's trainable tensors by parameter name


class AdapterTrainer:
    """Owns the LoRA model and its optimizer; :meth:`train` makes one checkpoint (version) per batch.

    :param run_dir: where checkpoints go (created); an existing one is resumed from where training stood.
    :param model_path: the base model ``reinforge serve`` serves (a folder or a built-in name).
    :param adapter: a PEFT adapter folder to start from when ``run_dir`` has no checkpoint yet
        (the adapter the server was started with); None: a fresh LoRA (the base model's outputs).
    :param lora: rank, alpha, dropout and target modules of a fresh adapter (``ModelConfig``'s keys); a
        resumed run keeps the shape its checkpoints have.
    :param loss: the loss settings (PPO clip, KL to the base model, epochs, gradient clipping).
    :param mini_batch_size: samples per optimizer step: a batch larger than this is split, in order, into
        that many PPO mini-batches (each clipped against the served logprobs); None: one step per batch.
    :param keep: checkpoints never served that are kept in ``run_dir`` (the oldest go; at least 1); served
        ones (``served.json``) and the current one are always kept.
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
        self.seed = seed
        self.run_dir = Path(run_dir).expanduser().absolute()
        self.versions = RunVersions(self.run_dir)
        self.keep = max(1, keep)
        if mini_batch_size is not None and mini_batch_size < 1:
            raise ConfigError(f"mini_batch_size: must be at least 1, got {mini_batch_size}")
        self.mini_batch_size = mini_batch_size
        model, tokenizer, self.folder = load_policy(model_path or DEFAULT_MODEL, dtype=dtype, device=device)
        self.tokenizer = tokenizer
        model = self._attach_initial(model, adapter, lora or ModelConfig(model_path=model_path or DEFAULT_MODEL))
        self._fresh_rng = (torch.get_rng_state(), random.getstate())  # a new run's, for going back to step-0
        self.packer = packing.Packer() if device == "cpu" and packing.available() else None
        if self.packer is not None:
            packing.install(model, self.packer)  # the frozen layers train on prepacked weights (and decode on them)
        self.model = model
        self.trainer = Trainer(
            model,
            ALGORITHMS["grpo"],
            loss or GroupSettings(),
            learning_rate=learning_rate,
            temperature=1.0,  # each sample carries its request's own temperature
            pad_id=_pad_id(tokenizer),
            micro_batch_tokens=micro_batch_tokens,
            peft=True,
        )
        self._fresh_optimizer = copy.deepcopy(self.trainer.optimizer.state_dict())  # step-0's: no moments yet
        self.state: dict[str, Any] = {"step": 0, "batches": [], "extra": {}}
        self.head = INITIAL  # the version the current weights, optimizer and state are
        self._highest = self.versions.highest()
        start = self.versions.start()
        if start != INITIAL:
            self.state = checkpoint.load(
                self.versions.existing(start), model=model, optimizer=self.trainer.optimizer, peft=True
            )
            self.head = start
        self._write_config(dtype)

    def _attach_initial(self, model: Any, adapter: str | Path | None, lora: ModelConfig) -> Any:
        """``model`` with the run's LoRA at its ``step-0`` weights, which are kept in ``RUN/initial/adapter``.

        The run's own adapter shape wins (``initial/``, else its latest checkpoint); a new folder starts from
        ``adapter`` or a fresh LoRA. A folder from before versions (checkpoints, no ``initial/``) gets its
        ``step-0`` written now: ``adapter``, or a fresh LoRA of its shape drawn from ``seed``.
        """
        initial = self.run_dir / "initial" / "adapter"
        latest = self.versions.latest()
        if (initial / "adapter_config.json").exists():
            model = _trainable_adapter(model, initial)
        elif latest is not None:
            model = _trainable_adapter(model, latest)
            _reset_to_initial(model, adapter, self.seed)
        elif adapter is not None:
            model = _trainable_adapter(model, Path(adapter).expanduser())
        else:
            model = attach_lora(model, lora)
        self._initial: Weights = _lora_weights(model)
        if not (initial / "adapter_config.json").exists():
            tmp = initial.parent.with_name("initial.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            model.save_pretrained(str(tmp / "adapter"))
            shutil.rmtree(initial.parent, ignore_errors=True)
            tmp.rename(initial.parent)
        return model

    # -- what has been trained --------------------------------------------------------------------

    @property
    def step(self) -> int:
        """The step of the current version (0: ``step-0``, before any batch or after going back to it)."""
        return int(self.state.get("step", 0))

    @property
    def extra(self) -> dict[str, Any]:
        """The caller's state saved with the current version (``{}`` at ``step-0``)."""
        return dict(self.state.get("extra") or {})

    def latest(self) -> Path | None:
        """The newest checkpoint folder, or None before the first batch (not always the current version)."""
        return self.versions.latest()

    def recorded(self, batch_id: str) -> Path | None:
        """The checkpoint that trained ``batch_id`` (None: not trained here, or its checkpoints are gone)."""
        return self.versions.recorded(batch_id)

    def trained(self, batch_id: str) -> bool:
        """Whether ``batch_id`` was trained into a checkpoint of this run (current or not)."""
        return self.recorded(batch_id) is not None

    def answer(self, folder: Path, *, trained: bool) -> dict[str, Any]:
        """What :meth:`train` says about the checkpoint ``folder``: the same for a batch and its resend."""
        return self.versions.answer(folder, trained=trained)

    # -- one batch -------------------------------------------------------------------------------

    def train(
        self, batch_id: str, samples: Sequence[Sample | Mapping[str, Any]], *, extra: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """One update on ``samples`` from the current version, saved as a new checkpoint with ``extra``.

        The answer: its folder, ``step``, ``parent`` (the version it was trained from) and ``metrics``.
        A sample is a :class:`~.trainer.Sample` or a mapping of its fields (what crosses a process boundary).

        A batch already trained is not trained again: the answer names the checkpoint that trained it, with
        ``"trained": False``. An empty batch saves a checkpoint too (with ``extra``, the same weights),
        so the caller's state and the batch id are recorded.

        :raises FloatingPointError: the loss or gradient was not finite (nothing is saved).
        """
        found = self.recorded(batch_id)
        if found is not None:
            return self.answer(found, trained=False)
        items = [s if isinstance(s, Sample) else Sample(**s) for s in samples]
        metrics = self._steps(items) if items else {"train/skipped_step": 1.0}
        release_free_memory()
        step = max(self._highest, self.versions.highest()) + 1  # never a step number written before
        state = {
            "step": step,
            "batch_id": batch_id,
            "parent": self.head,
            "batches": [*(self.state.get("batches") or ()), batch_id],
            "extra": extra if extra is not None else self.extra,
            # plain JSON for the store of versions: a metric that is not a number is left out
            "metrics": {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))},
        }
        folder = checkpoint.save(
            self.versions.folder(step_name(step)),
            model=self.model,
            optimizer=self.trainer.optimizer,
            state=state,
            peft=True,
        )
        self.state, self.head, self._highest = state, folder.name, step
        self._prune()
        return self.answer(folder, trained=True)

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

    # -- versions --------------------------------------------------------------------------------

    def restore(self, name: str) -> bool:
        """Make version ``name`` the current state: its weights, optimizer moments, RNG and ``extra``
        (``step-0``: the initial adapter, no moments, a new run's RNG, no ``extra``); whether anything changed.

        The next :meth:`train` starts from it and still writes a new step number. Recorded in ``head.json``,
        so a trainer started on this folder later resumes here too.

        :raises UnknownVersion: ``name`` has no checkpoint here (pruned or never written).
        """
        if name == self.head:
            return False
        if name == INITIAL:
            _set_weights(self.model, self._initial)
            self.trainer.optimizer.load_state_dict(copy.deepcopy(self._fresh_optimizer))
            torch.set_rng_state(self._fresh_rng[0])
            random.setstate(self._fresh_rng[1])
            self.state = {"step": 0, "batches": [], "extra": {}}
        else:
            folder = self.versions.existing(name)
            self.state = checkpoint.load(folder, model=self.model, optimizer=self.trainer.optimizer, peft=True)
        self.head = name
        self.versions.record_head(name, max(self._highest, self.versions.highest()))
        return True

    def weights(self) -> Weights:
        """A copy of the current LoRA tensors (by parameter name)."""
        return _lora_weights(self.model)

    def version_weights(self, name: str) -> Weights:
        """A copy of version ``name``'s LoRA tensors, read from its checkpoint (``step-0``: the initial adapter).

        :raises UnknownVersion: ``name`` has no checkpoint here.
        """
        if name == INITIAL:
            return {k: v.clone() for k, v in self._initial.items()}
        if name == self.head:
            return self.weights()
        saved = self.weights()
        try:
            _load_adapter(self.model, self.versions.existing(name))
            return self.weights()
        finally:
            _set_weights(self.model, saved)

    def swap_in(self, name: str) -> Weights | None:
        """Lend the model version ``name``'s weights (nothing else changes); what :meth:`put_back` needs, or
        None when ``name`` is the current version already.

        :raises UnknownVersion: ``name`` has no checkpoint here.
        """
        if name == self.head:
            return None
        saved = self.weights()
        if name == INITIAL:
            _set_weights(self.model, self._initial)
        else:
            _load_adapter(self.model, self.versions.existing(name))
        return saved

    def put_back(self, saved: Weights | None) -> None:
        """The current version's weights back, exactly as :meth:`swap_in` found them."""
        if saved is not None:
            _set_weights(self.model, saved)

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
        for old in self.versions.prunable(self.keep, self.head):
            shutil.rmtree(old, ignore_errors=True)


def _trainable_adapter(model: Any, adapter: Path) -> Any:
    """``model`` with the PEFT adapter at ``adapter`` loaded for training; a bad folder is a config error."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(_adapter_folder(adapter)), is_trainable=True)


def _adapter_folder(adapter: Path) -> Path:
    """The PEFT adapter folder of ``adapter`` (itself, or a checkpoint's ``adapter/``)."""
    if (adapter / "adapter_config.json").exists():
        return adapter
    sub = adapter / "adapter"
    if (sub / "adapter_config.json").exists():  # a checkpoint folder
        return sub
    raise ConfigError(f"{adapter}: not a PEFT adapter folder (no adapter_config.json)")


def _load_adapter(model: Any, folder: Path) -> None:
    """Copy the adapter weights at ``folder`` (a checkpoint or adapter folder) into ``model``'s LoRA, in place."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    set_peft_model_state_dict(model, load_peft_weights(str(_adapter_folder(folder)), device="cpu"))


def _lora_weights(model: Any) -> Weights:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _set_weights(model: Any, weights: Weights) -> None:
    """Copy ``weights`` into the trainable tensors in place (the optimizer keeps its references); exact."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if params.keys() != weights.keys():
        raise ValueError(f"the adapter tensors differ: {sorted(params.keys() ^ weights.keys())[:4]}")
    with torch.no_grad():
        for name, param in params.items():
            param.copy_(weights[name])


def _reset_to_initial(model: Any, adapter: str | Path | None, seed: int) -> None:
    """A folder from before versions: its ``step-0`` weights are ``adapter``'s, else a fresh LoRA drawn from ``seed``."""
    if adapter is not None:
        _load_adapter(model, Path(adapter).expanduser())
        return
    from peft.tuners.lora import LoraLayer

    torch.manual_seed(seed)
    for module in model.modules():
        if isinstance(module, LoraLayer):
            for name in list(module.lora_A):
                module.reset_lora_parameters(name, True)


def _pad_id(tokenizer: Any) -> int:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return int(pad or 0)
