"""The Triton path of the kernel-attention core (``linear``, ``efficient``, ``taylor``, ``flatten``,
``litemla``, ``pola``): fused GPU kernels for the forward (context reduction over N split across programs,
then application with the normaliser) and the backward, with the feature maps recomputed in registers.

Which calls take it is ``layers.fast_path.choose_path``'s decision: CUDA tensors whenever triton is
installed (or any tensor when forced by SEGATTN_KERNEL=triton, on the CPU through Triton's interpreter).
The path is a set of torch operators (``ops.py``, ``torch.ops.segattn.*``), so it also runs under
``torch.compile``, where the PyTorch Functions give way to the plain formulas; while tracing, scripting or
exporting both do, so exported files never hold the operators.

The kernels' module is loaded on first use (``load_kernels``), so that importing segattn never needs
triton. For the CPU interpreter TRITON_INTERPRET=1 must be set when the process starts (``kernels``).
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType


@functools.cache
def load_kernels() -> ModuleType:
    """``kernels``, imported on first use (it reads TRITON_INTERPRET then)."""
    return importlib.import_module(f"{__name__}.kernels")
