"""segattn: semantic-segmentation transformers with linear attention for high-resolution images."""

__version__ = "0.1.0"
