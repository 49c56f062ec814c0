"""One training run of the local backend, from model loading to the summary."""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from reinforge.plugin import (
    ConfigError,
    ModelConfig,
    RunContext,
    RunStatus,
    accuracy_of,
    check_accuracy_key,
    tool_use_of,
)
from reinforge.plugin import metric_names as mn

from ..model import checkpoint
from ..model.compute import on_compute_thread
from ..model.memory import release_free_memory
from ..model.modeling import DEFAULT_MODEL
from ..model.weights import merged_for_decode
from ..rollouts.runtime import PolicyRuntime
from .algorithms import ALGORITHMS, LossSettings
from .dynamic_sampling import refill
from .metrics_log import MetricsLog
from .progress import Progress, eval_line, say, summary_line
from .state import TrainState
from .trainer import SAMPLER_WEIGHT_CAP, Trainer, build_samples, has_signal

if TYPE_CHECKING:
    from reinforge.plugin import TuneJob

    from ..settings import LocalSettings

__all__ = ["TrainingSession"]


class TrainingSession:
    """One training run: :meth:`setup`, :meth:`step` until done, :meth:`finish`; :meth:`train` runs them.

    Everything happens inside the job's run lifecycle (``with job.running() as run``):
    each step is reported with ``run.step_end``, each evaluation with ``run.eval_end``,
    and the loop stops when ``run.stop_requested`` (an observer, or Ctrl-C).
    Core sends ``on_run_end`` once, whatever ended the run.
    """

    def __init__(self, job: TuneJob, opts: LocalSettings | None = None) -> None:
        self.job = job
        self.run = job.run
        if job.algorithm_name is None or (opts is None and job.backend_settings is None):
            raise ValueError("TrainingSession: the job was built without the local backend's checks (need_backend)")
        # both checked by core before any model loads (LocalBackend.settings and .algorithms)
        self.opts: LocalSettings = opts if opts is not None else job.backend_settings
        self.algo = self.run.algorithm
        self.algorithm = ALGORITHMS[job.algorithm_name]
        self.loss: LossSettings = job.algorithm_settings or self.algorithm.settings()
        if self.run.train_dataset is None:
            raise ConfigError(f"{self.run.where('train_dataset')}: the local backend needs a train_dataset")
        self.mc = self.run.model or ModelConfig(model_path=DEFAULT_MODEL)
        self.state = TrainState()
        self.status = RunStatus.FINISHED
        self.first_eval: dict[str, Any] | None = None
        self.last_eval: dict[str, Any] | None = None
        self.ctx: RunContext | None = None
        self.run_dir: Path | None = None
        self.policy: PolicyRuntime | None = None
        self.trainer: Trainer | None = None
        self.log: MetricsLog | None = None
        self.progress = Progress(0, enabled=False)
        self.rows: list[dict] = []
        self.eval_rows: list[dict] = []
        self.total = 0
        self.deadline: float | None = None

    # -- the run --------------------------------------------------------------------------------

    def train(self) -> dict[str, Any]:
        """Set up, train until done or stopped, finish; returns the summary."""
        with self.job.running() as ctx:
            self.ctx = ctx
            try:
                try:
                    self.setup()
                    if self.eval_rows and self.state.step == 0:
                        self._evaluate(0)
                    self.progress.start(self.state.step)
                    while self._keep_going():
                        try:
                            self.step()
                        except FloatingPointError as exc:
                            self.status = RunStatus.DIVERGED
                            last = checkpoint.latest(self.run_dir) if self.run_dir else None
                            say(
                                f"step {self.state.step + 1}: {exc}; stopping. "
                                f"Last good checkpoint: {last or 'none (none saved yet)'}"
                            )
                            break
                    self.progress.stop()
                    self.finish()
                finally:
                    self.close()
            except BaseException:
                # what the run got to, for observers; core records the status and the error
                got = {k: v for k, v in self.summary().items() if k != "status" and not (k == "run_dir" and v is None)}
                ctx.summary.update(got)
                raise
            summary = self.summary()
            ctx.summary.update(summary)  # on_run_end gets it also when this backend is run directly
            if self.run_dir is not None:
                (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
            say(summary_line(summary))
        return summary

    def setup(self) -> None:
        """Data, run folder, policy, trainer, and the checkpoint to resume from."""
        opts, algo, run = self.opts, self.algo, self.run
        if opts.threads:
            # on the thread that runs the kernels: torch's count, and that thread's own OpenMP count
            on_compute_thread(torch.set_num_threads, opts.threads)
        torch.manual_seed(algo.seed)
        random.seed(algo.seed)
        check_accuracy_key(self.job)
        data = run.train_dataset
        assert data is not None  # checked in __init__
        self.rows = data.rows()
        if not self.rows:
            raise ConfigError(f"{run.where('train_dataset')}: the dataset is empty")
        if run.eval_dataset is not None:
            self.eval_rows = run.eval_dataset.rows()
            if run.eval.limit is not None:
                self.eval_rows = self.eval_rows[: run.eval.limit]
        self.total = (
            algo.total_steps or data.total_steps or data.total_epochs * math.ceil(len(self.rows) / algo.batch_size)
        )
        self.run_dir = run_dir = self._run_dir()
        if self.ctx is not None:
            self.ctx.set_run_dir(run_dir)
        self.policy = policy = PolicyRuntime(
            self.mc,
            max_batch=opts.max_batch,
            window_s=opts.window_s,
            lora=True,
            fast_decode=opts.fast_decode,
            kv_cache_mb=opts.kv_cache_mb,
            prepacked_weights=opts.prepacked_weights,
            device=opts.device,
            keep_free_mb=opts.keep_free_mb,
            matmul_dtype=opts.matmul_dtype,
        )
        self.trainer = trainer = on_compute_thread(
            Trainer,
            policy.model,
            self.algorithm,
            self.loss,
            learning_rate=algo.learning_rate,
            temperature=self.mc.temperature,
            pad_id=policy.engine.pad_id,
            micro_batch=opts.micro_batch,
            micro_batch_tokens=opts.micro_batch_tokens,
            peft=policy.peft,
            pack=opts.packed_batches,
            sampler_correction=SAMPLER_WEIGHT_CAP if policy.matmul_dtype != "float32" else None,
            total_steps=self.total,
        )
        if not policy.peft and self.loss.kl_coef > 0:
            import copy

            trainer.reference = on_compute_thread(lambda: copy.deepcopy(policy.model).requires_grad_(False).eval())
        if opts.resume:
            ckpt = Path(opts.resume) if (Path(opts.resume) / "state.json").exists() else checkpoint.latest(run_dir)
            if ckpt is None:
                raise ConfigError(f"--resume: {run_dir} has no checkpoint")
            saved = on_compute_thread(
                checkpoint.load, ckpt, model=policy.model, optimizer=trainer.optimizer, peft=policy.peft
            )
            self.state = TrainState.from_json(saved)
            _trim_metrics(run_dir / "metrics.jsonl", self.state.step)
            say(f"resumed from {ckpt} at step {self.state.step}")
        else:
            from reinforge.plugin import to_dict

            config = to_dict(run)
            if isinstance(config.get("model"), dict):
                # the dtype actually trained in ("auto" resolved): export and serve rebuild the base in it
                config["model"]["dtype"] = policy.dtype
            if isinstance(config.get("backend_args"), dict):
                config["backend_args"]["matmul_dtype"] = policy.matmul_dtype  # "auto" resolved, likewise
            (run_dir / "config.json").write_text(json.dumps(config, indent=2, default=str))
        self.log = MetricsLog(run_dir, tensorboard=opts.tensorboard)
        self.progress = Progress(self.total, enabled=opts.progress)
        self.deadline = _clock() + opts.max_minutes * 60 if opts.max_minutes else None
        say(f"run folder {run_dir}; policy endpoint {policy.endpoint.root_url}/rollouts/<id>/v1")

    def _keep_going(self) -> bool:
        if self.state.step >= self.total:
            return False
        if self.ctx is not None and self.ctx.stop_requested:
            return False
        if self.deadline is not None and _clock() > self.deadline:
            say(f"time budget of {self.opts.max_minutes:g} min reached at step {self.state.step}")
            return False
        return True

    def step(self) -> dict[str, Any]:
        """One step: rollouts of the next batch, one update, then report, save and evaluate as configured.

        Returns the step's metrics record (what ``metrics.jsonl`` and ``on_step_end`` get).
        :raises FloatingPointError: the loss or the gradients were not finite (no update was made).
        """
        policy, trainer, algo, state = self.policy, self.trainer, self.algo, self.state
        assert policy is not None and trainer is not None and self.log is not None, "setup() first"
        step = state.step + 1
        t0 = time.perf_counter()
        tasks = self._next_batch()
        decode_before = policy.engine.stats.seconds, policy.engine.stats.completion_tokens
        provider = policy.provider((algo.seed, step), step - 1, self.mc.sampling())
        runner = self.job.make_runner(model_provider=provider)
        result = self._rollouts(runner, tasks)
        sampling_metrics: dict[str, float] = {}
        if getattr(self.loss, "dynamic_sampling", False):
            result, sampling_metrics = self._refill(result, runner, step)
        t_roll = time.perf_counter() - t0
        samples = build_samples(result, self.algorithm, self.loss)
        # on the thread that decodes (.compute); hands each micro-batch's freed activations back itself
        train_metrics = on_compute_thread(trainer.step, samples, at_step=step)
        state.step = step
        dec_s = policy.engine.stats.seconds - decode_before[0]
        dec_tok = policy.engine.stats.completion_tokens - decode_before[1]
        step_s = time.perf_counter() - t0
        record = {
            mn.KIND: mn.KIND_TRAIN,
            mn.STEP: step,
            mn.TIME: time.time(),
            **result.metrics,
            **train_metrics,
            **sampling_metrics,
            "zero_variance_groups": float(samples.zero_variance_groups),
            mn.TOKENS_PER_S: dec_tok / dec_s if dec_s else 0.0,
            "step_seconds": step_s,
            "time/rollout": t_roll,
            "time/decode": dec_s,
            "time/overhead": step_s - t_roll - train_metrics.get("time/train", 0.0),
        }
        self.log.write(record)
        if self.ctx is not None:
            self.ctx.step_end(record, step=step)
        self.progress.update(step, record)
        if algo.save_interval_steps and step % algo.save_interval_steps == 0:
            self._save()
        stopping = self.ctx is not None and self.ctx.stop_requested  # finish() evaluates, if at all
        due = self.eval_rows and algo.eval_interval_steps and step % algo.eval_interval_steps == 0
        if due and step < self.total and not stopping:
            te = _clock()
            self._evaluate(step, say_line=self.progress.note)
            if self.deadline is not None:  # max_minutes budgets training: evaluations come on top
                self.deadline += _clock() - te
        return record

    def finish(self) -> None:
        """After the last step: the final checkpoint and evaluation (not after a divergence or Ctrl-C)."""
        if self.status == RunStatus.DIVERGED:
            return
        self._save()
        ctx, step = self.ctx, self.state.step
        if ctx is not None and ctx.stop_requested:
            interrupted = ctx.summary.get("status") == RunStatus.INTERRUPTED
            self.status = RunStatus.INTERRUPTED if interrupted else RunStatus.STOPPED
            say(f"stopped at step {step}: {ctx.stop_reason}; resume with: --resume {self.run_dir}")
            if interrupted:
                return  # the user wants out: no evaluation
        if self.eval_rows and (self.last_eval is None or self.last_eval[mn.STEP] != step):
            self._evaluate(step)

    def close(self) -> None:
        """Release what :meth:`setup` opened (idempotent)."""
        self.progress.stop()
        if self.log is not None:
            self.log.close()
            self.log = None
        if self.policy is not None:
            self.policy.close()
            self.policy = None

    def summary(self) -> dict[str, Any]:
        first, last = self.first_eval, self.last_eval
        out: dict[str, Any] = {
            "status": self.status,
            "run_dir": str(self.run_dir) if self.run_dir is not None else None,
            "steps": self.state.step,
            "accuracy_before": first and first.get(mn.ACCURACY_GREEDY),
            "accuracy_after": last and last.get(mn.ACCURACY_GREEDY),
            "sampled_accuracy_before": first and first.get(mn.ACCURACY_SAMPLED),
            "sampled_accuracy_after": last and last.get(mn.ACCURACY_SAMPLED),
            # the held-out tool-use rate on tasks that need a tool (greedy), when the workflow reports one
            "tool_use_before": first and first.get("tool_use/greedy"),
            "tool_use_after": last and last.get("tool_use/greedy"),
        }
        if self.ctx is not None and self.ctx.stop_reason is not None:
            out["stop_reason"] = self.ctx.stop_reason
        return out

    # -- parts ----------------------------------------------------------------------------------

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

    def _refill(self, first: Any, runner: Any, step: int) -> tuple[Any, dict[str, float]]:
        """Dynamic sampling: further rounds of new prompts until the batch's groups carry signal (.dynamic_sampling)."""
        policy, algo = self.policy, self.algo
        assert policy is not None
        sampled = len(first.groups)

        def more(prompts: int, round_: int) -> Any:
            nonlocal sampled
            tasks = self._next_batch(prompts)
            provider = policy.provider((algo.seed, step, round_), step - 1, self.mc.sampling())
            result = self._rollouts(self.job.make_runner(model_provider=provider), tasks, start_index=sampled)
            sampled += len(tasks)
            return result

        return refill(
            first,
            more,
            batch_size=algo.batch_size,
            max_rounds=int(getattr(self.loss, "max_sampling_rounds", 1)),
            signal=lambda g: has_signal(g, self.algorithm, self.loss),
            summarize=runner.summarize,
        )

    def _next_batch(self, size: int | None = None) -> list[dict]:
        """The next ``size`` (default: ``batch_size``) rows of the shuffled data, epoch after epoch."""
        rows, state = self.rows, self.state
        size = self.algo.batch_size if size is None else size
        batch: list[dict] = []
        while len(batch) < size:
            order = self._order(state.epoch, len(rows))
            take = order[state.offset : state.offset + size - len(batch)]
            batch += [rows[i] for i in take]
            state.offset += len(take)
            if state.offset >= len(rows):
                state.epoch += 1
                state.offset = 0
        return batch

    def _rollouts(self, runner: Any, tasks: list[dict], start_index: int = 0) -> Any:
        assert self.policy is not None
        merged = merged_for_decode(self.policy.model, self.policy.peft)
        on_compute_thread(merged.__enter__)  # the merge is tensor work: on the decoding thread (.compute)
        try:
            # the event loop here, the decode batches there
            result = asyncio.run(runner.run_batch(tasks, start_index=start_index))
        finally:
            on_compute_thread(merged.__exit__, None, None, None)  # the originals back, whatever happened
        release_free_memory()  # the decode batches' caches are gone: their pages go back before the update
        return result

    def evaluate(self, rows: list[dict], step: int) -> dict[str, Any]:
        """Greedy and sampled accuracy of the current policy on ``rows`` (one rollout each)."""
        assert self.policy is not None
        record: dict[str, Any] = {mn.KIND: mn.KIND_EVAL, mn.STEP: step, mn.TIME: time.time()}
        key, threshold = self.run.eval.accuracy_key, self.run.eval.threshold
        modes = [("greedy", 0.0)] + ([("sampled", self.mc.temperature)] if self.opts.eval_sampled else [])
        for mode, temperature in modes:
            sampling = {**self.mc.sampling(), "temperature": temperature}
            provider = self.policy.provider(("eval", mode, self.algo.seed, step), step, sampling)
            runner = self.job.make_runner(model_provider=provider, group_size=1, sampling=sampling)
            result = self._rollouts(runner, rows)
            record[f"{mn.ACCURACY_PREFIX}{mode}"] = accuracy_of(result, key, threshold)
            tool_use = tool_use_of(result, self.run.eval.tool_use_metric, self.run.eval.tool_use_field)
            if tool_use is not None:
                record[f"tool_use/{mode}"] = tool_use
            if mode == "greedy":
                record.update({k: v for k, v in result.metrics.items() if not k.startswith(mn.COUNT_PREFIX)})
        return record

    def _evaluate(self, step: int, say_line: Any = None) -> dict[str, Any]:
        record = self.evaluate(self.eval_rows, step)
        if step == 0:
            self.first_eval = record
        self.last_eval = record
        assert self.log is not None
        self.log.write(record)
        if self.ctx is not None:
            self.ctx.eval_end(record, step=step)
        (say_line or say)(eval_line(record))
        return record

    def _save(self) -> None:
        assert self.run_dir is not None and self.policy is not None and self.trainer is not None
        folder = self.run_dir / "checkpoints" / f"step-{self.state.step}"
        on_compute_thread(
            checkpoint.save,
            folder,
            model=self.policy.model,
            optimizer=self.trainer.optimizer,
            state=self.state.to_json(),
            peft=self.policy.peft,
        )


def _clock() -> float:
    """The clock of the ``max_minutes`` budget (a name of its own, so tests can move it)."""
    return time.monotonic()


def _trim_metrics(path: Path, step: int) -> None:
    """Drop metric lines written after the checkpoint we resume from."""
    if not path.exists():
        return
    keep = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= step]
    path.write_text("".join(line + "\n" for line in keep))
