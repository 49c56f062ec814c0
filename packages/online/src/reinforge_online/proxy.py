"""Forwarding to an upstream: one pooled ``aiohttp`` client session per base URL, and what headers cross.

Requests go on with the client's headers minus hop-by-hop headers, credentials and our own
``x-reinforge-*`` headers; the upstream's key is the gateway's own. Responses come back
with their status, body bytes (still encoded as sent) and headers (minus hop-by-hop ones) as the
upstream sent them.

aiohttp, not httpx: on the pass-through path httpx + httpcore cost the gateway about 1.5 ms of CPU
per request here (a third of it sniffio asking which async library runs, on every call); aiohttp's
client does the same work in a fraction of that (``bench/gateway_overhead.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping

import aiohttp
from multidict import CIMultiDict
from yarl import URL

__all__ = ["Upstream", "UpstreamError", "UpstreamResponse", "request_headers", "response_headers"]

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
CREDENTIALS = frozenset({"authorization", "cookie", "api-key", "x-api-key"})
# recomputed or re-sent by the hop that sends them on
_NOT_FORWARDED = HOP_BY_HOP | CREDENTIALS | {"host", "content-length"}
_NOT_RETURNED = HOP_BY_HOP | {"date", "server"}  # uvicorn sends its own date and server


def _connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> set[str]:
    """Headers a ``Connection`` header names: hop-by-hop too."""
    found: set[str] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            found.update(t.strip().lower() for t in value.decode("latin-1").split(",") if t.strip())
    return found


def request_headers(raw: list[tuple[bytes, bytes]], key: str | None) -> list[tuple[bytes, bytes]]:
    """The client's headers as the upstream gets them, with ``Authorization: Bearer key`` when given."""
    drop = _connection_tokens(raw)
    out = []
    for name, value in raw:
        lower = name.decode("latin-1").lower()
        if lower in _NOT_FORWARDED or lower in drop or lower.startswith("x-reinforge-"):
            continue
        out.append((name, value))
    if key:
        out.append((b"authorization", f"Bearer {key}".encode("latin-1")))
    return out


def response_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers as the client gets them (lower-case names, as ASGI wants)."""
    drop = _connection_tokens(raw)
    out = []
    for name, value in raw:
        lower = name.decode("latin-1").lower()
        if lower in _NOT_RETURNED or lower in drop:
            continue
        out.append((lower.encode("latin-1"), value))
    return out


class UpstreamError(Exception):
    """The upstream could not be asked or broke off; ``timeout`` when it did not answer in time."""

    def __init__(self, message: str, *, timeout: bool = False) -> None:
        super().__init__(message)
        self.timeout = timeout


def _error(exc: BaseException) -> UpstreamError:
    timeout = isinstance(exc, (asyncio.TimeoutError, TimeoutError))
    return UpstreamError(f"{type(exc).__name__}: {exc}", timeout=timeout)


_FAILURES = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


class UpstreamResponse:
    """A response whose body has not been read yet: status, raw headers, then the body once."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status_code = response.status
        self.raw_headers: list[tuple[bytes, bytes]] = list(response.raw_headers)

    def header(self, name: str) -> str | None:
        """One header's value (case-insensitive), or None."""
        return self._response.headers.get(name)

    async def read(self) -> bytes:
        """The whole body, as sent (not decompressed); :class:`UpstreamError` if it breaks off."""
        try:
            return await self._response.read()
        except _FAILURES as exc:
            raise _error(exc) from exc
        finally:
            self._response.release()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (not decompressed); :class:`UpstreamError` if it breaks off."""
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except _FAILURES as exc:
            raise _error(exc) from exc
        finally:
            self._response.release()

    async def aclose(self) -> None:
        """Give the connection back (closed when the body was not read to the end)."""
        self._response.release()


class Upstream:
    """One OpenAI-compatible base URL (``.../v1``) and its pooled client session.

    The session is made on the serving loop at the first request (aiohttp binds it to that loop);
    responses are passed on undecoded and aiohttp adds no headers of its own (no user agent,
    accept or content type the client did not send).
    """

    def __init__(self, url: str, key: str | None, *, timeout_s: float, max_connections: int) -> None:
        self.url = url.rstrip("/")
        self.key = key
        # like a per-operation timeout: connecting (pool wait included), and each read of the body
        self.timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout_s, sock_connect=min(timeout_s, 10.0), sock_read=timeout_s
        )
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=self.timeout,
                auto_decompress=False,  # bodies go on byte for byte, encoded as the upstream sent them
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
                trust_env=False,  # no proxy from the environment: the upstream is the configured URL
            )
        return self._session

    def target(self, path: str) -> str:
        """``/v1/chat/completions`` under this base URL (which ends in ``/v1`` like an OpenAI ``base_url``)."""
        return self.url + (path[3:] if path.startswith("/v1/") else path)

    def own_headers(self) -> dict[str, str]:
        """Headers of a request the gateway makes itself (the policy's calls)."""
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        if self.key:
            headers["authorization"] = f"Bearer {self.key}"
        return headers

    async def send(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str] | Iterable[tuple[bytes, bytes]],
        content: bytes | None = None,
        query: str | None = None,
    ) -> UpstreamResponse:
        """Send a request; the response before its body is read. :class:`UpstreamError` if it cannot be asked."""
        if isinstance(headers, Mapping):
            sent = CIMultiDict(headers)
        else:
            sent = CIMultiDict((k.decode("latin-1"), v.decode("latin-1")) for k, v in headers)
        target = URL(f"{url}?{query}" if query else url, encoded=True)  # the client's query as it sent it
        try:
            response = await self.session.request(
                method, target, data=content, headers=sent, allow_redirects=False, compress=None
            )
        except _FAILURES as exc:
            raise _error(exc) from exc
        return UpstreamResponse(response)

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


async def raw_chunks(response: UpstreamResponse) -> AsyncIterator[bytes]:
    """The upstream's body bytes as they arrive.

    :raises UpstreamError: the upstream broke off (the status line is gone: the response to the client
        is cut too, see :class:`~reinforge_online.asgi.StreamResponse`).
    """
    try:
        async for chunk in response.chunks():
            yield chunk
    finally:
        await response.aclose()
