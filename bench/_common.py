"""What the bench scripts share: server processes, free ports, venvs from pinned requirements, the JSON line.

Every script imports it as ``_common`` (its own folder is first on ``sys.path``;
``bench/gpu/`` adds its parent). Standard library only, with psutil imported where
a process tree is measured, because some scripts run from venvs of their own
(vLLM's, the gateway's). ``nox -s bench`` runs no file whose name starts with ``_``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SETUP_FAILED = "SETUP_FAILED.txt"  # in a venv whose --setup failed: why (read by not_installed)


# -- output ---------------------------------------------------------------------------------------------------------


def emit(result: dict[str, Any]) -> None:
    """Print ``result`` as one JSON line: every script's last stdout line (``nox -s bench`` reads it)."""
    print(json.dumps(result, default=str), flush=True)


def last_json(stdout: str) -> Any:
    """The JSON value on the last line of a child's stdout (a bench child, a ``python -c`` probe)."""
    return json.loads(stdout.strip().splitlines()[-1])


def say(message: str, prefix: str = "") -> None:
    """Progress on stderr, so stdout keeps the tables and the JSON line."""
    print(f"{prefix}{message}", file=sys.stderr, flush=True)


def fmt(value: float | None, spec: str = ".2f") -> str:
    """A number for a table; ``-`` for none."""
    return "-" if value is None else format(value, spec)


# -- statistics -----------------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-quantile (0..1) with linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median_of(values: list[float | None]) -> float | None:
    """The median of the values that are there (a failed run's are None); None when none are."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


# -- processes ------------------------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path | None, lines: int = 15) -> str:
    """The last lines of a log, for an error message ("" when it cannot be read)."""
    if path is None:
        return ""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def process_tree(pid: int) -> list[Any]:
    """The psutil processes of ``pid`` and all its descendants ([] once it is gone)."""
    import psutil

    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return []


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and its descendants (pages two of them share count in each)."""
    import psutil

    total = 0
    for p in process_tree(pid):
        with suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its children so far."""
    import psutil

    total = 0.0
    for p in process_tree(pid):
        with suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 only


@dataclass
class Server:
    """A server process on 127.0.0.1, ready when ``ready_url`` answers 200, stopped by a signal then SIGKILL.

    ``own_group``: started in a process group of its own, which is signalled whole (a server whose
    workers must die with it); else the process alone is signalled and shuts its children down itself.
    """

    name: str
    command: list[str]
    ready_url: str
    headers: dict[str, str] = field(default_factory=dict)  # sent with the readiness check
    own_group: bool = True
    log: Path | None = None  # stdout and stderr
    proc: subprocess.Popen | None = None
    started: float = 0.0
    startup_s: float | None = None

    def start(self, env: dict[str, str], cwd: Path, log: Path | None = None) -> None:
        """Start it (``log``, else :attr:`log`, takes its output); :meth:`wait_ready` measures from here."""
        self.log = log or self.log
        if self.log is None:
            raise ValueError(f"{self.name}: no log file")
        self.started = time.perf_counter()
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd,
                start_new_session=self.own_group,
            )

    def poll_ready(self) -> bool:
        """True once ``ready_url`` answers 200 (and :attr:`startup_s` is set); RuntimeError if it exited."""
        if self.proc is None:
            raise RuntimeError(f"{self.name} was never started")
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode} while starting:\n{tail(self.log)}")
        try:
            request = urllib.request.Request(self.ready_url, headers=self.headers)
            with _NO_PROXY_OPENER.open(request, timeout=2) as resp:
                ok = resp.status == 200
        except OSError:
            return False
        if ok:
            self.startup_s = time.perf_counter() - self.started
        return ok

    def wait_ready(self, timeout_s: float, interval_s: float = 0.25) -> float:
        """Seconds from :meth:`start` until it answered; RuntimeError (with its log's tail) after ``timeout_s``."""
        wait_ready([self], timeout_s, interval_s)
        assert self.startup_s is not None
        return self.startup_s

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 20.0) -> int | None:
        """``sig``, then SIGKILL to what is left after ``timeout_s`` (its whole group when it has one); its exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            self._send(sig)
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=timeout_s)
        if self.own_group or proc.poll() is None:
            self._send(signal.SIGKILL)  # with a group: children that outlived it too
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        return proc.returncode

    def _send(self, sig: int) -> None:
        assert self.proc is not None
        with suppress(ProcessLookupError):
            if self.own_group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)


def wait_ready(servers: list[Server], timeout_s: float, interval_s: float = 0.25) -> None:
    """Wait for every server at once (they start in parallel); RuntimeError naming the first that is late."""
    pending = list(servers)
    deadline = time.perf_counter() + timeout_s
    while pending:
        pending = [s for s in pending if not s.poll_ready()]
        if not pending:
            return
        if time.perf_counter() > deadline:
            s = pending[0]
            raise RuntimeError(f"{s.name} did not answer {s.ready_url} in {timeout_s:.0f} s:\n{tail(s.log)}")
        time.sleep(interval_s)


# -- venvs ----------------------------------------------------------------------------------------------------------


def venv_python(venv: Path) -> Path:
    """The interpreter of a venv."""
    return venv / "bin" / "python"


def make_venv(
    name: str,
    venv: Path,
    steps: list[list[str]],
    *,
    base_python: str,
    log: Path,
    env: dict[str, str],
    cwd: Path | None = None,
) -> dict[str, Any]:
    """``base_python -m venv --clear VENV``, then each command of ``steps``, all logged to ``log``.

    A failure is recorded in ``VENV/SETUP_FAILED.txt`` (with the log's last lines), which
    :func:`not_installed` reports when the benchmark runs; a later success removes it. Returns
    ``{"venv", "ok", "error", "seconds"}``; never raises for a failed step.
    """
    failed = venv / SETUP_FAILED
    say(f"setup {name}: {venv} (log: {log})")
    start = time.perf_counter()
    error = None
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        for step in [[base_python, "-m", "venv", "--clear", str(venv)], *steps]:
            out.write(f"$ {' '.join(step)}\n")
            out.flush()
            rc = subprocess.call(step, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
            if rc != 0:
                error = f"`{' '.join(step[:6])} ...` exited with {rc}"
                break
    if error:
        error += f"; last lines of {log}:\n{tail(log, 12)}"
        venv.mkdir(parents=True, exist_ok=True)
        failed.write_text(error + "\n")
    elif failed.exists():
        failed.unlink()
    say(f"setup {name}: {'ok' if error is None else error}")
    return {"venv": str(venv), "ok": error is None, "error": error, "seconds": time.perf_counter() - start}


def not_installed(where: str | Path, venv: Path, what: str, script: str) -> str:
    """Why a peer's interpreter is unusable: the recorded ``--setup`` failure if any, else how to make it."""
    failed = venv / SETUP_FAILED
    if failed.is_file():
        return f"{what} is not installed: `--setup` failed: {failed.read_text().strip()}"
    return f"{what} is not installed in {where} (run `python bench/{script} --setup`)"


def versions(python: str, dists: tuple[str, ...]) -> dict[str, str]:
    """Installed versions of ``dists`` in the interpreter ``python`` (missing ones left out)."""
    code = (
        "import importlib.metadata as m, json, sys\n"
        "out = {}\n"
        "for d in sys.argv[1:]:\n"
        "    try: out[d] = m.version(d)\n"
        "    except m.PackageNotFoundError: pass\n"
        "print(json.dumps(out))"
    )
    done = subprocess.run([python, "-c", code, *dists], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{python} could not report versions: {done.stderr.strip()[-500:]}")
    return last_json(done.stdout)
