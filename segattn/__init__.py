"""segattn: semantic-segmentation transformers with linear attention for high-resolution images."""

import os

__version__ = "0.1.0"

# albumentations asks PyPI for its latest version on import (a network call, and a warning on stderr when
# offline); segattn runs without network, so the check is off unless the user sets the variable.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")


def __getattr__(name: str):
    """``segattn.load_model`` is imported on first use so that ``import segattn`` stays light."""
    if name == "load_model":
        from .checkpoints.loading import load_model

        return load_model
    raise AttributeError(f"module 'segattn' has no attribute {name!r}")
