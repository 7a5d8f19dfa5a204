"""release_free_memory: after a training micro-batch frees its activations, the heap's free pages go back to the OS
(glibc's malloc_trim) instead of staying mapped, fragmented, beside the next pass's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.process

# 256 blocks of 1 MiB on the heap (the mmap threshold is pinned above them), each followed by a 100 kB block
# (larger than any free-list entry) that stays allocated, so the heap cannot shrink from its top when the big
# blocks are freed: only a trim returns them.
FRAGMENTED_HEAP = """
import ctypes, json
from purplerl.engines.host_memory import _malloc_trim, release_free_memory
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
big, keep = [], []
for _ in range(256):
    p = libc.malloc(2**20); libc.memset(p, 1, 2**20); big.append(p)
    keep.append(libc.malloc(100_000))
before = rss_mib()
for p in big:
    libc.free(p)
freed = rss_mib()
release_free_memory()
print(json.dumps({"glibc": _malloc_trim() is not None, "before": before, "freed": freed, "trimmed": rss_mib()}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_a_trim_returns_the_freed_heap_to_the_os() -> None:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(16 * 2**20)}
    proc = subprocess.run([sys.executable, "-c", FRAGMENTED_HEAP], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if not out["glibc"]:
        pytest.skip("the C library has no malloc_trim")
    assert out["freed"] > out["before"] - 16, out  # free() alone keeps the fragmented pages mapped
    assert out["trimmed"] < out["freed"] - 200, out  # the trim returns (nearly) all 256 MiB
