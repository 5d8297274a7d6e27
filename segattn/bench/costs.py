"""The cost columns of ``bench accuracy``, measured after training in one process for all arms so that
ratios are fair: ``bench model``'s training step at each arm's batch and crop (time round-robin, peak
memory in fresh children) and ``bench maxres``'s largest square image at batch 1 within a memory budget.
They are kept in ``costs.json`` as they are measured and reused by a rerun with the same recipe and
settings."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..files import atomic_write
from ..images import as_hw
from .arms import is_run_override, run_overrides
from .maxres import MaxresSettings, find_maxres
from .measure import total_memory_budget
from .model import ModelSettings, measure_memory, time_steps
from .specs import Spec

if TYPE_CHECKING:
    from .accuracy import AccuracySettings


@dataclass(frozen=True)
class Recipe:
    """What the cost measurements take from the composed experiment: the same network, batch and crop;
    and the classes its mAP averages (``metrics.ap_mean_classes``), which the resolution plot shows."""

    model: Spec
    batch: int
    crop: int
    mean_classes: list[str] | None = None


def read_recipe(experiment: str, overrides: list[str]) -> Recipe:
    """Compose ``train.py experiment=<name> <overrides>`` and keep the model, batch size and crop side."""
    from ..cli import compose_command
    from ..config import plain

    cfg = compose_command("train", [f"experiment={experiment}", *overrides])
    options = plain(cfg.model)
    name = options.pop("name")
    for key in ("compile", "pretrained"):  # how it trains and starts, not the network that is timed
        options.pop(key, None)
    crop = as_hw(cfg.data.crop_size, "data.crop_size")
    if crop[0] != crop[1]:
        raise ValueError(
            f"bench accuracy: data.crop_size={list(crop)}; the step cost is measured on square crops"
        )
    label = f"{name}-{options['size']}" if options.get("size") else name
    mean_classes = cfg.metrics.ap_mean_classes
    mean_classes = None if mean_classes is None else [str(c) for c in mean_classes]
    return Recipe(Spec(name, options, label), int(cfg.data.batch_size), crop[0], mean_classes)


COSTS_FILE = "costs.json"


def cost_settings(settings: AccuracySettings, recipe: Recipe, device: torch.device) -> dict[str, Any]:
    """What the costs depend on: a ``costs.json`` measured under other values is measured again."""
    return {
        "model": recipe.model.label,
        "model_options": recipe.model.options,
        "batch": recipe.batch,
        "crop": recipe.crop,
        "device": str(device),
        "repeats": settings.repeats,
        "clock": settings.clock,
        "maxres_budget_gib": settings.maxres_budget_gib,
        "maxres": [
            settings.maxres_start,
            settings.maxres_step,
            settings.maxres_max_size,
            settings.maxres_timeout,
        ],
    }


def read_costs(path: Path, key: dict[str, Any]) -> dict[str, Any]:
    """The costs measured so far under ``key`` (empty when none, or measured under other settings)."""
    if path.is_file():
        stored = json.loads(path.read_text())
        if stored.get("settings") == key:
            return stored
    return {"settings": key, "steps": {}, "maxres": {}}


def write_costs(path: Path, costs: dict[str, Any]) -> None:
    """Crash-safe: an interrupted write leaves the previous file, never half of one."""
    atomic_write(path, lambda handle: handle.write((json.dumps(costs, indent=2) + "\n").encode()))


def arm_recipe(settings: AccuracySettings, variant: Spec) -> tuple[Recipe, Spec]:
    """The network, batch and crop one arm trains with (the experiment under the arm's own run overrides:
    another model, crop or scale), and the arm as a ``bench model`` variant (its other options)."""
    recipe = read_recipe(settings.experiment, [*settings.overrides, *run_overrides(variant)])
    options = {key: value for key, value in variant.options.items() if not is_run_override(key)}
    return recipe, Spec(variant.name, options, variant.label)


def measure_costs(
    settings: AccuracySettings, recipe: Recipe, device: torch.device, out_dir: Path
) -> dict[str, dict]:
    """Per variant: training-step seconds and peak memory at its batch and crop, and the largest trainable
    square image at batch 1 within the maxres budget; reused from ``costs.json``. Arms that train the same
    network at the same batch and crop are timed together (round-robin), so their ratios are fair; arms
    that differ only in their data (``data.downsample``) share one timing."""
    path = out_dir / COSTS_FILE
    stored = read_costs(path, cost_settings(settings, recipe, device))
    labels = [variant.label for variant in settings.variants]
    groups: dict[str, tuple[Recipe, list[Spec]]] = {}
    for variant in settings.variants:
        arm, spec = arm_recipe(settings, variant) if run_overrides(variant) else (recipe, variant)
        key = json.dumps([arm.model.label, arm.model.options, arm.batch, arm.crop], sort_keys=True)
        groups.setdefault(key, (arm, []))[1].append(spec)
    for arm, specs in groups.values():
        if all(spec.label in stored["steps"] for spec in specs):
            continue
        twins: dict[str, list[str]] = {}  # one timing per distinct network: flatten-x4 trains flatten's
        unique: dict[str, Spec] = {}
        for spec in specs:
            key = json.dumps([spec.name, spec.options], sort_keys=True)
            unique.setdefault(key, spec)
            twins.setdefault(unique[key].label, []).append(spec.label)
        model_settings = ModelSettings(
            models=[arm.model],
            variants=list(unique.values()),
            image_sizes=[arm.crop],
            dtypes=["fp32"],
            batch=arm.batch,
            repeats=settings.repeats,
            max_step_seconds=float("inf"),
            clock=settings.clock,
        )
        rows = time_steps(model_settings, device)
        measure_memory(rows, model_settings, device)
        for row in rows:
            if row["status"] == "ok":
                for label in twins[row["variant"]]:
                    stored["steps"][label] = {
                        "step_seconds": row.get("seconds"),
                        "peak_bytes": row.get("peak_bytes"),
                    }
        write_costs(path, stored)
    if settings.maxres_budget_gib:
        budget = int(settings.maxres_budget_gib * (1 << 30))
        maxres = MaxresSettings(
            models=[recipe.model],
            variants=settings.variants,
            budget_bytes=budget,
            checkpointing=[False],
            start=settings.maxres_start,
            step=settings.maxres_step,
            max_size=settings.maxres_max_size,
            probe_timeout=settings.maxres_timeout,
            extrapolate_gib=None,
        )
        budget = min(budget, total_memory_budget(device, fraction=0.9))
        for variant in settings.variants:
            if variant.label not in stored["maxres"]:
                row, _ = find_maxres(recipe.model, variant, False, 1, maxres, budget, device)
                stored["maxres"][variant.label] = {
                    "maxres": row["maxres"],
                    "maxres_limited_by": row["limited_by"],
                }
                write_costs(path, stored)
    return {
        label: {**stored["steps"].get(label, {}), **stored["maxres"].get(label, {})}
        for label in labels
        if label in stored["steps"] or label in stored["maxres"]
    }
