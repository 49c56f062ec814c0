"""Building the gateway's ASGI app: the routes, their error handlers, the request counter and the lifespan.

The request path itself is :class:`~reinforge_online.gateway.Gateway`; the ASGI pieces it runs on
are in :mod:`reinforge_online.asgi`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Route

from .asgi import (
    CLOSE_ROUTE,
    FEEDBACK_ROUTE,
    ROLLBACK_ROUTE,
    VERSIONS_ROUTE,
    CountRequests,
    GatewayApp,
    error_handlers,
    quiet_aborts,
)
from .config import CHAT_ROUTE, OnlineSettings, Secrets
from .gateway import Gateway
from .pipeline import Pipeline

__all__ = ["CLOSE_ROUTE", "FEEDBACK_ROUTE", "Gateway", "build_app"]


def build_app(
    settings: OnlineSettings,
    secrets: Secrets,
    *,
    pipeline: Pipeline | None = None,
    where: str = "online.yaml",
    **parts: Any,
) -> Starlette:
    """The gateway's ASGI app; its lifespan closes the clients and drains the store at shutdown.

    ``pipeline`` and ``parts`` (``store=``, ``selection=``, ``metrics=``, ``redact=``, ``committer=``) are
    the :class:`Gateway`'s. ``app.state.gateway`` is the gateway (its ``store`` and ``metrics`` included);
    ``where`` (the settings' file) starts the messages of components that fail to build. ``app.state.drained``
    says, after the shutdown, whether everything finished within the budget the server gave it
    (``app.state.shutdown_budget_s``, default ``shutdown_timeout_s``).
    """
    gw = Gateway(settings, secrets, pipeline=pipeline, where=where, **parts)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        budget = getattr(app.state, "shutdown_budget_s", None)
        app.state.drained = await gw.aclose(budget() if callable(budget) else budget)

    quiet_aborts()
    app = GatewayApp(
        routes=[
            Route(CHAT_ROUTE, gw.chat, methods=["POST"]),  # POST goes to serve_chat first: here for the 405s
            Route("/v1/models", gw.models, methods=["GET"]),
            Route("/healthz", gw.healthz, methods=["GET"]),
            Route("/metrics", gw.metrics_text, methods=["GET"]),
            Route(FEEDBACK_ROUTE, gw.post_feedback, methods=["POST"]),
            Route(CLOSE_ROUTE, gw.close_trace, methods=["POST"]),
            Route(VERSIONS_ROUTE, gw.versions, methods=["GET"]),
            Route(ROLLBACK_ROUTE, gw.rollback, methods=["POST"]),
        ],
        exception_handlers=error_handlers(),
        lifespan=lifespan,
    )
    app.state.gateway = gw
    app.state.drained = None
    app.add_middleware(CountRequests, metrics=gw.metrics)
    return app
