"""WORKAROUND for trinity-rft 0.6.0's ``external`` engine: the named Ray actor it looks up but never creates.

With ``explorer.rollout_model.engine_type: external`` Trinity's allocator builds no model actor, yet every
``WorkflowRunner`` still calls ``Allocator.get_model`` -> ``ray.get_actor(...)`` and fails with "Failed to look
up actor with name 'explorer_rollout_model_0_0'". This actor takes that name and answers the two calls the model
wrapper makes of it: the policy version (always 0: Trinity does not update an external model) and the
OpenAI-compatible server's root URL (the wrapper appends ``/v1``). It is used for the external engine only;
a vLLM, SGLang or Tinker engine creates its own actors.
"""

from __future__ import annotations

from typing import Any

__all__ = ["external_actor_name", "start_external_model_actor"]


def external_actor_name(config: Any) -> tuple[str, str]:
    """The (name, namespace) Trinity's runners look the rollout model up under (engine 0)."""
    from trinity.common.models.allocator import Allocator

    return Allocator(config.explorer).get_actor_name("rollout", 0, 0), config.explorer.rollout_model.ray_namespace


def start_external_model_actor(config: Any, url: str) -> Any:
    """Create the stand-in model actor for ``url`` (the server's root) on the connected Ray cluster; return it.

    The caller kills it when the stage ends (``ray.kill``). Needs ``ray.init`` first.
    """
    import ray

    class ExternalModel:
        """Answers what Trinity's ModelWrapper asks of a model actor, for a server Trinity does not run."""

        def __init__(self, url: str) -> None:
            self.url = url

        def get_model_version(self) -> int:
            return 0

        def get_api_server_url(self) -> str:
            return self.url

    remote: Any = ray.remote(num_cpus=0)(ExternalModel)  # takes no CPU: it only answers two questions
    name, namespace = external_actor_name(config)
    actor = remote.options(name=name, namespace=namespace).remote(url)
    ray.get(actor.get_api_server_url.remote())  # it is up before the runners look it up
    return actor
