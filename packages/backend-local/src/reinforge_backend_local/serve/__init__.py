"""The trained policy outside a run: ``reinforge serve`` (an OpenAI-compatible server) and ``reinforge export``.

:mod:`.model` loads a model, run or checkpoint; :mod:`.protocol` parses and
validates requests and shapes responses; :mod:`.app` holds the routes;
:mod:`.auth` the API key; :mod:`.metrics` the Prometheus metrics;
:mod:`.command` the command line; :mod:`.export` writes a run's policy as a
Hugging Face folder or a PEFT adapter.
"""
