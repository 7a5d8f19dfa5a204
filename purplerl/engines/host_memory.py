"""The process's heap between training passes: glibc keeps the pages a pass frees, fragmented, and the next pass maps
new pages beside them, so the peak RSS drifts far above the working set (bench/NOTES.md, "Heap trim")."""

from __future__ import annotations

import ctypes
import functools


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # the symbols this process has loaded, libc's among them
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_memory() -> None:
    """Give the heap's free pages back to the OS, between two training micro-batches (after one has freed its
    activations, before the next maps its own). Without it, the peak RSS of a 64 x 256 bf16 step ran 6.3 GiB on one
    2-core AMX machine and 8.0 GiB on another, for a working set of 3.7 GiB; with a trim between passes it is 5.1-5.2
    GiB. Not after a step's last pass: the next phase (sampling, scoring) reuses those pages, and trimming them made
    it page-fault them afresh (~850k faults, ~1 s of a 4.3 s training phase, bench/NOTES.md). Nothing to do without
    glibc."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
