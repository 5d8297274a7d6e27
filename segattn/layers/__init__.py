"""Small reusable pieces below attention/ and models/: the token grid ↔ image conversion (and the resampling
of a learned per-position embedding between grids), the channels-last depthwise conv, LayerNorm, and the one
choice between plain formulas, PyTorch Functions and Triton kernels (``fast_path``, which reads
SEGATTN_FUSED and SEGATTN_KERNEL)."""

from .depthwise import depthwise_conv, linear_conv_gelu, mix_ffn
from .dtypes import matmul_dtype, matmul_operand
from .fast_path import FUNCTION, FUSED_ENV, KERNEL_ENV, PLAIN, TRITON, choose_path, kernel_backend, loss_path
from .grid import HW, from_grid, interpolation_matrix, resample_grid, resample_grid_embedding, to_grid
from .norm import LayerNorm

__all__ = [
    "FUNCTION",
    "FUSED_ENV",
    "HW",
    "KERNEL_ENV",
    "PLAIN",
    "TRITON",
    "LayerNorm",
    "choose_path",
    "depthwise_conv",
    "from_grid",
    "interpolation_matrix",
    "kernel_backend",
    "linear_conv_gelu",
    "loss_path",
    "matmul_dtype",
    "matmul_operand",
    "mix_ffn",
    "resample_grid",
    "resample_grid_embedding",
    "to_grid",
]
