"""Spatial parallelism: one image split into bands of rows across a group of processes.

Each process of a band group holds a band of rows of the same image at every stride of the network. The
layers that mix rows exchange only what they must: linear attention sums its d×d key summaries over the
group (``tokens``), convolutions, pooling and upsampling take halo rows from the neighbouring bands and
BatchNorm its statistics (``ops``), position embeddings are resampled for the whole grid and sliced
(``Band``). ``forward.band_forward`` runs a Segmentor on this process's band; the Lightning side lives in
``segattn.training.spatial``.
"""

from .bands import Band, BandGroup, active_split, split_rows, tokens_split
from .draws import drawing_from, image_seed
from .forward import band_forward, image_bands, on_band, recompute_contexts
from .ops import band_of_embedding
from .tokens import token_count, token_max, token_reducer, token_softmax, token_sum

__all__ = [
    "Band",
    "BandGroup",
    "active_split",
    "band_forward",
    "band_of_embedding",
    "drawing_from",
    "image_bands",
    "image_seed",
    "on_band",
    "recompute_contexts",
    "split_rows",
    "token_count",
    "token_max",
    "token_reducer",
    "token_softmax",
    "token_sum",
    "tokens_split",
]
