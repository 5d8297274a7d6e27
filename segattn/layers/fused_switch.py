"""The switches between the fused autograd Functions and the plain autograd formulas they optimise, and
between the fused Functions' two implementations (PyTorch ops or Triton kernels).

Every fast path of the package (``attention.fused.kernel``, ``attention.fused.focus``, ``layers.depthwise``)
runs only where ``use_fused()`` says so; otherwise the caller takes its plain formula (``functional.py``,
``functional_approx.py``, FLatten's module code, ``F.conv2d``): same values within float rounding, ordinary
autograd. ``SEGATTN_FUSED=0`` in the environment selects the plain formulas everywhere, to rule the
hand-written backward passes in or out when a result looks wrong, or to time them against autograd.

Both are read once, when a module is built (``kernel_backend``: "plain" under SEGATTN_FUSED=0), and applied
per call (``use_fused``, ``attention.triton.use_triton``), so a module keeps the path it was built with.
``SEGATTN_KERNEL`` picks the implementation of the kernel-attention core: unset or ``auto``, CUDA tensors
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
PLAIN = "plain"  # the backend of a module built under SEGATTN_FUSED=0: the plain formulas


def fused_enabled() -> bool:
    """SEGATTN_FUSED as a bool: False for "0", True unset, empty or "1". Other values are a ValueError, so a
    misspelt "false" does not silently leave the fused path on."""
    value = os.environ.get(FUSED_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(
            f"{FUSED_ENV}={value!r}; expected 0 (plain autograd formulas) or 1 (fused Functions, the default)"
        )
    return value != "0"


def kernel_backend() -> str:
    """The fast path a module takes, read once when it is built: "plain" under SEGATTN_FUSED=0, else
    SEGATTN_KERNEL as "auto" (unset or empty), "torch" or "triton". Another SEGATTN_KERNEL value is a
    ValueError; "triton" without triton installed, or without a CUDA device and TRITON_INTERPRET=1, is a
    RuntimeError naming the setting."""
    value = os.environ.get(KERNEL_ENV, "") or "auto"
    if value not in KERNEL_BACKENDS:
        raise ValueError(f"{KERNEL_ENV}={value!r}; expected auto (the default), torch or triton")
    if not fused_enabled():
        return PLAIN
    if value == "triton" and importlib.util.find_spec("triton") is None:
        raise RuntimeError(f"{KERNEL_ENV}=triton but triton is not installed; unset it for the PyTorch path")
    if value == "triton" and not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            f"{KERNEL_ENV}=triton without a CUDA device needs TRITON_INTERPRET=1 (Triton's CPU interpreter); "
            f"unset {KERNEL_ENV} for the PyTorch path"
        )
    return value


def exporting() -> bool:
    """Whether the call is being traced, scripted or exported (TorchScript, ONNX, ``torch.export``): exported
    files hold the plain ops only, never the fused Functions or the Triton operators."""
    return (
        torch.jit.is_tracing()
        or torch.jit.is_scripting()
        or torch.onnx.is_in_onnx_export()
        or torch.compiler.is_exporting()
    )


def tracing() -> bool:
    """Whether the call is being traced, scripted, exported or compiled: those see the plain ops (the
    Triton path's operators survive ``torch.compile``: ``attention.triton.use_triton``)."""
    return exporting() or torch.compiler.is_compiling()


def use_fused(backend: str | None = None) -> bool:
    """Whether to take a fast path (fused Functions or Triton kernels): never while tracing, scripting,
    exporting or compiling; otherwise unless ``backend`` is "plain". ``backend`` is the module's
    ``kernel_backend``, read when it was built; None (a functional call outside a module) reads
    SEGATTN_FUSED now. On a band of a split image (``segattn.parallel``) the fused kernels sum their token
    summaries over the bands; the Functions that cannot (depthwise conv, key softmax, Performer's key
    stabiliser) check ``tokens_split`` themselves."""
    if tracing():
        return False  # checked first: compiled code never reads the environment
    return fused_enabled() if backend is None else backend != PLAIN
