"""What ``reinforge serve`` serves: a model folder or name, or a run's checkpoint (base model + its adapter)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reinforge.errors import ConfigError

from .. import checkpoint, packing
from ..engine import Engine, GenRequest, GenResult, MicroBatcher
from ..memory import limit_malloc_arenas
from ..modeling import ALIASES, DEFAULT_MODEL, GGUF_MODELS, load_policy
from ..policy import ChatTemplate


@dataclass
class Source:
    """Where the weights come from: a base model, and optionally a LoRA adapter or full weights on top."""

    model_path: str
    name: str
    adapter: Path | None = None
    full_weights: Path | None = None  # a full fine-tune checkpoint's model.pt
    max_model_len: int = 4096
    dtype: str = "float32"


def _is_checkpoint(path: Path) -> bool:
    return (path / "state.json").exists() and ((path / "adapter").is_dir() or (path / "model.pt").exists())


def resolve_source(target: str, adapter: str | None = None, *, name: str | None = None) -> Source:
    """``MODEL|RUN_DIR|CHECKPOINT`` (and ``--adapter DIR``) as a :class:`Source`.

    A run folder serves its latest checkpoint; a checkpoint serves the run's base model with its adapter
    (or its full weights). The base model, ``max_model_len`` and dtype come from the run's ``config.json``.
    """
    path = Path(target).expanduser()
    source: Source
    if path.is_dir() and ((path / "checkpoints").is_dir() or (path / "summary.json").exists()):
        ckpt = checkpoint.latest(path)
        if ckpt is None:
            raise ConfigError(f"{path} is a run folder without checkpoints: train it (or save one) first")
        source = _from_checkpoint(ckpt, path)
    elif path.is_dir() and _is_checkpoint(path):
        source = _from_checkpoint(path, path.parent.parent)
    elif target in GGUF_MODELS or target in ALIASES or (path.is_dir() and (path / "config.json").exists()):
        source = Source(model_path=target, name=ALIASES.get(target, target if not path.is_dir() else path.name))
    else:
        raise ConfigError(
            f"{target!r} is neither a model folder, a built-in model ({', '.join(GGUF_MODELS)}), "
            "a run folder nor a checkpoint folder"
        )
    if adapter is not None:
        adapter_dir = Path(adapter).expanduser()
        if not (adapter_dir / "adapter_config.json").exists():
            raise ConfigError(f"--adapter: {adapter_dir} is not a PEFT adapter folder (no adapter_config.json)")
        source.adapter, source.full_weights = adapter_dir, None
    if name:
        source.name = name
    return source


def _from_checkpoint(ckpt: Path, run_dir: Path) -> Source:
    config: dict[str, Any] = {}
    if (run_dir / "config.json").exists():
        config = json.loads((run_dir / "config.json").read_text()).get("model") or {}
    base = config.get("model_path") or DEFAULT_MODEL
    return Source(
        model_path=base,
        name=f"{run_dir.name}/{ckpt.name}",
        adapter=ckpt / "adapter" if (ckpt / "adapter").is_dir() else None,
        full_weights=ckpt / "model.pt" if (ckpt / "model.pt").exists() else None,
        max_model_len=int(config.get("max_model_len") or 4096),
        dtype=str(config.get("dtype") or "float32"),
    )


class ServeBatcher(MicroBatcher):
    """The engine's micro-batcher, reporting each batch's size and its requests' queue wait."""

    def __init__(self, engine: Engine, *, window_s: float, on_batch: Any = None) -> None:
        super().__init__(engine, window_s=window_s)
        self.active = 1 << 30  # unknown callers: a batch starts after the window or at max_batch
        self.on_batch = on_batch
        self._queued: dict[int, float] = {}

    async def submit(self, request: GenRequest) -> GenResult:
        self._queued[id(request)] = time.perf_counter()
        try:
            return await super().submit(request)
        finally:
            self._queued.pop(id(request), None)

    def _generate(self, requests: list[GenRequest]) -> list[GenResult]:
        now = time.perf_counter()
        if self.on_batch is not None:
            self.on_batch(len(requests), [now - self._queued.get(id(r), now) for r in requests])
        return super()._generate(requests)


@dataclass
class ServedModel:
    """Model, tokenizer, engine, batcher and chat template of the served policy."""

    name: str
    folder: Path
    tokenizer: Any
    engine: Engine
    batcher: ServeBatcher
    template: ChatTemplate
    max_model_len: int
    default_max_tokens: int = 512
    created: int = field(default_factory=lambda: int(time.time()))
    adapter: Path | None = None


def load(
    source: Source,
    *,
    max_batch: int = 64,
    window_s: float = 0.01,
    max_model_len: int | None = None,
    kv_cache_mb: float = 1024,
    on_batch: Any = None,
) -> ServedModel:
    """Load the weights (the adapter merged in, so decoding runs at base speed) and build the engine."""
    import torch

    limit_malloc_arenas()
    model, tokenizer, folder = load_policy(source.model_path, dtype=source.dtype)
    if source.adapter is not None:
        from peft import PeftModel

        try:
            model = PeftModel.from_pretrained(model, str(source.adapter)).merge_and_unload()
        except Exception as exc:  # noqa: BLE001 - peft raises many kinds for a bad adapter
            raise ConfigError(f"adapter {source.adapter}: cannot be loaded onto {folder}: {exc}") from exc
        model.eval()
    elif source.full_weights is not None:
        model.load_state_dict(torch.load(source.full_weights, map_location="cpu"))
    length = max_model_len or source.max_model_len
    config_len = getattr(model.config, "max_position_embeddings", None)
    if config_len:
        length = min(length, int(config_len))
    packer = packing.Packer() if packing.available() else None
    if packer is not None:
        packing.install(model, packer)
    engine = Engine(model, tokenizer, max_model_len=length, max_batch=max_batch, kv_cache_mb=kv_cache_mb, packer=packer)
    return ServedModel(
        name=source.name,
        folder=folder,
        tokenizer=tokenizer,
        engine=engine,
        batcher=ServeBatcher(engine, window_s=window_s, on_batch=on_batch),
        template=ChatTemplate(tokenizer, length),
        max_model_len=length,
        adapter=source.adapter,
    )
