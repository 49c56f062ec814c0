"""Where training stands (a checkpoint's ``state.json``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["TrainState"]


@dataclass
class TrainState:
    """Where training stands: the last finished step and the position in the shuffled data.

    Saved as a checkpoint's ``state.json``; 0.2's files have the same keys and load as they are.
    """

    step: int = 0
    epoch: int = 0  # passes over the train rows begun
    offset: int = 0  # rows of this epoch's order already used

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainState:
        return cls(**{f.name: int(data.get(f.name, 0)) for f in fields(cls)})
