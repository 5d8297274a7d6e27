"""Small reusable pieces below attention/ and models/: the token grid ↔ image conversion (and the resampling
of a learned per-position embedding between grids), the channels-last depthwise conv, and the SEGATTN_FUSED
switch between fused autograd Functions and plain formulas."""

from .depthwise import depthwise_conv
from .fused_switch import FUSED_ENV, use_fused
from .grid import HW, from_grid, interpolation_matrix, resample_grid, resample_grid_embedding, to_grid

__all__ = [
    "FUSED_ENV",
    "HW",
    "depthwise_conv",
    "from_grid",
    "interpolation_matrix",
    "resample_grid",
    "resample_grid_embedding",
    "to_grid",
    "use_fused",
]
