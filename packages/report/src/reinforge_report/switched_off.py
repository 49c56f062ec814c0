"""Quantities a run switched off: their panels say so instead of drawing a flat line at zero.

A run without a KL term (``kl_coef: 0``) logs ``kl`` as 0 at every step, and one
with a single PPO epoch logs ``clip_frac`` as 0 (the policy has not moved when its
ratio is taken, so nothing is clipped). A flat zero reads like a measurement; these
notes say what it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reinforge.plugin import metric_names as mn

__all__ = ["off_note"]

# metric -> (the algorithm key that switches it on, its value when off, why that value turns it off)
_SWITCHES: dict[str, tuple[str, float, str]] = {
    mn.KL: ("kl_coef", 0, "no KL term in the loss"),
    mn.CLIP_FRAC: ("ppo_epochs", 1, "one update per batch: the ratio stays 1, nothing to clip"),
}


def off_note(key: str, values: list[float], config: Mapping[str, Any] | None) -> str | None:
    """``"off: kl_coef is 0 (...)"`` when ``key`` is switched off in this run, else None (draw it).

    Off means every logged value is exactly 0 and the run's ``algorithm`` section
    (the run folder's ``config.json``) does not switch the quantity on: its key
    has the "off" value, or is not set. Any non-zero value, or a key set to turn
    the quantity on, and the panel is drawn as usual.
    """
    switch = _SWITCHES.get(key)
    if switch is None or not values or any(v != 0 for v in values):
        return None
    name, off_value, why = switch
    algorithm = (config or {}).get("algorithm")
    value = algorithm.get(name) if isinstance(algorithm, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"off: 0 at every step and {name} is not set ({why})"
    if value == off_value:
        return f"off: {name} is {value:g} ({why})"
    return None
