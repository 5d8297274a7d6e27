"""Multi-process workers for the band-parallel tests: gloo process groups on CPU, started by a fork server.

Every process builds the same model (same seed) and the same images. The single-process result of each image
(the reference: whole image, ordinary forward and backward) is computed by one process and sent to all: it is
the same everywhere, and computing it on every process was most of the tests' time. Each process then
computes its band's part of the split computation and writes the largest relative error of each compared
quantity to ``<out>/<rank>.json``.
Both run in float64 unless a case says otherwise: the comparison then measures the algorithm, not the
rounding of an ill-conditioned fp32 model (vit + efficient's gradients are 5e-4 from float64 in fp32).
A plain module (not conftest.py) so that the fork server can import it by name.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor
from warm_processes import forkserver

from segattn.attention import check_band_variant
from segattn.models import build_model
from segattn.models.blocks import MixFFN
from segattn.parallel import BandGroup, band_forward, drawing_from, image_seed
from segattn.training.losses import SegLoss
from segattn.training.spatial import band_loss

IGNORE = 255
# The variants with a band form (``band_parallel``), as docs/spatial.md lists them
BAND_VARIANTS = ["efficient", "linear", "taylor", "flatten", "performer"]
NUM_CLASSES = 5
# Each family at its smallest, with every kind of layer that crosses rows: overlapping and strided convs,
# depthwise convs, BatchNorm (heads, ResNet), max pooling, bilinear upsampling, position embeddings.
MODELS: dict[str, dict[str, Any]] = {
    "pvt": {
        "name": "pvt",
        "embed_dims": [16, 16, 32, 32],
        "depths": [1, 1, 1, 1],
        "num_heads": [1, 1, 2, 2],
        "aux_head": True,
    },
    "vit": {"name": "vit", "embed_dim": 32, "depth": 2, "num_heads": 2, "patch_size": 8, "head": "pup"},
    "unet": {"name": "unet", "encoder": "test_resnet"},
}
COMMON = {"head_channels": 16, "dropout": 0.0, "drop_path_rate": 0.0}


def build(case: dict[str, Any]) -> torch.nn.Module:
    """The case's model, seeded, in training mode (BatchNorm uses batch statistics), in the case's dtype;
    without dropout and drop path unless the case sets ``regularisers``."""
    torch.manual_seed(0)
    options = {**MODELS[case["model"]], **COMMON, **case.get("regularisers", {})}
    if case["model"] == "unet":
        options.pop("drop_path_rate")
    model = build_model(num_classes=NUM_CLASSES, attention=case["attention"], **options)
    if case.get("mix_ffn_backend"):  # e.g. "torch": attention on the kernels, Mix-FFN on PyTorch's ops
        for module in model.modules():
            if isinstance(module, MixFFN):
                module.kernel_backend = case["mix_ffn_backend"]
    model.set_grad_checkpointing(case.get("checkpointing", False))
    return model.to(getattr(torch, case.get("dtype", "float64"))).train()


def batch(seed: int, height: int, width: int, dtype: str = "float64") -> tuple[Tensor, Tensor]:
    """One image and its mask (a tenth of the pixels ignored)."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(1, 3, height, width, generator=generator).to(getattr(torch, dtype))
    masks = torch.randint(0, NUM_CLASSES, (1, height, width), generator=generator)
    masks[torch.rand(1, height, width, generator=generator) < 0.1] = IGNORE
    return images, masks


def relative_error(actual: Tensor, expected: Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-30)).item()


def reference(model: torch.nn.Module, criterion: SegLoss, images: Tensor, masks: Tensor):
    """Single-process logits, aux logits, loss and parameter gradients on the whole image."""
    model.zero_grad()
    logits, aux = model.forward_with_aux(images)
    loss = criterion(logits, masks) + (0 if aux is None else model.aux_weight * criterion(aux, masks))
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), None if aux is None else aux.detach(), loss.detach(), grads


def compare_case(case: dict[str, Any], group: BandGroup, data_groups: int) -> dict[str, Any]:
    """Max relative errors of one case (``errors``): the band's logits (and aux logits) against the
    reference's rows, the loss, and every parameter gradient after the data-parallel average. The bands of
    an image draw their dropout / drop-path decisions from the group's ``image_seed``; each reference
    (one process, whole image) is given the same draws. ``seeds``: every rank's seed."""
    template = build(case)
    check_band_variant(template)
    criterion = SegLoss(NUM_CLASSES, ignore_index=IGNORE)
    height, width = case["size"]
    dtype = case.get("dtype", "float64")
    rank = dist.get_rank()
    torch.manual_seed(1000 + rank)  # the processes' own streams differ, as a real job's may
    seed = image_seed(group, torch.device("cpu"))
    seeds: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(seeds, seed)
    references = []
    for g in range(data_groups):  # each image's reference computed once, by rank g, and sent to every rank
        shared: list[Any] = [None]
        if rank == g:
            with drawing_from(seeds[g * group.size], torch.device("cpu")):
                shared[0] = reference(copy.deepcopy(template), criterion, *batch(g, height, width, dtype))
        dist.broadcast_object_list(shared, src=g)
        references.append(shared[0])
    logits_ref, aux_ref, loss_ref, _ = references[rank // group.size]
    grads_ref = {n: sum(r[3][n] for r in references) / data_groups for n in references[0][3]}

    model = copy.deepcopy(template)
    images, masks = batch(rank // group.size, height, width, dtype)
    logits, aux, band = band_forward(model, images, group, with_aux=True, seed=seed)
    rows = slice(band.start, band.start + logits.shape[2])
    loss, image_loss = band_loss(criterion, logits, aux, model.aux_weight, masks[:, rows], group)
    loss.backward()
    errors = {
        "logits": relative_error(logits.detach(), logits_ref[:, :, rows]),
        "loss": relative_error(image_loss, loss_ref),
    }
    if aux is not None:
        errors["aux_logits"] = relative_error(aux.detach(), aux_ref[:, :, rows])
    grads = []
    for param in model.parameters():  # DDP: the mean over all processes
        grad = param.grad.clone()
        dist.all_reduce(grad)
        grads.append(grad.flatten() / dist.get_world_size())
    expected = torch.cat([grads_ref[name].flatten() for name, _ in model.named_parameters()])
    # relative to the largest gradient: a bias followed by BatchNorm has a gradient of rounding noise
    errors["gradients"] = relative_error(torch.cat(grads), expected)
    return {"errors": errors, "seeds": seeds}


def worker(
    rank: int, world: int, phases: list[tuple[int, list[dict[str, Any]]]], init_file: str, out: str
) -> None:
    """Run each phase's cases with the world split into band groups of the phase's size."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = []
    for bands, cases in phases:
        groups = [dist.new_group(list(range(g, g + bands))) for g in range(0, world, bands)]
        start = rank // bands * bands
        group = BandGroup(groups[rank // bands], tuple(range(start, start + bands)), rank - start)
        for case in cases:
            try:
                results.append({**case, "bands": bands, **compare_case(case, group, world // bands)})
            except ValueError as error:
                results.append({**case, "bands": bands, "error": str(error)})
    Path(out, f"{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def run_world(
    tmp_path: Path,
    world: int,
    phases: list[tuple[int, list[dict[str, Any]]]],
    start_method: str = "forkserver",
) -> list[list[dict[str, Any]]]:
    """Run ``phases`` ((bands, cases) each) in ``world`` fresh processes; each rank's results, in order.

    By default forked from the test worker's fork server (``warm_processes.forkserver``), which has imported
    this module (torch, segattn) once for the whole test session: a clean process like spawn's, without each
    of the world's processes paying the imports again. The server keeps the environment it started with: a
    caller that sets variables the processes must see (SEGATTN_KERNEL, TRITON_INTERPRET) passes
    ``start_method="spawn"``."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if start_method == "forkserver":
        forkserver()
    mp.start_processes(
        worker,
        args=(world, phases, str(tmp_path / "init"), str(tmp_path)),
        nprocs=world,
        start_method=start_method,
    )
    return [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(world)]
