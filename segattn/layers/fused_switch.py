"""The switches between the fused autograd Functions and the plain autograd formulas they optimise, and
between the fused Functions' two implementations (PyTorch ops or Triton kernels).

Every fast path of the package (``attention.fused_kernel``, ``attention.fused_focus``, ``layers.depthwise``)
runs only where ``use_fused()`` says so; otherwise the caller takes its plain formula (``functional.py``,
``functional_approx.py``, FLatten's module code, ``F.conv2d``): same values within float rounding, ordinary
autograd. ``SEGATTN_FUSED=0`` in the environment selects the plain formulas everywhere, to rule the
hand-written backward passes in or out when a result looks wrong, or to time them against autograd.

``SEGATTN_KERNEL`` picks the implementation of the kernel-attention core when an attention module is built
(``kernel_backend``; ``attention.triton.use_triton`` applies it per call): unset or ``auto``, CUDA tensors
take the Triton kernels whenever triton is installed and everything else the PyTorch Functions; ``torch``
keeps the PyTorch Functions everywhere; ``triton`` forces the kernels (on the CPU only through Triton's
interpreter, TRITON_INTERPRET=1).
"""

from __future__ import annotations

import importlib.util
import os

import torch

FUSED_ENV = "SEGATTN_FUSED"  # "0": plain autograd formulas; unset, "" or "1": fused Functions (default)
KERNEL_ENV = "SEGATTN_KERNEL"  # "auto" (default), "torch" or "triton"
KERNEL_BACKENDS = ("auto", "torch", "triton")


def kernel_backend() -> str:
    """SEGATTN_KERNEL as "auto" (unset or empty), "torch" or "triton", read once per attention module when it
    is built. Another value is a ValueError; "triton" without triton installed, or without a CUDA device
    and TRITON_INTERPRET=1, is a RuntimeError naming the setting."""
    value = os.environ.get(KERNEL_ENV, "") or "auto"
    if value not in KERNEL_BACKENDS:
        raise ValueError(f"{KERNEL_ENV}={value!r}; expected auto (the default), torch or triton")
    if value == "triton" and importlib.util.find_spec("triton") is None:
        raise RuntimeError(f"{KERNEL_ENV}=triton but triton is not installed; unset it for the PyTorch path")
    if value == "triton" and not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            f"{KERNEL_ENV}=triton without a CUDA device needs TRITON_INTERPRET=1 (Triton's CPU interpreter); "
            f"unset {KERNEL_ENV} for the PyTorch path"
        )
    return value


def use_fused() -> bool:
    """Whether to take the fused Functions: False while tracing, scripting, exporting or compiling (those
    see the plain ops) and with SEGATTN_FUSED=0; True otherwise. On a band of a split image
    (``segattn.parallel``) the fused kernels sum their token summaries over the bands; the Functions that
    cannot (depthwise conv, key softmax, Performer's key stabiliser) check ``tokens_split`` themselves.

    The variable is read on every call, not at import, so a test or a benchmark can flip it within one
    process; the lookup costs about a microsecond per attention call. Values other than "", "0" and "1"
    are a ValueError, so a misspelt "false" does not silently leave the fused path on.
    """
    if (
        torch.jit.is_tracing()
        or torch.jit.is_scripting()
        or torch.onnx.is_in_onnx_export()
        or torch.compiler.is_compiling()
    ):
        return False  # checked first: compiled code never reads the environment
    value = os.environ.get(FUSED_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(
            f"{FUSED_ENV}={value!r}; expected 0 (plain autograd formulas) or 1 (fused Functions, the default)"
        )
    return value != "0"
