"""Core's public boundary is ruff's banned-api rule (TID251), configured in the root pyproject.toml.

Plugins import core from ``reinforge`` (the contracts), ``reinforge.plugin`` and ``reinforge.testing``;
every other core module is listed as banned for plugin sources, plugin tests and templates/plugin
(``nox -s lint`` runs it). These tests check the list is complete, that the rule catches every import
form of an internal with file and line, and that the tree passes it.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PYPROJECT = ROOT / "pyproject.toml"
CORE = ROOT / "packages" / "core" / "src" / "reinforge"
PUBLIC = {"plugin", "testing"}  # and the package itself: `from reinforge import ChatModel, hookimpl`


def banned_modules() -> set[str]:
    """The modules named in ``[tool.ruff.lint.flake8-tidy-imports.banned-api]``."""
    text = PYPROJECT.read_text(encoding="utf-8")
    section = text.split("[tool.ruff.lint.flake8-tidy-imports.banned-api]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r'^"reinforge\.([a-z_]+)"\.msg', section, flags=re.MULTILINE))


def ruff() -> list[str]:
    if importlib.util.find_spec("ruff") is not None:
        return [sys.executable, "-m", "ruff"]
    found = shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed here (the root `test` dependency group installs it)")
    return [found]


def ruff_check(*paths: Path) -> subprocess.CompletedProcess[str]:
    args = ["check", "--no-cache", "--config", str(PYPROJECT), "--select", "TID251", "--output-format", "concise"]
    return subprocess.run([*ruff(), *args, *map(str, paths)], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_every_core_module_is_public_or_banned_for_plugins() -> None:
    modules = {
        p.stem if p.is_file() else p.name for p in CORE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    modules.discard("__init__")
    assert modules >= PUBLIC, f"{CORE}: the public modules {sorted(PUBLIC - modules)} are gone"
    unlisted = sorted(modules - PUBLIC - banned_modules())
    assert not unlisted, (
        f"core modules neither public nor banned for plugins: {unlisted}; add each to "
        f"[tool.ruff.lint.flake8-tidy-imports.banned-api] in {PYPROJECT.name} (or export what plugins need "
        "through reinforge.plugin)"
    )
    assert not banned_modules() & PUBLIC


def test_ruff_names_file_and_line_of_every_import_form_of_a_core_internal(tmp_path: Path) -> None:
    plugin = tmp_path / "src" / "reinforge_example" / "plugin.py"
    plugin.parent.mkdir(parents=True)
    plugin.write_text(
        "from reinforge import ChatModel, hookimpl, metric_names\n"  # line 1: a module through the package
        "from reinforge.config import RunConfig\n"  # line 2
        "import reinforge.errors\n"  # line 3
        "from reinforge.judges.rules import last_number\n"  # line 4: a submodule of a banned package
        "from reinforge.plugin import ConfigError, metric_names as mn\n"  # line 5: public
        "from reinforge.testing import runner_for\n"  # line 6: public
    )
    proc = ruff_check(plugin)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    found = sorted(re.findall(r"plugin\.py:(\d+):\d+: TID251 `(reinforge\.[a-z_.]+)` is banned", proc.stdout))
    assert found == [
        ("1", "reinforge.metric_names"),
        ("2", "reinforge.config"),
        ("3", "reinforge.errors"),
        ("4", "reinforge.judges"),
    ], proc.stdout


def test_every_plugin_package_the_template_and_the_examples_pass_the_boundary() -> None:
    proc = ruff_check(ROOT / "packages", ROOT / "templates" / "plugin", ROOT / "examples")
    assert proc.returncode == 0, "plugins must import core through its public API:\n" + proc.stdout + proc.stderr
