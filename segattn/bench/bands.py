"""``bench maxres spatial=[P]``: a probe that trains one image split into P bands across P processes.

The probe child starts P gloo processes on this machine. Each builds the same model, holds the whole batch (as
``trainer=spatial`` does after sharing it) and trains its band; its peak memory and the bytes it sent through
the band collectives in the last step come back. The probe's peak is the largest process's: the budget is per
process, as a GPU's memory is. With ``device=cuda`` the P processes share the one GPU (gloo is not bound by
NCCL's one-process-per-GPU rule; halos go through host memory), so a single GPU measures P bands against one
process.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .measure import Emit, PeakMemory, autocast_for, guard_memory, time_call


def band_worker(rank: int, task: dict[str, Any], folder: str) -> None:
    """One band process: ``task['steps']`` training steps on its band; writes ``<folder>/<rank>.json``."""
    from ..cpu_memory import reuse_freed_memory
    from ..models import build_model
    from ..parallel import BandGroup, band_forward
    from ..parallel.collectives import TRAFFIC
    from ..training.losses import SegLoss
    from ..training.spatial import band_loss
    from .model import NUM_CLASSES
    from .op import DTYPES
    from .specs import kernel_path

    reuse_freed_memory()
    torch.set_num_threads(task["threads"])
    bands = task["bands"]
    dist.init_process_group("gloo", init_method=f"file://{folder}/init", rank=rank, world_size=bands)
    group = BandGroup(dist.new_group(list(range(bands))), tuple(range(bands)), rank)
    device = torch.device(task["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    guard_memory(device, task["guard"])
    result: dict[str, Any] = {"status": "ok"}
    try:
        with PeakMemory(device) as peak:
            torch.manual_seed(0)
            with kernel_path(task["kernel"]):
                model = build_model(**task["kwargs"]).to(device).train()
            model.set_grad_checkpointing(task["checkpointing"])
            optimizer = torch.optim.AdamW(model.param_groups(lr=1e-4, weight_decay=0.01))
            criterion = SegLoss(NUM_CLASSES)
            size = task["size"]
            images = torch.randn(1, 3, size, size, device=device)
            masks = torch.randint(0, NUM_CLASSES, (1, size, size), device=device)

            def step() -> None:
                optimizer.zero_grad(set_to_none=True)
                with autocast_for(device, DTYPES[task["dtype"]]):  # as bench model's TrainStep
                    logits, aux, band = band_forward(model, images, group, with_aux=True)
                rows = masks[:, band.start : band.start + logits.shape[2]]
                band_loss(criterion, logits, aux, model.aux_weight, rows, group)[0].backward()
                for param in model.parameters():  # DDP's gradient average
                    if param.grad is not None:
                        dist.all_reduce(param.grad)
                        param.grad /= bands
                optimizer.step()

            for _ in range(task["steps"]):
                TRAFFIC.update(dict.fromkeys(TRAFFIC, 0))
                result["seconds"] = time_call(step, device)
        result |= {"peak_bytes": peak.peak, "traffic": dict(TRAFFIC)}
    except (RuntimeError, MemoryError, ValueError) as error:  # ValueError: e.g. too few rows for the bands
        result = {"status": "oom" if "memory" in str(error).lower() else "error", "error": str(error)[:300]}
    Path(folder, f"{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def band_probe_child(task: dict[str, Any], emit: Emit) -> None:
    """Probe child for ``bands`` > 1: run the band processes, emit the largest peak, the slowest step and
    the bytes one process sent per step (the most any sent)."""
    os.environ.setdefault("OMP_NUM_THREADS", str(task["threads"]))
    with tempfile.TemporaryDirectory() as folder:
        try:
            mp.start_processes(band_worker, args=(task, folder), nprocs=task["bands"], start_method="spawn")
        except mp.ProcessExitedException as error:  # killed, e.g. by the OOM killer
            emit({"status": f"killed ({error.exit_code})"})
            return
        results = [json.loads(Path(folder, f"{rank}.json").read_text()) for rank in range(task["bands"])]
    failed = [r for r in results if r["status"] != "ok"]
    if failed:
        emit(failed[0])
        return
    emit(
        {
            "status": "ok",
            "peak_bytes": max(r["peak_bytes"] for r in results),
            "seconds": max(r["seconds"] for r in results),
            "traffic": {kind: max(r["traffic"][kind] for r in results) for kind in results[0]["traffic"]},
        }
    )
