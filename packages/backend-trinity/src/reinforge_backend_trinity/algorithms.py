"""Algorithms of the ``trinity`` backend: reinforge's names mapped onto Trinity-RFT's, Trinity's passed through.

``algorithm_type`` may be one of reinforge's names (``grpo``, ``ppo``, ``rloo``, ``reinforce_pp``, ...;
:data:`TO_TRINITY` says which Trinity algorithm each becomes) or any name of Trinity's algorithm
registry (``dapo``, ``opmd``, ``cispo``, ... or a dotted path to an ``AlgorithmType`` of your own).
With Trinity installed, a name is checked against its registry when the run is checked; without it,
a name outside :data:`TRINITY_ALGORITHMS` passes and is checked when Trinity is there.

The keys under ``algorithm:`` besides core's fields are Trinity's own algorithm keys
(:class:`TrinityAlgorithmSettings`), written into the config's ``algorithm:`` section as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reinforge.plugin import FieldError, Settings, one_of

from .extra import require_trinity, trinity_installed

__all__ = [
    "ALIASES",
    "TO_TRINITY",
    "TRINITY_ALGORITHMS",
    "TrinityAlgorithmSettings",
    "registry_names",
    "trinity_name",
    "unknown_algorithm",
]

# reinforge's algorithm names (as backend-local spells them) -> Trinity-RFT 0.6.0's.
# Trinity's `ppo` trains a critic (backend-local's ppo is critic-free PPO-clip on GRPO advantages).
TO_TRINITY = {
    "grpo": "grpo",
    "ppo": "ppo",
    "rloo": "rloo",
    "reinforce_pp": "reinforceplusplus",
    "multi_step_grpo": "multi_step_grpo",
    "gspo": "gspo",
}
ALIASES = {"reinforce++": "reinforce_pp", "reinforce_plus_plus": "reinforce_pp"}

# Trinity-RFT 0.6.0's registry (trinity.algorithm.ALGORITHM_TYPE); a test holds this list to the real one.
TRINITY_ALGORITHMS = (
    "asymre",
    "cispo",
    "cpt",
    "dapo",
    "dpo",
    "gigpo",
    "grpo",
    "grpo_verl",
    "gspo",
    "jsd",
    "mix",
    "mix_chord",
    "multi_step_grpo",
    "on_policy_distill",
    "opmd",
    "ppo",
    "raft",
    "rec",
    "reinforceplusplus",
    "rloo",
    "sapo",
    "sft",
    "sppo",
    "topr",
)

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclass
class TrinityAlgorithmSettings(Settings):
    """Trinity's own ``algorithm:`` keys (names as in Trinity's AlgorithmConfig); unset ones keep its defaults."""

    advantage_fn: str | None = None
    advantage_fn_args: dict[str, Any] | None = None
    policy_loss_fn: str | None = None
    policy_loss_fn_args: dict[str, Any] | None = None
    kl_loss_fn: str | None = None  # "none" disables the KL loss
    kl_loss_fn_args: dict[str, Any] | None = None
    kl_penalty_fn: str | None = None
    kl_penalty_fn_args: dict[str, Any] | None = None
    entropy_loss_fn: str | None = None
    entropy_loss_fn_args: dict[str, Any] | None = None
    sample_strategy: str | None = None
    sample_strategy_args: dict[str, Any] | None = None
    loss_agg_mode: str | None = None
    # optimizer keys besides lr (core's learning_rate): lr_warmup_steps, weight_decay, clip_grad, ...
    optimizer: dict[str, Any] | None = None

    def check(self) -> None:
        if self.loss_agg_mode is not None:
            one_of("loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        if self.optimizer is not None and "lr" in self.optimizer:
            raise FieldError("optimizer.lr", "set algorithm.learning_rate instead")

    def trinity_keys(self) -> dict[str, Any]:
        """The keys that are set, as Trinity's ``algorithm:`` section spells them."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_") and v is not None}


def trinity_name(name: str) -> str:
    """The Trinity algorithm for a (canonical) ``algorithm_type``: reinforge's mapped, Trinity's as is."""
    return TO_TRINITY.get(name, name)


def registry_names() -> list[str]:
    """The names in the installed Trinity's algorithm registry (requires the ``trinity`` extra)."""
    module = require_trinity("trinity.algorithm")
    registry = module.ALGORITHM_TYPE
    return sorted({*registry._default_mapping, *registry.modules})


def unknown_algorithm(name: str) -> list[str] | None:
    """Trinity's algorithm names when the installed Trinity has none called ``name``; None when it has one.

    Without Trinity installed, nothing can be checked: None.
    """
    if name in TO_TRINITY or not trinity_installed():
        return None
    known = registry_names()
    if trinity_name(name) in known:
        return None
    if "." in name:  # a dotted path to an AlgorithmType of the user's: Trinity's registry imports it
        registry = require_trinity("trinity.algorithm").ALGORITHM_TYPE
        try:
            if registry.get(name) is not None:
                return None
        except ImportError:
            pass
    return known
