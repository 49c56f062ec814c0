"""reinforge-online's ``local`` committer with its real parts: the real SmolLM2 served by ``reinforge serve``
(uvicorn on 127.0.0.1), the real gateway in front of it (the committer found through online's
``register_committers`` hook), the openai client, feedback over HTTP, and the real
:class:`~reinforge_backend_local.training.adapter_trainer.AdapterTrainer` in the committer's spawned worker process;
versions checked on a run file made of the math example (its workflow, judges and 8 test questions).

``test_online_committer.py`` runs the same committer with a scripted trainer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reinforge.testing import BackgroundServer

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


def test_traffic_through_the_gateway_trains_a_version_that_is_then_served(
    tmp_path: Path, server: BackgroundServer, served: Any, model_folder: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import openai

    from reinforge.plugin import load_settings
    from reinforge_backend_local.online.committer import LocalCommitter
    from reinforge_backend_local.training.adapter_trainer import AdapterTrainer
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
        # the worker trained one update on the four recorded calls into a candidate version
        result = committer.last
        assert result["trained"] and result["step"] == 1 and result["samples"] == 4
        # on-policy: the trainer's recomputed logprobs at the request's temperature match the served ones
        assert result["metrics"]["ratio/mean"] == pytest.approx(1.0, abs=2e-3)
        version = result["version"]
        checkpoint = Path(result["checkpoint"])
        assert version.name == "step-1" and version.detail["checkpoint"] == str(checkpoint)
        assert checkpoint == run / "checkpoints" / "step-1" and (checkpoint / "adapter").is_dir()
        state = json.loads((checkpoint / "state.json").read_text())
        assert state["batches"] == [batch_id] and state["extra"]["baseline"]["count"] == 4
        promoter = getattr(gateway.pipeline, "promoter", None)  # reinforge-online's promotion gate, where it exists
        if promoter is not None:
            assert promoter.wait_decided(2, timeout=300)  # step-0 served at start, then step-1 (no gate configured)
        else:  # send does not serve: stand in for the promoter
            committer.serve(version)
        card = _card(server)
        assert Path(card["adapter"]) in (checkpoint, checkpoint / "adapter")
        served_as = str(card["policy_version"])
        assert int(served_as) > version_before
        # the next sampled call is answered by the served version, and recorded with its policy version
        raw = client.chat.completions.with_raw_response.create(
            model=served[0].name,
            messages=QUESTION,  # type: ignore[arg-type]
            max_tokens=4,
            temperature=0,
            extra_headers={"x-session-id": "user-9"},
        )
        gateway.store.submit(lambda db: None).result(30)  # the writer queue is FIFO: the call is written
        recorded = gateway.store.trace(raw.headers["x-reinforge-trace-id"])
        assert recorded["calls"][0]["policy_version"] == served_as
        first = gateway.store.trace(traces[0][0])
        assert first["calls"][0]["policy_version"] != served_as
    # a resend of the same batch id (a lost acknowledgement) trains nothing and names the same checkpoint
    trainer = AdapterTrainer(run, model_path=str(model_folder))
    assert trainer.step == 1 and trainer.head == "step-1" and trainer.trained(batch_id)
    again = trainer.train(batch_id, [])
    assert again == {**{k: v for k, v in result.items() if k in again}, "trained": False}
    assert again["checkpoint"] == str(checkpoint) and again["parent"] == "step-0"


def test_a_batch_split_into_mini_batches_takes_one_optimizer_step_each(tmp_path: Path, model_folder: Any) -> None:
    from reinforge.plugin import ConfigError
    from reinforge_backend_local.training.adapter_trainer import AdapterTrainer

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
    from reinforge_backend_local.model import checkpoint

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


SAMPLES = [
    {"prompt_ids": [1, 2, 3 + i], "completion_ids": [40 + i, 41], "old_logprobs": [-1.0, -1.0], "advantage": a}
    for i, a in enumerate((1.0, -1.0, 0.5, -0.5))
]


STUCK_WORKFLOW = """
import asyncio
from pathlib import Path


async def workflow(task, model):
    await model.chat([{"role": "user", "content": task["question"]}])
    (Path(__file__).parent / "answered").touch()
    await asyncio.Event().wait()
"""


def _math_run(tmp_path: Path, model: str = "smollm2-135m-instruct") -> Path:
    """A run file of the math example's workflow and judges over its first 8 test questions."""
    import shutil

    example = Path(__file__).resolve().parents[3] / "examples" / "math"
    folder = tmp_path / "check"
    (folder / "data").mkdir(parents=True)
    for name in ("workflow.py", "judges.py"):
        shutil.copy(example / name, folder / name)
    rows = (example / "data" / "test.jsonl").read_text().splitlines()
    (folder / "data" / "test.jsonl").write_text("\n".join(rows[:20]) + "\n")
    text = (example / "run.yaml").read_text()
    text = text.replace("train_dataset: {path: data, split: train, total_steps: 40}\n", "")
    text = text.replace("model_path: smollm2-135m-instruct", f"model_path: {model}")
    (folder / "run.yaml").write_text(text)
    return folder / "run.yaml"


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _checkpoint_adapter(folder: Path) -> dict[str, Any]:
    from peft.utils import load_peft_weights

    return dict(load_peft_weights(str(folder / "adapter"), device="cpu"))


def _peft_state(trainer: Any) -> dict[str, Any]:
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(trainer.model).items()}


def test_versions_are_checked_lent_and_restored_exactly(tmp_path: Path, model_folder: Any) -> None:
    import torch

    from reinforge.plugin import ModelConfig, get_plugin_manager
    from reinforge.testing import HookRecorder
    from reinforge_backend_local.model.compute import on_compute_thread
    from reinforge_backend_local.online.version_check import CheckTimeout, check_version
    from reinforge_backend_local.training.adapter_trainer import AdapterTrainer

    lora = ModelConfig(model_path=str(model_folder), lora_rank=4, lora_alpha=8)
    trainer = on_compute_thread(
        AdapterTrainer, tmp_path / "run", model_path=str(model_folder), lora=lora, learning_rate=1e-2, keep=5
    )
    initial = on_compute_thread(trainer.weights)
    one = on_compute_thread(trainer.train, "b1", SAMPLES, extra={"baseline": {"n": 1}})
    two = on_compute_thread(trainer.train, "b2", SAMPLES[::-1], extra={"baseline": {"n": 2}})
    assert (one["step"], two["step"], two["parent"]) == (1, 2, "step-1")
    current = on_compute_thread(trainer.weights)
    assert not _same(current, initial)
    step1 = tmp_path / "run" / "checkpoints" / "step-1"

    # lending a version's weights and putting the current ones back is exact
    saved = on_compute_thread(trainer.swap_in, "step-1")
    assert _same(_peft_state(trainer), _checkpoint_adapter(step1))
    on_compute_thread(trainer.put_back, saved)
    assert _same(on_compute_thread(trainer.weights), current)

    run_file = _math_run(tmp_path, str(model_folder))
    pm = get_plugin_manager()
    with HookRecorder.attach(pm) as hooks:
        results = {
            name: check_version(trainer, name, run=str(run_file), split=None, limit=8, timeout_s=600, plugin_manager=pm)
            for name in ("step-0", "step-1", "step-2")
        }
    for name, out in results.items():
        assert 0.0 <= out["score"] <= 1.0 and out["tasks"] == 8, (name, out)
        assert out["metrics"]["accuracy"] == out["score"] and "reward/correct" in out["metrics"]
        assert out["seconds"] > 0
    # a check is not a run: no lifecycle, no trajectories for observers
    assert not {"on_run_start", "on_step_end", "on_run_end", "on_trajectory"} & set(hooks.names())
    assert _same(on_compute_thread(trainer.weights), current) and trainer.head == "step-2"
    with pytest.raises(CheckTimeout, match="took longer than 0.001 s"):
        check_version(trainer, "step-1", run=str(run_file), split=None, limit=8, timeout_s=0.001)
    # a workflow that never ends: its rollouts are cancelled at the timeout, after the model answered once
    (run_file.parent / "stuck.py").write_text(STUCK_WORKFLOW)
    stuck = run_file.with_name("stuck.yaml")
    stuck.write_text(run_file.read_text().replace("workflow: workflow:math_workflow", "workflow: stuck:workflow"))
    with pytest.raises(CheckTimeout, match="on 2 tasks took longer than 5 s"):
        check_version(trainer, "step-1", run=str(stuck), split=None, limit=2, timeout_s=5)
    assert (run_file.parent / "answered").exists()
    assert _same(on_compute_thread(trainer.weights), current)

    # training goes back to step-1: its adapter, optimizer moments and extra; the next step is 3
    assert on_compute_thread(trainer.restore, "step-1") is True
    assert _same(_peft_state(trainer), _checkpoint_adapter(step1))
    moments = torch.load(step1 / "optimizer.pt", map_location="cpu")["state"]
    now = trainer.trainer.optimizer.state_dict()["state"]
    assert moments.keys() == now.keys() and all(_same(moments[k], now[k]) for k in moments)
    assert trainer.extra == {"baseline": {"n": 1}} and trainer.head == "step-1"
    three = on_compute_thread(trainer.train, "b3", SAMPLES)
    assert (three["step"], three["parent"]) == (3, "step-1")
    # and back to step-0: the initial adapter, no moments, no extra
    assert on_compute_thread(trainer.restore, "step-0") is True
    assert _same(on_compute_thread(trainer.weights), initial)
    assert trainer.trainer.optimizer.state_dict()["state"] == {} and trainer.extra == {}
    assert on_compute_thread(trainer.restore, "step-0") is False
    # a trainer started on the folder later resumes where training went back to, with the same step-0
    again = on_compute_thread(AdapterTrainer, tmp_path / "run", model_path=str(model_folder))
    assert again.head == "step-0" and _same(on_compute_thread(again.weights), initial)
    assert on_compute_thread(again.train, "b4", SAMPLES)["step"] == 4


def test_the_committer_checks_versions_in_its_worker(tmp_path: Path, model_folder: Any) -> None:
    from local_testlib import SWAP_KEY, FakeAdmin

    from reinforge_backend_local.online.committer import LocalCommitter, LocalCommitterSettings, options_of
    from reinforge_online.versions import CheckResult, CheckSpec

    fake = FakeAdmin()
    settings = LocalCommitterSettings(
        admin_key_env="SWAP", model=str(model_folder), lora_rank=4, lora_alpha=8, threads=2
    )
    options = {**options_of(settings), "learning_rate": 1e-2, "nice": 0}
    with BackgroundServer(fake.app()) as admin:
        committer = LocalCommitter(tmp_path / "run", admin_url=admin.base, admin_key=SWAP_KEY, options=options)
        try:
            rows = [
                {
                    "reward": r,
                    "calls": [
                        {
                            "request": {"messages": QUESTION},
                            "prompt_token_ids": [1, 2, 3],
                            "token_ids": [40 + i, 41],
                            "logprobs": [-1.0, -1.0],
                        }
                    ],
                }
                for i, r in enumerate((1.0, 0.0, 1.0, 0.0))
            ]
            version = committer.send("b1", rows)
            assert version is not None and version.name == "step-1" and fake.paths == []
            spec = CheckSpec(str(_math_run(tmp_path, str(model_folder))), limit=8, timeout_s=600)
            for v in (committer.initial_version(), version):
                result = committer.check(v, spec)
                assert isinstance(result, CheckResult) and result.tasks == 8 and 0.0 <= result.score <= 1.0
            committer.train_from(committer.initial_version())
            assert committer.status()["head"] == "step-0"
            assert committer.send("b2", rows).detail["parent"] == "step-0"
            assert committer.serve(version) == "1" and fake.paths == [str(tmp_path / "run" / "checkpoints" / "step-1")]
        finally:
            committer.close()


def test_a_run_folder_from_before_versions_gets_its_step_0(tmp_path: Path, model_folder: Any) -> None:
    import shutil

    import torch

    from reinforge.plugin import ModelConfig
    from reinforge_backend_local.training.adapter_trainer import AdapterTrainer

    lora = ModelConfig(model_path=str(model_folder), lora_rank=4, lora_alpha=8)
    run = tmp_path / "run"
    first = AdapterTrainer(run, model_path=str(model_folder), lora=lora, learning_rate=1e-2)
    first.train("b1", SAMPLES)
    shutil.rmtree(run / "initial")  # what 0.4 wrote: checkpoints only
    trainer = AdapterTrainer(run, model_path=str(model_folder))
    assert trainer.head == "step-1" and (run / "initial" / "adapter" / "adapter_config.json").exists()
    assert _same(_peft_state(trainer), _checkpoint_adapter(run / "checkpoints" / "step-1"))
    assert trainer.restore("step-0")
    weights = trainer.weights()
    lora_b = [w for name, w in weights.items() if ".lora_B." in name]
    assert lora_b and all(torch.count_nonzero(w) == 0 for w in lora_b)  # a fresh LoRA: the base model's outputs
    assert any(torch.count_nonzero(w) for name, w in weights.items() if ".lora_A." in name)
