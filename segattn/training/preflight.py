"""Checks a run passes before it creates a logger, a trainer or any output.

The data splits exist (every file read and checked with ``data.validate=true``), the model accepts the sizes
it will see, and on a GPU one training step at the largest fits (``memory_fit``). Unknown model / attention /
dataset names and a ``data.num_classes`` that disagrees with the dataset are refused earlier, by the builders.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.utilities import rank_zero_info, rank_zero_warn

from ..attention import AttentionBase, check_band_variant
from ..data import SegDataModule
from ..errors import ConfigError
from ..images import as_hw
from ..models import Segmentor
from ..parallel import image_bands
from ..tiling import scaled_size
from .memory_fit import check_memory_fits
from .spatial import check_band_loss

if TYPE_CHECKING:
    from .module import SegmentationModule


def attention_grid(model: Segmentor, size: Sequence[int]) -> tuple[int, int]:
    """The largest token grid any attention layer of ``model`` sees for an input of ``size`` (H, W): the
    Segmentor pads to a multiple of its stride; the finest level with attention sets the grid."""
    stride, finest = model.stride, model.encoder.attention_stride
    height, width = (-(-int(side) // stride) * stride // finest for side in size)
    return height, width


def check_token_limit(model: Segmentor, size: Sequence[int], where: str) -> None:
    """Refuse a size whose token grid exceeds an attention layer's ``max_tokens`` (Linformer)."""
    limits = [
        module.max_tokens
        for module in model.modules()
        if isinstance(module, AttentionBase) and module.max_tokens is not None
    ]
    if not limits:
        return
    height, width = attention_grid(model, size)
    if height * width > min(limits):
        raise ValueError(
            f"{where}: at {size[0]}×{size[1]} px the first attention stage sees a {height}×{width} grid = "
            f"{height * width} tokens (stride {model.encoder.attention_stride}), more than "
            f"attention.options.max_tokens={min(limits)}; set attention.options.max_tokens={height * width} "
            "or use smaller crops"
        )


def eval_sizes(inference: Mapping[str, Any], datamodule: SegDataModule) -> dict[str, tuple[int, int]]:
    """The input sizes validation will feed the model (its ``inference`` settings), by the config key that
    sets them."""
    if inference["mode"] == "slide":
        crop = as_hw(inference["crop"], "inference.crop")
        return {f"inference.crop={list(crop)}": crop}
    dataset = datamodule.datasets["val"]
    if len(dataset) == 0:
        return {}
    first = dataset[0]  # whole-image validation: the first image, at the largest test-time scale
    height, width = first["image"].shape[-2:]
    where = f"inference.scales={list(inference['scales'])} on {first['path']}"
    return {where: scaled_size(height, width, max(inference["scales"]))}


def train_sizes(datamodule: SegDataModule) -> dict[str, tuple[int, int]]:
    """The input sizes training will feed the model, by the config key (and file) that sets them: the crop, or
    with ``data.crop_size=null`` each training image size. Reading them runs train.py's image checks (the
    doctor runs them too): whole images of mixed sizes in batches of more than one, and images
    ``data.downsample`` does not divide, are refused; a crop larger than a shrunk image is warned about."""
    crop, factor = datamodule.crop_size, datamodule.downsample
    if crop is not None:
        check_crop_at_shrink(crop, factor, datamodule)
        return {f"data.crop_size={list(crop)}": crop}
    sizes = datamodule.whole_image_sizes()
    return {f"data.crop_size=null on {paths[0]}": size for size, paths in sizes.items()}


def check_crop_at_shrink(crop: tuple[int, int], factor: int, datamodule: SegDataModule) -> None:
    """Warn in one line, naming the image, its shrunk size and both keys, when the crop is larger than a
    training image shrunk by ``data.downsample``: it only pads it with ignored pixels, often a sign the crop
    was meant in original pixels. Not a refusal: a table may hold the crop equal across shrinks on purpose
    (``idrid_cpu``'s 8x arm)."""
    if factor == 1:
        return
    for (height, width), images in datamodule.train_image_sizes().items():
        if crop[0] > height or crop[1] > width:
            rank_zero_warn(
                f"data.crop_size={list(crop)} with data.downsample={factor}: {images[0]} is "
                f"{height}x{width} (HxW) at that shrink, so its crops are padded with ignored pixels; the "
                f"crop is in shrunk pixels: at most [{height}, {width}] crops inside it"
            )
            return


def preflight(cfg: DictConfig, datamodule: SegDataModule, module: SegmentationModule) -> None:
    """Fail before training: missing or empty splits, bad files (``data.validate``), sizes the model
    cannot take, whole-image batches of mixed sizes, a training step larger than the GPU. Errors name the
    file or config key and what was expected."""
    datamodule.setup("fit")
    training, mode = train_sizes(datamodule), module.inference["mode"]
    if datamodule.crop_size is None and mode != "whole":
        rank_zero_info(
            f"data.crop_size=null trains on whole images while validation uses inference.mode={mode}; set "
            "inference.mode=whole to validate and test on whole images too"
        )
    sizes = {**training, **eval_sizes(module.inference, datamodule)}
    for where, size in sizes.items():
        check_token_limit(module.model, size, where)
    check_bands(OmegaConf.select(cfg, "trainer.strategy"), module, sizes)
    check_memory_fits(cfg, module, datamodule, training)


def check_bands(strategy: Any, module: SegmentationModule, sizes: dict[str, tuple[int, int]]) -> None:
    """Refuse, under ``trainer.strategy.name=spatial``, a model, loss, validation or input size of the built
    ``module`` that cannot split into ``trainer.strategy.bands`` bands; each refusal names the key and the
    alternatives."""
    if not (OmegaConf.is_dict(strategy) and strategy.get("name") == "spatial"):
        return
    model, loss, inference = module.model, module.criterion, module.inference
    check_band_variant(model)
    check_band_loss(loss.dice, loss.lovasz, loss.ohem_thresh)
    if loss.chunk_rows is not None:
        raise ConfigError(
            f"loss.chunk_rows={loss.chunk_rows} with trainer=spatial: each band scores its own rows "
            "already; set loss.chunk_rows=null"
        )
    if module.compile_network:
        raise ValueError(
            "model.compile=true with trainer=spatial: compiled graphs do not run the band exchanges"
        )
    mode, scales, flip = inference["mode"], list(inference["scales"]), inference["flip"]
    if mode != "whole" or scales != [1.0] or flip:
        raise ValueError(
            f"inference.mode={mode}, scales={scales}, flip={flip}: "
            "with trainer=spatial validation splits each whole image into bands; use inference.mode=whole "
            "inference.scales=[1.0] inference.flip=false"
        )
    bands = strategy.get("bands", 2)
    for where, (height, _) in sizes.items():
        try:
            image_bands(model, height, bands)
        except ValueError as error:
            raise ValueError(f"{where} with trainer.strategy.bands={bands}: {error}") from None
