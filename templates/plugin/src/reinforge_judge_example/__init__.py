"""An example reinforge judge plugin: rewards responses that contain a keyword."""

from .__about__ import __version__
from .plugin import PoliteJudge, keyword_judge

__all__ = ["PoliteJudge", "__version__", "keyword_judge"]
