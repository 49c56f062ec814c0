"""``reinforge online serve online.yaml``: the gateway on uvicorn (uvloop + httptools)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["HELP", "add_arguments", "build", "run"]

HELP = "the online-learning gateway: sample production traffic for the policy under training"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``reinforge online serve``."""
    parser.add_argument("config", metavar="ONLINE.yaml", help="the gateway's settings (see reinforge-online's README)")
    parser.add_argument("--host", help="override listen.host")
    parser.add_argument("--port", type=int, help="override listen.port")
    parser.add_argument("--dev", action="store_true", help="allow anonymous traffic/admin (same as dev: true)")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


def build(args: argparse.Namespace) -> tuple[Starlette, str, int]:
    """The app and where to bind, settings and secrets checked (nothing bound yet)."""
    from .app import build_app
    from .config import load_config, resolve_secrets

    settings = load_config(args.config, dev=getattr(args, "dev", False))
    host = args.host or settings.listen.host
    port = settings.listen.port if args.port is None else args.port
    app = build_app(settings, resolve_secrets(settings, str(args.config)), where=str(args.config))
    return app, host, port


def run(args: argparse.Namespace) -> int:
    """``reinforge online serve``: build the gateway, then serve until SIGTERM/SIGINT (a bounded shutdown)."""
    from .server import serve

    app, host, port = build(args)
    print(f"reinforge-online: gateway at http://{host}:{port}/v1", file=sys.stderr, flush=True)
    settings = app.state.gateway.settings
    return serve(app, host, port, shutdown_timeout_s=settings.shutdown_timeout_s, log_level=args.log_level)
