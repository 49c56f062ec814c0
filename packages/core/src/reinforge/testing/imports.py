"""Checks that a package has no runtime import cycle, for reinforge and its plugins' test suites.

A cycle closed by a function-local import works until someone moves that
import to the top of the file, or a module is imported on its own first; both
checks here catch it before then:

- :func:`import_cycles` reads every module of a package with :mod:`ast` and
  builds its import graph (top-level and function-local imports, relative ones
  resolved; imports under ``if TYPE_CHECKING:`` are not run and are left out),
  then reports each cycle.
- :func:`import_each_alone` imports every module in a fresh interpreter, so a
  module that only imports when another one was imported first is found.

Use them in a package's tests (this is core's ``tests/test_import_cycles.py``)::

    from pathlib import Path

    import reinforge_backend_local
    from reinforge.testing.imports import import_cycles, import_each_alone

    def test_no_import_cycle():
        assert import_cycles(Path(reinforge_backend_local.__file__).parent) == []

    def test_every_module_imports_alone():
        assert import_each_alone("reinforge_backend_local") == {}

Neither imports pytest; both are plain functions returning what they found.
Imports made through :func:`importlib.import_module` (lazy export tables such as
``reinforge.plugin``'s, which run on first attribute access) are not edges of the graph.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

__all__ = ["import_cycles", "import_each_alone", "import_graph", "modules_of"]


def modules_of(package_dir: str | os.PathLike[str], package_name: str | None = None) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file under ``package_dir`` (the package's own folder).

    ``package_name`` defaults to the folder's name (``.../src/reinforge`` is ``reinforge``).
    """
    root = Path(package_dir)
    name = package_name or root.name
    found: dict[str, Path] = {}
    for file in sorted(root.rglob("*.py")):
        parts = file.relative_to(root).with_suffix("").parts
        if any(not p.isidentifier() for p in parts):
            continue  # not importable by name (a data or template folder)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((name, *parts))] = file
    return found


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``: a block that never runs."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _runtime_imports(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: at any depth (functions too), but not under ``if TYPE_CHECKING``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The package's own modules that ``node`` (in ``module``) imports."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in known}
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
        source = ".".join([*base, node.module] if node.module else base)
    else:
        source = node.module or ""
    out = set()
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        if sub in known:  # ``from . import config``: the submodule
            out.add(sub)
        elif source in known:
            out.add(source)
    return out


def import_graph(package_dir: str | os.PathLike[str], package_name: str | None = None) -> dict[str, set[str]]:
    """``{module: modules of the same package it imports}`` (runtime imports only, see the module docstring).

    The implicit import of a module's parent packages is not an edge: it runs
    before the module, never in the middle of it.
    """
    files = modules_of(package_dir, package_name)
    known = set(files)
    graph: dict[str, set[str]] = {}
    for module, file in files.items():
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
        is_package = file.name == "__init__.py"
        edges: set[str] = set()
        for node in _runtime_imports(tree):
            edges |= _targets(node, module, is_package, known)
        edges.discard(module)
        graph[module] = edges
    return graph


def import_cycles(package_dir: str | os.PathLike[str], package_name: str | None = None) -> list[list[str]]:
    """One cycle per strongly connected group of modules, as ``[a, b, ..., a]``; ``[]`` when there is none.

    Each cycle is a shortest one through the group's first module (by name), so
    the same tree always gives the same answer; fixing it may reveal another one
    in the same group.
    """
    graph = import_graph(package_dir, package_name)
    cycles = []
    for group in _strongly_connected(graph):
        if len(group) > 1:
            start = min(group)
            cycles.append(_shortest_cycle(graph, start, set(group)))
    return sorted(cycles)


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative (a deep package would overflow the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                groups.append(sorted(group))
    return groups


def _shortest_cycle(graph: dict[str, set[str]], start: str, group: set[str]) -> list[str]:
    """Breadth-first from ``start`` back to itself, inside ``group``."""
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in sorted(graph[node] & group):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if child not in parents:
                    parents[child] = node
                    nxt.append(child)
        frontier = nxt
    return [start]  # unreachable for a strongly connected group


def import_each_alone(
    package_name: str,
    *,
    skip: Iterable[str] = (),
    python: str = sys.executable,
    timeout: float = 120.0,
    jobs: int | None = None,
) -> dict[str, str]:
    """Import every module of ``package_name`` in its own fresh interpreter; ``{module: error}`` for each failure.

    ``__main__`` modules are skipped (importing one runs the program), and so are
    the dotted names in ``skip`` (modules that need an extra the environment
    lacks). The error is the last line of the child's stderr (the exception).
    The children inherit this process's environment, ``PYTHONPATH`` included;
    ``jobs`` of them run at a time (default: the CPU count), which matters for a
    package whose modules each import torch.
    """
    import importlib.util
    from concurrent.futures import ThreadPoolExecutor

    spec = importlib.util.find_spec(package_name)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{package_name!r} is not an importable package")
    package_dir = next(iter(spec.submodule_search_locations))
    skipped = set(skip)
    modules = [
        m for m in modules_of(package_dir, package_name) if m not in skipped and m.rsplit(".", 1)[-1] != "__main__"
    ]

    def attempt(module: str) -> str | None:
        done = subprocess.run(
            [python, "-c", f"import {module}"], capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode == 0:
            return None
        lines = done.stderr.strip().splitlines()
        return lines[-1] if lines else f"exit status {done.returncode}"

    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        results = list(pool.map(attempt, modules))
    return {m: error for m, error in zip(modules, results) if error is not None}
