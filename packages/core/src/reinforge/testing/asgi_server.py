"""An ASGI app served by a real uvicorn on 127.0.0.1, in a thread, for the length of a ``with`` block.

Plugin tests that serve something (``reinforge serve``, the online gateway, a committer's endpoint) talk
to it through a real socket with a real client, as a user's process would. uvicorn is imported when a
server is made: core does not depend on it; a package whose tests use this has it already.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

__all__ = ["BackgroundServer"]


class BackgroundServer:
    """``app`` on uvicorn at 127.0.0.1 on a free port; ``with`` waits until its lifespan startup finished.

    ``fast`` picks uvloop and httptools (what ``reinforge serve`` and the gateway run on) instead of
    uvicorn's pure-Python defaults. The socket is bound before the thread starts, so ``port`` is known
    at once and no other process can take it in between.
    """

    def __init__(self, app: Any, *, fast: bool = True, start_timeout_s: float = 60.0) -> None:
        try:
            import uvicorn
        except ImportError as exc:
            raise ImportError(
                "reinforge.testing.BackgroundServer needs uvicorn: pip install 'uvicorn[standard]'"
            ) from exc

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.start_timeout_s = start_timeout_s
        self.ready = threading.Event()
        options: dict[str, Any] = {"loop": "uvloop", "http": "httptools"} if fast else {}
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", **options))
        original = self.server.startup

        async def startup(sockets: Any = None) -> None:
            await original(sockets=sockets)
            self.ready.set()

        self.server.startup = startup  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        if not self.ready.wait(self.start_timeout_s):
            raise RuntimeError(f"the ASGI server on port {self.port} did not start in {self.start_timeout_s} s")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()

    @property
    def base(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def v1(self) -> str:
        """The OpenAI-style base URL, ``<base>/v1``."""
        return f"{self.base}/v1"
