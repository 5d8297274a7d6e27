"""segattn: semantic-segmentation transformers with linear attention for high-resolution images."""

import os

__version__ = "0.1.0"

# albumentations asks PyPI for its latest version on import (a network call, and a warning on stderr when
# offline); segattn runs without network, so the check is off unless the user sets the variable.
os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")


def __getattr__(name: str):
    """``segattn.open_model`` is imported on first use so that ``import segattn`` stays light."""
    if name == "open_model":
        from .inference.trained import open_model

        return open_model
    raise AttributeError(f"module 'segattn' has no attribute {name!r}")
