"""The package's layout holds: subpackages by stage, each importing only from the stages below it, no import cycle.

Read from the sources with ``ast`` (function-local imports included, imports for type checking only
left out), so a lazy import inside a function cannot close a cycle unnoticed.
"""

import ast
from pathlib import Path

import reinforge_backend_local

PACKAGE = "reinforge_backend_local"
ROOT = Path(reinforge_backend_local.__file__).parent
# lowest first: a module may import from its own stage and the stages before it (the README's "Layout")
STAGES = ["model", "inference", "serve", "rollouts", "training", "online", ""]  # "": plugin, backend, settings


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = [PACKAGE, *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking_only(tree: ast.Module) -> set[int]:
    """Line numbers of imports under ``if TYPE_CHECKING:``."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                for sub in ast.walk(inner):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)):
                        lines.add(sub.lineno)
    return lines


def _imports(name: str, source: str, package: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module ``name`` (in ``package``) imports at run time, anywhere in ``source``.

    Packages' ``__init__`` modules are left out: they hold a docstring (the root: ``__version__``).
    """
    tree = ast.parse(source)
    skip = _type_checking_only(tree)
    found = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - (node.level - 1)]
                origin = ".".join([*base, node.module] if node.module else base)
            else:
                origin = node.module or ""
            targets = [origin] + [f"{origin}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules and modules[t].name != "__init__.py" and t != name}
    return found


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else ""


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        graph[name] = _imports(name, path.read_text(encoding="utf-8"), package, modules)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, str] = {}
    cycles: list[str] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return cycles


def test_every_module_belongs_to_a_stage():
    for module in _modules():
        assert _stage(module) in STAGES, f"{module}: not in a stage of tests/test_package_layers.py STAGES"


def test_each_stage_imports_only_from_itself_and_the_stages_below():
    wrong = [
        f"{module} imports {target}"
        for module, targets in _graph().items()
        for target in sorted(targets)
        if STAGES.index(_stage(target)) > STAGES.index(_stage(module))
    ]
    assert wrong == []


def test_no_import_cycle_among_the_modules():
    assert _cycles(_graph()) == []


def test_a_function_local_import_that_closes_a_cycle_is_found():
    """0.5's ``algorithms.resolve()`` built a ``LocalBackend`` inside a function: that cycle is caught."""
    graph, modules = _graph(), _modules()
    algorithms = f"{PACKAGE}.training.algorithms"
    lazy = "def resolve(algo):\n    from ..backend import LocalBackend\n\n    return LocalBackend()\n"
    graph[algorithms] = graph[algorithms] | _imports(algorithms, lazy, f"{PACKAGE}.training", modules)
    assert _cycles(graph) == [f"{PACKAGE}.backend -> {algorithms} -> {PACKAGE}.backend"]
    typed = "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ..backend import LocalBackend\n"
    assert _imports(algorithms, typed, f"{PACKAGE}.training", modules) == set()  # types only: no cycle
