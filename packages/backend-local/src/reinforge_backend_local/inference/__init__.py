"""Generating tokens.

The hand-written decoder for Llama-family models (``decoder``), sampling with one uniform per row
and step (``sampling``), the batched engine and the micro-batcher a run's rollouts go through
(``engine``), continuous batching for the server (``scheduler``), and the chat template with the
in-process ``ChatModel`` that records tokens and logprobs (``policy``).
"""
