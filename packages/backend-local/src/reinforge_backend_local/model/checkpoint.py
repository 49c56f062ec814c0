"""Checkpoints: adapter (or full weights), optimizer, RNG states and data position, for exact resume."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from reinforge.plugin import ConfigError

from .run_versions import steps

__all__ = ["latest", "load", "save", "steps"]


def _to_cpu(value: Any) -> Any:
    """``value`` with every tensor in it on the CPU: a GPU run's checkpoint loads anywhere."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def save(folder: Path, *, model: Any, optimizer: Any, state: dict[str, Any], peft: bool) -> Path:
    """Write a checkpoint aside, then move it into place, so a crash never leaves half of one.

    Tensors are saved as CPU tensors (the adapter's safetensors are CPU already);
    loading moves the optimizer state back to each parameter's device.
    """
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if peft:
        model.save_pretrained(str(tmp / "adapter"))
    else:
        torch.save(_to_cpu(model.state_dict()), tmp / "model.pt")
    torch.save(_to_cpu(optimizer.state_dict()), tmp / "optimizer.pt")
    rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()  # LoRA dropout on a GPU draws from these
    torch.save(rng, tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps(state, indent=2))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def latest(run_dir: Path) -> Path | None:
    ckpts = steps(run_dir)
    return ckpts[-1] if ckpts else None


def load(folder: Path, *, model: Any, optimizer: Any, peft: bool) -> dict[str, Any]:
    if not (folder / "state.json").exists():
        raise ConfigError(f"--resume: {folder} is not a checkpoint (no state.json)")
    if peft:
        from peft import set_peft_model_state_dict
        from peft.utils import load_peft_weights

        set_peft_model_state_dict(model, load_peft_weights(str(folder / "adapter"), device="cpu"))
    else:
        model.load_state_dict(torch.load(folder / "model.pt", map_location="cpu"))
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location="cpu"))
    rng = torch.load(folder / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if "cuda" in rng and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return json.loads((folder / "state.json").read_text())
