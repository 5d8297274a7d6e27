"""Small reusable pieces below attention/ and models/: the token grid ↔ image conversion, the channels-last
depthwise conv, and the SEGATTN_FUSED switch between fused autograd Functions and plain formulas."""

from .depthwise import depthwise_conv
from .fused_switch import FUSED_ENV, use_fused
from .grid import HW, from_grid, to_grid

__all__ = ["FUSED_ENV", "HW", "depthwise_conv", "from_grid", "to_grid", "use_fused"]
