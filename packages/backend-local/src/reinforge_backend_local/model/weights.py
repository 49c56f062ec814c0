"""LoRA set-up and decoding with the adapter merged (base speed), restored exactly afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from reinforge.plugin import ConfigError


def attach_lora(model: Any, cfg: Any) -> Any:
    """Wrap ``model`` with a LoRA adapter; a target module that does not exist is a config error."""
    from peft import LoraConfig, get_peft_model

    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in cfg.lora_target_modules if t not in names]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if type(m).__name__ == "Linear"})
        raise ConfigError(
            f"model.lora_target_modules: {missing} not found in the model; its linear layers are {linear}"
        )
    config = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.lora_target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


@contextlib.contextmanager
def merged_for_decode(model: Any, peft: bool) -> Iterator[None]:
    """Fold LoRA into the base weights while decoding; put the exact originals back after.

    Unmerging by subtraction would drift by rounding each step (and break
    exact resume); swapping the original tensors back does not.
    """
    if not peft:
        yield
        return
    from peft.tuners.lora import LoraLayer

    saved = []
    try:
        for module in model.modules():
            if isinstance(module, LoraLayer):
                for name in module.active_adapters:
                    if name in module.lora_A:
                        base = module.get_base_layer()
                        original = base.weight.data
                        base.weight.data = original + module.get_delta_weight(name).to(original.dtype)
                        saved.append((base, original))
        with model.disable_adapter():
            yield
    finally:
        for base, original in reversed(saved):
            base.weight.data = original
