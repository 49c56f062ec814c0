"""The package's layout holds: subpackages by stage, each importing only from the stages below it, no import cycle.

The import graph is core's (``reinforge.testing.imports``: read with ``ast``, function-local imports
included, imports for type checking only left out), so a lazy import inside a function cannot close a
cycle unnoticed.
"""

from pathlib import Path

import reinforge_backend_local
from reinforge.testing.imports import import_cycles, import_each_alone, import_graph, modules_of

PACKAGE = "reinforge_backend_local"
ROOT = Path(reinforge_backend_local.__file__).parent
# lowest first: a module may import from its own stage and the stages before it (the README's "Layout")
STAGES = ["model", "inference", "serve", "rollouts", "training", "online", ""]  # "": plugin, backend, settings


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else ""


def _packages() -> set[str]:
    """The subpackages themselves (their ``__init__`` holds a docstring): no stage of their own."""
    return {name for name, path in modules_of(ROOT, PACKAGE).items() if path.name == "__init__.py"}


def test_every_module_belongs_to_a_stage():
    for module in modules_of(ROOT, PACKAGE):
        assert _stage(module) in STAGES, f"{module}: not in a stage of tests/test_package_layers.py STAGES"


def test_each_stage_imports_only_from_itself_and_the_stages_below():
    packages = _packages()
    wrong = [
        f"{module} imports {target}"
        for module, targets in import_graph(ROOT, PACKAGE).items()
        for target in sorted(targets - packages)
        if STAGES.index(_stage(target)) > STAGES.index(_stage(module))
    ]
    assert wrong == []


def test_no_import_cycle_among_the_modules():
    assert import_cycles(ROOT, PACKAGE) == []


def test_a_function_local_import_that_closes_a_cycle_is_found(tmp_path):
    """0.5's ``algorithms.resolve()`` built a ``LocalBackend`` inside a function: that cycle is caught."""
    package = tmp_path / "pkg"
    (package / "training").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "training" / "__init__.py").write_text("")
    (package / "backend.py").write_text("from .training.algorithms import ALGORITHMS\n")
    lazy = (
        "ALGORITHMS = {}\n\n\ndef resolve(algo):\n    from ..backend import LocalBackend\n\n    return LocalBackend()\n"
    )
    (package / "training" / "algorithms.py").write_text(lazy)
    assert import_cycles(package, "pkg") == [["pkg.backend", "pkg.training.algorithms", "pkg.backend"]]
    typed = "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ..backend import LocalBackend\n"
    (package / "training" / "algorithms.py").write_text("ALGORITHMS = {}\n" + typed)
    assert import_cycles(package, "pkg") == []  # types only: no cycle


def test_every_module_imports_alone_in_a_fresh_interpreter():
    assert import_each_alone(PACKAGE, jobs=2) == {}
