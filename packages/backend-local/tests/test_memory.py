import subprocess
import sys
import textwrap

import pytest

from reinforge_backend_local.model.memory import fix_mmap_threshold, keep_heap_top, limit_malloc_arenas

glibc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and malloc_trim")


def _run_untuned(monkeypatch, script):
    """``script``'s printed words, run in a fresh interpreter without the user's malloc variables."""
    for name in ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"):
        monkeypatch.delenv(name, raising=False)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, check=True
    ).stdout.split()


def test_a_users_malloc_arena_max_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False


def test_a_users_mmap_threshold_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert fix_mmap_threshold() is False


def test_a_users_trim_threshold_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert keep_heap_top() is False


@glibc
def test_glibc_accepts_the_arena_limit(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert limit_malloc_arenas() is True


# In a fresh interpreter (this one's heap is pytest's): 200 MB of 256 KiB blocks, below the fixed mmap
# threshold so they come from the heap; all but the last are freed, so the free pages sit below a live block
# and glibc's automatic trim of the heap's top cannot return them. release_free_memory() must.
_HEAP_IN_THE_MIDDLE = """
from reinforge_backend_local.model.memory import configure_malloc, release_free_memory

def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

configure_malloc()
blocks = [bytearray(256 * 1024) for _ in range(800)]
last = blocks.pop()
del blocks
held = rss_mb()
released = release_free_memory(keep=0)
print(released, held - rss_mb())
"""


@glibc
def test_release_free_memory_returns_freed_heap_pages_below_a_live_block(monkeypatch):
    out = _run_untuned(monkeypatch, _HEAP_IN_THE_MIDDLE)
    assert out[0] == "True"
    assert float(out[1]) > 150, f"only {out[1]} MB of the 200 MB freed went back"


# Blocks of 4 MB (tensors of a training pass: activations of a few hundred tokens): freed, then asked for
# again. Under configure_malloc() the second round reuses the heap's pages (no new page faults), and a
# release that keeps up to 1 GiB free leaves them there; one that keeps nothing returns them.
_REUSE = """
import resource
from reinforge_backend_local.model.memory import configure_malloc, free_heap_bytes, release_free_memory

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def touch_and_free():
    before = faults()
    blocks = [bytearray(4 << 20) for _ in range(50)]  # bytearray zero-fills: every page is touched
    del blocks
    return faults() - before

configure_malloc()
first = touch_and_free()
kept = release_free_memory(keep=1 << 30)
free = free_heap_bytes()
second = touch_and_free()
gone = release_free_memory(keep=0)
print(first, second, kept, free, gone, free_heap_bytes())
"""


@glibc
def test_freed_blocks_are_reused_without_new_page_faults_until_released(monkeypatch):
    out = _run_untuned(monkeypatch, _REUSE)
    first, second = int(out[0]), int(out[1])
    assert first > 40_000, f"200 MB touched with only {first} page faults"  # 51,200 pages of 4 KiB
    assert second < first // 10, f"the second round faulted {second} times (first {first}): the pages went back"
    assert out[2] == "False" and int(out[3]) >= 200 << 20  # under the 1 GiB kept, nothing went back
    assert out[4] == "True" and int(out[5]) < int(out[3])


_TIGHT = """
import resource
from reinforge_backend_local.model.memory import configure_malloc

def touch_and_free():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [bytearray(4 << 20) for _ in range(50)]
    del blocks
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

configure_malloc(keep_free=0)
print(touch_and_free(), touch_and_free())
"""


@glibc
def test_keeping_nothing_returns_each_large_block_as_it_is_freed(monkeypatch):
    out = _run_untuned(monkeypatch, _TIGHT)
    first, second = int(out[0]), int(out[1])
    assert second > first // 2, f"the second round faulted {second} times (first {first}): the blocks were kept"
