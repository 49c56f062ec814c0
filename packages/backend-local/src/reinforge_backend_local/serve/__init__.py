"""``reinforge serve``: the policy as an OpenAI-compatible server on starlette + uvicorn.

:mod:`.model` loads a model, run or checkpoint; :mod:`.protocol` parses and
validates requests and shapes responses; :mod:`.app` holds the routes;
:mod:`.auth` the API key; :mod:`.metrics` the Prometheus metrics;
:mod:`.command` the command line.
"""
