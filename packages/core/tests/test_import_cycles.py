"""No runtime import cycle inside core, and every module imports on its own (issue 31).

``config`` -> ``components`` -> ``rewards`` -> ``config`` used to be closed by a
function-local import; the graph check counts those, so it fails on that tree.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import reinforge
from reinforge.testing.imports import import_cycles, import_each_alone, import_graph

CORE = Path(reinforge.__file__).parent


def test_core_has_no_import_cycle() -> None:
    assert import_cycles(CORE) == []


def test_every_core_module_imports_alone_in_a_fresh_interpreter() -> None:
    # the agentscope adapter needs the agentscope extra, tested in its own nox session
    assert import_each_alone("reinforge", skip={"reinforge.agentscope_model"}) == {}


def test_config_imports_no_component_machinery() -> None:
    graph = import_graph(CORE)
    leaves = {"reinforge.errors", "reinforge.settings"}
    # DatasetConfig.load()/rows()/preview() import the reader on use; the reader is a leaf too
    assert graph["reinforge.config"] <= leaves | {"reinforge.dataset_io"}
    assert graph["reinforge.dataset_io"] <= leaves


def _package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pkg"
    for name, text in files.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return pkg


def test_a_cycle_closed_by_a_function_local_relative_import_is_found(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from .b import x\n",
            "b.py": "x = 1\ndef f():\n    from . import c\n",
            "sub/__init__.py": "",
            "c.py": "from pkg.sub import d\n",
            "sub/d.py": "def g():\n    from ..a import x\n",
        },
    )
    assert import_cycles(pkg) == [["pkg.a", "pkg.b", "pkg.c", "pkg.sub.d", "pkg.a"]]


def test_type_checking_imports_are_not_edges(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from typing import TYPE_CHECKING\nfrom . import b\n",
            "b.py": "import typing\nif typing.TYPE_CHECKING:\n    from .a import A\nelse:\n    import json\n",
        },
    )
    assert import_graph(pkg) == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": set()}
    assert import_cycles(pkg) == []


def test_a_module_that_fails_when_imported_first_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from . import b\nVALUE = 1\n",
            "b.py": "from .a import VALUE\n",  # works when b is imported first; a alone fails half-way
        },
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.syspath_prepend(str(tmp_path))
    failures = import_each_alone("pkg")
    assert list(failures) == ["pkg.a"] and "ImportError" in failures["pkg.a"]
