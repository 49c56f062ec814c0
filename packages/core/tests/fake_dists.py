"""A tiny installed distribution on ``sys.path`` for tests of plugin loading: a module and its ``.dist-info``."""

from __future__ import annotations

import textwrap
from pathlib import Path


def make_dist(root: Path, dist: str, module_source: str, ep_name: str | None = None, *, with_ep: bool = True) -> None:
    """Write ``<module>.py`` and ``<module>-0.1.dist-info`` (with a ``reinforge`` entry point unless ``with_ep`` is false)."""
    module = dist.replace("-", "_")
    (root / f"{module}.py").write_text(textwrap.dedent(module_source))
    info = root / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    if with_ep:
        (info / "entry_points.txt").write_text(f"[reinforge]\n{ep_name or dist} = {module}\n")
