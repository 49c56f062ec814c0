"""``reinforge online versions`` and ``reinforge online rollback``: an operator's view of a running gateway's versions.

Both read ``online.yaml`` for where the gateway listens and which environment variable holds its
admin key, and ask the gateway over HTTP (``GET /online/v1/versions``, ``POST /online/v1/rollback``):
the gateway owns the committer, so a rollback happens where the policy is served.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any

__all__ = ["ROLLBACK_HELP", "VERSIONS_HELP", "rollback_arguments", "run_rollback", "run_versions", "versions_arguments"]

VERSIONS_HELP = "the policy versions of a running gateway: which is live, scores, every promotion, refusal and rollback"
ROLLBACK_HELP = "serve an earlier policy version again (default: the live one's predecessor)"


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", metavar="ONLINE.yaml", help="the gateway's settings (where it listens, its admin key)"
    )
    parser.add_argument("--url", help="the gateway's root URL (default: listen.host and listen.port of ONLINE.yaml)")
    parser.add_argument("--json", action="store_true", help="print the gateway's JSON answer")


def versions_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)


def rollback_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("version", nargs="?", type=int, help="the version number to serve again (see `versions`)")
    _common(parser)


def _ask(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    from .config import load_config

    settings = load_config(args.config, dev=True)  # the keys are read below, only the admin one
    host = settings.listen.host if settings.listen.host not in ("0.0.0.0", "::") else "127.0.0.1"
    url = (args.url or f"http://{host}:{settings.listen.port}").rstrip("/") + path
    headers = {"content-type": "application/json"}
    name = settings.auth.admin_key_env
    if name:
        key = os.environ.get(name)
        if not key:
            raise SystemExit(f"{args.config}: auth.admin_key_env: the environment variable {name} is not set or empty")
        headers["authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=600) as resp:  # a rollback waits for a gate check in progress
            answer: dict[str, Any] = json.loads(resp.read())
            return answer
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")
        with contextlib.suppress(ValueError, KeyError, TypeError):  # an OpenAI-style error: its message
            detail = json.loads(detail)["error"]["message"]
        raise SystemExit(f"{url}: HTTP {exc.code}: {detail}") from None
    except urllib.error.URLError as exc:
        raise SystemExit(f"{url}: the gateway cannot be reached: {exc.reason}") from None


def _when(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.datetime.fromtimestamp(at).strftime("%Y-%m-%d %H:%M:%S")


def run_versions(args: argparse.Namespace) -> int:
    answer = _ask(args, "GET", "/online/v1/versions")
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    print(f"{'version':>7}  {'state':<11} {'score':>6}  {'created':<19}  name")
    for v in answer["versions"]:
        score = "-" if v["score"] is None else f"{v['score']:.3f}"
        mark = "*" if v["version"] == answer["live"] else " "
        print(f"{mark}{'v' + str(v['version']):>6}  {v['state']:<11} {score:>6}  {_when(v['created_at'])}  {v['name']}")
    print("\ndecisions (newest first):")
    for d in answer["decisions"][:20]:
        print(f"  {_when(d['at'])}  v{d['version']} {d['decision']}: {d['reason']}")
    return 0


def run_rollback(args: argparse.Namespace) -> int:
    body = {} if args.version is None else {"version": args.version}
    answer = _ask(args, "POST", "/online/v1/rollback", body)
    if args.json:
        print(json.dumps(answer))
    else:
        print(f"v{answer['live']} ({answer['name']}) is served again", file=sys.stdout)
    return 0
