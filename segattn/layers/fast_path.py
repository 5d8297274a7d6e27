"""The one choice of path, per call, for every core with a fast path (``choose_path``): its plain autograd
formula (PLAIN, the reference), a PyTorch autograd Function with a hand-written backward (FUNCTION:
``attention.autograd``, ``layers.depthwise``) or the Triton kernels (TRITON: ``attention.triton``,
``layers.depthwise_triton``), with the settings, tracing, export, device and dtype rules in this module
alone. Same values within float rounding.

The settings are read when a module is built (``kernel_backend``), so it keeps its path; a functional call
outside a module reads them at each call. ``SEGATTN_FUSED=0``: the plain formulas everywhere (to rule the
hand-written backward passes in or out, or time them). ``SEGATTN_KERNEL``: ``auto`` (default) gives CUDA
tensors the Triton kernels that a GPU run has measured faster than their PyTorch path (the attention cores,
Mix-FFN's conv + GELU, LayerNorm) when triton is installed, ``torch`` never, ``triton`` every one, and the
name of an opt-in form (``OPT_IN``: the fused loss, slower than the PyTorch loss on an H200,
docs/performance.md; the decode head's upsampling as matmuls, untimed, on the Triton rules though not
Triton; the decode head's BatchNorm + ReLU + classifier, untimed; Mix-FFN's conv + GELU + fc2, untimed; a
block's residual adds in the LayerNorm after them, untimed) ``auto`` plus that one, so that a GPU run can
time it against ``auto`` alone.
"""

from __future__ import annotations

import contextvars
import functools
import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from ..parallel import tokens_split

FUSED_ENV = "SEGATTN_FUSED"  # "0": plain autograd formulas; unset, "" or "1": the Functions (default)
KERNEL_ENV = "SEGATTN_KERNEL"  # one of KERNEL_BACKENDS; "auto" by default
# fast forms "auto" leaves out until a GPU run times them faster
OPT_IN = ("loss", "upsample", "head", "ffn", "residual")
KERNEL_BACKENDS = ("auto", "torch", "triton", *OPT_IN)
PLAIN, FUNCTION, TRITON = "plain", "function", "triton"  # the paths; PLAIN is also a module's backend
MAX_HEAD_DIM = 128  # the widest features the Triton kernels take
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
GPU_PATHS = contextvars.ContextVar("GPU_PATHS", default=False)  # set by ``paths_of_a_gpu``


@contextmanager
def paths_of_a_gpu() -> Iterator[None]:
    """Choose, for CPU tensors, the paths CUDA tensors would take (the Triton operators where "auto" gives
    them, and CUDA's autocast dtypes where a module picks its own: ``on_a_gpu``), for fake tensors only:
    ``bench traffic`` counts a GPU's step on a CPU, where nothing runs and each operator is one op of its
    fake implementation."""
    token = GPU_PATHS.set(True)
    try:
        yield
    finally:
        GPU_PATHS.reset(token)


def on_a_gpu(x: Tensor) -> bool:
    """Whether ``x`` takes a CUDA device's paths and autocast rules: a CUDA tensor, or any under
    ``paths_of_a_gpu``."""
    return x.is_cuda or GPU_PATHS.get()


def functions_enabled() -> bool:
    """SEGATTN_FUSED as a bool: False for "0", True unset, empty or "1". Other values are a ValueError, so a
    misspelt "false" does not silently leave the Functions on."""
    value = os.environ.get(FUSED_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(
            f"{FUSED_ENV}={value!r}; expected 0 (plain autograd formulas) or 1 (the Functions, the default)"
        )
    return value != "0"


def kernel_backend() -> str:
    """The fast path a module takes, read once when it is built: "plain" under SEGATTN_FUSED=0, else
    SEGATTN_KERNEL as "auto" (unset or empty), "torch", "triton" or an ``OPT_IN`` name. Another
    SEGATTN_KERNEL value is a ValueError; "triton" without triton installed, or without a CUDA device and
    TRITON_INTERPRET=1, is a RuntimeError naming the setting."""
    value = os.environ.get(KERNEL_ENV, "") or "auto"
    if value not in KERNEL_BACKENDS:
        raise ValueError(
            f"{KERNEL_ENV}={value!r}; expected auto (the default), torch, triton, "
            f"{', '.join(OPT_IN[:-1])} or {OPT_IN[-1]} (auto and that form)"
        )
    if not functions_enabled():
        return PLAIN
    if value == "triton" and not triton_installed():
        raise RuntimeError(f"{KERNEL_ENV}=triton but triton is not installed; unset it for the PyTorch path")
    if value == "triton" and not (torch.cuda.is_available() or interpreted() or GPU_PATHS.get()):
        raise RuntimeError(
            f"{KERNEL_ENV}=triton without a CUDA device needs TRITON_INTERPRET=1 (Triton's CPU interpreter); "
            f"unset {KERNEL_ENV} for the PyTorch path"
        )
    return value


@torch.compiler.assume_constant_result  # compiled code takes the answer as a constant
@functools.cache
def triton_installed() -> bool:
    """Whether triton is installed (checked once, without importing it)."""
    return importlib.util.find_spec("triton") is not None


@torch.compiler.assume_constant_result
def interpreted() -> bool:
    """Whether TRITON_INTERPRET=1 asks for Triton's CPU interpreter (``attention.triton.kernels`` refuses to
    load when triton was imported with the opposite setting)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def exporting() -> bool:
    """Whether the call is being traced, scripted or exported (TorchScript, ONNX, ``torch.export``): exported
    files hold the plain ops only, never the Functions or the Triton operators."""
    return (
        torch.jit.is_tracing()
        or torch.jit.is_scripting()
        or torch.onnx.is_in_onnx_export()
        or torch.compiler.is_exporting()
    )


def choose_path(
    backend: str | None,
    x: Tensor,
    *,
    triton_head_dim: int | None = None,
    widening: int = 1,
    function: bool = True,
    whole_image: bool = False,
    opt_in: str | None = None,
) -> str:
    """The path of one call on ``x`` (q, or any input: its device and dtype decide) under ``backend`` (the
    module's ``kernel_backend``; None: the environment now): TRITON, FUNCTION or PLAIN.

    The caller says which forms its core has: ``triton_head_dim`` (heads that wide, 1 for a per-channel
    core such as Mix-FFN's conv + GELU; None: no Triton form; ``widening``: features per head channel,
    pola's 2), ``function`` (a PyTorch Function), ``whole_image`` (a sum or max over all tokens that the
    fast forms cannot split: PLAIN on a band of a split image, ``segattn.parallel``; the others sum their
    token summaries over the bands), ``opt_in`` (its ``OPT_IN`` name: a fast form that "auto" leaves out,
    which "triton" and its own name take).

    TRITON: "auto" takes CUDA tensors of fp32/bf16/fp16 with head_dim·widening up to ``MAX_HEAD_DIM`` when
    triton is installed; "triton" every such tensor, on the CPU only under TRITON_INTERPRET=1, and wider
    features are a ValueError naming the head dim. Under ``torch.compile`` too (its operators stay in the
    graph), except on a band of a split image (the backward's sum over the bands is captured per call).
    FUNCTION: unless ``backend`` is "plain", and never while compiling. Neither while tracing, scripting or
    exporting.
    """
    if whole_image and tokens_split():
        return PLAIN
    backend = auto_for(kernel_backend() if backend is None else backend, opt_in)
    if triton_head_dim is not None and takes_triton(backend, x, triton_head_dim, widening):
        return TRITON
    if not function or exporting() or torch.compiler.is_compiling():  # compiled code never reads the env
        return PLAIN
    return FUNCTION if backend != PLAIN else PLAIN


def auto_for(backend: str, opt_in: str | None) -> str:
    """``backend`` as a core named ``opt_in`` (None: a core "auto" takes) reads it: an ``OPT_IN`` name is
    "auto" for its own core and for the others "auto" takes, "torch" for the other opt-in cores; "auto" is
    "torch" for an opt-in core."""
    if backend in OPT_IN:
        return "auto" if opt_in in (None, backend) else "torch"
    return "torch" if backend == "auto" and opt_in is not None else backend


def loss_path(backend: str, x: Tensor, classes: int) -> str:
    """The training loss's path under ``backend`` (the module's ``kernel_backend``) for ``x`` (the images;
    their device and dtype decide): TRITON, the fused upsampling and loss operator (``training.fused_loss``,
    under SEGATTN_KERNEL=triton or loss), where ``choose_path`` gives heads as wide as ``classes`` the
    Triton kernels; else PLAIN. More classes than the kernels' widest heads: PLAIN."""
    if classes > MAX_HEAD_DIM:
        return PLAIN
    path = choose_path(backend, x, triton_head_dim=classes, function=False, opt_in="loss")
    return TRITON if path == TRITON else PLAIN


def takes_triton(backend: str, x: Tensor, head_dim: int, widening: int) -> bool:
    """``choose_path``'s Triton rule for heads ``head_dim`` wide with ``widening`` features per channel."""
    if backend in ("torch", PLAIN) or x.dtype not in TRITON_DTYPES or exporting():
        return False
    if torch.compiler.is_compiling() and tokens_split():
        return False
    width = head_dim * widening
    on_gpu = on_a_gpu(x)
    if backend == "auto":
        return on_gpu and triton_installed() and width <= MAX_HEAD_DIM
    if width > MAX_HEAD_DIM:
        features = f" ({width} features)" if widening > 1 else ""
        raise ValueError(
            f"{KERNEL_ENV}=triton: head dim {head_dim}{features} is above the Triton kernels' "
            f"{MAX_HEAD_DIM}; use narrower heads or {KERNEL_ENV}=torch"
        )
    if not on_gpu and not interpreted():
        raise RuntimeError(
            f"{KERNEL_ENV}=triton on a {x.device.type} tensor needs TRITON_INTERPRET=1 set when the process "
            f"starts (or a CUDA device); unset {KERNEL_ENV} for the PyTorch path"
        )
    return True
