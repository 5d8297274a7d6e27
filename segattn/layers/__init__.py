"""Small reusable pieces below attention/ and models/: the token grid ↔ image conversion (and the resampling
of a learned per-position embedding between grids), the channels-last depthwise conv, and the SEGATTN_FUSED
and SEGATTN_KERNEL switches between plain formulas, fused PyTorch Functions and Triton kernels."""

from .depthwise import depthwise_conv
from .fused_switch import FUSED_ENV, KERNEL_ENV, exporting, kernel_backend, use_fused
from .grid import HW, from_grid, interpolation_matrix, resample_grid, resample_grid_embedding, to_grid

__all__ = [
    "FUSED_ENV",
    "HW",
    "KERNEL_ENV",
    "depthwise_conv",
    "exporting",
    "from_grid",
    "interpolation_matrix",
    "kernel_backend",
    "resample_grid",
    "resample_grid_embedding",
    "to_grid",
    "use_fused",
]
