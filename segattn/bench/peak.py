"""``python -m segattn.bench.peak REPORT MODULE ARGS...``: run ``python -m MODULE ARGS`` in this process and
write its peak resident set (bytes) to REPORT when it ends, however it ends.

The peak is the kernel's high-water mark of this process's own memory (``VmHWM``). A child's
``ru_maxrss`` as ``wait4`` reports it is not: Linux carries the high-water mark of the memory image the
child had before ``exec`` (the parent's, shared or copied at fork) into the new program, so a parent that
has imported torch would be counted in the child's peak. Nothing is imported here beyond the standard
library, so the command's own imports are measured as part of it.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def peak_bytes() -> int:
    """This process's resident high-water mark (Linux ``/proc/self/status`` VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM line (not Linux?)")


def reset_peak_bytes() -> None:
    """Start this process's resident high-water mark again from its present resident set (Linux
    ``/proc/self/clear_refs``), so that ``peak_bytes`` measures what follows."""
    Path("/proc/self/clear_refs").write_text("5")


def main() -> None:
    report, module, *args = sys.argv[1:]
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        Path(report).write_text(str(peak_bytes()))


if __name__ == "__main__":
    main()
