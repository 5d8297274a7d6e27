"""How glibc's malloc treats large freed CPU tensors: kept for reuse (training speed) or returned (measuring).

glibc serves every block over 32 MiB with its own mmap and unmaps it on free, so each training step at
high resolution page-faults all of its large activations afresh: about half of a pvt-b0 step at 1024²
on this project's CPU. Keeping freed blocks on the heap, as PyTorch's CUDA caching allocator does on the
GPU, removes that cost. It is opt-in (SEGATTN_REUSE_FREED_MEMORY=1) because glibc's heap fragments: the
resident peak is higher, and some allocation orders make the heap grow step after step (README,
Performance).
"""

from __future__ import annotations

import ctypes
import functools
import os

OPT_IN = "SEGATTN_REUSE_FREED_MEMORY"  # set to 1 to keep freed blocks for reuse
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
GLIBC_MMAP_MAX = 65536  # glibc's default M_MMAP_MAX


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, musl): nothing to tune
        return None
    return libc if hasattr(libc, "mallopt") else None


def _mallopt(*settings: tuple[int, int]) -> bool:
    libc = _glibc()
    return libc is not None and all(libc.mallopt(option, value) == 1 for option, value in settings)


def reuse_requested() -> bool:
    """Whether the environment opts in to keeping freed blocks (SEGATTN_REUSE_FREED_MEMORY=1)."""
    return os.environ.get(OPT_IN) == "1"


def reuse_freed_memory() -> bool:
    """With SEGATTN_REUSE_FREED_MEMORY=1, keep freed blocks of any size on the heap for the next allocation
    (no mmap, no trimming); called by the train, predict and bench commands. Returns whether it applied."""
    if not reuse_requested():
        return False
    return _mallopt((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1))


def return_freed_memory() -> bool:
    """Hand every block of 128 KiB or more back to the OS on free, so the resident size tracks live
    tensors: the bench's memory children measure successive configurations in one process this way."""
    return _mallopt(
        (M_MMAP_MAX, GLIBC_MMAP_MAX), (M_MMAP_THRESHOLD, 128 * 1024), (M_TRIM_THRESHOLD, 256 * 1024)
    )
