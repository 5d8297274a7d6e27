"""segattn: semantic-segmentation transformers with linear attention for high-resolution images."""

import os

__version__ = "0.1.0"

# Large CPU tensors on transparent huge pages: a fresh 100 MB tensor costs ~5x less in page faults here.
# PyTorch reads this once, at its first large allocation, so it is set on import; export
# THP_MEM_ALLOC_ENABLE=0 to opt out.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def __getattr__(name: str):
    """``segattn.load_model`` is imported on first use so that ``import segattn`` stays light."""
    if name == "load_model":
        from .loading import load_model

        return load_model
    raise AttributeError(f"module 'segattn' has no attribute {name!r}")
