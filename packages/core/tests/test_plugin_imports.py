"""No production source imports core's stdlib test server (``reinforge.testing.openai_server``).

The plugin boundary itself (``reinforge``, ``reinforge.plugin``, ``reinforge.testing`` only) is ruff's
banned-api rule, TID251 in the root pyproject.toml (see test_public_boundary.py). This rule is narrower
than one banned-api list can say: the test double is fine in every package's tests and in the testing
kit, but not in any package's ``src``, core's included.
"""

from __future__ import annotations

import re
from pathlib import Path

PACKAGES = Path(__file__).resolve().parents[2]
# Any import of the stdlib test server: ``from reinforge.testing.openai_server import``,
# ``from .openai_server import``, ``from reinforge.testing import openai_server``, ``import ...openai_server``.
TEST_SERVER = re.compile(
    r"^\s*(?:from\s+\S*openai_server\s+import|from\s+\S+\s+import\s+.*\bopenai_server\b|import\s+\S*openai_server\b)"
)
# Where the test double may be imported from: the testing kit, and the deprecated alias itself.
TEST_SERVER_HOMES = ("core/src/reinforge/testing/", "core/src/reinforge/openai_server.py")


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
