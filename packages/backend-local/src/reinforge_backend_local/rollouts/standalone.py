"""The base policy as a ``ChatModel`` for ``reinforge eval``: no training, calls batched by time window."""

from __future__ import annotations

import random
from typing import Any

from reinforge import ChatResponse
from reinforge.plugin import ModelConfig

from ..inference.policy import sampling_request, to_response
from .runtime import PolicyRuntime

__all__ = ["StandaloneModel", "standalone_model"]


class StandaloneModel:
    """A ``ChatModel`` over the base policy for ``reinforge eval`` (no training)."""

    def __init__(self, policy: PolicyRuntime) -> None:
        self.policy = policy
        self.policy.batcher.active = 1 << 30  # unknown callers: batch by time window
        self.model_name = policy.name
        self.base_url = None

    async def chat(self, messages: list[dict[str, Any]], tools: Any = None, **sampling: Any) -> ChatResponse:
        prompt_ids = self.policy.template.prompt_ids(messages, tools)
        key = (random.getrandbits(62),)
        request = sampling_request(prompt_ids, sampling, self.policy.config.sampling(), key, key)
        result = await self.policy.batcher.submit(request)
        return to_response(result, prompt_ids, 0, self.model_name)


def standalone_model(model_cfg: ModelConfig) -> StandaloneModel:
    return StandaloneModel(PolicyRuntime(model_cfg, max_batch=64, window_s=0.05, lora=False))
