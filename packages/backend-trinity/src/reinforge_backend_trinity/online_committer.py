"""reinforge-online's ``trinity`` committer: rewarded traces go to a Trinity-RFT explorer in serve mode.

Registered through reinforge-online's ``register_committers`` hook (an optional hookimpl in
:mod:`reinforge_backend_trinity.plugin`: this package works without reinforge-online), so
``online.yaml`` says ``committer: {kind: trinity, args: {url: ...}}`` (:class:`TrinityCommitterSettings`).

Trinity's serve mode (``mode: serve``) runs an OpenAI-compatible proxy in front of its vLLM engines that
records every reply under its response id. Point the gateway at it (``policy.url`` in ``route`` mode, or
``upstream.url`` in ``record`` mode) and each recorded call keeps that id. A committed batch then becomes one
``POST /feedback {reward, msg_ids, task_id, run_id}`` per trace (its calls' response ids, the trace id as
``task_id``) and one ``POST /commit``, which moves the rewarded replies into Trinity's experience buffer,
where its trainer takes them. The client is this package's :class:`~.serve_client.ServeClient` (httpx only:
the gateway does not need trinity-rft installed).

A failed request raises, so the outbox sends the batch again with the same id. Trinity 0.6.0 forgets the
replies it committed and answers ``success`` to feedback for ids it does not know, so a resend after a
commit that went through adds nothing to its buffer; a resend after a partial feedback pass rewards the
same replies again with the same rewards. Traces whose calls carry no response id (a fallback to another
upstream) cannot be matched and are skipped, counted in ``skipped_traces``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reinforge.plugin import ConfigError, FieldError, Settings, at_least

from .serve_client import ServeClient

if TYPE_CHECKING:
    from reinforge_online import CommitterContext

__all__ = ["TrinityCommitter", "TrinityCommitterSettings", "feedback_of", "trinity_committer"]

_log = logging.getLogger("reinforge_backend_trinity.online_committer")


@dataclass
class TrinityCommitterSettings(Settings):
    """``committer.args`` of ``kind: trinity``: the serve-mode explorer, by URL or by Trinity's job folder."""

    url: str | None = None  # the explorer's proxy (root or .../v1)
    job_dir: str | None = None  # ... or Trinity's checkpoint job folder (explorer_server_url.txt in it)
    timeout_s: float = 60.0  # per request to the explorer

    def check(self) -> None:
        if (self.url is None) == (self.job_dir is None):
            raise FieldError("url", "set exactly one of url and job_dir")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise FieldError("url", f"expected an http:// or https:// URL, got {self.url!r}")
        at_least("timeout_s", self.timeout_s, 0.0, strict=True)


def feedback_of(rows: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """A batch's rows as ``/feedback`` bodies (reward, msg_ids, task_id), and how many traces had no ids."""
    out, skipped = [], 0
    for row in rows:
        reward = row.get("reward")
        ids = [
            str(call["response"]["id"])
            for call in row.get("calls") or ()
            if isinstance(call.get("response"), dict) and call["response"].get("id")
        ]
        if reward is None or not ids:
            skipped += 1
            continue
        out.append({"reward": float(reward), "msg_ids": ids, "task_id": str(row.get("trace_id"))})
    return out, skipped


class TrinityCommitter:
    """Sends each batch to one Trinity serve-mode explorer: feedback for every trace, then a commit.

    :param url: the explorer's URL (its proxy's root or ``.../v1``); or
    :param job_dir: Trinity's checkpoint job folder, where the explorer writes ``explorer_server_url.txt``
        (read at each send, so a restarted explorer on a new port is found).
    :param client: a factory of the client (tests); default :class:`~.serve_client.ServeClient`.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        job_dir: str | Path | None = None,
        timeout_s: float = 60.0,
        client: Callable[..., Any] | None = None,
    ) -> None:
        if (url is None) == (job_dir is None):
            raise ConfigError("TrinityCommitter: set exactly one of url and job_dir")
        self.url = url
        self.job_dir = Path(job_dir) if job_dir is not None else None
        self.timeout_s = timeout_s
        self._client: Any = client or ServeClient
        self.skipped_traces = 0
        self.commits = 0

    def _open(self) -> Any:
        if self.job_dir is not None:
            return self._client.from_job_dir(self.job_dir, timeout=self.timeout_s)
        return self._client(self.url, timeout=self.timeout_s)

    def send(self, batch_id: str, rows: list[dict[str, Any]]) -> None:
        """Feedback for each trace of the batch, then one commit; raises on any failure (the batch is resent)."""
        bodies, skipped = feedback_of(rows)
        asyncio.run(self._send(bodies))
        self.skipped_traces += skipped
        self.commits += 1
        _log.info(
            "batch %s: %d traces rewarded in Trinity and committed (%d without ids)", batch_id, len(bodies), skipped
        )

    async def _send(self, bodies: list[dict[str, Any]]) -> None:
        async with self._open() as client:
            for body in bodies:
                await client.feedback(body["reward"], body["msg_ids"], task_id=body["task_id"])
            await client.commit()


def trinity_committer(settings: TrinityCommitterSettings, context: CommitterContext) -> TrinityCommitter:
    """The factory registered as ``trinity``: ``job_dir`` resolved against ``online.yaml``'s folder."""
    job_dir = context.path(settings.job_dir) if settings.job_dir is not None else None
    return TrinityCommitter(settings.url, job_dir=job_dir, timeout_s=settings.timeout_s)
