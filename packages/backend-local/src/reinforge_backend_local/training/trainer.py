"""One policy-gradient update from scored trajectories.

Every recorded model call of a kept trajectory becomes a training sample:
prompt tokens as context, completion tokens as actions, the trajectory's
advantage on every action token (for multi-step runs that is the trajectory
reward broadcast to each call, as in step-wise GRPO). The loss is PPO-clip
against the generation-time logprobs (ratio 1 on the first epoch), optionally
sequence-level (GSPO), plus an optional k3 KL to the base model, which with
LoRA is the same network with the adapter switched off.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from reinforge.plugin import BatchResult, GroupResult
from reinforge.plugin import metric_names as mn

from ..model.memory import release_free_memory
from . import attention, layout
from .algorithms import Algorithm, LossSettings, advantages, call_advantages, zero_variance
from .schedule import lr_factor


@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]
    advantage: float
    weight: float = 1.0  # per-trajectory share, so long episodes do not dominate
    temperature: float | None = None  # the call's own sampling temperature; None: the trainer's


@dataclass
class Samples:
    items: list[Sample] = field(default_factory=list)
    zero_variance_groups: int = 0
    groups: int = 0
    advantages: list[float] = field(default_factory=list)


def build_samples(result: BatchResult, algorithm: Algorithm, settings: LossSettings | None = None) -> Samples:
    """Advantages per group, then one sample per recorded model call.

    With an algorithm that reads call rewards (``multi_step_grpo``), a call that carries its own reward
    (``call.reward``, from ``WorkflowOutput.call_rewards``) also gets its
    group-relative call advantage (:func:`~.algorithms.call_advantages`); a
    group whose trajectory rewards are equal still trains when its call rewards differ.

    :param algorithm: the algorithm's record (``ALGORITHMS[job.algorithm_name]``).
    :param settings: its loss settings (``job.algorithm_settings``, checked by core); default: the record's defaults.
    """
    if settings is None:
        settings = algorithm.settings()
    out = Samples()
    groups = [g for g in result.groups if g.kept]
    out.groups = len(groups)
    call_weight = _call_weight(algorithm, settings)
    scored = []
    for g in groups:
        if not has_signal(g, algorithm, settings):
            out.zero_variance_groups += 1
            continue
        rewarded = _rewarded_calls(g) if call_weight > 0 else []
        scored.append((g, [_reward(t) for t in g.kept], rewarded))
    if not scored:
        return out
    advs = advantages(algorithm, [r for _, r, _ in scored], settings.scale)
    per_call: dict[int, float] = {}
    if call_weight > 0:
        call_advs = call_advantages([[c.reward for c in rc] for _, _, rc in scored], settings.scale, call_weight)
        per_call = {id(c): a for (_, _, rc), ca in zip(scored, call_advs) for c, a in zip(rc, ca)}
    for (g, _, _), group_adv in zip(scored, advs):
        for t, adv in zip(g.kept, group_adv):
            calls = _trained_calls(t)
            if not calls:
                continue
            for call in calls:
                if call.prompt_token_ids is None or call.completion_token_ids is None or call.logprobs is None:
                    raise ValueError("a recorded call has no token ids or logprobs; the local policy records both")
                out.items.append(
                    Sample(
                        list(call.prompt_token_ids),
                        list(call.completion_token_ids),
                        list(call.logprobs),
                        adv + per_call.get(id(call), 0.0),
                        1.0 / len(calls) if algorithm.per_call_weight else 1.0,
                    )
                )
            out.advantages.append(adv)
    return out


def has_signal(group: GroupResult, algorithm: Algorithm, settings: LossSettings) -> bool:
    """Whether ``group`` trains: it has kept rollouts and, for a group-relative algorithm, rewards that differ.

    With call rewards (``multi_step_grpo``), call rewards that differ are signal too.
    """
    if not group.kept:
        return False
    rewards = [_reward(t) for t in group.kept]
    if not algorithm.group_relative or (len(rewards) > 1 and not zero_variance(rewards)):
        return True
    if _call_weight(algorithm, settings) <= 0:
        return False
    rewarded = _rewarded_calls(group)
    return len(rewarded) > 1 and not zero_variance([c.reward for c in rewarded])


def _call_weight(algorithm: Algorithm, settings: LossSettings) -> float:
    return float(getattr(settings, "call_reward_weight", 0.0)) if algorithm.call_rewards else 0.0


def _rewarded_calls(group: GroupResult) -> list[Any]:
    return [c for t in group.kept for c in _trained_calls(t) if getattr(c, "reward", None) is not None]


def _trained_calls(t: Any) -> list[Any]:
    """The calls of a trajectory that produced tokens (the ones a sample is made of)."""
    return [c for c in t.calls if c.completion_token_ids]


def _reward(t: Any) -> float:
    if t.reward is None:  # the runner keeps only scored trajectories
        raise ValueError(f"kept trajectory {t.task_index}/{t.rollout_index} has no reward")
    return float(t.reward)


SAMPLER_WEIGHT_CAP = 2.0  # truncated importance sampling: a token's sampler-correction weight is at most this

MIN_SHARED_TRAIN_PREFIX = 32  # shorter shared prefixes are not worth a forward of their own


def shared_prefix(batch: list[Sample]) -> int:
    """The prompt tokens every sample of a micro-batch starts with, when worth running once (else 0).

    Each prompt keeps at least one token of its own: the first completion token's logit
    comes from the last prompt position, which must be in the part run per row.
    """
    if len(batch) < 2:
        return 0
    n = min(len(os.path.commonprefix([s.prompt_ids for s in batch])), min(len(s.prompt_ids) for s in batch) - 1)
    return n if n >= MIN_SHARED_TRAIN_PREFIX else 0


@functools.cache
def _cache_keyword_of(forward: Any) -> str:
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def _cache_keyword(model: Any) -> str:
    """What the model's forward calls its KV cache: ``cache`` (transformers 5.x) or ``past_key_values`` (4.x)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return _cache_keyword_of(type(base).forward)


# Causal LMs whose logits are exactly ``lm_head(final hidden state)`` (no scaling or soft-capping after it):
# for these the trainer runs the LM head itself, on the completion tokens only.
_PLAIN_HEAD_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
LOGPROB_CHUNK_TOKENS = 128  # completion tokens per LM-head chunk (logits of ~25 MB for a 49k vocabulary)


def _plain_head(model: Any) -> tuple[Any, Any] | None:
    """The inner decoder and the LM head of a model whose logits are the head of the last hidden state, else None."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = getattr(base, "config", None)
    if getattr(cfg, "model_type", None) not in _PLAIN_HEAD_TYPES:
        return None
    inner, head = getattr(base, "model", None), getattr(base, "lm_head", None)
    return (inner, head) if inner is not None and head is not None else None


def completion_logprobs(
    head: Any,
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temps: torch.Tensor | float,
    chunk: int,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob of each target token and the entropy at its position: ``(n,)`` each, from ``hidden`` ``(n, d)``.

    The vocabulary-wide work (logits, log-sum-exp, entropy) runs ``chunk`` tokens at a time, so
    no (tokens x vocabulary) log-softmax is ever stored; ``logit[target] - logsumexp`` equals the
    log-softmax entry. ``temps``: one divisor, or one per token. A frozen head (LoRA) runs in
    :class:`_HeadLogprobs`, which exponentiates each logit once and keeps the softmax for backward.
    ``entropy_grad``: the entropy carries a gradient too (the loss has an entropy term); else it is a statistic.
    """
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor) and not weight.requires_grad and getattr(head, "bias", None) is None:
        return _HeadLogprobs.apply(hidden, targets, temps, chunk, head, entropy_grad)
    logps, entropies = [], []
    for a in range(0, hidden.shape[0], chunk):
        logits = _scaled(head(hidden[a : a + chunk]).float(), temps, a, chunk)
        lse = torch.logsumexp(logits, dim=-1)
        logps.append(logits.gather(-1, targets[a : a + chunk].unsqueeze(1)).squeeze(1) - lse)
        with contextlib.nullcontext() if entropy_grad else torch.no_grad():
            entropies.append(lse - (torch.softmax(logits, dim=-1) * logits).sum(-1))
    return torch.cat(logps), torch.cat(entropies)


def _rows(values: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Per-token ``values`` (sample by sample) laid out in the left-padded ``(samples, completion)`` shape."""
    return torch.zeros(real.shape, dtype=values.dtype, device=values.device).masked_scatter(real, values)


def _scaled(logits: torch.Tensor, temps: torch.Tensor | float, a: int, chunk: int) -> torch.Tensor:
    """``logits`` (rows ``a:a+chunk``) divided by their temperatures; as they are at temperature 1."""
    if isinstance(temps, torch.Tensor):
        return logits / temps[a : a + chunk].unsqueeze(1)
    return logits if temps == 1.0 else logits / temps


class _HeadLogprobs(torch.autograd.Function):
    """:func:`completion_logprobs` through a frozen head: the gradient reaches ``hidden`` only.

    Forward: per chunk, the logits, one ``exp``, the softmax (kept), the target's log-softmax and the
    entropy. Backward: ``d logp / d logits = onehot(target) - softmax``, through the temperature and
    the head's weight. Autograd would exponentiate again in backward and keep the logits as well.
    With ``entropy_grad`` the entropy is differentiable too: ``d H / d logits = -softmax * (log softmax + H)``,
    the log-softmax recomputed in backward from the logits (one more head matmul per chunk).
    """

    @staticmethod
    def forward(ctx: Any, hidden: Any, targets: Any, temps: Any, chunk: int, head: Any, entropy_grad: bool) -> Any:
        logps, entropies, probs, lses = [], [], [], []
        with torch.no_grad():
            for a in range(0, hidden.shape[0], chunk):
                logits = _scaled(head(hidden[a : a + chunk]).float(), temps, a, chunk)
                top = logits.amax(-1, keepdim=True)
                p = (logits - top).exp_()
                total = p.sum(-1, keepdim=True)
                lse = top + total.log()
                p.div_(total)
                logps.append((logits.gather(-1, targets[a : a + chunk].unsqueeze(1)) - lse).squeeze(1))
                entropies.append(lse.squeeze(1) - torch.linalg.vecdot(p, logits))
                probs.append(p)
                lses.append(lse)
        entropy = torch.cat(entropies)
        if entropy_grad:
            ctx.save_for_backward(targets, hidden, entropy, *probs)
            ctx.lses = lses
        else:
            ctx.save_for_backward(targets, *probs)
            ctx.mark_non_differentiable(entropy)
        ctx.temps, ctx.chunk, ctx.weight, ctx.dtype = temps, chunk, head.weight, hidden.dtype
        ctx.head, ctx.entropy_grad = head, entropy_grad
        return torch.cat(logps), entropy

    @staticmethod
    def backward(ctx: Any, grad: Any, grad_entropy: Any) -> Any:
        if ctx.entropy_grad:
            targets, hidden, entropy, *probs = ctx.saved_tensors
        else:
            targets, *probs = ctx.saved_tensors
        parts = []
        for k, p in enumerate(probs):
            a = k * ctx.chunk
            n = p.shape[0]
            g = grad[a : a + n].unsqueeze(1)
            d = (p * -g).scatter_add_(1, targets[a : a + n].unsqueeze(1), g)
            if ctx.entropy_grad and grad_entropy is not None:
                with torch.no_grad():
                    logits = _scaled(ctx.head(hidden[a : a + n]).float(), ctx.temps, a, ctx.chunk)
                    log_p = logits - ctx.lses[k]
                    h = entropy[a : a + n].unsqueeze(1)
                    d -= grad_entropy[a : a + n].unsqueeze(1) * p * (log_p + h)
            d = _scaled(d, ctx.temps, a, ctx.chunk)
            parts.append(d.to(ctx.dtype) @ ctx.weight)
        return torch.cat(parts), None, None, None, None, None


def _micro_batches(
    samples: list[Sample], size: int, max_tokens: int | None = None, shared: int = 0
) -> list[list[Sample]]:
    """Similar lengths together (little padding); at most ``size`` sequences and ``max_tokens`` padded tokens.

    Activation memory grows with the padded tokens of a micro-batch, so long
    multi-turn samples go a few at a time while short ones still fill ``size``.
    A single sequence longer than ``max_tokens`` goes alone. ``shared`` prompt
    tokens that every sample starts with run once per micro-batch, so they do not count.
    """
    order = sorted(samples, key=lambda s: len(s.prompt_ids) + len(s.completion_ids))
    batches: list[list[Sample]] = []
    current: list[Sample] = []
    for s in order:
        width = len(s.prompt_ids) + len(s.completion_ids) - shared  # the longest so far: sorted ascending
        if current and (len(current) >= size or (max_tokens and (len(current) + 1) * width > max_tokens)):
            batches.append(current)
            current = []
        current.append(s)
    if current:
        batches.append(current)
    return batches


class Trainer:
    """Owns the optimizer; ``step`` runs ``ppo_epochs`` passes over one batch of samples.

    :param algorithm: the algorithm's record (``ALGORITHMS[job.algorithm_name]``): its ratio is per token or
        per sequence.
    :param settings: its :class:`~.algorithms.LossSettings` (``job.algorithm_settings``, checked by core);
        default: the record's defaults.
    :param learning_rate: AdamW's (``algorithm.learning_rate`` of the run file); the base of the schedule.
    :param total_steps: the run's steps, where a decaying schedule (``settings.lr_schedule``) ends.
    """

    def __init__(
        self,
        model: Any,
        algorithm: Algorithm,
        settings: LossSettings | None = None,
        *,
        learning_rate: float,
        temperature: float,
        pad_id: int,
        micro_batch: int = 8,
        micro_batch_tokens: int | None = 1024,
        peft: bool,
        share_prefix: bool = True,
        completion_head: bool = True,
        pack: bool = True,
        segment_attention: bool = True,
        sampler_correction: float | None = None,
        total_steps: int | None = None,
    ) -> None:
        self.model = model
        self.algorithm = algorithm
        self.settings = settings if settings is not None else algorithm.settings()
        self.temperature = temperature if temperature > 0 else 1.0
        self.pad_id = pad_id
        self.micro_batch = micro_batch
        self.micro_batch_tokens = micro_batch_tokens
        self.peft = peft
        self.share_prefix = share_prefix  # run a micro-batch's shared prompt prefix once (exact: gradients add up)
        # the LM head on the real completion tokens only, in chunks (models whose logits are just the head's)
        self.completion_head = completion_head
        # padding-free micro-batches: each group's prompt once, samples packed into rows (needs the plain head)
        self.pack = pack and completion_head and _plain_head(model) is not None
        # packed rows attend sequence by sequence, not row by row under a mask (.attention)
        self.segment_attention = segment_attention
        # The sampler's numbers differ from the trainer's (bf16 matmuls, other kernels): the PPO ratio is then taken
        # against the trainer's own logprobs at the step's start, and each token's loss weighted by
        # min(p_trainer / p_sampler, cap) (truncated importance sampling); None: against the sampler's logprobs.
        self.sampler_correction = sampler_correction
        self._anchors: dict[tuple[int, ...], torch.Tensor] = {}  # micro-batch -> the trainer's logprobs at step start
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("no trainable parameters")
        self.params = params
        self.optimizer = torch.optim.AdamW(params, lr=learning_rate, betas=(0.9, 0.999), weight_decay=0.0)
        self.learning_rate = learning_rate
        self.total_steps = total_steps
        if self.settings.lr_schedule != "constant" and total_steps is None:
            raise ValueError(f"algorithm.lr_schedule {self.settings.lr_schedule} decays until total_steps: give them")
        self.reference = None  # full fine-tuning with KL keeps a frozen copy

    def _forward_logprobs(
        self, model: Any, batch: list[Sample], entropy_grad: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logprobs (and entropies) of each completion token, left-padded so completions end together.

        The batch is laid out on the CPU and copied to the model's device once (three copies, not one per row).
        ``entropy_grad``: the entropies carry gradients (``entropy_coef > 0``).
        """
        dev = next(model.parameters()).device
        if self.pack:
            return self._packed_logprobs(model, batch, dev, entropy_grad)
        shared = shared_prefix(batch) if self.share_prefix else 0
        seqs = [s.prompt_ids[shared:] + s.completion_ids for s in batch]
        width = max(map(len, seqs))
        comp = max(len(s.completion_ids) for s in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), shared + width), dtype=torch.long)
        mask[:, :shared] = 1
        cmask = torch.zeros((len(batch), comp), dtype=torch.float32)
        for i, (s, seq) in enumerate(zip(batch, seqs)):
            ids[i, width - len(seq) :] = torch.tensor(seq)
            mask[i, shared + width - len(seq) :] = 1
            cmask[i, comp - len(s.completion_ids) :] = 1
        ids, mask, cmask = ids.to(dev), mask.to(dev), cmask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp_(min=0)[:, shared:]
        past = None
        if shared:
            # the prompts' shared prefix (a system prompt, few-shot turns) runs once, as one row, with gradients;
            # every row reads its keys and values (copies whose gradients add up into the one forward)
            key = _cache_keyword(model)
            out = model(input_ids=ids.new_tensor([batch[0].prompt_ids[:shared]]), use_cache=True, logits_to_keep=1)
            past = getattr(out, key)
            past.batch_repeat_interleave(len(batch))
        given = {_cache_keyword(model): past, "use_cache": True} if past is not None else {"use_cache": False}
        parts = _plain_head(model) if self.completion_head else None
        if parts is not None:
            inner, head = parts
            out = inner(input_ids=ids, attention_mask=mask, position_ids=pos, **given)
            hidden = out.last_hidden_state[:, width - comp - 1 : width - 1]  # the positions that predict completions
            real = cmask.bool()
            temps = self._temperatures(batch, dev)
            if isinstance(temps, torch.Tensor):
                temps = temps.view(-1, 1).expand(len(batch), comp)[real]
            lp, ent = completion_logprobs(
                head, hidden[real], ids[:, width - comp :][real], temps, LOGPROB_CHUNK_TOKENS, entropy_grad
            )
            return _rows(lp, real), _rows(ent, real), cmask
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=comp + 1, **given).logits
        logits = logits[:, :-1, :].float() / self._temperatures(batch, logits.device)
        targets = ids[:, width - comp :]
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        with contextlib.nullcontext() if entropy_grad else torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy, cmask

    def _packed_logprobs(
        self, model: Any, batch: list[Sample], dev: Any, entropy_grad: bool = False
    ) -> tuple[torch.Tensor, ...]:
        """:meth:`_forward_logprobs` over the padding-free layout (:mod:`.layout`), in the same left-padded shape."""
        parts = _plain_head(model)
        assert parts is not None
        inner, head = parts
        dtype = next(model.parameters()).dtype
        packed = layout.pack([s.prompt_ids for s in batch], [s.completion_ids for s in batch], self.pad_id, dtype)
        segments = packed.segments.to(dev)
        by_segment = self.segment_attention and attention.applies(inner, segments)
        with attention.segmented(inner, segments) if by_segment else contextlib.nullcontext():
            out = inner(
                input_ids=packed.ids.to(dev),
                attention_mask=packed.mask.to(dev),
                position_ids=packed.positions.to(dev),
                use_cache=False,
            )
        hidden = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])[packed.predict.to(dev)]
        temps = self._temperatures(batch, dev)
        if isinstance(temps, torch.Tensor):
            counts = torch.tensor([len(s.completion_ids) for s in batch], device=dev)
            temps = temps.view(-1).repeat_interleave(counts)
        lp, ent = completion_logprobs(head, hidden, packed.targets.to(dev), temps, LOGPROB_CHUNK_TOKENS, entropy_grad)
        comp = max(len(s.completion_ids) for s in batch)
        cmask = torch.zeros((len(batch), comp), dtype=torch.float32)
        for i, s in enumerate(batch):
            cmask[i, comp - len(s.completion_ids) :] = 1
        cmask = cmask.to(dev)
        real = cmask.bool()  # row-major: sample by sample, each one's tokens in order, as ``predict``
        return _rows(lp, real), _rows(ent, real), cmask

    def _run_tokens(self, batch: list[Sample]) -> int:
        """Token positions the forward runs for ``batch``: a shared prefix once; padded rows count their padding."""
        if self.pack:
            return layout.tokens_run([s.prompt_ids for s in batch], [s.completion_ids for s in batch])
        shared = shared_prefix(batch) if self.share_prefix else 0
        return shared + len(batch) * max(len(s.prompt_ids) + len(s.completion_ids) - shared for s in batch)

    def _temperatures(self, batch: list[Sample], dev: Any) -> torch.Tensor | float:
        """The divisor of each row's logits: its sample's temperature (greedy counts as 1), else the trainer's."""
        if all(s.temperature is None for s in batch):
            return self.temperature
        temps = [
            self.temperature if s.temperature is None else (s.temperature if s.temperature > 0 else 1.0) for s in batch
        ]
        return torch.tensor(temps, dtype=torch.float32, device=dev).view(-1, 1, 1)

    def _reference_logprobs(self, batch: list[Sample]) -> torch.Tensor:
        with torch.no_grad():
            if self.peft:
                with self.model.disable_adapter():
                    return self._forward_logprobs(self.model, batch)[0]
            assert self.reference is not None
            return self._forward_logprobs(self.reference, batch)[0]

    def _batch_loss(self, batch: list[Sample], total_w_tokens: float, total_w_seqs: float) -> tuple[Any, dict]:
        """This micro-batch's share of the step loss, and its token statistics."""
        opts = self.settings
        low = opts.clip_range
        high = opts.clip_range_high if opts.clip_range_high is not None else opts.clip_range
        tr = time.perf_counter()
        ref = self._reference_logprobs(batch) if opts.kl_coef > 0 else None
        ref_s = time.perf_counter() - tr
        logp, entropy, cmask = self._forward_logprobs(self.model, batch, entropy_grad=opts.entropy_coef > 0)
        comp, dev = cmask.shape[1], logp.device
        old = torch.zeros(logp.shape, dtype=logp.dtype)  # filled on the CPU, then one copy to the device
        for i, s in enumerate(batch):
            old[i, comp - len(s.old_logprobs) :] = torch.tensor(s.old_logprobs)
        old = old.to(dev)
        sampler_weight = None
        if self.sampler_correction is not None:
            anchor = self._anchors.setdefault(tuple(id(s) for s in batch), logp.detach())
            sampler_weight = torch.exp((anchor - old) * cmask).clamp_(max=self.sampler_correction)
            old = anchor
        adv = torch.tensor([s.advantage for s in batch], device=dev).unsqueeze(1)
        weight = torch.tensor([s.weight for s in batch], device=dev).unsqueeze(1)
        log_ratio = (logp - old) * cmask
        if self.algorithm.sequence_ratio:
            # one ratio per sequence: the geometric mean of its token ratios
            lengths = cmask.sum(1, keepdim=True).clamp(min=1)
            ratio = torch.exp(log_ratio.sum(1, keepdim=True) / lengths).expand_as(logp)
        else:
            ratio = torch.exp(log_ratio)
        per_token = -torch.min(ratio * adv, torch.clamp(ratio, 1 - low, 1 + high) * adv)
        if sampler_weight is not None:
            per_token = per_token * sampler_weight
        stats = {
            "tokens": float(cmask.sum()),
            "seq_tokens": float(sum(len(s.prompt_ids) + len(s.completion_ids) for s in batch)),
            "run_tokens": float(self._run_tokens(batch)),
            "reference_s": ref_s,
        }
        if ref is not None:
            d = ref - logp
            kl = torch.exp(d) - d - 1  # k3 estimator, >= 0
            per_token = per_token + opts.kl_coef * kl
            stats["kl"] = float((kl.detach() * cmask).sum())
        if opts.entropy_coef > 0:  # an entropy bonus: keeps exploring (0 leaves the loss exactly as it was)
            per_token = per_token - opts.entropy_coef * entropy
        if sampler_weight is not None:
            stats["sampler_weight"] = float((sampler_weight * cmask).sum())
        if opts.loss_agg_mode == "sequence-mean":
            per_seq = (per_token * cmask).sum(1) / cmask.sum(1).clamp(min=1)
            loss = (per_seq * weight.squeeze(1)).sum() / total_w_seqs
        else:
            loss = (per_token * cmask * weight).sum() / total_w_tokens
        with torch.no_grad():
            stats["entropy"] = float((entropy * cmask).sum())
            stats["ratio"] = float((ratio * cmask).sum())
            bound = torch.where(adv > 0, torch.tensor(high, device=dev), torch.tensor(low, device=dev))
            stats["clip_frac"] = float((((ratio - 1).abs() > bound) * cmask).sum())
        return loss, stats

    def _split(self, items: list[Sample]) -> list[list[Sample]]:
        if self.pack:
            parts = layout.split(
                [s.prompt_ids for s in items], [s.completion_ids for s in items], self.micro_batch_tokens
            )
            return [[items[i] for i in part] for part in parts]
        shared = shared_prefix(items) if self.share_prefix else 0
        return _micro_batches(items, self.micro_batch, self.micro_batch_tokens, shared)

    @staticmethod
    def _totals(items: list[Sample]) -> tuple[float, float]:
        return sum(s.weight * len(s.completion_ids) for s in items), sum(s.weight for s in items)

    def loss(self, samples: Samples) -> float:
        """The loss of a batch under the current weights, without updating them."""
        totals = self._totals(samples.items)
        self._anchors.clear()
        with torch.no_grad():
            return sum(float(self._batch_loss(b, *totals)[0]) for b in self._split(samples.items))

    def lr_at(self, step: int) -> float:
        """The learning rate of update ``step`` (1-based) under ``settings``' schedule."""
        opts = self.settings
        factor = lr_factor(
            step,
            self.total_steps or step,  # None only with a constant schedule, where it is not read
            warmup=opts.lr_warmup_steps,
            schedule=opts.lr_schedule,
            min_ratio=opts.lr_min_ratio,
        )
        return self.learning_rate * factor

    def step(self, samples: Samples, *, at_step: int | None = None) -> dict[str, float]:
        """``ppo_epochs`` updates on ``samples``; ``at_step`` (1-based): the run's step, which sets a scheduled rate.

        Without a schedule (``LossSettings.lr_scheduled`` false) the optimizer's rate is left as it is.
        """
        opts = self.settings
        items = samples.items
        lr = None
        if at_step is not None and opts.lr_scheduled:
            lr = self.lr_at(at_step)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
        if not items:
            return {"train/skipped_step": 1.0}
        self.model.train()
        t0 = time.perf_counter()
        totals = self._totals(items)
        epochs = max(1, opts.ppo_epochs)
        sums = {
            "loss": 0.0,
            "kl": 0.0,
            "entropy": 0.0,
            "clip_frac": 0.0,
            "ratio": 0.0,
            "tokens": 0.0,
            "seq_tokens": 0.0,
            "run_tokens": 0.0,
            "sampler_weight": 0.0,
        }
        self._anchors.clear()
        grad_norm = 0.0
        timings = {"time/forward_backward": 0.0, "time/reference": 0.0, "time/optimizer": 0.0}
        try:
            for _epoch in range(epochs):
                self.optimizer.zero_grad(set_to_none=True)
                for batch in self._split(items):
                    tf = time.perf_counter()
                    loss, stats = self._batch_loss(batch, *totals)
                    loss.backward()
                    timings["time/forward_backward"] += time.perf_counter() - tf - stats["reference_s"]
                    timings["time/reference"] += stats["reference_s"]
                    sums["loss"] += float(loss.detach()) / epochs
                    for key in (
                        "kl",
                        "entropy",
                        "clip_frac",
                        "ratio",
                        "tokens",
                        "seq_tokens",
                        "run_tokens",
                        "sampler_weight",
                    ):
                        sums[key] += stats.get(key, 0.0) / epochs
                    del loss
                    release_free_memory()  # the micro-batch's activations: the next one starts from live memory
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, opts.max_grad_norm))
                if not (math.isfinite(grad_norm) and math.isfinite(sums["loss"])):
                    self.optimizer.zero_grad(set_to_none=True)
                    raise FloatingPointError(f"loss is {sums['loss']}, gradient norm {grad_norm}")
                to = time.perf_counter()
                self.optimizer.step()
                timings["time/optimizer"] += time.perf_counter() - to
        finally:
            self.model.eval()
        tokens = max(sums["tokens"], 1.0)
        metrics = {
            mn.LOSS: sums["loss"],
            mn.ENTROPY: sums["entropy"] / tokens,
            mn.KL: sums["kl"] / tokens,
            mn.CLIP_FRAC: sums["clip_frac"] / tokens,
            "ratio/mean": sums["ratio"] / tokens,
            mn.GRAD_NORM: grad_norm,
            "train/samples": float(len(items)),
            "train/tokens": sums["tokens"],
            "train/seq_tokens": sums["seq_tokens"],
            "train/run_tokens": sums["run_tokens"],
            **timings,
            "time/train": time.perf_counter() - t0,
        }
        if self.sampler_correction is not None:
            metrics["train/sampler_weight"] = sums["sampler_weight"] / tokens
        if lr is not None:
            metrics["train/lr"] = lr
        return metrics
