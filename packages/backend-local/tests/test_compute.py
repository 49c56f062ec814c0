"""The process's tensor work on one thread (compute.py): the helpers' contracts."""

import os
import subprocess
import sys
import threading

import pytest

from reinforge_backend_local.model.compute import compute_executor, in_passing_thread, on_compute_thread


def test_on_compute_thread_runs_there_and_inline_when_already_there():
    name = on_compute_thread(lambda: threading.current_thread().name)
    assert name.startswith("reinforge-compute") and name != threading.current_thread().name

    def nested():  # a call from the compute thread itself does not wait on its own queue
        return on_compute_thread(lambda: threading.current_thread().name)

    assert compute_executor().submit(nested).result(timeout=30) == name
    with pytest.raises(ZeroDivisionError):
        on_compute_thread(lambda: 1 / 0)


def test_in_passing_thread_returns_raises_and_the_thread_ends():
    threads = []

    def work(x, *, y):
        threads.append(threading.current_thread())
        return x + y

    assert in_passing_thread(work, 1, y=2) == 3
    assert threads[0] is not threading.current_thread() and not threads[0].is_alive()
    with pytest.raises(KeyError, match="missing"):
        in_passing_thread(lambda: {}["missing"])


BUILD_ON_MAIN_THREAD = """
import os, types
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from reinforge_backend_local.inference.engine import Engine

torch.set_num_threads(2)
config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(config).eval()
before = len(os.listdir("/proc/self/task"))
engine = Engine(model, types.SimpleNamespace(eos_token_id=2, pad_token_id=None), max_model_len=64)
assert engine.decoder is not None
print(before, len(os.listdir("/proc/self/task")))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_building_the_engine_starts_no_openmp_team_on_the_callers_thread():
    """PolicyRuntime builds its engine on the caller's thread; tensor work there would give that thread an
    OpenMP team of its own (one more OS thread), and every parallel region of the compute thread got
    2-4x slower for the rest of the process (measured: a bf16 decode step 58 -> 31 ms without it)."""
    out = subprocess.run([sys.executable, "-c", BUILD_ON_MAIN_THREAD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, after = map(int, out.stdout.split())
    assert after == before, f"building the engine started {after - before} thread(s) on the caller's side"
