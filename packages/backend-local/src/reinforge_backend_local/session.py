"""One training run of the local backend, from model loading to the final report."""

from __future__ import annotations

import asyncio
import json
import math
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

from reinforge.config import ModelConfig
from reinforge.errors import ConfigError
from reinforge.evaluation import accuracy_of, check_accuracy_key
from reinforge.models import RecordingChatModel

from . import checkpoint, packing
from .endpoint import PolicyEndpoint
from .engine import Engine, MicroBatcher
from .memory import limit_malloc_arenas
from .metrics_log import MetricsLog
from .modeling import DEFAULT_MODEL, load_policy
from .policy import ChatTemplate, PolicyChatModel
from .trainer import Trainer, build_samples
from .weights import attach_lora, merged_for_decode


def _say(message: str) -> None:
    print(f"reinforge: {message}", file=sys.stderr, flush=True)


class Policy:
    """Model, tokenizer, engine, batcher and endpoint: everything that generates."""

    def __init__(
        self,
        mc: ModelConfig,
        *,
        max_batch: int,
        window_s: float,
        lora: bool,
        fast_decode: bool = True,
        kv_cache_mb: float = 1024,
        prepacked_weights: bool = True,
    ):
        self.config = mc
        limit_malloc_arenas()  # decode threads and the training thread share freed memory
        model, tokenizer, self.folder = load_policy(mc.model_path, dtype=mc.dtype)
        self.peft = lora and not mc.full_finetune
        if self.peft:
            model = attach_lora(model, mc)
        elif lora:
            model.requires_grad_(True)
        self.model = model
        self.tokenizer = tokenizer
        self.name = mc.model_path or DEFAULT_MODEL
        packer = packing.Packer() if prepacked_weights and packing.available() else None
        if packer is not None:
            packing.install(model, packer)  # frozen layers train on the packed weights too
        self.engine = Engine(
            model,
            tokenizer,
            max_model_len=mc.max_model_len,
            max_batch=max_batch,
            fast=fast_decode,
            kv_cache_mb=kv_cache_mb,
            packer=packer,
        )
        self.batcher = MicroBatcher(self.engine, window_s=window_s)
        self.template = ChatTemplate(tokenizer, mc.max_model_len)
        self.endpoint = PolicyEndpoint(self.name).start()

    def provider(self, seed_key: tuple, version: int, sampling: dict[str, Any]):
        """A model provider for the runner: each trajectory gets its own recorded policy model."""

        def make(t: Any) -> RecordingChatModel:
            model = PolicyChatModel(
                self.batcher,
                self.template,
                seed_key=(*seed_key, t.task_index, t.rollout_index, t.attempts),
                order_key=(t.task_index, t.rollout_index),
                version=version,
                model_name=self.name,
                defaults=sampling,
                on_release=lambda m: self.endpoint.close_route(m.base_url),
            )
            model.base_url = self.endpoint.open_route(model, t)
            return RecordingChatModel(model, t, sampling)

        return make

    def close(self) -> None:
        self.endpoint.stop()


class StandaloneModel:
    """A ``ChatModel`` over the base policy for ``reinforge eval`` (no training)."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.policy.batcher.active = 1 << 30  # unknown callers: batch by time window
        self.model_name = policy.name
        self.base_url = None

    async def chat(self, messages: list[dict[str, Any]], tools: Any = None, **sampling: Any):
        from .policy import sampling_request, to_response

        prompt_ids = self.policy.template.prompt_ids(messages, tools)
        key = (random.getrandbits(62),)
        request = sampling_request(prompt_ids, sampling, self.policy.config.sampling(), key, key)
        result = await self.policy.batcher.submit(request)
        return to_response(result, prompt_ids, 0, self.model_name)


def standalone_model(model_cfg: ModelConfig) -> StandaloneModel:
    return StandaloneModel(Policy(model_cfg, max_batch=64, window_s=0.05, lora=False))


class TrainingSession:
    def __init__(self, job: Any, opts: Any):
        self.job = job
        self.run = job.run
        self.opts = opts
        self.algo = self.run.algorithm
        if self.run.train_dataset is None:
            raise ConfigError(f"{self.run.where('train_dataset')}: the local backend needs a train_dataset")
        self.mc = self.run.model or ModelConfig(model_path=DEFAULT_MODEL)
        self.stop_requested = False

    # -- set-up ------------------------------------------------------------------------------

    def _run_dir(self) -> Path:
        if self.opts.resume:
            path = Path(self.opts.resume)
            if (path / "state.json").exists():  # a checkpoint folder
                return path.parent.parent
            if not path.is_dir():
                raise ConfigError(f"--resume: {path} does not exist")
            return path
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = Path(self.opts.output_dir) / self.run.project_name
        path = base / f"{self.run.experiment_name}-{stamp}"
        n = 1
        while path.exists():
            n += 1
            path = base / f"{self.run.experiment_name}-{stamp}-{n}"
        path.mkdir(parents=True)
        return path

    def _order(self, epoch: int, n: int) -> list[int]:
        order = list(range(n))
        random.Random(self.algo.seed * 1000003 + epoch).shuffle(order)
        return order

    def _next_batch(self, rows: list[dict], state: dict[str, Any]) -> list[dict]:
        batch = []
        while len(batch) < self.algo.batch_size:
            order = self._order(state["epoch"], len(rows))
            take = order[state["offset"] : state["offset"] + self.algo.batch_size - len(batch)]
            batch += [rows[i] for i in take]
            state["offset"] += len(take)
            if state["offset"] >= len(rows):
                state["epoch"] += 1
                state["offset"] = 0
        return batch

    # -- phases --------------------------------------------------------------------------------

    def _rollouts(self, policy: Policy, runner: Any, tasks: list[dict]) -> Any:
        with merged_for_decode(policy.model, policy.peft):
            return asyncio.run(runner.run_batch(tasks))

    def evaluate(self, policy: Policy, rows: list[dict], step: int) -> dict[str, Any]:
        record: dict[str, Any] = {"kind": "eval", "step": step, "time": time.time()}
        key, threshold = self.run.eval.accuracy_key, self.run.eval.threshold
        for mode, temperature in (("greedy", 0.0), ("sampled", self.mc.temperature)):
            sampling = {**self.mc.sampling(), "temperature": temperature}
            provider = policy.provider(("eval", mode, self.algo.seed, step), step, sampling)
            runner = self.job.make_runner(model_provider=provider, group_size=1, sampling=sampling)
            result = self._rollouts(policy, runner, rows)
            record[f"accuracy/{mode}"] = accuracy_of(result, key, threshold)
            if mode == "greedy":
                record.update({k: v for k, v in result.metrics.items() if not k.startswith("count/")})
        return record

    def train(self) -> dict[str, Any]:
        opts, algo, run = self.opts, self.algo, self.run
        if opts.threads:
            torch.set_num_threads(opts.threads)
        torch.manual_seed(algo.seed)
        random.seed(algo.seed)
        check_accuracy_key(self.job)
        rows = run.train_dataset.rows()
        if not rows:
            raise ConfigError(f"{run.where('train_dataset')}: the dataset is empty")
        eval_rows = []
        if run.eval_dataset is not None:
            eval_rows = run.eval_dataset.rows()
            if run.eval.limit is not None:
                eval_rows = eval_rows[: run.eval.limit]
        total = run.train_dataset.total_steps or run.train_dataset.total_epochs * math.ceil(len(rows) / algo.batch_size)
        run_dir = self._run_dir()
        policy = Policy(
            self.mc,
            max_batch=opts.max_batch,
            window_s=opts.window_s,
            lora=True,
            fast_decode=opts.fast_decode,
            kv_cache_mb=opts.kv_cache_mb,
            prepacked_weights=opts.prepacked_weights,
        )
        trainer = Trainer(
            policy.model,
            algo,
            temperature=self.mc.temperature,
            pad_id=policy.engine.pad_id,
            micro_batch=opts.micro_batch,
            micro_batch_tokens=opts.micro_batch_tokens,
            peft=policy.peft,
        )
        if not policy.peft and algo.kl_coef > 0:
            import copy

            trainer.reference = copy.deepcopy(policy.model).requires_grad_(False).eval()
        state: dict[str, Any] = {"step": 0, "epoch": 0, "offset": 0}
        if opts.resume:
            ckpt = Path(opts.resume) if (Path(opts.resume) / "state.json").exists() else checkpoint.latest(run_dir)
            if ckpt is None:
                raise ConfigError(f"--resume: {run_dir} has no checkpoint")
            state = checkpoint.load(ckpt, model=policy.model, optimizer=trainer.optimizer, peft=policy.peft)
            _trim_metrics(run_dir / "metrics.jsonl", state["step"])
            _say(f"resumed from {ckpt} at step {state['step']}")
        else:
            from reinforge.config import to_dict

            (run_dir / "config.json").write_text(json.dumps(to_dict(run), indent=2, default=str))
        log = MetricsLog(run_dir, tensorboard=opts.tensorboard)
        hook = self.job.hook
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        _say(f"run folder {run_dir}; policy endpoint {policy.endpoint.root_url}/rollouts/<id>/v1")
        first_eval = last_eval = None
        status = "finished"
        try:
            if eval_rows and state["step"] == 0:
                first_eval = last_eval = self.evaluate(policy, eval_rows, 0)
                log.write(first_eval)
                _say(_eval_line(first_eval))
            progress = _Progress(total, enabled=opts.progress)
            progress.start(state["step"])
            deadline = time.monotonic() + opts.max_minutes * 60 if opts.max_minutes else None
            while state["step"] < total and not self.stop_requested:
                if deadline is not None and time.monotonic() > deadline:
                    _say(f"time budget of {opts.max_minutes:g} min reached at step {state['step']}")
                    break
                step = state["step"] + 1
                t0 = time.perf_counter()
                tasks = self._next_batch(rows, state)
                decode_before = policy.engine.stats.seconds, policy.engine.stats.completion_tokens
                provider = policy.provider((algo.seed, step), step - 1, self.mc.sampling())
                runner = self.job.make_runner(model_provider=provider)
                result = self._rollouts(policy, runner, tasks)
                t_roll = time.perf_counter() - t0
                samples = build_samples(result, algo)
                try:
                    train_metrics = trainer.step(samples)
                except FloatingPointError as exc:
                    status = "diverged"
                    ckpt = checkpoint.latest(run_dir)
                    _say(f"step {step}: {exc}; stopping. Last good checkpoint: {ckpt or 'none (none saved yet)'}")
                    break
                state["step"] = step
                dec_s = policy.engine.stats.seconds - decode_before[0]
                dec_tok = policy.engine.stats.completion_tokens - decode_before[1]
                step_s = time.perf_counter() - t0
                record = {
                    "kind": "train",
                    "step": step,
                    "time": time.time(),
                    **result.metrics,
                    **train_metrics,
                    "zero_variance_groups": float(samples.zero_variance_groups),
                    "tokens_per_s": dec_tok / dec_s if dec_s else 0.0,
                    "step_seconds": step_s,
                    "time/rollout": t_roll,
                    "time/decode": dec_s,
                    "time/overhead": step_s - t_roll - train_metrics.get("time/train", 0.0),
                }
                log.write(record)
                if hook is not None:
                    hook.on_step_end(step=step, metrics=record)
                progress.update(step, record)
                if algo.save_interval_steps and step % algo.save_interval_steps == 0:
                    self._save(run_dir, policy, trainer, state)
                if eval_rows and algo.eval_interval_steps and step % algo.eval_interval_steps == 0 and step < total:
                    last_eval = self.evaluate(policy, eval_rows, step)
                    log.write(last_eval)
                    progress.note(_eval_line(last_eval))
            progress.stop()
            if status == "finished":
                self._save(run_dir, policy, trainer, state)
                if self.stop_requested:
                    status = "interrupted"
                    _say(f"stopped at step {state['step']}; resume with: --resume {run_dir}")
                elif eval_rows and (last_eval is None or last_eval["step"] != state["step"]):
                    last_eval = self.evaluate(policy, eval_rows, state["step"])
                    log.write(last_eval)
                    _say(_eval_line(last_eval))
        finally:
            signal.signal(signal.SIGINT, previous)
            log.close()
            policy.close()
        summary = {
            "status": status,
            "run_dir": str(run_dir),
            "steps": state["step"],
            "accuracy_before": first_eval and first_eval.get("accuracy/greedy"),
            "accuracy_after": last_eval and last_eval.get("accuracy/greedy"),
            "sampled_accuracy_before": first_eval and first_eval.get("accuracy/sampled"),
            "sampled_accuracy_after": last_eval and last_eval.get("accuracy/sampled"),
        }
        if opts.report and status != "diverged":
            summary["report"] = _report(run_dir)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        if hook is not None:
            hook.on_run_end(summary=summary)
        _say(_summary_line(summary))
        return summary

    def _save(self, run_dir: Path, policy: Policy, trainer: Trainer, state: dict[str, Any]) -> None:
        folder = run_dir / "checkpoints" / f"step-{state['step']}"
        checkpoint.save(folder, model=policy.model, optimizer=trainer.optimizer, state=dict(state), peft=policy.peft)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if self.stop_requested:
            raise KeyboardInterrupt
        self.stop_requested = True
        _say("stopping after this step and saving a checkpoint (Ctrl-C again to abort now)")


def _trim_metrics(path: Path, step: int) -> None:
    """Drop metric lines written after the checkpoint we resume from."""
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= step]
    path.write_text("".join(line + "\n" for line in keep))


def _pct(v: Any) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _eval_line(record: dict[str, Any]) -> str:
    return (
        f"eval at step {record['step']}: greedy accuracy {_pct(record.get('accuracy/greedy'))}, "
        f"sampled {_pct(record.get('accuracy/sampled'))}, reward {record.get('reward/mean', float('nan')):.3f}"
    )


def _summary_line(summary: dict[str, Any]) -> str:
    line = (
        f"{summary['status']} after {summary['steps']} steps; held-out greedy accuracy "
        f"{_pct(summary['accuracy_before'])} -> {_pct(summary['accuracy_after'])}; run folder {summary['run_dir']}"
    )
    if summary.get("report"):
        line += f"; report {summary['report']}"
    return line


def _report(run_dir: Path) -> str | None:
    try:
        from reinforge.report import write_report
    except ImportError:
        return None
    try:
        result = write_report(run_dir)
    except Exception as exc:  # a report problem must not lose the run
        _say(f"could not write the report: {exc}")
        return None
    return str(getattr(result, "html", None) or getattr(result, "png", None) or run_dir / "report")


class _Progress:
    """A rich progress bar with step, reward, tokens/s and ETA; plain lines when rich is missing."""

    def __init__(self, total: int, enabled: bool):
        self.total = total
        self.enabled = enabled
        self._bar = None
        self._task = None

    def start(self, done: int) -> None:
        if not self.enabled:
            return
        try:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        except ImportError:
            return
        self._bar = Progress(
            TextColumn("step {task.completed}/{task.total}"),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            transient=False,
        )
        self._bar.start()
        self._task = self._bar.add_task("train", total=self.total, completed=done, info="")

    def update(self, step: int, record: dict[str, Any]) -> None:
        info = (
            f"reward {record.get('reward/mean', float('nan')):.3f}  {record['tokens_per_s']:.0f} tok/s  "
            f"{record['step_seconds']:.1f} s/step"
        )
        if self._bar is not None:
            self._bar.update(self._task, completed=step, info=info)
        elif self.enabled:
            _say(f"step {step}/{self.total}: {info}")

    def note(self, line: str) -> None:
        if self._bar is not None:
            self._bar.console.print(line)
        else:
            _say(line)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
