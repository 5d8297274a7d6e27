"""Whether one training step fits the GPU, asked before training.

A run whose image is too large for the device is refused in one line naming the settings that shrink it, not
by an out-of-memory traceback after the loggers, run files and data loaders exist. One step on zeros of the
largest training batch shape, under the trainer's precision, gives the exact peak of that step's activations;
optimizer state (made at the first real step) and the loader's pinned buffers come on top, so a peak above
``TIGHT`` of the device is reported as tight. CPU runs are not checked: host memory is shared with the whole
machine, and running out of it kills the process rather than raising.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.utilities import rank_zero_info

from ..errors import SegattnError

if TYPE_CHECKING:
    from ..data import SegDataModule
    from .module import SegmentationModule

AUTOCAST = {"bf16-mixed": torch.bfloat16, "bf16": torch.bfloat16, "16-mixed": torch.float16}
TIGHT = 0.9  # peak over this fraction of the device: said, since optimizer state comes on top
STRATEGIES_CHECKED = ("auto", "ddp", "ddp_spawn", "single_device")  # each rank holds the whole step


def check_memory_fits(
    cfg: DictConfig, module: SegmentationModule, datamodule: SegDataModule, sizes: dict[str, tuple[int, int]]
) -> int | None:
    """Refuse, in one line, a run whose largest training step does not fit its GPU; say the peak when it
    does. ``sizes``: the training input sizes by the config key that sets them (``preflight.train_sizes``);
    the batch is ``datamodule``'s, the precision and devices the trainer's (``cfg``, not built yet).
    Returns the peak in bytes, or None where nothing was checked (``check_memory=false``, a CPU run, a
    strategy that splits one step over devices)."""
    device = training_device(cfg)
    if not cfg.get("check_memory", True) or device is None or not sizes:
        return None
    where, (height, width) = max(sizes.items(), key=lambda item: item[1][0] * item[1][1])
    batch = datamodule.batch_size
    dtype = AUTOCAST.get(str(cfg.trainer.get("precision")))
    total = torch.cuda.get_device_properties(device).total_memory
    try:
        peak = step_peak_bytes(module, (batch, 3, height, width), device, dtype)
    except torch.OutOfMemoryError:
        release(module)
        raise SegattnError(
            f"{where} at data.batch_size={batch}: one training step does not fit in {device} "
            f"({torch.cuda.get_device_name(device)}, {total / 2**30:.1f} GiB); "
            f"{remedies(cfg, module, datamodule)}; or check_memory=false to try anyway"
        ) from None
    share = peak / total
    note = "; tight: optimizer state comes on top" if share > TIGHT else ""
    rank_zero_info(
        f"check_memory: one training step at {height}x{width}, batch {batch} peaks at "
        f"{peak / 2**30:.2f} GiB of {total / 2**30:.1f} GiB on {device}{note}"
    )
    return peak


def training_device(cfg: DictConfig) -> torch.device | None:
    """The one CUDA device this run trains on, or None when it trains on the CPU, on several devices (each
    rank's device is chosen later, by Lightning), or with a strategy that splits a step over devices
    (``spatial`` bands, FSDP's shards): one device's share is not what this measures."""
    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    if accelerator not in ("auto", "gpu", "cuda") or not torch.cuda.is_available():
        return None
    strategy = OmegaConf.select(cfg, "trainer.strategy")
    name = strategy.get("name", "auto") if OmegaConf.is_dict(strategy) else str(strategy or "auto")
    if name not in STRATEGIES_CHECKED or int(cfg.trainer.get("num_nodes", 1)) != 1:
        return None
    devices = cfg.trainer.get("devices", "auto")
    if OmegaConf.is_list(devices):
        return torch.device("cuda", int(devices[0])) if len(devices) == 1 else None
    if str(devices) == "1" or (str(devices) in ("auto", "-1") and torch.cuda.device_count() == 1):
        return torch.device("cuda", 0)
    return None


def step_peak_bytes(
    module: SegmentationModule,
    shape: tuple[int, int, int, int],
    device: torch.device,
    dtype: torch.dtype | None,
) -> int:
    """Peak CUDA bytes of one forward, loss and backward of ``module`` (moved to ``device``) on zeros of
    ``shape`` with all-background masks; the gradients are dropped after."""
    module.to(device)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    images = torch.zeros(shape, device=device)
    masks = torch.zeros((shape[0], *shape[2:]), dtype=torch.long, device=device)
    with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss, aux_loss = module.head_losses(images, masks)
        if aux_loss is not None:
            loss = loss + module.model.aux_weight * aux_loss
    loss.backward()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del images, masks, loss, aux_loss
    release(module)
    return peak


def release(module: SegmentationModule) -> None:
    """Drop the check's gradients and cached blocks, so training starts from what it would have."""
    module.zero_grad(set_to_none=True)
    torch.cuda.empty_cache()


def remedies(cfg: DictConfig, module: SegmentationModule, datamodule: SegDataModule) -> str:
    """The settings that cut a step's memory, those the built ``module`` and ``datamodule`` (and the
    trainer's precision) do not already use, by what they give up least."""
    steps = []
    if not module.model.config.get("grad_checkpointing"):
        steps.append("model.grad_checkpointing=true")
    if module.criterion.chunk_rows is None:
        steps.append("loss.chunk_rows=256")
    if str(cfg.trainer.get("precision")) not in AUTOCAST:
        steps.append("trainer.precision=bf16-mixed")
    if datamodule.batch_size > 1:
        steps.append(f"data.batch_size={datamodule.batch_size // 2}")
    if datamodule.crop_size is not None:
        steps.append("a smaller data.crop_size")
    elif hasattr(datamodule.source, "downsample"):  # a dataset that can be read shrunk
        steps.append(f"data.downsample={2 * datamodule.downsample}")
    return "set " + ", ".join(steps)


__all__ = ["check_memory_fits", "remedies", "training_device"]
