"""A run's policy generating rollouts.

:class:`~.runtime.PolicyRuntime` (model, tokenizer, engine, micro-batcher and endpoint), its
OpenAI-compatible endpoint with one base URL per rollout (``endpoint``), and the base policy as a
``ChatModel`` for ``reinforge eval`` (``standalone``).
"""
