"""reinforge-online's ``local`` committer with its real parts: the real SmolLM2 served by ``reinforge serve``
(uvicorn on 127.0.0.1), the real gateway in front of it (the committer found through online's
``register_committers`` hook), the openai client, feedback over HTTP, and the real
:class:`~reinforge_backend_local.adapter_trainer.AdapterTrainer` in the committer's spawned worker process.

``test_online_committer.py`` runs the same committer with a scripted trainer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_serve import BackgroundServer

pytest.importorskip("reinforge_online")

KEY = "serve-traffic"
ADMIN = "serve-admin"
GATEWAY_KEYS = {"T": "gw-traffic", "A": "gw-admin", "F": "gw-feedback-secret", "SWAP": ADMIN}
QUESTION = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def server(served: Any) -> Iterator[BackgroundServer]:
    from reinforge_backend_local.serve.app import build_app

    model, metrics = served
    with BackgroundServer(build_app(model, api_key=KEY, metrics=metrics, admin_key=ADMIN)) as s:
        yield s


def _card(server: BackgroundServer) -> dict[str, Any]:
    r = httpx.get(f"{server.base}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert r.status_code == 200, r.text
    card: dict[str, Any] = r.json()["data"][0]
    return card


def test_traffic_through_the_gateway_trains_and_swaps_the_served_adapter(
    tmp_path: Path, server: BackgroundServer, served: Any, model_folder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import openai

    from reinforge.plugin import load_settings
    from reinforge_backend_local.adapter_trainer import AdapterTrainer
    from reinforge_backend_local.online_committer import LocalCommitter
    from reinforge_online.app import build_app
    from reinforge_online.config import OnlineSettings, resolve_secrets

    for name, value in GATEWAY_KEYS.items():
        monkeypatch.setenv(name, value)
    run = tmp_path / "online-run"
    data = {
        "upstream": {"url": f"{server.base}/v1", "key_env": None},
        "policy": {"url": f"{server.base}/v1", "model": served[0].name},
        "auth": {"traffic_key_env": "T", "admin_key_env": "A", "feedback_secret_env": "F"},
        "store": {"path": str(tmp_path / "traces.sqlite")},
        "selection": {"sampling_rate": 1.0},
        "committer": {
            "kind": "local",
            "interval_s": 600,  # only the trace count triggers the commit here
            "min_traces": 4,
            "args": {
                "run_dir": str(run),
                "model": str(model_folder),
                "admin_key_env": "SWAP",
                "learning_rate": 1e-3,
                "lora_rank": 4,
                "lora_alpha": 8,
                "threads": 1,
            },
        },
    }
    monkeypatch.setenv("SERVE_KEY", KEY)
    data["policy"]["key_env"] = "SERVE_KEY"
    data["upstream"]["key_env"] = "SERVE_KEY"
    settings = load_settings(OnlineSettings, data, where="online.yaml")
    version_before = int(_card(server)["policy_version"])
    app = build_app(settings, resolve_secrets(settings))
    gateway = app.state.gateway
    with BackgroundServer(app) as gw:
        client = openai.OpenAI(base_url=f"{gw.base}/v1", api_key=GATEWAY_KEYS["T"], max_retries=0)
        traces = []
        for i in range(4):
            raw = client.chat.completions.with_raw_response.create(
                model=served[0].name,
                messages=QUESTION,  # type: ignore[arg-type]
                max_tokens=8,
                temperature=0.9,
                extra_headers={"x-session-id": f"user-{i}"},
            )
            assert raw.parse().choices[0].message.content is not None
            traces.append((raw.headers["x-reinforge-trace-id"], raw.headers["x-reinforge-feedback-token"]))
        for i, (trace_id, token) in enumerate(traces):
            r = httpx.post(
                f"{gw.base}/online/v1/feedback",
                json={"trace_id": trace_id, "reward": float(i % 2)},
                headers={"Authorization": f"Bearer {GATEWAY_KEYS['T']}", "x-reinforge-feedback-token": token},
                timeout=30,
            )
            assert r.status_code == 200, r.text
        outbox = gateway.pipeline.outbox
        assert outbox is not None and outbox.wait_committed(1, timeout=300), "no batch was committed"
        committer = gateway.pipeline.committer
        assert isinstance(committer, LocalCommitter) and committer is outbox.committer
        (batch_id,) = outbox.committed
        # the worker trained one update on the four recorded calls, then the server loaded its checkpoint
        result = committer.last
        assert result["trained"] and result["step"] == 1 and result["samples"] == 4
        # on-policy: the trainer's recomputed logprobs at the request's temperature match the served ones
        assert result["metrics"]["ratio/mean"] == pytest.approx(1.0, abs=2e-3)
        checkpoint = Path(result["checkpoint"])
        assert checkpoint == run / "checkpoints" / "step-1" and (checkpoint / "adapter").is_dir()
        state = json.loads((checkpoint / "state.json").read_text())
        assert state["batches"] == [batch_id] and state["extra"]["baseline"]["count"] == 4
        card = _card(server)
        assert int(card["policy_version"]) == version_before + 1
        assert result["server"]["policy_version"] == version_before + 1
        # the next sampled call is answered by the swapped-in policy, and recorded with its version
        raw = client.chat.completions.with_raw_response.create(
            model=served[0].name,
            messages=QUESTION,  # type: ignore[arg-type]
            max_tokens=4,
            temperature=0,
            extra_headers={"x-session-id": "user-9"},
        )
        gateway.store.submit(lambda db: None).result(30)  # the writer queue is FIFO: the call is written
        recorded = gateway.store.trace(raw.headers["x-reinforge-trace-id"])
        assert recorded["calls"][0]["policy_version"] == str(version_before + 1)
        first = gateway.store.trace(traces[0][0])
        assert first["calls"][0]["policy_version"] == str(version_before)
    # a resend of the same batch id (a lost acknowledgement) trains nothing and swaps the same checkpoint again
    trainer = AdapterTrainer(run, model_path=str(model_folder))
    assert trainer.step == 1 and trainer.trained(batch_id) and trainer.latest() == checkpoint
    again = trainer.train(batch_id, [])
    assert again == {"checkpoint": str(checkpoint), "trained": False, "step": 1}


def test_a_batch_split_into_mini_batches_takes_one_optimizer_step_each(tmp_path: Path, model_folder: Any) -> None:
    from reinforge.plugin import ConfigError
    from reinforge_backend_local.adapter_trainer import AdapterTrainer

    samples = [
        {"prompt_ids": [1, 2, 3 + i], "completion_ids": [40 + i, 41], "old_logprobs": [-1.0, -1.0], "advantage": a}
        for i, a in enumerate((1.0, -1.0, 0.5, -0.5, 1.0))
    ]
    trainer = AdapterTrainer(tmp_path / "run", model_path=str(model_folder), mini_batch_size=2, learning_rate=1e-3)
    out = trainer.train("b1", samples)
    assert out["trained"] and out["metrics"]["train/optimizer_steps"] == 3.0  # 2 + 2 + 1
    assert out["metrics"]["train/samples"] == 5.0
    steps = {int(state["step"]) for state in trainer.trainer.optimizer.state.values()}
    assert steps == {3}
    with pytest.raises(ConfigError, match="mini_batch_size: must be at least 1"):
        AdapterTrainer(tmp_path / "other", model_path=str(model_folder), mini_batch_size=0)


def test_a_half_written_checkpoint_a_crash_left_is_not_the_latest(tmp_path: Path) -> None:
    from reinforge_backend_local import checkpoint

    for name, complete in (
        ("step-1", True),
        ("step-2", True),
        ("step-10", True),
        ("step-11.tmp", True),
        ("step-12", False),
    ):
        folder = tmp_path / "checkpoints" / name
        folder.mkdir(parents=True)
        if complete:
            (folder / "state.json").write_text("{}")
    assert [p.name for p in checkpoint.steps(tmp_path)] == ["step-1", "step-2", "step-10"]
    assert checkpoint.latest(tmp_path) == tmp_path / "checkpoints" / "step-10"
