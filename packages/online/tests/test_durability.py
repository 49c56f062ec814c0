"""Acknowledged means durable, tested the way an operator would: a real gateway process under load from a
separate client process, killed with SIGKILL, three rounds on one store; every trace id a client was
told (in a response header, streams included) must be in the store afterwards.

Round two holds SQLite's write lock from another connection for a stretch of the load: sampled
requests then get their answer without trace headers (counted in ``reinforge_online_traces_dropped_total``),
and what was acknowledged before and after is still all there.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from online_testlib import HTTP, GatewayProcess, free_port, write_config

from reinforge_online.store import TraceStore

CLIENT = Path(__file__).with_name("load_client.py")
ROUND_ACKS = 150  # acknowledged traces a round waits for before the kill
CLIENTS = 12


class Load:
    """The client process; its lines counted as they come (``ack <id>``, ``drop``, ``up``, ``end``)."""

    def __init__(self, base: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CLIENT), base, "--clients", str(CLIENTS), "--max-requests", "6000"],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.acks: list[str] = []
        self.drops = 0
        self.answered = 0
        self.changed = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, _, rest = line.strip().partition(" ")
            with self.changed:
                self.answered += kind in ("ack", "drop", "up")
                if kind == "ack":
                    self.acks.append(rest)
                elif kind == "drop":
                    self.drops += 1
                self.changed.notify_all()

    def wait(self, condition: Any, timeout: float = 60) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: condition(self), timeout)

    def finish(self) -> None:
        self.proc.wait(60)
        self.reader.join(10)


def test_kill_9_under_load_keeps_every_trace_a_client_was_told(tmp_path, upstream, policy, fakes):
    port = free_port()
    store_path = tmp_path / "traces.sqlite"
    config = write_config(
        tmp_path / "online.yaml",
        {
            "upstream": {"url": upstream[1].v1},
            "policy": {"url": policy[1].v1, "model": "pol"},
            "listen": {"port": port},
            "selection": {"sampling_rate": 0.5},
            "store": {"path": str(store_path), "busy_timeout_ms": 100, "probe_interval_s": 0.05},
            "limits": {"requests_per_s": None},
            "dev": True,
        },
    )
    base = f"http://127.0.0.1:{port}"
    told: list[str] = []
    rounds: list[dict[str, int]] = []
    for round_no in range(3):
        with GatewayProcess(config) as gateway:
            load = Load(base)
            assert load.wait(lambda c: len(c.acks) >= ROUND_ACKS), gateway.output
            dropped = 0
            if round_no == 1:  # another connection holds the write lock for a stretch of the load
                locker = sqlite3.connect(store_path, timeout=5, isolation_level=None)
                locker.execute("BEGIN IMMEDIATE")
                try:
                    assert load.wait(lambda c: c.drops >= 3), "no sampled request went without headers"
                finally:
                    locker.execute("ROLLBACK")
                    locker.close()
                before = len(load.acks)
                assert load.wait(lambda c, n=before: len(c.acks) >= n + ROUND_ACKS), "acknowledgements did not resume"
                metrics = HTTP.get(f"{base}/metrics").text
                dropped = sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in metrics.splitlines()
                    if line.startswith("reinforge_online_traces_dropped_total{")
                )
                assert dropped >= 3, metrics  # each answer without headers was counted
            assert gateway.proc is not None
            gateway.proc.send_signal(signal.SIGKILL)  # mid-load: no shutdown code runs
            gateway.proc.wait(30)
            load.finish()
            told.extend(load.acks)
            rounds.append(
                {
                    "answered": load.answered,
                    "acknowledged": len(load.acks),
                    "answered_without_headers": load.drops,
                    "counted_dropped": int(dropped),
                }
            )
    store = TraceStore(store_path)
    try:
        lost = [t for t in told if store.trace(t) is None]
        print(json.dumps({"rounds": rounds, "acknowledged": len(told), "lost": len(lost)}))  # the figures, with -s
        assert not lost, f"{len(lost)} of {len(told)} acknowledged traces lost: {lost[:5]} (rounds: {rounds})"
        assert len(set(told)) == len(told) >= 4 * ROUND_ACKS
        states = {c["state"] for t in told[:: max(1, len(told) // 200)] for c in store.trace(t)["calls"]}
        assert states <= {"complete", "streaming", "aborted"}
    finally:
        store.close()
