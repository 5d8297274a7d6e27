"""Where glibc puts large CPU tensors under each allocator setting, read from mallinfo2 in a fresh process:
kept on the heap and reused (opt-in, for training), or mmap'ed and unmapped on free (glibc's default for
blocks over 32 MiB, and every block of 128 KiB or more in the bench's memory children)."""

import ctypes
import json
import os
import subprocess
import sys

import pytest

PROBE = """
import ctypes, json, sys
import torch
from segattn import cpu_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
applied = getattr(cpu_memory, sys.argv[1])()
STEPS = 30
MIB = 2**20
arena, mmapped = [], []
for step in range(STEPS):  # like training steps: large activations, their gradients, small tensors between
    before = libc.mallinfo2()
    activations = []
    for size in (48, 64, 64, 96):
        activations += [torch.empty(size * MIB, dtype=torch.uint8).fill_(1), torch.empty(1000)]
    gradients = [torch.empty_like(tensor) for tensor in activations[::2]]
    held = libc.mallinfo2()
    del activations, gradients
    arena.append(held.arena)
    mmapped.append(held.hblkhd - before.hblkhd)
print(json.dumps({"applied": applied, "arena": arena, "mmapped": mmapped}))
"""

MIB = 2**20
LARGE_BYTES_PER_STEP = 2 * (48 + 64 + 64 + 96) * MIB  # the activations and their gradients


def glibc_has_mallinfo2() -> bool:
    try:
        return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not glibc_has_mallinfo2(), reason="needs glibc >= 2.33 (mallinfo2)")


def probe(setting: str, opt_in: bool = True) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "SEGATTN_REUSE_FREED_MEMORY"}
    env |= {"OMP_NUM_THREADS": "1"} | ({"SEGATTN_REUSE_FREED_MEMORY": "1"} if opt_in else {})
    result = subprocess.run(
        [sys.executable, "-c", PROBE, setting], capture_output=True, text=True, check=True, env=env
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_reuse_serves_large_tensors_from_the_heap_and_the_next_steps_reuse_them():
    stats = probe("reuse_freed_memory")
    assert stats["applied"]
    assert max(stats["mmapped"]) < MIB
    # Freed blocks are served again: 30 steps allocate 30x the per-step bytes, the heap holds far less. It
    # does grow over the first steps (fragmentation), which is why reuse is opt-in.
    assert stats["arena"][-1] - stats["arena"][0] < 2 * LARGE_BYTES_PER_STEP


def test_return_maps_each_large_tensor_on_its_own():
    stats = probe("return_freed_memory")
    assert stats["applied"]
    assert min(stats["mmapped"]) >= LARGE_BYTES_PER_STEP
    assert stats["arena"][-1] - stats["arena"][0] < 48 * MIB


def test_reuse_is_off_unless_the_environment_opts_in():
    stats = probe("reuse_freed_memory", opt_in=False)
    assert not stats["applied"]
    assert min(stats["mmapped"]) >= LARGE_BYTES_PER_STEP  # glibc maps every block over 32 MiB itself
