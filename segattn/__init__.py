"""segattn: semantic-segmentation transformers with linear attention for high-resolution images."""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``segattn.load_model`` is imported on first use so that ``import segattn`` stays light."""
    if name == "load_model":
        from .checkpoints.loading import load_model

        return load_model
    raise AttributeError(f"module 'segattn' has no attribute {name!r}")
