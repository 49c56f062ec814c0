"""``reinforge serve MODEL|RUN_DIR|CHECKPOINT``: the command line."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from reinforge.plugin import ConfigError


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        metavar="MODEL|RUN_DIR|CHECKPOINT",
        help="a model folder or built-in model name, a run folder (its latest checkpoint) or a checkpoint folder",
    )
    parser.add_argument("--adapter", metavar="DIR", help="a PEFT LoRA adapter folder to merge into the model")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default 8000; 0 picks a free one)")
    parser.add_argument(
        "--api-key-env", metavar="NAME", help="environment variable holding the key clients must send as Bearer"
    )
    parser.add_argument(
        "--admin-key-env",
        metavar="NAME",
        help="environment variable holding the admin key for POST /admin/adapter (without it the route is off)",
    )
    parser.add_argument(
        "--max-batch", type=int, default=64, metavar="N", help="rows decoded together at most (default 64)"
    )
    parser.add_argument(
        "--kv-cache-mb", type=float, default=1024, metavar="MB", help="KV cache the admitted requests may need (1024)"
    )
    parser.add_argument("--max-model-len", type=int, help="context length (default: the run's or 4096)")
    parser.add_argument("--max-body-mb", type=float, default=4.0, help="request body limit in MiB (default 4)")
    parser.add_argument("--served-model-name", metavar="NAME", help="the model id clients send (default: derived)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu (default), cuda, cuda:N or auto (the first GPU if there is one); on a GPU decoding uses HF's forward",
    )
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


def _check(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be in 0..65535, got {args.port}")
    if args.max_batch < 1:
        raise ConfigError(f"--max-batch must be at least 1, got {args.max_batch}")
    if args.kv_cache_mb <= 0:
        raise ConfigError(f"--kv-cache-mb must be positive, got {args.kv_cache_mb}")
    if args.max_body_mb <= 0:
        raise ConfigError(f"--max-body-mb must be positive, got {args.max_body_mb}")
    from ..model.modeling import device_problem

    problem = device_problem(args.device)
    if problem:
        raise ConfigError(f"--device: {problem}")
    if args.max_model_len is not None and args.max_model_len < 2:
        raise ConfigError(f"--max-model-len must be at least 2, got {args.max_model_len}")


def build(args: argparse.Namespace) -> Any:
    """The ASGI app for ``args`` (model loaded), without binding anything."""
    from ..model.compute import in_passing_thread
    from . import auth
    from .app import build_app
    from .metrics import Metrics
    from .model import load, resolve_source

    _check(args)
    key = auth.key_from_env(args.api_key_env)
    admin_key = auth.key_from_env(getattr(args, "admin_key_env", None), "--admin-key-env")
    if admin_key is not None and admin_key == key:
        raise ConfigError("--admin-key-env: the admin key must differ from the traffic key (--api-key-env)")
    source = resolve_source(args.target, args.adapter, name=args.served_model_name)
    metrics = Metrics()
    # loaded on a thread that ends: the decode thread must be the process's only OpenMP team (.compute)
    served = in_passing_thread(
        load,
        source,
        max_batch=args.max_batch,
        max_model_len=args.max_model_len,
        kv_cache_mb=args.kv_cache_mb,
        metrics=metrics,
        device=args.device,
    )
    return build_app(
        served, api_key=key, max_body_bytes=int(args.max_body_mb * 2**20), metrics=metrics, admin_key=admin_key
    )


def run(args: argparse.Namespace) -> int:
    import uvicorn

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    app = build(args)
    served = app.state.service.served
    where = f"http://{args.host}:{args.port}/v1"
    auth_note = f"key from ${args.api_key_env}" if args.api_key_env else "no API key (open)"
    print(f"reinforge: serving {served.name!r} ({served.folder}) at {where}, {auth_note}", file=sys.stderr, flush=True)
    if not args.api_key_env and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"reinforge: warning: {args.host} is reachable from other machines and no --api-key-env is set",
            file=sys.stderr,
            flush=True,
        )
    config = uvicorn.Config(
        app, host=args.host, port=args.port, loop="uvloop", http="httptools", log_level=args.log_level
    )
    uvicorn.Server(config).run()
    return 0
