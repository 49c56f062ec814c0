"""Forwarding to an upstream: one pooled ``httpx.AsyncClient`` per base URL, and what headers cross.

Requests go on with the client's headers minus hop-by-hop headers, credentials and our own
``x-reinforge-*`` headers; the upstream's key is the gateway's own. Responses come back
with their status, body bytes and headers (minus hop-by-hop ones) as the upstream sent them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

import httpx

__all__ = ["Upstream", "request_headers", "response_headers"]

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


class Upstream:
    """One OpenAI-compatible base URL (``.../v1``) and its pooled client, made on the serving loop."""

    def __init__(self, url: str, key: str | None, *, timeout_s: float, max_connections: int) -> None:
        self.url = url.rstrip("/")
        self.key = key
        self.timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        self.limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._client: httpx.AsyncClient | None = None
        _ = self.client  # made now, not on the first request (loading CA certificates takes a while)

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            # Plain http:// never reaches TLS (redirects are not followed), so it needs no CA certificates.
            tls = self.url.startswith("https://")
            self._client = httpx.AsyncClient(
                timeout=self.timeout, limits=self.limits, follow_redirects=False, verify=tls
            )
        return self._client

    def target(self, path: str) -> str:
        """``/v1/chat/completions`` under this base URL (which ends in ``/v1`` like an OpenAI ``base_url``)."""
        return self.url + (path[3:] if path.startswith("/v1/") else path)

    def own_headers(self) -> dict[str, str]:
        """Headers of a request the gateway makes itself (the policy's calls)."""
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        if self.key:
            headers["authorization"] = f"Bearer {self.key}"
        return headers

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()


async def raw_chunks(response: httpx.Response) -> AsyncIterator[bytes]:
    """The upstream's body bytes as they arrive (encoded as sent); ends quietly if the upstream breaks off."""
    try:
        async for chunk in response.aiter_raw():
            yield chunk
    except httpx.HTTPError:
        return  # the status line is gone: the client sees a short body, as from the upstream itself
    finally:
        await response.aclose()
