"""``reinforge online serve online.yaml`` as a user runs it: a process on uvicorn, stopped by SIGINT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

from online_testlib import HTTP, UPSTREAM_BODY, free_port

REINFORGE = [sys.executable, "-c", "import sys; from reinforge.cli import main; sys.exit(main())"]


def test_the_command_serves_the_gateway(tmp_path, upstream, fakes):
    port = free_port()
    (tmp_path / "online.yaml").write_text(
        json.dumps(
            {
                "upstream": {"url": upstream[1].v1, "key_env": "UP_KEY"},
                "mode": "record",
                "listen": {"port": port},
                "auth": {"traffic_key_env": "T_KEY", "admin_key_env": "A_KEY", "feedback_secret_env": "F_KEY"},
            }
        )
    )
    env = {
        **os.environ,
        "T_KEY": "t",
        "A_KEY": "a",
        "F_KEY": "f",
        "UP_KEY": "u",
        "REINFORGE_LOAD_PLUGINS": "reinforge-online",
    }
    proc = subprocess.Popen(
        [*REINFORGE, "online", "serve", str(tmp_path / "online.yaml"), "--log-level", "info"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    ready = threading.Event()
    lines: list[str] = []

    def watch() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "Uvicorn running on" in line:  # bound and listening
                ready.set()
        ready.set()  # it exited

    threading.Thread(target=watch, daemon=True).start()
    try:
        assert ready.wait(60) and proc.poll() is None, "".join(lines)
        base = f"http://127.0.0.1:{port}"
        r = HTTP.post(
            f"{base}/v1/chat/completions", json={"model": "m", "messages": []}, headers={"authorization": "Bearer t"}
        )
        assert r.status_code == 200 and r.content == UPSTREAM_BODY
        assert fakes[0].requests[-1][0]["authorization"] == "Bearer u"
        assert HTTP.get(f"{base}/metrics", headers={"authorization": "Bearer a"}).status_code == 200
        assert (tmp_path / "traces.sqlite").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    out = "".join(lines)
    # a clean shutdown (the store drained by the lifespan) exits 0: the signal is not raised again
    assert code == 0 and "Application shutdown complete" in out and "Traceback" not in out, out
    assert "reinforge-online: gateway at" in out


def test_a_bad_file_is_a_clear_error_without_a_traceback(tmp_path):
    (tmp_path / "online.yaml").write_text("upstream: {url: 'http://127.0.0.1:1/v1'}\nmode: shadwo\n")
    proc = subprocess.run(
        [*REINFORGE, "online", "serve", str(tmp_path / "online.yaml")],
        capture_output=True,
        text=True,
        env={**os.environ, "REINFORGE_LOAD_PLUGINS": "reinforge-online"},
        timeout=60,
    )
    assert proc.returncode != 0
    assert "online.yaml: mode: must be one of route, record, shadow; got 'shadwo'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_judge_that_does_not_resolve_is_a_clear_error_before_anything_binds(tmp_path):
    (tmp_path / "online.yaml").write_text(
        "upstream: {url: 'http://127.0.0.1:1/v1'}\ndev: true\nmode: record\nreward: {judges: [exact_mach]}\n"
    )
    proc = subprocess.run(
        [*REINFORGE, "online", "serve", str(tmp_path / "online.yaml")],
        capture_output=True,
        text=True,
        env={**os.environ, "REINFORGE_LOAD_PLUGINS": "reinforge-online"},
        timeout=60,
    )
    assert proc.returncode != 0
    assert f"{tmp_path / 'online.yaml'}: reward.judges[0]: no judge named 'exact_mach'" in proc.stderr, proc.stderr
    assert "exact_match" in proc.stderr and "Traceback" not in proc.stderr  # the hint names the right one


def test_kill_9_under_load_keeps_every_acknowledged_trace(tmp_path, upstream, policy, fakes):
    """Feedback answered 200 means its trace (and reward) committed: all of those survive a kill -9."""
    import httpx

    from reinforge_online.store import TraceStore

    port = free_port()
    (tmp_path / "online.yaml").write_text(
        json.dumps(
            {
                "upstream": {"url": upstream[1].v1},
                "policy": {"url": policy[1].v1, "model": "pol"},
                "listen": {"port": port},
                "selection": {"sampling_rate": 1.0},
                "dev": True,
            }
        )
    )
    proc = subprocess.Popen(
        [*REINFORGE, "online", "serve", str(tmp_path / "online.yaml"), "--log-level", "info"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "REINFORGE_LOAD_PLUGINS": "reinforge-online"},
    )
    ready = threading.Event()

    def watch() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "Uvicorn running on" in line:
                ready.set()
        ready.set()

    threading.Thread(target=watch, daemon=True).start()
    acknowledged: list[str] = []
    enough = threading.Event()
    base = f"http://127.0.0.1:{port}"

    def load(worker: int) -> None:
        with httpx.Client(verify=False, timeout=10) as c:
            for i in range(10_000):
                try:
                    r = c.post(
                        f"{base}/v1/chat/completions", json={"model": "m", "messages": [], "user": f"{worker}-{i}"}
                    )
                    trace_id = r.headers["x-reinforge-trace-id"]
                    fb = c.post(
                        f"{base}/online/v1/feedback",
                        json={"trace_id": trace_id, "reward": 1.0},
                        headers={"x-reinforge-feedback-token": r.headers["x-reinforge-feedback-token"]},
                    )
                except (httpx.HTTPError, KeyError):
                    return  # the gateway is gone
                if fb.status_code == 200:
                    acknowledged.append(trace_id)
                    if len(acknowledged) >= 30:
                        enough.set()

    try:
        assert ready.wait(60) and proc.poll() is None
        workers = [threading.Thread(target=load, args=(w,), daemon=True) for w in range(3)]
        for w in workers:
            w.start()
        assert enough.wait(60)
        proc.kill()  # SIGKILL while requests are in flight
        proc.wait(30)
        for w in workers:
            w.join(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    store = TraceStore(tmp_path / "traces.sqlite")
    try:
        for trace_id in acknowledged:
            trace = store.trace(trace_id)
            assert trace is not None and trace["reward"] == 1.0 and trace["calls"][0]["token_ids"]
    finally:
        store.close()


def test_sigterm_ends_the_process_within_its_budget_whatever_the_clients_do(tmp_path, upstream, fakes):
    """Issue 30, finding 6: a stalled unauthenticated feedback upload, a partial authenticated chat body and a
    stream in flight (its upstream stalls after the first chunk) do not hold the process past shutdown_timeout_s,
    and a shutdown whose drain finished exits 0."""
    import socket
    import time

    from online_testlib import GatewayProcess, write_config

    fakes[0].behaviour = "stall"
    port = free_port()
    budget = 4.0
    config = write_config(
        tmp_path / "online.yaml",
        {
            "upstream": {"url": upstream[1].v1},
            "mode": "record",
            "listen": {"port": port},
            "auth": {"traffic_key_env": "T_KEY", "admin_key_env": "A_KEY", "feedback_secret_env": "F_KEY"},
            "shutdown_timeout_s": budget,
        },
    )
    with GatewayProcess(config, {"T_KEY": "t", "A_KEY": "a", "F_KEY": "f"}) as gateway:
        stalled = []
        for head in (
            b"POST /online/v1/feedback HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n",
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer t\r\n",
        ):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(head + b"content-length: 1000\r\n\r\n" + b'{"trace_id":')  # 12 bytes of 1000
            stalled.append(s)
        stream = socket.create_connection(("127.0.0.1", port))
        body = json.dumps({"model": "m", "messages": [], "stream": True}).encode()
        stream.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer t\r\n"
            b"content-type: application/json\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        assert b"200 OK" in stream.recv(65536)  # the stream started: its first chunk is on its way
        assert gateway.proc is not None
        started = time.monotonic()
        gateway.proc.send_signal(signal.SIGTERM)
        code = gateway.proc.wait(budget + 5)
        took = time.monotonic() - started
        for s in (*stalled, stream):
            s.close()
    out = gateway.output
    assert took <= budget + 1.5, (took, out)  # the budget, and the interpreter's own exit
    assert code == 0, out
    assert "Traceback" not in out, out
