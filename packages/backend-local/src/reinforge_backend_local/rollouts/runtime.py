"""The policy at run time: the model loaded on the compute thread, its decode engine, batcher and endpoint.

:class:`PolicyRuntime` is what a training session generates its rollouts and evaluations with, and
what ``reinforge eval`` wraps (:mod:`.standalone`). (The in-process ``ChatModel`` over it is
:class:`~..inference.policy.PolicyChatModel`.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from reinforge.plugin import ModelConfig, RecordingChatModel

from ..inference.engine import Engine, MicroBatcher
from ..inference.policy import ChatTemplate, PolicyChatModel
from ..model import packing
from ..model.compute import on_compute_thread
from ..model.memory import KEEP_FREE, configure_malloc
from ..model.modeling import DEFAULT_MODEL, load_policy, resolve_device, resolve_dtype
from ..model.weights import attach_lora
from .endpoint import PolicyEndpoint

__all__ = ["PolicyRuntime"]


class PolicyRuntime:
    """Model, tokenizer, engine, batcher and endpoint: everything that generates a run's rollouts."""

    def __init__(
        self,
        mc: ModelConfig,
        *,
        max_batch: int,
        window_s: float,
        lora: bool,
        fast_decode: bool = True,
        kv_cache_mb: float = 1024,
        prepacked_weights: bool = True,
        device: str = "auto",
        keep_free_mb: float = KEEP_FREE / 2**20,
        matmul_dtype: str = "float32",
    ) -> None:
        self.config = mc
        configure_malloc(int(keep_free_mb * 2**20))  # one arena; freed memory kept for reuse up to keep_free_mb
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(mc.dtype, self.device)
        self.peft = lora and not mc.full_finetune
        self.name = mc.model_path or DEFAULT_MODEL
        # loaded, wrapped and packed on the thread that will decode and train with it (.compute)
        model, tokenizer, self.folder, packer = on_compute_thread(self._load, mc, lora, prepacked_weights, matmul_dtype)
        self.model = model
        self.tokenizer = tokenizer
        # what the packed matmuls run in ("auto" resolved); without packed weights, the model's dtype
        self.matmul_dtype = "bfloat16" if packer is not None and packer.compute_dtype == torch.bfloat16 else "float32"
        self.engine = Engine(
            model,
            tokenizer,
            max_model_len=mc.max_model_len,
            max_batch=max_batch,
            fast=fast_decode,
            kv_cache_mb=kv_cache_mb,
            packer=packer,
        )
        self.batcher = MicroBatcher(self.engine, window_s=window_s)
        self.template = ChatTemplate(tokenizer, mc.max_model_len)
        self.endpoint = PolicyEndpoint(self.name).start()

    def _load(
        self, mc: ModelConfig, lora: bool, prepacked_weights: bool, matmul_dtype: str
    ) -> tuple[Any, Any, Path, Any]:
        model, tokenizer, folder = load_policy(mc.model_path, dtype=self.dtype, device=str(self.device))
        if self.peft:
            model = attach_lora(model, mc)
        elif lora:
            model.requires_grad_(True)
        # oneDNN packing is a CPU layout; on a GPU every layer stays on F.linear
        on_cpu = self.device.type == "cpu"
        packer = None
        if prepacked_weights and on_cpu and packing.available():
            low = packing.resolve_matmul_dtype(matmul_dtype) == "bfloat16"  # "auto": bf16 where it is native
            packer = packing.Packer(torch.bfloat16 if low else None)
        if packer is not None:
            packing.install(model, packer)  # frozen layers train on the packed weights too
        return model, tokenizer, folder, packer

    def provider(self, seed_key: tuple, version: int, sampling: dict[str, Any]) -> Callable[[Any], RecordingChatModel]:
        """A model provider for the runner: each trajectory gets its own recorded policy model."""

        def make(t: Any) -> RecordingChatModel:
            model = PolicyChatModel(
                self.batcher,
                self.template,
                seed_key=(*seed_key, t.task_index, t.rollout_index, t.attempts),
                order_key=(t.task_index, t.rollout_index),
                version=version,
                model_name=self.name,
                defaults=sampling,
                on_release=lambda m: self.endpoint.close_route(m.base_url),
            )
            model.base_url = self.endpoint.open_route(model, t)
            return RecordingChatModel(model, t, sampling)

        return make

    def close(self) -> None:
        self.endpoint.stop()
