"""``reinforge export``: a real one-step run of SmolLM2, exported merged and as an adapter, loaded back.

The reference policy is built the way the backend builds it (``load_policy`` + ``attach_lora``, the
checkpoint's adapter weights loaded into it) and decodes unmerged, so a merged export that lacked
the adapter, or merged it wrongly, gives other logits.
"""

import json
import shutil
import zlib
from pathlib import Path

import pytest
import torch

from reinforge import JudgeOutput, WorkflowOutput, tune
from reinforge.plugin import AlgorithmConfig, DatasetConfig, ModelConfig
from reinforge.testing import cli_main
from reinforge_backend_local.model import checkpoint
from reinforge_backend_local.serve.export import export_run

PROMPTS = ["What is 2 + 2?", "Name a colour.", "Say hello.", "What is the capital of France?", "Count to three."]
NEW_TOKENS = 8
LORA = {"lora_rank": 8, "lora_alpha": 16}


async def workflow(task, model):
    return WorkflowOutput(response=await model.chat([{"role": "user", "content": task["question"]}]))


def judge(task, response):
    # Spread-out rewards: two different samples of a group almost surely differ, so the step has a gradient.
    return JudgeOutput(reward=(zlib.crc32(response.content.encode()) % 1000) / 1000.0)


@pytest.fixture(scope="module")
def run_dir(model_folder, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export-run")
    data = tmp / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + {i}?"}) + "\n" for i in range(8)))
    summary = tune(
        workflow_func=workflow,
        judge_func=judge,
        train_dataset=DatasetConfig(path=str(data), total_steps=1),
        model=ModelConfig(model_path=str(model_folder), max_tokens=6, **LORA),
        algorithm=AlgorithmConfig(group_size=2, batch_size=2, learning_rate=1e-2, save_interval_steps=1, seed=3),
        backend="local",
        backend_args={"output_dir": str(tmp / "runs"), "progress": False, "tensorboard": False},
        report={"enabled": False},
    )
    return Path(summary["run_dir"])


def _tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def _greedy(model, tokenizer):
    """Greedy completions and last-step logits of PROMPTS, through the chat template."""
    texts, logits = [], []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
            )["input_ids"]
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
            )
            texts.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
            logits.append(model(input_ids=ids).logits[0, -1].float())
    return texts, torch.stack(logits)


@pytest.fixture(scope="module")
def reference(run_dir, model_folder):
    """The run's policy as the backend builds it, the checkpoint's adapter loaded, decoding unmerged."""
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    from reinforge_backend_local.model.modeling import load_policy
    from reinforge_backend_local.model.weights import attach_lora

    model, tokenizer, _ = load_policy(str(model_folder))
    model = attach_lora(model, ModelConfig(model_path=str(model_folder), **LORA))
    ckpt = checkpoint.latest(run_dir)
    set_peft_model_state_dict(model, load_peft_weights(str(ckpt / "adapter"), device="cpu"))
    model.eval()
    return _greedy(model, tokenizer)


def _export(capsys, *args):
    code = cli_main(["export", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_merged_export_loads_with_transformers_and_decodes_like_the_runs_policy(
    run_dir, model_folder, reference, tmp_path, capsys
):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "merged"
    code, said = _export(capsys, run_dir, "--out", out, "--merged")
    assert code == 0, said
    assert str(out) in said
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= names, names
    assert not any(name.endswith((".bin", ".pt")) for name in names), names
    assert not (out / "adapter_config.json").exists()

    model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    tokenizer = _tokenizer(out)
    assert tokenizer.chat_template and tokenizer.chat_template == _tokenizer(model_folder).chat_template
    assert model.dtype == torch.float32
    assert all(type(m).__name__ != "LoraLayer" for m in model.modules())
    texts, logits = _greedy(model, tokenizer)
    ref_texts, ref_logits = reference
    assert texts == ref_texts
    assert torch.allclose(logits, ref_logits, atol=1e-4), (logits - ref_logits).abs().max()

    # The adapter really is in the weights: the attention projections moved, the rest did not.
    merged, base = load_file(str(out / "model.safetensors")), load_file(str(model_folder / "model.safetensors"))
    q = "model.layers.0.self_attn.q_proj.weight"
    assert (merged[q] - base[q]).abs().max() > 1e-5
    mlp = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(merged[mlp], base[mlp])
    base_logits = _greedy(AutoModelForCausalLM.from_pretrained(str(model_folder)).eval(), tokenizer)[1]
    assert not torch.allclose(logits, base_logits, atol=1e-4)


def test_adapter_export_loads_with_peft_on_the_recorded_base_folder(run_dir, model_folder, reference, tmp_path, capsys):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "adapter"
    code, said = _export(capsys, checkpoint.latest(run_dir), "--out", out, "--adapter")
    assert code == 0, said
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(model_folder.absolute())
    assert (out / "adapter_model.safetensors").exists()

    base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"])
    model = PeftModel.from_pretrained(base, str(out)).eval()
    texts, logits = _greedy(model, _tokenizer(model_folder))
    assert texts == reference[0]
    assert torch.allclose(logits, reference[1], atol=1e-4)


def test_export_run_from_python_and_force_replaces_a_non_empty_out(run_dir, tmp_path, capsys):
    out = tmp_path / "adapter"
    out.mkdir()
    (out / "old.txt").write_text("old")
    code, said = _export(capsys, run_dir, "--out", out, "--adapter")
    assert code == 1
    assert f"--out {out} exists and is not empty; pass --force" in said and "Traceback" not in said
    assert (out / "old.txt").exists()
    assert export_run(run_dir, out, merged=False, force=True) == out
    assert (out / "adapter_config.json").exists() and not (out / "old.txt").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert export_run(run_dir, empty, merged=False) == empty


def _fake_run(run_dir, tmp_path, *, checkpoint_files=(), dtype=None):
    """A run folder with the real run's config.json and, optionally, one checkpoint made of these files."""
    fake = tmp_path / "fake-run"
    (fake / "checkpoints").mkdir(parents=True)
    config = json.loads((run_dir / "config.json").read_text())
    if dtype is not None:
        config["model"]["dtype"] = dtype
    (fake / "config.json").write_text(json.dumps(config))
    if checkpoint_files:
        ckpt = fake / "checkpoints" / "step-1"
        ckpt.mkdir()
        for name in checkpoint_files:
            (ckpt / name).write_text("{}")
    return fake


def test_a_run_folder_without_checkpoints_is_an_error_naming_it(run_dir, tmp_path, capsys):
    fake = _fake_run(run_dir, tmp_path)
    code, said = _export(capsys, fake, "--out", tmp_path / "out")
    assert code == 1 and "Traceback" not in said
    assert f"the run folder {fake} has no checkpoint" in said
    assert not (tmp_path / "out").exists()


def test_a_missing_path_is_an_error(tmp_path, capsys):
    code, said = _export(capsys, tmp_path / "nope", "--out", tmp_path / "out")
    assert code == 1 and "Traceback" not in said
    assert f"{tmp_path / 'nope'} does not exist" in said


def test_a_full_finetune_checkpoint_has_no_adapter_to_export(run_dir, tmp_path, capsys):
    fake = _fake_run(run_dir, tmp_path, checkpoint_files=("state.json", "model.pt"))
    code, said = _export(capsys, fake, "--out", tmp_path / "out", "--adapter")
    assert code == 1 and "Traceback" not in said
    assert "is a full fine-tune checkpoint" in said and "use --merged" in said
    assert not (tmp_path / "out").exists()


def test_a_full_finetune_checkpoint_exports_its_weights_merged(run_dir, model_folder, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    fake = _fake_run(run_dir, tmp_path, checkpoint_files=("state.json",))
    weights = AutoModelForCausalLM.from_pretrained(str(model_folder)).state_dict()
    weights["model.layers.0.mlp.up_proj.weight"] += 0.5
    torch.save(weights, fake / "checkpoints" / "step-1" / "model.pt")
    code, said = _export(capsys, fake, "--out", tmp_path / "out")
    assert code == 0, said
    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).state_dict()
    assert torch.equal(exported["model.layers.0.mlp.up_proj.weight"], weights["model.layers.0.mlp.up_proj.weight"])


def test_a_bfloat16_run_exports_bfloat16_weights(run_dir, tmp_path, capsys):
    from safetensors.torch import load_file

    fake = _fake_run(run_dir, tmp_path, dtype="bfloat16")
    shutil.copytree(checkpoint.latest(run_dir), fake / "checkpoints" / "step-1")
    code, said = _export(capsys, fake, "--out", tmp_path / "out")
    assert code == 0, said
    weights = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert {w.dtype for w in weights.values()} == {torch.bfloat16}


def test_a_lone_full_finetune_checkpoint_names_what_is_missing(tmp_path, capsys):
    ckpt = tmp_path / "step-3"
    ckpt.mkdir()
    (ckpt / "state.json").write_text("{}")
    (ckpt / "model.pt").write_text("")
    code, said = _export(capsys, ckpt, "--out", tmp_path / "out")
    assert code == 1 and "Traceback" not in said
    assert f"cannot tell which base model {ckpt} was trained from" in said


def test_out_may_not_be_the_run_folder(run_dir, capsys):
    code, said = _export(capsys, run_dir, "--out", run_dir, "--force")
    assert code == 1 and "Traceback" not in said
    assert "would overwrite" in said
    assert checkpoint.latest(run_dir) is not None
