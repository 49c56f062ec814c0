"""Shared setup: the testing kit's fixtures, the fake upstream and policy on uvicorn, a gateway factory."""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reinforge.testing.plugin import reinforge_pm  # noqa: F401

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from online_testlib import SECRETS, FakePolicy, FakeUpstream, settings

from reinforge.testing import BackgroundServer


@pytest.fixture(scope="session")
def upstream() -> Iterator[tuple[FakeUpstream, BackgroundServer]]:
    fake = FakeUpstream()
    with BackgroundServer(fake.app()) as server:
        yield fake, server


@pytest.fixture(scope="session")
def policy() -> Iterator[tuple[FakePolicy, BackgroundServer]]:
    fake = FakePolicy()
    with BackgroundServer(fake.app()) as server:
        yield fake, server


@pytest.fixture
def fakes(upstream: Any, policy: Any) -> Iterator[tuple[FakeUpstream, FakePolicy]]:
    for fake in (upstream[0], policy[0]):
        fake.requests.clear()
        fake.fail, fake.behaviour = False, "ok"
    yield upstream[0], policy[0]
    for fake in (upstream[0], policy[0]):
        fake.fail, fake.behaviour = False, "ok"
        fake.hold.set()
        fake.hold = threading.Event()


@pytest.fixture
def gateway(tmp_path: Path, upstream: Any, policy: Any, fakes: Any) -> Iterator[Callable[..., BackgroundServer]]:
    """``gateway(**overrides)``: a gateway on uvicorn in front of the fakes (stopped at the test's end)."""
    from reinforge_online.app import build_app

    started: list[BackgroundServer] = []

    def start(*, upstream_url: str | None = None, policy_url: str | None = None, **overrides: Any) -> BackgroundServer:
        s = settings(
            upstream_url or upstream[1].v1,
            policy_url or policy[1].v1,
            tmp_path / f"traces{len(started)}.sqlite",
            **overrides,
        )
        server = BackgroundServer(build_app(s, SECRETS)).__enter__()
        started.append(server)
        return server

    yield start
    for server in started:
        server.__exit__(None, None, None)


# -- the trace store, on SQLite and (in the online_postgres session) on a real PostgreSQL server -----------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "postgres: needs a PostgreSQL server (nox -s online_postgres)")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    import pg_testlib

    reason = pg_testlib.skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with pg_testlib.server() as server:
        yield server


@pytest.fixture
def pg_url(pg_server: Any, request: pytest.FixtureRequest) -> str:
    """A fresh database on the test server for this test; its URL (the password is ``pg_server.password``)."""
    name = "t_" + uuid.uuid4().hex[:12]
    return str(pg_server.create_database(name))


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """Where a test's store lives: a SQLite file, or a fresh PostgreSQL database (see :func:`open_store_at`)."""
    if request.param == "sqlite":
        return {"kind": "sqlite", "path": str(tmp_path / "t.sqlite")}
    server = request.getfixturevalue("pg_server")
    return {"kind": "postgres", "url": request.getfixturevalue("pg_url"), "password": server.password}


@pytest.fixture
def make_store(store_spec: dict[str, Any]) -> Callable[..., Any]:
    """``make_store(**options)``: a store at ``store_spec`` (again the same data on every call)."""
    from online_testlib import open_store_at

    return lambda **options: open_store_at(store_spec, **options)
