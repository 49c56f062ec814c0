"""uvicorn for the gateway, with a shutdown that ends within ``shutdown_timeout_s`` whatever the clients do.

On SIGTERM (or SIGINT) the server stops accepting, gives open connections half the budget to
finish (uvicorn's graceful-shutdown timeout; then it cancels them: a stream in flight is cut and
stored ``aborted``), and the lifespan closes the pipeline (scoring, a last commit, the store's
drain) within what is left of nine tenths of it. A watchdog ends the process at the full budget
if anything still hangs. The exit status is 0 after a clean drain, 1 when something was left (it is
logged), and the signal is not re-raised (uvicorn would make the status -15).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

import uvicorn

__all__ = ["GatewayServer", "serve"]

_log = logging.getLogger("reinforge_online")
CONNECTIONS_SHARE = 0.5  # of shutdown_timeout_s: open connections may finish within this
DRAIN_END = 0.9  # ... and the pipeline's close must end by this share


class _CancelledAtShutdown(logging.Filter):
    """uvicorn logs a traceback for every request task its graceful-shutdown timeout cancels; its own line
    ("Cancel N running task(s) ...") already says what happened, so those tracebacks are dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, asyncio.CancelledError) and "graceful shutdown" in str(exc))


class GatewayServer(uvicorn.Server):
    """``uvicorn.Server`` whose shutdown is bounded (see the module docstring)."""

    should_exit: bool  # uvicorn's own flags, set here too
    force_exit: bool

    def __init__(self, config: uvicorn.Config, shutdown_timeout_s: float) -> None:
        super().__init__(config)
        self.shutdown_timeout_s = shutdown_timeout_s
        self.signalled_at: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded for uvicorn to raise again after the shutdown: the status is ours (see serve()).
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()
            _log.info(
                "%s: shutting down within %.0f s", signal.Signals(sig).name if sig else "exit", self.shutdown_timeout_s
            )
            watchdog = threading.Timer(self.shutdown_timeout_s, self._hard_exit)
            watchdog.daemon = True
            watchdog.start()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: no waiting for connections
        else:
            self.should_exit = True

    def _hard_exit(self) -> None:
        _log.error("the shutdown did not finish within %.0f s; exiting now", self.shutdown_timeout_s)
        logging.shutdown()
        sys.stderr.flush()
        os._exit(1)

    def drain_budget(self) -> float:
        """Seconds left for the pipeline's close: until nine tenths of the budget since the signal."""
        start = self.signalled_at if self.signalled_at is not None else time.monotonic()
        return max(0.5, start + DRAIN_END * self.shutdown_timeout_s - time.monotonic())


def serve(app: Any, host: str, port: int, *, shutdown_timeout_s: float, log_level: str = "info") -> int:
    """Serve ``app`` (from :func:`~reinforge_online.app.build_app`) until a signal; the exit status."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=max(0.5, CONNECTIONS_SHARE * shutdown_timeout_s),
    )
    server = GatewayServer(config, shutdown_timeout_s)
    logging.getLogger("uvicorn.error").addFilter(_CancelledAtShutdown())
    app.state.shutdown_budget_s = server.drain_budget
    server.run()
    drained = app.state.drained
    if server.started and drained is False:
        _log.error("the shutdown left work undone (see the lines above); exit status 1")
        return 1
    return 0 if server.started else 1
