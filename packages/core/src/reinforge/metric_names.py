"""The stable names of step metrics: a contract between backends, which write them, and readers.

A training backend writes one record per training step and per evaluation (into
``RUN_DIR/metrics.jsonl`` and through the ``on_step_end`` hook); reinforge-report
plots them and runs its reward-hacking checks on them. Any name may be missing from
any record; readers must tolerate that, and ignore names they do not know.

================================  ===========  ===================================================
name                              records      meaning
================================  ===========  ===================================================
``step``                          both         global training step (1-based; 0 = the base model)
``kind``                          both         ``"train"`` or ``"eval"`` (a line without it is train)
``time``                          both         Unix time the record was written, seconds
``reward/mean``                   both         mean final reward of the step's samples
``reward/std``                    train        its standard deviation
``reward/<dimension>/mean``       both         mean of one reward dimension (a judge's metric, e.g.
                                               ``reward/correct/mean``; may hold a ``/``)
``reward/<dimension>/std``        train        its standard deviation
``response_length/mean``          both         mean response length (tokens)
``response_length/std``           train        its standard deviation
``entropy``                       train        mean policy entropy, nats per token
``kl``                            train        KL divergence to the reference policy
``clip_frac``                     train        fraction of tokens whose ratio was clipped
``grad_norm``                     train        gradient norm before clipping
``loss``                          train        training loss
``tokens_per_s``                  train        throughput, tokens per second
``truncated_rate``                train        fraction of responses cut at ``max_tokens``
``count/discarded``               train        samples discarded (failed rollouts or groups)
``accuracy/greedy``               eval         held-out accuracy, greedy decoding
``accuracy/sampled``              eval         held-out accuracy, sampled at the run's temperature
================================  ===========  ===================================================

This module imports nothing, so any package can use it without loading core. Plugins import it as
``from reinforge.plugin import metric_names``; core's writers (``Runner.summarize``, ``RunContext``)
use the same constants.
"""

from __future__ import annotations

# -- record fields
STEP = "step"
KIND = "kind"
TIME = "time"
KIND_TRAIN = "train"
KIND_EVAL = "eval"
RECORD_FIELDS = (KIND, STEP, TIME)  # not metrics: every reader skips these

# -- rewards
REWARD = "reward"  # the final reward's dimension name (``eval.accuracy_key``'s default)
REWARD_MEAN = "reward/mean"
REWARD_STD = "reward/std"
REWARD_PREFIX = "reward/"  # reward/<dimension>/mean, reward/<dimension>/std
MEAN_SUFFIX = "/mean"
STD_SUFFIX = "/std"

# -- responses
RESPONSE_LENGTH = "response_length"
RESPONSE_LENGTH_MEAN = "response_length/mean"
RESPONSE_LENGTH_STD = "response_length/std"
TRUNCATED_RATE = "truncated_rate"

# -- optimisation
ENTROPY = "entropy"
KL = "kl"
CLIP_FRAC = "clip_frac"
GRAD_NORM = "grad_norm"
LOSS = "loss"
TOKENS_PER_S = "tokens_per_s"
COUNT_PREFIX = "count/"  # count/<counter>: the runner's counters (rollouts, retries, failed, kept...)
COUNT_DISCARDED = "count/discarded"

# -- evaluation
ACCURACY_PREFIX = "accuracy/"
ACCURACY_GREEDY = "accuracy/greedy"
ACCURACY_SAMPLED = "accuracy/sampled"


def dimension_mean(dimension: str) -> str:
    """``reward/<dimension>/mean``."""
    return f"{REWARD_PREFIX}{dimension}{MEAN_SUFFIX}"


def dimension_std(dimension: str) -> str:
    """``reward/<dimension>/std``."""
    return f"{REWARD_PREFIX}{dimension}{STD_SUFFIX}"


def dimension_of(name: str) -> str | None:
    """The dimension of ``reward/<dimension>/mean``, or None for any other name (``reward/mean`` included)."""
    if name.startswith(REWARD_PREFIX) and name.endswith(MEAN_SUFFIX) and name != REWARD_MEAN:
        return name[len(REWARD_PREFIX) : -len(MEAN_SUFFIX)]
    return None
