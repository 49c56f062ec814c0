"""Acceptance test of core 0.3's backend API, from both sides.

A third-party backend package is written to a temporary folder, built into a
wheel by hatchling, installed by pip into a private folder and used from fresh
``python -m reinforge`` processes that see it through ``PYTHONPATH`` (as core's
test of the plugin template does): its own algorithm and keys pass
``tune --dry-run``, the same run on ``--backend local`` is refused with the local
backend's algorithms listed, and a wrong type in its settings names the key and
the file. The local backend's own ``backend_args`` are checked the same way,
before any model loads.

Needs ``hatchling`` and ``pip`` in the test environment (the root pyproject's
``test`` dependency group).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from reinforge.testing import build_and_install, cli_main, plugin_env, run_process

TIMEOUT = 120
DIST = "reinforge-backend-toy"

PYPROJECT = """\
[build-system]
requires = ["hatchling>=1.21"]
build-backend = "hatchling.build"

[project]
name = "reinforge-backend-toy"
version = "0.1.0"
requires-python = ">=3.10"
dependencies = ["reinforge>=0.3,<0.4"]

[project.entry-points.reinforge]
reinforge-backend-toy = "reinforge_backend_toy.plugin"

[tool.hatch.build.targets.wheel]
packages = ["src/reinforge_backend_toy"]
"""

PLUGIN = '''\
"""A third-party backend: one algorithm with keys of its own."""

from dataclasses import dataclass

from reinforge.plugin import Backend, Settings, at_least, hookimpl, one_of


@dataclass
class MyAlgoSettings(Settings):
    temperature_schedule: str = "flat"
    beta: float = 0.1

    def check(self):
        one_of("temperature_schedule", self.temperature_schedule, ("flat", "cosine"))
        at_least("beta", self.beta, 0.0)


@dataclass
class ToySettings(Settings):
    workers: int = 1


class ToyBackend(Backend):
    name = "toy"
    settings = ToySettings
    algorithms = {"my_algo": MyAlgoSettings}

    def run(self, job):
        return {"status": "finished", "steps": 0}


@hookimpl
def register_backends(register):
    register("toy", ToyBackend)
'''

FLOW = """\
from reinforge import JudgeOutput, WorkflowOutput


async def workflow(task, model):
    return WorkflowOutput(response=await model.chat([{"role": "user", "content": task["question"]}]))


def judge(task, response):
    return JudgeOutput(reward=1.0)
"""

RUN = """\
workflow: {flow}:workflow
judges: [{flow}:judge]
train_dataset: {{path: data.jsonl}}
model: {{model_path: {model}}}
algorithm:
{algorithm}
"""

MY_ALGO = "  algorithm_type: my_algo\n  group_size: 2\n  temperature_schedule: cosine\n  beta: 0.2\n"


def _run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None, check: bool = True):
    return run_process(args, cwd=cwd, env=env, check=check, timeout=TIMEOUT)


def _env(*paths: Path) -> dict[str, str]:
    return plugin_env(*paths)


def _write_run(folder: Path, name: str, *, algorithm: str, backend_args: str = "", model: str = "no-such-model"):
    text = RUN.format(flow="toyflow", model=model, algorithm=algorithm.rstrip("\n"))
    if backend_args:
        text += f"backend_args: {backend_args}\n"
    path = folder / name
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> dict[str, Path]:
    """The toy backend built into a wheel and installed into a private folder; a project folder using it."""
    root = tmp_path_factory.mktemp("backend_api")
    src = root / "toy"
    package = src / "src" / "reinforge_backend_toy"
    package.mkdir(parents=True)
    (src / "pyproject.toml").write_text(PYPROJECT)
    (package / "__init__.py").write_text('"""A toy reinforge backend."""\n')
    (package / "plugin.py").write_text(PLUGIN)
    site = root / "site"
    build_and_install(src, site)  # the real path: a hatchling wheel, pip-installed
    project = root / "project"
    project.mkdir()
    (project / "toyflow.py").write_text(FLOW)
    (project / "data.jsonl").write_text(json.dumps({"question": "What is 1 + 1?"}) + "\n")
    return {"site": site, "project": project}


def _tune(toy: dict[str, Path], run_file: Path, *args: str):
    command = [sys.executable, "-m", "reinforge", "tune", str(run_file), *args, "--dry-run"]
    return _run(command, cwd=toy["project"], env=_env(toy["site"]), check=False)


def test_a_third_party_backend_takes_its_own_algorithm_and_keys(toy):
    run_file = _write_run(toy["project"], "run.yaml", algorithm=MY_ALGO)
    plugins = _run([sys.executable, "-m", "reinforge", "plugins"], cwd=toy["project"], env=_env(toy["site"]))
    assert DIST in plugins.stdout and "backends: toy" in plugins.stdout, plugins.stdout

    proc = _tune(toy, run_file, "--backend", "toy")
    assert proc.returncode == 0, proc.stderr
    described = json.loads(proc.stdout)
    assert described["backend"] == "toy" and described["algorithm"] == "my_algo"
    assert described["algorithm_settings"] == {"temperature_schedule": "cosine", "beta": 0.2}
    assert described["backend_settings"] == {"workers": 1}


def test_the_same_run_on_the_local_backend_lists_the_local_algorithms(toy):
    run_file = _write_run(toy["project"], "run.yaml", algorithm=MY_ALGO)
    proc = _tune(toy, run_file, "--backend", "local")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert str(run_file.resolve()) in proc.stderr, proc.stderr
    assert "backend 'local' has no algorithm 'my_algo'" in proc.stderr, proc.stderr
    assert "its algorithms: grpo, gspo, multi_step_grpo, ppo, reinforce_pp, rloo" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("algorithm", "backend_args", "message"),
    [
        (MY_ALGO, "{workers: two}", "backend_args.workers: expected an integer, got str 'two'"),
        (MY_ALGO.replace("0.2", "high"), "", "algorithm.beta: expected a number, got str 'high'"),
        (MY_ALGO.replace("cosine", "linear"), "", "algorithm.temperature_schedule: must be one of flat, cosine"),
        (MY_ALGO + "  kl_coef: 0.1\n", "", "unknown key 'algorithm.kl_coef'"),
    ],
)
def test_a_wrong_key_of_the_third_party_backend_names_the_key_and_the_file(toy, algorithm, backend_args, message):
    run_file = _write_run(toy["project"], "bad.yaml", algorithm=algorithm, backend_args=backend_args)
    proc = _tune(toy, run_file, "--backend", "toy")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{run_file.resolve()}: {message}" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def _forbid_model_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any model load fails the test: these checks must stop a run before one."""
    from reinforge_backend_local.model import modeling
    from reinforge_backend_local.rollouts import runtime

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(modeling, "load_policy", no_model)
    monkeypatch.setattr(runtime, "load_policy", no_model)


def _local_run_file(tmp_path, monkeypatch, flow: str, extra: str = "", algorithm: str = "  group_size: 2"):
    """``tmp_path/run.yaml`` of the local backend with its workflow module ``flow`` and a one-row dataset."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / f"{flow}.py").write_text(FLOW)
    (tmp_path / "data.jsonl").write_text(json.dumps({"question": "What is 1 + 1?"}) + "\n")
    run_file = tmp_path / "run.yaml"
    run_file.write_text(RUN.format(flow=flow, model="no-such-model", algorithm=algorithm) + extra)
    return run_file


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_wrong_type_in_local_backend_args_fails_before_any_model_loads(tmp_path, monkeypatch, capsys, dry_run):
    _forbid_model_loading(monkeypatch)
    run_file = _local_run_file(
        tmp_path, monkeypatch, "toyflow_mb", 'backend: local\nbackend_args: {micro_batch: "8"}\n'
    )

    code = cli_main(["tune", str(run_file), *(["--dry-run"] if dry_run else [])])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"{run_file.resolve()}: backend_args.micro_batch: expected an integer, got str '8'" in err, err


def test_the_old_report_switch_in_backend_args_points_at_the_reports_own_section(tmp_path, monkeypatch, capsys):
    run_file = _local_run_file(tmp_path, monkeypatch, "toyflow_rp", "backend: local\nbackend_args: {report: false}\n")

    assert cli_main(["tune", str(run_file), "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert (
        "backend_args.report: moved to reinforge-report's own section of the run file: report: {enabled: false}" in err
    )


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_run_without_train_dataset_is_refused_by_tune_and_its_dry_run_alike(tmp_path, monkeypatch, capsys, dry_run):
    """Fails before core 0.4: ``tune --dry-run`` passed a run file that ``tune`` then refused."""
    _forbid_model_loading(monkeypatch)
    run_file = _local_run_file(tmp_path, monkeypatch, "toyflow_nodata")
    run_file.write_text(run_file.read_text().replace("train_dataset: {path: data.jsonl}\n", ""))

    code = cli_main(["tune", str(run_file), *(["--dry-run"] if dry_run else [])])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"{run_file.resolve()}: train_dataset: the local backend needs a train_dataset" in err, err


def test_the_local_dry_run_describes_the_checked_settings(tmp_path, monkeypatch, capsys):
    algorithm = "  algorithm_type: reinforce++\n  kl_coef: 0.05\n  batch_size: 4"
    extra = "backend_args: {micro_batch: 4, output_dir: out}\n"
    run_file = _local_run_file(tmp_path, monkeypatch, "toyflow_dry", extra, algorithm)

    assert cli_main(["tune", str(run_file), "--dry-run"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["backend"] == "local" and described["algorithm"] == "reinforce_pp"
    assert described["algorithm_settings"]["kl_coef"] == 0.05 and "scale_rewards" not in described["algorithm_settings"]
    assert described["backend_settings"]["micro_batch"] == 4 and described["output_dir"] == "out"
    assert described["algorithm_config"]["batch_size"] == 4 and described["model"] == "no-such-model"
    assert not (tmp_path / "out").exists()


def test_the_backend_declares_its_settings_and_algorithms():
    from reinforge.plugin import Backend, get_plugin_manager
    from reinforge.testing import plugin_registry
    from reinforge_backend_local.backend import LocalBackend, LocalSettings

    comp = plugin_registry(get_plugin_manager()).get("backends", "local")
    assert comp is not None and comp.obj is LocalBackend and issubclass(LocalBackend, Backend)
    assert LocalBackend.name == "local" and LocalBackend.settings is LocalSettings
    assert LocalBackend.algorithm_aliases == {"reinforce++": "reinforce_pp", "reinforce_plus_plus": "reinforce_pp"}
    with pytest.raises(Exception, match=r"micro_batch: must be at least 1, got 0"):
        LocalSettings(micro_batch=0)


def test_the_readme_documents_every_key_with_its_default():
    from dataclasses import MISSING, fields

    from reinforge_backend_local.backend import LocalSettings
    from reinforge_backend_local.training.algorithms import ALGORITHMS

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    # the run file's keys: the online committer's table further down has keys of the same names
    run_file = readme.split("## reinforge-online's `local` committer")[0]
    rows = {line.split("|")[1].strip(): line for line in run_file.splitlines() if line.startswith("| `")}
    for cls in {LocalSettings, *(record.settings for record in ALGORITHMS.values())}:
        for f in fields(cls):
            row = rows.get(f"`{f.name}`")
            assert row is not None, f"README has no table row for {cls.__name__}.{f.name}"
            default = "null" if f.default is None else json.dumps(f.default).strip('"')
            assert f.default is not MISSING and f"`{default}`" in row, (f.name, default, row)
    for name in ALGORITHMS:
        assert f"| `{name}` |" in readme, name
