import subprocess
import sys
import textwrap

import pytest

from reinforge_backend_local.memory import fix_mmap_threshold, limit_malloc_arenas

glibc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and malloc_trim")


def test_a_users_malloc_arena_max_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False


def test_a_users_mmap_threshold_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert fix_mmap_threshold() is False


@glibc
def test_glibc_accepts_the_arena_limit(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert limit_malloc_arenas() is True


# In a fresh interpreter (this one's heap is pytest's): 200 MB of 256 KiB blocks, below the fixed mmap
# threshold so they come from the heap; all but the last are freed, so the free pages sit below a live block
# and glibc's automatic trim of the heap's top cannot return them. release_free_memory() must.
_HEAP_IN_THE_MIDDLE = """
from reinforge_backend_local.memory import configure_malloc, release_free_memory

def rss_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

configure_malloc()
blocks = [bytearray(256 * 1024) for _ in range(800)]
last = blocks.pop()
del blocks
held = rss_mb()
released = release_free_memory()
print(released, held - rss_mb())
"""


@glibc
def test_release_free_memory_returns_freed_heap_pages_below_a_live_block(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_HEAP_IN_THE_MIDDLE)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out[0] == "True"
    assert float(out[1]) > 150, f"only {out[1]} MB of the 200 MB freed went back"
