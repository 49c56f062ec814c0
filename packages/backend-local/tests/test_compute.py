"""The process's tensor work on one thread (compute.py): the helpers' contracts."""

import threading

import pytest

from reinforge_backend_local.compute import compute_executor, in_passing_thread, on_compute_thread


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
