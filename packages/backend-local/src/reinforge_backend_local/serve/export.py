"""``reinforge export RUN_DIR|CHECKPOINT --out DIR [--merged | --adapter]``: a run's policy for other tools.

- ``--merged`` (the default): a standard Hugging Face folder, the LoRA adapter folded into the
  base weights (safetensors, in the run's dtype), with the tokenizer, its chat template and the
  generation config; ``transformers.AutoModelForCausalLM.from_pretrained`` and vLLM load it as is.
- ``--adapter``: the PEFT adapter folder, its ``base_model_name_or_path`` the absolute path of the
  base model folder the run used; ``peft.PeftModel.from_pretrained(base, DIR)`` loads it.

Stages, one function each: :func:`resolve_checkpoint` (which checkpoint, which base model),
:func:`load_merged` (base + checkpoint weights), :func:`write_merged` / :func:`write_adapter`.
Imported by every ``reinforge`` command (through the plugin), so torch and transformers are
imported only inside the functions that need them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reinforge.plugin import ConfigError, ReinforgeError

from ..model import checkpoint

HELP = "write a run's policy as a merged Hugging Face folder or a PEFT adapter"


class ExportError(ReinforgeError):
    """``reinforge export`` cannot export what it was given (the message names the path)."""


@dataclass(frozen=True)
class Source:
    """A checkpoint to export and what it was trained from."""

    checkpoint: Path
    run_dir: Path
    base: Path  # the base model folder, absolute
    dtype: str
    peft: bool


# -- stage 1: which checkpoint ------------------------------------------------------------------


def resolve_checkpoint(path: Path) -> Source:
    """``path`` is a checkpoint folder or a run folder (its latest checkpoint)."""
    path = Path(path).expanduser().absolute()
    if not path.exists():
        raise ExportError(f"export: {path} does not exist")
    if (path / "state.json").exists():
        ckpt, run_dir = path, path.parent.parent
    elif path.is_dir() and ((path / "checkpoints").is_dir() or (path / "config.json").exists()):
        found = checkpoint.latest(path)
        if found is None:
            raise ExportError(
                f"export: the run folder {path} has no checkpoint (nothing in {path / 'checkpoints'} "
                "with a state.json); a run saves one at its end and every algorithm.save_interval_steps"
            )
        ckpt, run_dir = found, path
    else:
        raise ExportError(f"export: {path} is neither a run folder nor a checkpoint folder (no state.json)")
    peft = (ckpt / "adapter" / "adapter_config.json").exists()
    if not peft and not (ckpt / "model.pt").exists():
        raise ExportError(f"export: the checkpoint {ckpt} has neither adapter/ nor model.pt")
    model = _run_model(run_dir, ckpt)
    return Source(
        checkpoint=ckpt,
        run_dir=run_dir,
        base=_base_folder(model, ckpt, peft),
        dtype=str((model or {}).get("dtype") or "float32"),
        peft=peft,
    )


def _run_model(run_dir: Path, ckpt: Path) -> dict[str, Any] | None:
    """The ``model`` section of the run's ``config.json`` (``None`` when the run folder has no config)."""
    config = run_dir / "config.json"
    if not config.exists():
        return None
    try:
        model = json.loads(config.read_text()).get("model") or {}
    except (json.JSONDecodeError, AttributeError) as exc:
        raise ExportError(f"export: {config} (the run config of {ckpt}) is not a JSON object: {exc}") from exc
    return model if isinstance(model, dict) else {}


def _base_folder(model: dict[str, Any] | None, ckpt: Path, peft: bool) -> Path:
    """The base model folder, absolute: the run's ``model_path``, else what the adapter recorded.

    A run config without a model section trained the default model.
    """
    from ..model.modeling import DEFAULT_MODEL, resolve_model_path

    candidates: list[str] = []
    if model is not None:
        candidates.append(str(model.get("model_path") or DEFAULT_MODEL))
    if peft:
        recorded = json.loads((ckpt / "adapter" / "adapter_config.json").read_text()).get("base_model_name_or_path")
        if recorded:
            candidates.append(str(recorded))
    if not candidates:
        raise ExportError(
            f"export: cannot tell which base model {ckpt} was trained from: no config.json in its run folder "
            f"{ckpt.parent.parent} and no LoRA adapter config"
        )
    errors = []
    for name in candidates:
        try:
            return resolve_model_path(name).absolute()
        except ConfigError as exc:
            errors.append(str(exc))
    raise ExportError(f"export: cannot find the base model of {ckpt}: {'; '.join(errors)}")


# -- stage 2: base + checkpoint weights ---------------------------------------------------------


def load_merged(source: Source) -> tuple[Any, Any]:
    """(model, tokenizer) on CPU: the base model with the checkpoint's weights, LoRA merged in."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, source.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ExportError(f"export: the run's model.dtype {source.dtype!r} is not a torch dtype")
    tokenizer = AutoTokenizer.from_pretrained(str(source.base))
    model = AutoModelForCausalLM.from_pretrained(str(source.base), dtype=dtype)
    if source.peft:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(source.checkpoint / "adapter")).merge_and_unload()
    else:
        model.load_state_dict(torch.load(source.checkpoint / "model.pt", map_location="cpu"))
    model.eval()
    return model, tokenizer


# -- stage 3: write -----------------------------------------------------------------------------


def write_merged(model: Any, tokenizer: Any, out: Path) -> Path:
    """A Hugging Face folder: config, safetensors weights, generation config, tokenizer, chat template."""
    from transformers import GenerationConfig

    if getattr(model, "generation_config", None) is None:
        model.generation_config = GenerationConfig.from_model_config(model.config)
    model.save_pretrained(str(out), safe_serialization=True)
    model.generation_config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def write_adapter(source: Source, out: Path) -> Path:
    """The checkpoint's PEFT adapter, pointing at the absolute base model folder."""
    if not source.peft:
        raise _full_finetune(source)
    shutil.copytree(source.checkpoint / "adapter", out, dirs_exist_ok=True)
    config_file = out / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = str(source.base)
    config_file.write_text(json.dumps(config, indent=2, sort_keys=True))
    return out


# -- the whole export ---------------------------------------------------------------------------


def export_run(
    path: str | os.PathLike[str], out: str | os.PathLike[str], *, merged: bool = True, force: bool = False
) -> Path:
    """Export a run folder's latest checkpoint (or a checkpoint folder) to ``out``; returns ``out``.

    Written beside ``out`` first and moved into place, so a failed export leaves no half folder.
    """
    source = resolve_checkpoint(Path(path))
    target = _check_out(Path(out), source, force=force)
    if not merged and not source.peft:
        raise _full_finetune(source)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        if merged:
            write_merged(*load_merged(source), tmp)
        else:
            write_adapter(source, tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _full_finetune(source: Source) -> ExportError:
    return ExportError(
        f"export: {source.checkpoint} is a full fine-tune checkpoint (model.pt, no LoRA adapter); "
        "--adapter needs a LoRA run, use --merged"
    )


def _check_out(out: Path, source: Source, *, force: bool) -> Path:
    out = out.expanduser().absolute()
    if out.exists() and not out.is_dir():
        raise ExportError(f"export: --out {out} exists and is not a folder")
    for protected in (source.checkpoint, source.run_dir, source.base):
        if out == protected or out in protected.parents:
            raise ExportError(f"export: --out {out} would overwrite {protected}; choose another folder")
    if source.checkpoint in out.parents:
        raise ExportError(f"export: --out {out} is inside the checkpoint {source.checkpoint}; choose another folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(f"export: --out {out} exists and is not empty; pass --force to replace it")
    return out


# -- the command --------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path", metavar="RUN_DIR|CHECKPOINT", help="a run folder (its latest checkpoint) or a checkpoint"
    )
    parser.add_argument("--out", required=True, metavar="DIR", help="the folder to write (new or empty)")
    kind = parser.add_mutually_exclusive_group()
    kind.add_argument(
        "--merged",
        dest="merged",
        action="store_true",
        default=True,
        help="a Hugging Face folder with the adapter merged into the weights (default)",
    )
    kind.add_argument("--adapter", dest="merged", action="store_false", help="the PEFT adapter folder only")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists and is not empty")


def run(args: argparse.Namespace) -> int:
    out = export_run(args.path, args.out, merged=args.merged, force=args.force)
    kind = "merged Hugging Face model" if args.merged else "PEFT adapter"
    print(f"reinforge: wrote the {kind} to {out}")
    return 0
