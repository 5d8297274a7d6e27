"""The Triton path of the kernel-attention core (``linear``, ``efficient``, ``taylor``, ``flatten``,
``litemla``, ``pola``): fused GPU kernels for the forward (context reduction over N split across programs,
then application with the normaliser) and the backward, with the feature maps recomputed in registers.

Which path runs is chosen once, when an attention module is built (``layers.kernel_backend``:
SEGATTN_KERNEL), and applied per call by ``use_triton``: the Triton path takes CUDA tensors whenever triton
imports (or any tensor when forced, on the CPU through Triton's interpreter); the PyTorch fused path
(``fused.kernel``, ``fused.focus``) everything else. The Triton path is a set of torch operators
(``ops.py``, ``torch.ops.segattn.*``), so it also runs under ``torch.compile``, where the PyTorch fused path
gives way to the plain formulas (``layers.use_fused``); while tracing, scripting or exporting
(``layers.exporting``) both do, so exported files never hold the operators. float64 and head dims above
``MAX_HEAD_DIM`` stay on the PyTorch path unless Triton is forced, which refuses such a head dim by name.

The kernels' module is loaded on first use (``load_kernels``), so that importing segattn never needs
triton. For the CPU interpreter TRITON_INTERPRET=1 must be set when the process starts (``kernels``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from types import ModuleType

import torch
from torch import Tensor

from ...layers import KERNEL_ENV, exporting
from ...layers.fused_switch import PLAIN
from ...parallel import tokens_split

MAX_HEAD_DIM = 128
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@torch.compiler.assume_constant_result  # compiled code takes the answer as a constant
@functools.cache
def available() -> bool:
    """Whether triton is installed (checked once, without importing it)."""
    return importlib.util.find_spec("triton") is not None


@functools.cache
def load_kernels() -> ModuleType:
    """``kernels``, imported on first use (it reads TRITON_INTERPRET then)."""
    return importlib.import_module(f"{__name__}.kernels")


@torch.compiler.assume_constant_result
def interpreted() -> bool:
    """Whether the kernels run on Triton's CPU interpreter (``kernels.INTERPRETED``)."""
    return load_kernels().INTERPRETED


def use_triton(backend: str, x: Tensor, head_dim: int, widening: int = 1) -> bool:
    """Whether a call on ``x`` (q, or any input: its device and dtype decide) with heads ``head_dim`` wide
    takes the Triton path under the module's ``backend`` ("auto", "torch" or "triton";
    ``layers.kernel_backend``); ``widening``: features per head channel (pola's 2).

    "auto": CUDA tensors of fp32/bf16/fp16 with head_dim·widening up to ``MAX_HEAD_DIM`` when triton is
    installed. "triton": every such tensor, on the CPU only when the kernels were loaded under
    TRITON_INTERPRET=1; wider features are a ValueError naming the head dim. Under ``torch.compile`` too
    (the operators stay in the graph), except on a band of a split image (the backward's sum over the bands
    is captured per call); never while tracing, scripting or exporting.
    """
    if backend in ("torch", PLAIN) or x.dtype not in DTYPES or exporting():
        return False
    if torch.compiler.is_compiling() and tokens_split():
        return False
    width = head_dim * widening
    if backend == "auto":
        return x.is_cuda and available() and width <= MAX_HEAD_DIM
    if width > MAX_HEAD_DIM:
        features = f" ({width} features)" if widening > 1 else ""
        raise ValueError(
            f"{KERNEL_ENV}=triton: head dim {head_dim}{features} is above the Triton kernels' "
            f"{MAX_HEAD_DIM}; use narrower heads or {KERNEL_ENV}=torch"
        )
    if not x.is_cuda and not interpreted():
        raise RuntimeError(
            f"{KERNEL_ENV}=triton on a {x.device.type} tensor needs TRITON_INTERPRET=1 set when the process "
            f"starts (or a CUDA device); unset {KERNEL_ENV} for the PyTorch path"
        )
    return True
