"""Acceptance test of templates/plugin: a third-party judge package, end to end.

The template is copied, built into a wheel by hatchling (the backend ``hatch
build`` uses), installed by pip into a private folder and used from fresh
``python -m reinforge`` processes that see it through ``PYTHONPATH``: listed
by ``reinforge plugins``, hidden by ``REINFORGE_LOAD_PLUGINS=""``, refused when
another distribution registers the same judge name, and used by name in a YAML
run evaluated by ``reinforge eval``.

Needs ``hatchling`` and ``pip`` in the test environment (the root pyproject's
``test`` dependency group, which ``nox -s tests`` installs).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from reinforge.testing import build_and_install, plugin_env, run_command, run_process
from reinforge.testing.openai_server import OpenAIServer

REPO = Path(__file__).resolve().parents[3]
TEMPLATE = REPO / "templates" / "plugin"
DIST = "reinforge-judge-example"
DIST2 = "reinforge-judge-example2"
JUDGE = "example_keyword"
TIMEOUT = 120

pytestmark = pytest.mark.slow


def _run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None, check: bool = True):
    return run_process(args, cwd=cwd, env=env, check=check, timeout=TIMEOUT)


def _copy_template(dest: Path, suffix: str = "") -> Path:
    """Copy the template; with a suffix, rename its distribution and import package (not the judge)."""
    shutil.copytree(TEMPLATE, dest, ignore=shutil.ignore_patterns("dist", "__pycache__", "*.pyc", ".*"))
    if suffix:
        old_pkg = dest / "src" / "reinforge_judge_example"
        old_pkg.rename(old_pkg.with_name(f"reinforge_judge_example{suffix}"))
        for path in dest.rglob("*"):
            if path.is_file() and path.suffix in {".py", ".toml", ".md"}:
                text = path.read_text()
                path.write_text(re.sub(r"reinforge([-_])judge([-_])example", lambda m: m.group(0) + suffix, text))
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path]:
    """Both copies of the template built and installed: {'site': ..., 'site2': ..., 'root': ...}."""
    root = tmp_path_factory.mktemp("plugin_template")
    site, site2 = root / "site", root / "site2"
    wheel = build_and_install(_copy_template(root / "plugin"), site)
    assert wheel.name.startswith("reinforge_judge_example-0.1.0-"), wheel.name
    wheel2 = build_and_install(_copy_template(root / "plugin2", suffix="2"), site2)
    assert wheel2.name.startswith("reinforge_judge_example2-0.1.0-"), wheel2.name
    return {"root": root, "site": site, "site2": site2}


def _env(*paths: Path, **extra: str) -> dict[str, str]:
    return plugin_env(*paths, **extra)


def _reinforge(args: list[str], env: dict[str, str], cwd: Path, check: bool = True):
    return run_command(args, cwd=cwd, env=env, check=check, timeout=TIMEOUT)  # python -m reinforge ...


def test_template_wheel_contents(installed):
    site = installed["site"]
    assert (site / "reinforge_judge_example" / "plugin.py").is_file()
    dist_infos = list(site.glob("reinforge_judge_example-0.1.0.dist-info"))
    assert dist_infos, sorted(p.name for p in site.iterdir())
    entry_points = (dist_infos[0] / "entry_points.txt").read_text()
    assert "[reinforge]" in entry_points
    assert "reinforge-judge-example = reinforge_judge_example.plugin" in entry_points


def test_plugins_lists_the_installed_template(installed):
    proc = _reinforge(["plugins"], _env(installed["site"]), cwd=installed["root"])
    assert DIST in proc.stdout
    assert JUDGE in proc.stdout
    assert "0.1.0" in proc.stdout


def test_load_plugins_empty_hides_the_template(installed):
    proc = _reinforge(["plugins"], _env(installed["site"], REINFORGE_LOAD_PLUGINS=""), cwd=installed["root"])
    assert DIST not in proc.stdout
    assert JUDGE not in proc.stdout


def test_load_plugins_list_selects_the_template(installed):
    env = _env(installed["site"], installed["site2"], REINFORGE_LOAD_PLUGINS=DIST)
    proc = _reinforge(["plugins"], env, cwd=installed["root"])
    assert DIST in proc.stdout
    assert DIST2 not in proc.stdout


def test_same_judge_name_from_two_distributions_is_an_error_naming_both(installed):
    env = _env(installed["site"], installed["site2"])
    # the command one uses to diagnose it still works, and shows the collision ...
    listing = _reinforge(["plugins"], env, cwd=installed["root"], check=False)
    assert listing.returncode == 0, f"exit {listing.returncode}\nstdout:\n{listing.stdout}\nstderr:\n{listing.stderr}"
    assert f"conflict: judges {JUDGE!r} also registered by {DIST2}" in listing.stdout, listing.stdout
    # ... and using the name is an error naming both distributions
    args = ["try", "judge", JUDGE, "--input", str(installed["root"] / "judge_input.json")]
    (installed["root"] / "judge_input.json").write_text('{"task": {"question": "q"}, "response": "please"}')
    proc = _reinforge(args, env, cwd=installed["root"], check=False)
    assert proc.returncode == 1, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert re.search(r"reinforge-judge-example(?!2)", proc.stderr), proc.stderr
    assert DIST2 in proc.stderr, proc.stderr
    assert JUDGE in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_templates_own_tests_pass_against_the_installed_wheel(installed):
    plugin = installed["root"] / "plugin"
    # the copy's own pyproject.toml is its config, not whatever pytest config lies above the tmp folder
    args = ["-c", str(plugin / "pyproject.toml"), "--rootdir", str(plugin), "-q", "-p", "no:cacheprovider"]
    proc = _run(
        [sys.executable, "-m", "pytest", *args, str(plugin / "tests")],
        cwd=installed["root"],
        env=_env(installed["site"]),
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 passed" in proc.stdout, proc.stdout


ROWS = [
    "could you please pass the salt",
    "pass the salt",
    "please",
    "thank you",
    "no keyword here",
]


def test_yaml_run_uses_the_judge_by_name(installed, tmp_path):
    (tmp_path / "data.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in ROWS))
    (tmp_path / "wf.py").write_text(
        "from reinforge import WorkflowOutput\n\n\n"
        "async def echo(task, model):\n"
        '    return WorkflowOutput(response=task["text"])\n'
    )
    with OpenAIServer(lambda request: "unused") as server:
        (tmp_path / "run.yaml").write_text(
            "workflow: wf:echo\n"
            "judges:\n"
            f"  - name: {JUDGE}\n"
            '    args: {keyword: "please"}\n'
            "eval_dataset: {path: data.jsonl}\n"
            f'model: {{model_path: scripted, api_base: "{server.base_url}"}}\n'
            "eval: {accuracy_key: reward, threshold: 1.0, split: train}\n"
        )
        env = _env(
            installed["site"],
            OPENAI_API_KEY="sk-test",
            HF_HOME=str(tmp_path / "hf"),
            HF_DATASETS_OFFLINE="1",
            HF_HUB_OFFLINE="1",
        )
        proc = _reinforge(["eval", str(tmp_path / "run.yaml"), "--json"], env, cwd=tmp_path)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert lines, f"no output\nstderr:\n{proc.stderr}"
    result = json.loads(lines[-1])
    assert isinstance(result, dict), lines[-1]
    expected = sum("please" in t for t in ROWS) / len(ROWS)
    assert result["accuracy"] == pytest.approx(expected), result
