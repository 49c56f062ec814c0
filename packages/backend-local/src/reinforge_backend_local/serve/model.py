"""What ``reinforge serve`` serves: a model folder or name, or a run's checkpoint (base model + its adapter)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reinforge.plugin import ConfigError

from ..inference.decoder import projection_groups
from ..inference.engine import Engine
from ..inference.policy import ChatTemplate
from ..inference.scheduler import Scheduler
from ..model import checkpoint, packing
from ..model.memory import limit_malloc_arenas
from ..model.modeling import ALIASES, DEFAULT_MODEL, GGUF_MODELS, load_policy


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


@dataclass
class ServedModel:
    """Model, tokenizer, engine, scheduler and chat template of the served policy."""

    name: str
    folder: Path
    tokenizer: Any
    engine: Engine
    scheduler: Scheduler
    template: ChatTemplate
    max_model_len: int
    default_max_tokens: int = 512
    created: int = field(default_factory=lambda: int(time.time()))
    adapter: Path | None = None
    swapper: AdapterSwapper | None = None
    policy_version: int = 0  # +1 per successful hot swap (``POST /admin/adapter``)


class AdapterError(ValueError):
    """An adapter that cannot be swapped in; the message names the path and the problem."""


LoraFactors = dict[str, tuple[Any, Any, float]]  # module name -> (lora_A, lora_B, scaling)


def adapter_folder(path: Path) -> Path:
    """The PEFT adapter folder of ``path``: an adapter folder, a checkpoint folder or a run folder (its latest)."""
    if not path.exists():
        raise AdapterError(f"{path}: no such file or folder")
    if not path.is_dir():
        raise AdapterError(f"{path}: not a folder (give a PEFT adapter, checkpoint or run folder)")
    if (path / "adapter_config.json").exists():
        return path
    if (path / "checkpoints").is_dir() or (path / "summary.json").exists():
        ckpt = checkpoint.latest(path)
        if ckpt is None:
            raise AdapterError(f"{path}: a run folder without checkpoints")
        path = ckpt
    if (path / "state.json").exists():
        if (path / "adapter" / "adapter_config.json").exists():
            return path / "adapter"
        if (path / "model.pt").exists():
            raise AdapterError(f"{path}: a full fine-tune checkpoint (model.pt), not a LoRA adapter")
    raise AdapterError(f"{path}: not a PEFT adapter folder (no adapter_config.json)")


def _pattern(patterns: dict[str, Any], name: str, default: Any) -> Any:
    """peft's rank/alpha pattern lookup: a key matches a module name ending in it."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", name):
            return value
    return default


class AdapterSwapper:
    """LoRA adapters merged into the model's weights, exactly: each swap is base + the new delta.

    The original weight of every module an adapter touched is kept (a copy of just those
    modules), so a swap restores it before adding the next adapter's ``B @ A * scaling``,
    the same arithmetic as peft's ``merge_and_unload``; ``None`` restores the base model.
    """

    def __init__(self, model: Any, lock: threading.Lock, packer: Any = None, on_apply: Any = None) -> None:
        self.model = model
        self.lock = lock
        self.packer = packer
        self.on_apply = on_apply  # told after every swap (the scheduler's cached prefixes are of the old weights)
        self.modules = dict(model.named_modules())
        self.base: dict[str, Any] = {}
        self.current: LoraFactors = {}
        self.released: BaseWeights | None = None  # set by :meth:`release`: plain weights gone, packed ones pinned
        self.groups: dict[str, tuple[str, ...]] = {}  # module name -> the names pinned stacked with it
        self.mapped: set[str] = set()  # modules whose weight is the model file's pages (read-only)

    def release(self, folder: Path, groups: Sequence[tuple[Any, ...]] = (), *, map_embedding: bool = True) -> int:
        """Drop the plain copy of every linear weight the packer holds packed; returns how many.

        Serving decodes on the packed weights only, so keeping both doubles the model's memory
        (about 0.43 GB of SmolLM2-135M's 0.54). A swap reads the base weights back from the
        model folder's safetensors. Only for weights equal to the folder's (no full fine-tune
        loaded over them) and not tied to the embedding. Each of ``groups`` (modules that read
        the same input, :func:`~..inference.decoder.projection_groups`) is pinned as one stacked weight.
        With ``map_embedding`` the embedding table is read from the file's pages (:meth:`_map_embedding`).
        """
        import torch

        if self.packer is None or self.current:
            return 0
        base = BaseWeights.of(folder)
        if base is None:
            return 0
        embed = self.model.get_input_embeddings().weight.data_ptr()
        names = {id(m): n for n, m in self.modules.items()}

        def releasable(module: Any) -> bool:
            name = names.get(id(module))
            if name is None or type(module) is not torch.nn.Linear or f"{name}.weight" not in base.names:
                return False
            weight = module.weight
            return weight.data_ptr() != embed and not weight.requires_grad and packing.packable(weight)

        def drop(module: Any) -> None:
            weight = module.weight
            # the shape stays (adapters are checked against it); the storage is one number
            module.weight = torch.nn.Parameter(torch.zeros((), dtype=weight.dtype).expand(weight.shape), False)
            base.held.add(names[id(module)])

        count = 0
        for group in groups:
            if not all(releasable(m) for m in group):
                continue
            self.packer.pin_group(group, packing.pack(torch.cat([m.weight.detach() for m in group])))
            for module in group:
                self.groups[names[id(module)]] = tuple(names[id(m)] for m in group)
                drop(module)
                count += 1
        for name, module in self.modules.items():
            if name in base.held or not releasable(module):
                continue
            packed = self.packer.packed(module, module.weight)
            if packed is None:
                continue
            self.packer.pin(module, packed)
            drop(module)
            count += 1
        if count:
            embedding = self._map_embedding(base, names) if map_embedding else None
            # The weights that stay (norms) get memory of their own: the file mapping they shared
            # with the dropped ones goes with its last tensor, and so do its resident pages.
            for param in self.model.parameters():
                if 0 not in param.stride() and param is not embedding:  # dropped ones: one expanded number
                    param.data = param.data.clone()
            import gc

            gc.collect()
        self.released = base
        return count

    def _map_embedding(self, base: BaseWeights, names: dict[int, str]) -> Any:
        """Read the embedding table from the model file's pages instead of a copy in memory; returns it.

        A server looks up a few thousand distinct tokens, so a mapping of the file keeps only
        their rows resident (llama.cpp maps all its weights this way), where a copy holds all
        49k rows (0.11 GB of SmolLM2-135M). An output layer tied to the table keeps its packed
        copy (pinned first, so the packer does not pack the mapped table again). Adapters on
        the table or a layer tied to it are not swapped then (:meth:`apply` says so).
        """
        embedding = self.model.get_input_embeddings()
        name = names.get(id(embedding))
        param = getattr(embedding, "weight", None)
        if name is None or param is None or param.requires_grad:
            return None
        mapped = base.mapped(f"{name}.weight", param)
        if mapped is None:
            return None
        tied = [m for m in self.modules.values() if m is not embedding and getattr(m, "weight", None) is param]
        for module in tied:
            packed = self.packer.packed(module, param)
            if packed is None:  # it would run on the mapped table itself, unpacked: keep the copy
                return None
            self.packer.pin(module, packed)
        param.data = mapped
        self.mapped = {name, *(names[id(m)] for m in tied)}
        return param

    def read(self, path: Path | None) -> tuple[Path | None, LoraFactors]:
        """The adapter at ``path`` as LoRA factors, checked against the model (nothing is changed)."""
        import torch

        if path is None:
            return None, {}
        folder = adapter_folder(path)
        try:
            config = json.loads((folder / "adapter_config.json").read_text())
        except (OSError, ValueError) as exc:
            raise AdapterError(f"{folder}: adapter_config.json is not readable JSON: {exc}") from exc
        if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
            raise AdapterError(f"{folder}: not a LoRA adapter (peft_type {config.get('peft_type')!r})")
        for flag in ("use_dora", "lora_bias"):
            if config.get(flag):
                raise AdapterError(f"{folder}: {flag} adapters cannot be hot-swapped (serve them with --adapter)")
        if config.get("modules_to_save"):
            raise AdapterError(f"{folder}: adapters with modules_to_save cannot be hot-swapped")
        state = self._weights(folder)
        pairs: dict[str, dict[str, Any]] = {}
        for key, tensor in state.items():
            m = re.fullmatch(r"(?:base_model\.model\.)?(.+)\.lora_([AB])(?:\.[^.]+)?\.weight", key)
            if m is None:
                raise AdapterError(f"{folder}: unsupported adapter weight {key!r} (only LoRA on linear layers)")
            pairs.setdefault(m.group(1), {})[m.group(2)] = tensor
        if not pairs:
            raise AdapterError(f"{folder}: the adapter has no LoRA weights")
        alpha, rslora = float(config.get("lora_alpha", 8)), bool(config.get("use_rslora"))
        factors: LoraFactors = {}
        for name, ab in sorted(pairs.items()):
            module = self.modules.get(name)
            if module is None:
                raise AdapterError(f"{folder}: the adapter targets {name!r}, which the model does not have")
            if not isinstance(module, torch.nn.Linear):
                raise AdapterError(f"{folder}: {name!r} is a {type(module).__name__}; only linear layers swap")
            if set(ab) != {"A", "B"}:
                raise AdapterError(f"{folder}: {name!r} lacks lora_{'A' if 'A' not in ab else 'B'}")
            a, b = ab["A"], ab["B"]
            shape = tuple(module.weight.shape)  # peft turns fan_in_fan_out off on nn.Linear
            if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1] or (b.shape[0], a.shape[1]) != shape:
                raise AdapterError(
                    f"{folder}: shape mismatch at {name!r}: lora_B {tuple(b.shape)} @ lora_A {tuple(a.shape)} "
                    f"does not fit the model's weight {tuple(module.weight.shape)} (another base model?)"
                )
            r = a.shape[0]
            a_ = float(_pattern(config.get("alpha_pattern") or {}, name, alpha))
            scaling = a_ / r**0.5 if rslora else a_ / r
            factors[name] = (a.to(module.weight.dtype), b.to(module.weight.dtype), scaling)
        return folder, factors

    def _weights(self, folder: Path) -> dict[str, Any]:
        import torch

        try:
            if (folder / "adapter_model.safetensors").exists():
                from safetensors.torch import load_file

                return dict(load_file(str(folder / "adapter_model.safetensors")))
            if (folder / "adapter_model.bin").exists():
                return dict(torch.load(folder / "adapter_model.bin", map_location="cpu", weights_only=True))
        except Exception as exc:
            raise AdapterError(f"{folder}: the adapter weights cannot be read: {exc}") from exc
        raise AdapterError(f"{folder}: no adapter_model.safetensors or adapter_model.bin")

    def apply(self, factors: LoraFactors) -> None:
        """Swap to ``factors`` (``{}``: the base model), holding the engine's lock: no batch runs meanwhile."""
        import torch

        def merged(name: str) -> Any:  # base from the folder + this adapter's delta
            assert self.released is not None
            weight = self.released.weight(name, self.modules[name].weight.dtype)
            if name in factors:
                a, b, scaling = factors[name]
                weight.addmm_(b, a, alpha=scaling)
            return weight

        touched = sorted(self.mapped & set(factors))
        if touched:
            raise AdapterError(
                f"the adapter changes {touched[0]!r}, which this server reads from the model file "
                "(the embedding table or a layer tied to it): serve it with --adapter instead"
            )
        with self.lock, torch.no_grad():
            stacked: set[tuple[str, ...]] = set()
            for name in sorted(set(self.current) | set(factors)):
                module = self.modules[name]
                if name in self.groups:  # re-stacked once below, with its unchanged neighbours
                    stacked.add(self.groups[name])
                    continue
                if self.released is not None and name in self.released.held:
                    self.packer.pin(module, packing.pack(merged(name)))
                    continue
                weight = module.weight
                if name not in self.base:
                    self.base[name] = weight.detach().clone()
                weight.copy_(self.base[name])
                if name in factors:
                    a, b, scaling = factors[name]
                    weight += (b @ a) * scaling
                if self.packer is not None:  # the prepacked copy is of the old weight
                    self.packer.entries.pop(id(module), None)
            for group in sorted(stacked):
                weights = torch.cat([merged(n) for n in group])
                self.packer.pin_group([self.modules[n] for n in group], packing.pack(weights))
            self.current = factors
            if self.on_apply is not None:
                self.on_apply()


@dataclass
class BaseWeights:
    """The base model's weights on disk (its safetensors file), read back one tensor at a time."""

    file: Path
    names: set[str]
    held: set[str] = field(default_factory=set)  # module names whose plain weight was dropped

    @classmethod
    def of(cls, folder: Path) -> BaseWeights | None:
        from safetensors import safe_open

        file = folder / "model.safetensors"
        if not file.exists():  # sharded or another format: keep the weights in memory
            return None
        with safe_open(str(file), framework="pt") as f:
            names = set(f.keys())
        return cls(file, names)

    def mapped(self, key: str, like: Any) -> Any:
        """Tensor ``key`` as a view of the file's pages (copy-on-write), or ``None`` if it differs from ``like``.

        Only pages that are read become resident, and the kernel can drop them again.
        """
        import mmap
        import warnings

        import torch

        with self.file.open("rb") as fh:
            header_len = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(header_len))
            entry = header.get(key)
            dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
            if not entry or dtypes.get(entry["dtype"]) != like.dtype or tuple(entry["shape"]) != tuple(like.shape):
                return None
            first, end = entry["data_offsets"]
            offset = 8 + header_len + first
            if offset % like.element_size():
                return None
            pages = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            view = torch.frombuffer(pages, dtype=like.dtype, count=(end - first) // like.element_size(), offset=offset)
        view = view.view(like.shape)
        if not torch.equal(view[:8], like[:8]):  # not what was loaded (a few rows: reading all would map all)
            return None
        return view

    def weight(self, name: str, dtype: Any) -> Any:
        from safetensors import safe_open

        with safe_open(str(self.file), framework="pt") as f:
            return f.get_tensor(f"{name}.weight").to(dtype)


def load(
    source: Source,
    *,
    max_batch: int = 64,
    max_model_len: int | None = None,
    kv_cache_mb: float = 1024,
    metrics: Any = None,
    device: str = "cpu",
) -> ServedModel:
    """Load the weights (the adapter merged in, so decoding runs at base speed) and build the engine."""
    import torch

    limit_malloc_arenas()
    model, tokenizer, folder = load_policy(source.model_path, dtype=source.dtype, device=device)
    model.eval().requires_grad_(False)  # nothing trains here: frozen weights run packed, no autograd state
    if source.full_weights is not None and source.adapter is None:
        model.load_state_dict(torch.load(source.full_weights, map_location="cpu"))
    length = max_model_len or source.max_model_len
    config_len = getattr(model.config, "max_position_embeddings", None)
    if config_len:
        length = min(length, int(config_len))
    on_cpu = next(model.parameters()).device.type == "cpu"
    packer = packing.Packer() if on_cpu and packing.available() else None
    if packer is not None:
        packing.install(model, packer)
    engine = Engine(model, tokenizer, max_model_len=length, max_batch=max_batch, kv_cache_mb=kv_cache_mb, packer=packer)
    swapper = AdapterSwapper(model, engine.lock, packer, on_apply=engine.weights_changed)
    factors: LoraFactors = {}
    if source.adapter is not None:
        try:
            factors = swapper.read(source.adapter)[1]
        except AdapterError as exc:
            raise ConfigError(f"adapter {source.adapter}: cannot be loaded onto {folder}: {exc}") from exc
    if engine.decoder is not None and source.full_weights is None:
        table = model.get_input_embeddings().weight  # an adapter on a layer tied to it keeps it in memory
        tied = any(swapper.modules[n].weight is table for n in factors)
        swapper.release(folder, projection_groups(model), map_embedding=not tied)
    if factors:  # merged the same way a hot swap merges, so the base stays recoverable
        try:
            swapper.apply(factors)
        except AdapterError as exc:
            raise ConfigError(f"adapter {source.adapter}: cannot be loaded onto {folder}: {exc}") from exc
    return ServedModel(
        name=source.name,
        folder=folder,
        tokenizer=tokenizer,
        engine=engine,
        scheduler=Scheduler(
            engine,
            max_batch=max_batch,
            on_admit=metrics.on_admit if metrics is not None else None,
            on_step=metrics.on_step if metrics is not None else None,
        ),
        template=ChatTemplate(tokenizer, length),
        max_model_len=length,
        adapter=source.adapter,
        swapper=swapper,
    )
