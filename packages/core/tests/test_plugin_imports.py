"""Plugins import core through its public API only: ``reinforge.plugin`` and the contracts in ``reinforge``.

Scans the sources of every plugin package of this repository, so a new import of a core internal
(``reinforge.errors``, ``reinforge.config``, ...) fails here with the file and line.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGES = Path(__file__).resolve().parents[2]
INTERNAL = re.compile(r"^\s*(?:from reinforge\.(?!plugin\b)([a-z_.]+) import|import reinforge\.(?!plugin\b)([a-z_.]+))")
# Any import of the stdlib test server: ``from reinforge.testing.openai_server import``,
# ``from .openai_server import``, ``from reinforge.testing import openai_server``, ``import ...openai_server``.
TEST_SERVER = re.compile(
    r"^\s*(?:from\s+\S*openai_server\s+import|from\s+\S+\s+import\s+.*\bopenai_server\b|import\s+\S*openai_server\b)"
)
# Where the test double may be imported from: the testing kit, and the deprecated alias itself.
TEST_SERVER_HOMES = ("core/src/reinforge/testing/", "core/src/reinforge/openai_server.py")


def test_plugin_sources_import_no_core_internals() -> None:
    sources = [p for p in PACKAGES.glob("*/src/**/*.py") if p.relative_to(PACKAGES).parts[0] != "core"]
    assert sources, f"no plugin sources found under {PACKAGES}"
    found = []
    for path in sources:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            match = INTERNAL.match(line)
            if match:
                found.append(f"{path.relative_to(PACKAGES)}:{number}: {line.strip()}")
    assert not found, "plugins must import core from reinforge.plugin:\n" + "\n".join(found)


def test_no_production_source_imports_the_stdlib_test_server() -> None:
    """Production HTTP runs on starlette + uvicorn; core's ``OpenAIServer`` is a test double."""
    sources = sorted(PACKAGES.glob("*/src/**/*.py"))
    assert sources, f"no sources found under {PACKAGES}"
    found = []
    for path in sources:
        name = path.relative_to(PACKAGES).as_posix()
        if name.startswith(TEST_SERVER_HOMES):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if TEST_SERVER.match(line):
                found.append(f"{name}:{number}: {line.strip()}")
    assert not found, "only reinforge.testing may import the stdlib OpenAIServer:\n" + "\n".join(found)


def test_the_test_server_patterns_match_every_import_form() -> None:
    for line in (
        "from reinforge.openai_server import OpenAIServer",
        "from reinforge.testing.openai_server import Reply",
        "    from .openai_server import OpenAIServer, Responder",
        "from reinforge.testing import openai_server",
        "from reinforge import hookimpl, openai_server",
        "import reinforge.openai_server",
    ):
        assert TEST_SERVER.match(line), line
    for line in ("from reinforge.testing.plugin import openai_server_fixture", "openai_server = 1"):
        assert not TEST_SERVER.match(line), line


def test_the_old_module_name_still_imports_with_a_deprecation_warning() -> None:
    import importlib
    import sys

    import pytest

    from reinforge.testing import openai_server

    sys.modules.pop("reinforge.openai_server", None)
    with pytest.warns(DeprecationWarning, match=r"reinforge\.testing\.openai_server"):
        alias = importlib.import_module("reinforge.openai_server")
    assert (alias.OpenAIServer, alias.Reply) == (openai_server.OpenAIServer, openai_server.Reply)
