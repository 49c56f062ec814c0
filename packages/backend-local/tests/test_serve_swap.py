"""Hot adapter swap on ``reinforge serve``: real uvicorn, the real SmolLM2, real clients.

Two LoRA adapters are made without training (random non-zero ``lora_B``, fixed seeds); their
greedy outputs are computed offline with peft's own ``merge_and_unload`` on a fresh base model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reinforge.testing import BackgroundServer

KEY = "traffic-key"
ADMIN = "admin-key"
CHAT = [{"role": "user", "content": "Name a colour."}]
MAX_TOKENS = 12


def _make_adapter(model_folder: Path, out: Path, seed: int) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(model_folder))
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    peft_model.save_pretrained(str(out))


def _offline_greedy(model_folder: Path, adapter: Path | None, prompt_ids: list[int]) -> list[int]:
    """The greedy tokens of base (+ adapter merged by peft itself), on the serving engine's code path."""
    from peft import PeftModel

    from reinforge_backend_local.inference.engine import Engine, GenRequest
    from reinforge_backend_local.model import packing
    from reinforge_backend_local.model.modeling import load_policy

    model, tokenizer, _ = load_policy(str(model_folder))
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    model.eval()
    packer = packing.Packer() if packing.available() else None
    if packer is not None:
        packing.install(model, packer)
    engine = Engine(model, tokenizer, max_model_len=512, packer=packer)
    request = GenRequest(prompt_ids, MAX_TOKENS, temperature=0.0, seed_key=(0, 0, 0), order_key=(0,))
    return engine.generate([request])[0].token_ids


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: Any, model_folder: Any) -> dict[str, Path]:
    import torch
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("adapters")
    out = {"a": root / "a", "b": root / "b"}
    _make_adapter(model_folder, out["a"], seed=1)
    _make_adapter(model_folder, out["b"], seed=2)
    # a checkpoint folder of a run whose adapter is B: the swap takes run and checkpoint folders too
    ckpt = root / "run" / "checkpoints" / "step-2"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text("{}")
    (ckpt / "adapter").symlink_to(out["b"], target_is_directory=True)
    out["run"] = root / "run"
    # shape mismatch: lora_A of one layer is 100 wide where the model's q_proj takes 576
    bad = root / "bad-shape"
    bad.mkdir()
    (bad / "adapter_config.json").write_text((out["a"] / "adapter_config.json").read_text())
    state = load_file(str(out["a"] / "adapter_model.safetensors"))
    key = next(k for k in sorted(state) if k.endswith("q_proj.lora_A.weight"))
    state[key] = torch.zeros(state[key].shape[0], 100)
    save_file(state, str(bad / "adapter_model.safetensors"))
    out["bad-shape"] = bad
    not_peft = root / "not-peft"
    not_peft.mkdir()
    (not_peft / "weights.txt").write_text("hello")
    out["not-peft"] = not_peft
    return out


@pytest.fixture(scope="module")
def prompt_ids(served: Any) -> list[int]:
    return list(served[0].template.prompt_ids(CHAT, None))


@pytest.fixture(scope="module")
def expected(model_folder: Any, adapters: dict[str, Path], prompt_ids: list[int], served: Any) -> dict[str, str]:
    """Greedy completion text of the chat prompt: base, base + A, base + B (computed offline)."""
    tok = served[0].tokenizer
    out = {}
    for which, adapter in (("base", None), ("a", adapters["a"]), ("b", adapters["b"])):
        out[which] = tok.decode(_offline_greedy(model_folder, adapter, prompt_ids), skip_special_tokens=True)
    assert len(set(out.values())) == 3, out  # the adapters do change the greedy output
    return out


@pytest.fixture(scope="module")
def server(served: Any) -> Iterator[BackgroundServer]:
    from reinforge_backend_local.serve.app import build_app

    model, metrics = served
    with BackgroundServer(build_app(model, api_key=KEY, metrics=metrics, admin_key=ADMIN)) as s:
        yield s


@pytest.fixture()
def http(server: BackgroundServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
        yield c


def _swap(http: httpx.Client, path: Any, key: str = ADMIN) -> httpx.Response:
    return http.post("/admin/adapter", json={"path": path}, headers={"Authorization": f"Bearer {key}"})


def _version(http: httpx.Client) -> int:
    r = http.get("/v1/models")
    assert r.status_code == 200, r.text
    return int(r.json()["data"][0]["policy_version"])


def _greedy(http: httpx.Client) -> tuple[str, int]:
    """(greedy text of the chat prompt, the response's x-policy-version)."""
    r = http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"], int(r.headers["x-policy-version"])


def _gauge(http: httpx.Client) -> float:
    text = http.get("/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("reinforge_serve_policy_version "))
    return float(line.split()[1])


def test_swap_to_an_adapter_and_back_to_base(http: httpx.Client, adapters: dict[str, Path], expected: Any) -> None:
    v0 = _version(http)
    if v0 == 0:  # the first test run on this server: it serves the base model
        assert _greedy(http) == (expected["base"], 0)
    r = _swap(http, str(adapters["a"]))
    assert r.status_code == 200, r.text
    assert r.headers["x-policy-version"] == str(v0 + 1) and r.json()["policy_version"] == v0 + 1
    assert r.json()["adapter"] == str(adapters["a"])
    assert _version(http) == v0 + 1 and _gauge(http) == v0 + 1
    card = http.get("/v1/models").json()["data"][0]
    assert card["adapter"] == str(adapters["a"])
    assert _greedy(http) == (expected["a"], v0 + 1)  # exactly peft's merge of A on the base

    # A -> B is base + B, not B merged on top of A (here through the run folder: its latest checkpoint)
    r = _swap(http, str(adapters["run"]))
    assert r.status_code == 200, r.text
    assert _greedy(http) == (expected["b"], v0 + 2)

    r = _swap(http, None)  # back to the base model, restored exactly
    assert r.status_code == 200, r.text
    assert r.json()["adapter"] is None
    assert _greedy(http) == (expected["base"], v0 + 3)
    assert http.get("/v1/models").json()["data"][0]["adapter"] is None
    completion = http.post("/v1/completions", json={"prompt": "1, 2, 3,", "max_tokens": 2, "temperature": 0})
    assert completion.status_code == 200 and completion.headers["x-policy-version"] == str(v0 + 3)


def test_swap_during_16_streaming_requests(
    server: BackgroundServer, served: Any, adapters: dict[str, Path], expected: Any
) -> None:
    import openai

    async def main() -> tuple[int, list[tuple[int, str]], tuple[str, int], httpx.Response]:
        headers = {"Authorization": f"Bearer {KEY}"}
        async with httpx.AsyncClient(base_url=server.base, headers=headers, timeout=120) as h:
            r = await h.post(
                "/admin/adapter", json={"path": str(adapters["a"])}, headers={"Authorization": f"Bearer {ADMIN}"}
            )
            assert r.status_code == 200, r.text
            v_a = int(r.headers["x-policy-version"])
            client = openai.AsyncOpenAI(base_url=f"{server.base}/v1", api_key=KEY, max_retries=0)
            first_chunk = asyncio.Event()

            async def one() -> tuple[int, str]:
                raw = await client.chat.completions.with_raw_response.create(
                    model=served[0].name,
                    messages=CHAT,  # type: ignore[arg-type]
                    max_tokens=MAX_TOKENS,
                    temperature=0,
                    stream=True,
                )
                version = int(raw.headers["x-policy-version"])
                text = ""
                async for chunk in raw.parse():
                    first_chunk.set()
                    if chunk.choices and chunk.choices[0].delta.content:
                        text += chunk.choices[0].delta.content
                return version, text

            tasks = [asyncio.create_task(one()) for _ in range(16)]
            await first_chunk.wait()  # at least one stream is running: swap now
            swap = await h.post(
                "/admin/adapter", json={"path": str(adapters["b"])}, headers={"Authorization": f"Bearer {ADMIN}"}
            )
            results = await asyncio.gather(*tasks)  # none fails
            after = await h.post(
                "/v1/chat/completions", json={"messages": CHAT, "max_tokens": MAX_TOKENS, "temperature": 0}
            )
            await client.close()
            return (
                v_a,
                list(results),
                (after.json()["choices"][0]["message"]["content"], int(after.headers["x-policy-version"])),
                swap,
            )

    v_a, results, after, swap = asyncio.run(main())
    assert swap.status_code == 200, swap.text
    assert swap.json()["policy_version"] == v_a + 1
    assert len(results) == 16
    for version, text in results:  # each response on the weights its header names
        assert version in (v_a, v_a + 1)
        assert text == (expected["a"] if version == v_a else expected["b"]), (version, text)
    assert any(version == v_a for version, _ in results)  # the one that sent its first chunk, at least
    assert after == (expected["b"], v_a + 1)


def test_admin_key(server: BackgroundServer, http: httpx.Client, adapters: dict[str, Path], expected: Any) -> None:
    v0, (text, _) = _version(http), _greedy(http)
    for headers in ({}, {"Authorization": f"Bearer {KEY}"}, {"Authorization": "Bearer nope"}, {"Authorization": ADMIN}):
        r = httpx.post(f"{server.base}/admin/adapter", json={"path": str(adapters["a"])}, headers=headers)
        assert r.status_code == 401, r.text
        assert "admin key" in r.json()["error"]["message"]
    assert _version(http) == v0 and _greedy(http) == (text, v0)  # nothing loaded
    # the admin key is not a traffic key
    r = httpx.get(f"{server.base}/v1/models", headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 401


def test_bad_adapter_is_a_400_and_the_old_weights_serve(http: httpx.Client, adapters: dict[str, Path]) -> None:
    v0, before = _version(http), _greedy(http)
    missing = adapters["a"].parent / "does-not-exist"
    cases = [
        (str(missing), "no such file or folder"),
        (str(adapters["not-peft"]), "not a PEFT adapter folder"),
        (str(adapters["bad-shape"]), "shape mismatch"),
    ]
    for path, problem in cases:
        r = _swap(http, path)
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert path in message and problem in message, message
        assert r.json()["error"]["param"] == "path"
        assert _version(http) == v0 and _gauge(http) == v0
        assert _greedy(http) == before  # the old weights keep serving
    for body in ({}, {"path": 3}):
        r = http.post("/admin/adapter", json=body, headers={"Authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 400 and "'path'" in r.json()["error"]["message"]
    assert _version(http) == v0


def test_admin_endpoint_disabled_without_an_admin_key(served: Any, adapters: dict[str, Path]) -> None:
    from reinforge_backend_local.serve.app import build_app

    model, metrics = served
    with BackgroundServer(build_app(model, api_key=KEY, metrics=metrics)) as s:
        for key in (KEY, ADMIN):
            r = httpx.post(
                f"{s.base}/admin/adapter", json={"path": str(adapters["a"])}, headers={"Authorization": f"Bearer {key}"}
            )
            assert r.status_code == 403 and "admin endpoint disabled" in r.json()["error"]["message"]


def test_same_key_for_traffic_and_admin_is_refused(served: Any) -> None:
    from reinforge.plugin import ConfigError
    from reinforge_backend_local.serve.app import build_app

    with pytest.raises(ConfigError, match="must differ"):
        build_app(served[0], api_key=KEY, admin_key=KEY)


def test_swapper_is_exact(model_folder: Any, adapters: dict[str, Path]) -> None:
    """A then B gives bit for bit peft's merge of B alone; None gives the base weights back."""
    import threading

    import torch
    from peft import PeftModel

    from reinforge_backend_local.model.modeling import load_policy
    from reinforge_backend_local.serve.model import AdapterSwapper

    model, _, _ = load_policy(str(model_folder))
    base = {k: v.clone() for k, v in model.state_dict().items()}
    swapper = AdapterSwapper(model, threading.Lock())
    swapper.apply(swapper.read(adapters["a"])[1])
    assert not torch.equal(
        model.state_dict()["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )
    folder, factors = swapper.read(adapters["b"])
    assert folder == adapters["b"]
    swapper.apply(factors)
    reference, _, _ = load_policy(str(model_folder))
    reference = PeftModel.from_pretrained(reference, str(adapters["b"])).merge_and_unload()
    want = reference.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in model.state_dict().items())
    swapper.apply(swapper.read(None)[1])
    assert all(torch.equal(v, base[k]) for k, v in model.state_dict().items())


def test_admin_key_env(monkeypatch: pytest.MonkeyPatch, model_folder: Any) -> None:
    import argparse

    from reinforge.plugin import ConfigError
    from reinforge_backend_local.serve import command

    parser = argparse.ArgumentParser()
    command.arguments(parser)
    monkeypatch.setenv("T_KEY", "same")
    monkeypatch.setenv("A_KEY", "same")
    args = parser.parse_args([str(model_folder), "--api-key-env", "T_KEY", "--admin-key-env", "A_KEY"])
    with pytest.raises(ConfigError, match="must differ"):
        command.build(args)
    args = parser.parse_args([str(model_folder), "--admin-key-env", "UNSET_ADMIN_KEY_ENV"])
    with pytest.raises(ConfigError, match="--admin-key-env"):
        command.build(args)


def test_adapter_given_at_start_swaps_away_exactly(model_folder: Any, adapters: dict[str, Path]) -> None:
    """``--adapter A`` at start merges A the swap's way: swapping to the base model gives the base back exactly."""
    import torch

    from reinforge_backend_local.model.modeling import load_policy
    from reinforge_backend_local.serve.model import load, resolve_source

    served = load(resolve_source(str(model_folder), str(adapters["a"])), max_batch=2, max_model_len=512)
    assert served.adapter == adapters["a"] and served.swapper is not None
    base = load_policy(str(model_folder))[0]
    model, swapper = served.engine.model, served.swapper

    def weight(name: str) -> Any:
        return _served_weight(swapper, name)

    def want(name: str) -> Any:
        return base.get_submodule(name).weight.detach()

    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert not torch.equal(weight("model.layers.0.self_attn.q_proj"), want("model.layers.0.self_attn.q_proj"))
    swapper.apply(swapper.read(None)[1])
    assert all(torch.equal(weight(n), want(n)) for n in names)


def test_released_weights_serve_packed_and_swap_exactly_from_the_folder(
    model_folder: Any, adapters: dict[str, Path]
) -> None:
    """``reinforge serve`` keeps each linear weight once (packed); a swap reads the base back from the folder."""
    import torch
    from peft import PeftModel

    from reinforge_backend_local.model.modeling import load_policy

    model, packer, swapper = _packed_model(model_folder)
    assert swapper.release(model_folder) == 7 * model.config.num_hidden_layers  # q k v o gate up down
    q = model.model.layers[0].self_attn.q_proj
    assert q.weight.shape == (576, 576) and q.weight.stride() == (0, 0)  # one number, the shape kept
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    embedding = model.get_input_embeddings().weight
    assert sum(storages.values()) < embedding.numel() * embedding.element_size() * 1.1  # the embedding, norms

    swapper.apply(swapper.read(adapters["b"])[1])
    reference, _, _ = load_policy(str(model_folder))
    merged = PeftModel.from_pretrained(reference, str(adapters["b"])).merge_and_unload()
    want = merged.model.layers[0].self_attn.q_proj.weight.detach()
    assert torch.equal(_unpacked(packer.pinned[id(q)], 576), want)  # peft's merge, exactly
    swapper.apply({})
    base, _, _ = load_policy(str(model_folder))
    assert torch.equal(_unpacked(packer.pinned[id(q)], 576), base.model.layers[0].self_attn.q_proj.weight.detach())


def test_projections_served_stacked_swap_exactly_and_cannot_run_alone(
    model_folder: Any, adapters: dict[str, Path]
) -> None:
    """q/k/v and gate/up are pinned as one stacked weight each; a swap re-stacks them from peft's merge, exactly."""
    import torch
    from peft import PeftModel

    from reinforge_backend_local.inference.decoder import LlamaDecoder, projection_groups
    from reinforge_backend_local.model.modeling import load_policy
    from reinforge_backend_local.serve.model import AdapterError

    model, packer, swapper = _packed_model(model_folder)
    layers = model.config.num_hidden_layers
    ids = torch.tensor([[1, 17, 250, 3001, 42, 9]])
    plain = model(ids).logits[0, -1].detach()
    assert swapper.release(model_folder, projection_groups(model)) == 7 * layers
    assert len(packer.groups) == 2 * layers and len(packer.pinned) == 2 * layers + 1  # o, down; the tied head
    embedding = model.get_input_embeddings().weight  # read from the file's pages, not a copy in memory
    assert _mapping_of(embedding.data_ptr()).endswith(str(model_folder / "model.safetensors"))
    tied = {"lm_head": (torch.zeros(2, 576), torch.zeros(model.lm_head.out_features, 2), 1.0)}
    with pytest.raises(AdapterError, match="lm_head.*model file"):  # a swap must not write into the file's pages
        swapper.apply(tied)
    with pytest.raises(RuntimeError, match="stacked"):  # its packed weight is the group's: no silent zeros
        model.model.layers[0].self_attn.k_proj(torch.zeros(1, 576))
    decoder = LlamaDecoder(model, packer)
    with torch.inference_mode():
        stacked = decoder.session().prefill([ids[0].tolist()], [0], 1)[0]
    torch.testing.assert_close(stacked, plain, atol=2e-3, rtol=0)  # the decoder's tolerance to HF

    swapper.apply(swapper.read(adapters["b"])[1])
    reference, _, _ = load_policy(str(model_folder))
    merged = PeftModel.from_pretrained(reference, str(adapters["b"])).merge_and_unload()
    names = [
        f"model.layers.{i}.{part}"
        for i in (0, layers - 1)
        for part in (
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        )
    ]
    for name in names:
        assert torch.equal(_served_weight(swapper, name), merged.get_submodule(name).weight.detach()), name
    swapper.apply({})
    base, _, _ = load_policy(str(model_folder))
    for name in names:
        assert torch.equal(_served_weight(swapper, name), base.get_submodule(name).weight.detach()), name


def _packed_model(model_folder: Any) -> tuple[Any, Any, Any]:
    """The model as serve holds it before :meth:`AdapterSwapper.release`: frozen, its linears on a packer."""
    import threading

    from reinforge_backend_local.model import packing
    from reinforge_backend_local.model.modeling import load_policy
    from reinforge_backend_local.serve.model import AdapterSwapper

    if not packing.available():
        pytest.skip("oneDNN is not available in this torch build")
    model, _, _ = load_policy(str(model_folder))
    model.requires_grad_(False)
    packer = packing.Packer()
    packing.install(model, packer)  # as serve does: the model's own linears run on the packer's weights
    return model, packer, AdapterSwapper(model, threading.Lock(), packer)


def _mapping_of(address: int) -> str:
    """The path of the memory mapping (``/proc/self/maps``) that holds ``address``, or ``''``."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *rest = line.split(maxsplit=5)
        first, end = (int(x, 16) for x in span.split("-"))
        if first <= address < end:
            return rest[-1] if len(rest) == 5 else ""
    return ""


def _served_weight(swapper: Any, name: str) -> Any:
    """What the decoder multiplies by for module ``name``: its rows of a stacked weight, its packed copy, or its weight."""
    module = swapper.modules[name]
    fan_in = module.weight.shape[1]
    if name in swapper.groups:
        group = swapper.groups[name]
        stacked = _unpacked(swapper.packer.group([swapper.modules[n] for n in group]), fan_in)
        first = sum(swapper.modules[n].weight.shape[0] for n in group[: group.index(name)])
        return stacked[first : first + module.weight.shape[0]]
    if swapper.released is not None and name in swapper.released.held:
        return _unpacked(swapper.packer.pinned[id(module)], fan_in)
    return module.weight


def _unpacked(packed: Any, fan_in: int) -> Any:
    """A packed weight as a plain one: the identity times it (each product is exact: one 1, the rest 0)."""
    import torch

    from reinforge_backend_local.model import packing

    return packing.packed_linear(torch.eye(fan_in), packed, None).T.contiguous()
