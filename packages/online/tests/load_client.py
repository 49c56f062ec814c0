"""A separate client process for the kill -9 tests: concurrent users that note what the gateway told them.

``python load_client.py BASE_URL --clients 12 --stream-share 0.25 --max-requests 4000 --max-seconds 60``

Each user sends chat requests (a quarter streamed), each in a session of its own, and prints one line per
answer, flushed before anything else happens, so what was printed is exactly what a client was told:

- ``ack <trace_id>``: the response carried ``x-reinforge-trace-id`` (for a stream: as soon as its headers came);
- ``drop``: the policy answered (its text is "policy") without trace headers;
- ``up``: the upstream answered.

It ends when the gateway stops answering (killed), or at the bounds.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import threading
import time

import httpx

_lock = threading.Lock()


def say(line: str) -> None:
    with _lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def user(base: str, n: int, args: argparse.Namespace, counter: itertools.count, deadline: float) -> None:
    failures = 0
    with httpx.Client(timeout=10) as client:
        for i in counter:
            if i >= args.max_requests or time.monotonic() > deadline:
                return
            stream = (i % 100) < args.stream_share * 100
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": f"q{i}"}],
                "user": f"user-{n}-{i}",
                "stream": stream,
            }
            try:
                if stream:
                    with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
                        trace_id = r.headers.get("x-reinforge-trace-id")
                        if trace_id:
                            say(f"ack {trace_id}")  # told at the headers, before the body
                        text = r.read()
                    if not trace_id:
                        say("drop" if b"po" in text and b"upstream" not in text else "up")
                else:
                    r = client.post(f"{base}/v1/chat/completions", json=body)
                    trace_id = r.headers.get("x-reinforge-trace-id")
                    if trace_id:
                        say(f"ack {trace_id}")
                    else:
                        say("drop" if b'"policy"' in r.content else "up")
                failures = 0
            except httpx.HTTPError:
                failures += 1
                if failures >= 3:
                    return  # the gateway is gone


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base")
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--stream-share", type=float, default=0.25)
    parser.add_argument("--max-requests", type=int, default=4000)
    parser.add_argument("--max-seconds", type=float, default=60.0)
    args = parser.parse_args()
    counter = itertools.count()
    deadline = time.monotonic() + args.max_seconds
    users = [
        threading.Thread(target=user, args=(args.base, n, args, counter, deadline), daemon=True)
        for n in range(args.clients)
    ]
    for u in users:
        u.start()
    for u in users:
        u.join()
    say("end")


if __name__ == "__main__":
    main()
