"""What a trained model is, without torch: ``ModelRecord``, and its forms in the files that carry it.

A record travels in three forms: a checkpoint's ``ckpt["segattn"]`` and an exported directory's
``model.yaml`` hold ``{"model": <build_model config>, "data": data_section()}`` (the directory's classes in
``classes.json``); ``model.onnx`` and ``model.pt`` embed the flat ``to_dict()`` as JSON. Readers of older
files get the same defaults as before: ImageNet normalisation, the PASCAL palette, ignore index 255.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .images import IGNORE_INDEX, IMAGENET_MEAN, IMAGENET_STD, Color, default_palette

MODEL_FILE = "model.yaml"  # an exported directory's config and normalisation
WEIGHTS_FILE = "model.safetensors"  # an exported directory's weights


@dataclass(frozen=True)
class ModelRecord:
    """A trained model: the ``build_model`` config that rebuilds it (family ``name``, ``num_classes``,
    ``attention`` and ``attention_options``, the family's size options), the classes it predicts and their
    colours, the normalisation its inputs need (mean and std of RGB / 255), the ignore index it was trained
    with, and the dataset it was trained on (name and the recorded ``data`` config eval.py reuses)."""

    model: dict[str, Any]
    classes: list[str]
    palette: list[Color]
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    ignore_index: int = IGNORE_INDEX
    dataset: str | None = None
    data_config: dict[str, Any] | None = None

    @property
    def num_classes(self) -> int:
        """How many classes the model predicts (its logits' channels)."""
        return int(self.model["num_classes"])

    @property
    def family(self) -> str:
        """The model family's registry name (``vit``, ``pvt``, ``unet``, ``efficientvit``)."""
        return str(self.model["name"])

    @property
    def attention(self) -> str:
        """The attention variant's registry name (``softmax`` where the config names none)."""
        return str(self.model.get("attention", "softmax"))

    @property
    def attention_options(self) -> dict[str, Any]:
        """The attention variant's options as trained."""
        return dict(self.model.get("attention_options") or {})

    @classmethod
    def from_sections(cls, model: Mapping[str, Any], data: Mapping[str, Any]) -> ModelRecord:
        """A record from a checkpoint's or ``model.yaml``'s ``model`` and ``data`` sections; what ``data``
        leaves out takes the defaults (class names "0".."K-1", the PASCAL palette)."""
        num_classes = int(model["num_classes"])
        return cls(
            model=dict(model),
            classes=[str(name) for name in data.get("classes") or range(num_classes)],
            palette=[
                (int(r), int(g), int(b)) for r, g, b in data.get("palette") or default_palette(num_classes)
            ],
            mean=tuple(float(v) for v in data.get("mean") or IMAGENET_MEAN),
            std=tuple(float(v) for v in data.get("std") or IMAGENET_STD),
            ignore_index=int(data.get("ignore_index", IGNORE_INDEX)),
            dataset=data.get("name"),
            data_config=data.get("config"),
        )

    def data_section(self) -> dict[str, Any]:
        """``data`` of a checkpoint and of ``model.yaml``: plain lists and numbers only."""
        return {
            "name": self.dataset,
            "config": self.data_config,
            "classes": list(self.classes),
            "palette": [list(colour) for colour in self.palette],
            "ignore_index": self.ignore_index,
            "mean": list(self.mean),
            "std": list(self.std),
        }

    @classmethod
    def from_dict(cls, meta: Mapping[str, Any]) -> ModelRecord:
        """A record from its flat form (``to_dict``), as embedded in ``model.onnx`` and ``model.pt``."""
        data = {**meta, "name": meta.get("dataset"), "config": meta.get("data_config")}
        return cls.from_sections(meta["model"], data)

    def to_dict(self) -> dict[str, Any]:
        """The flat form: the data section's entries beside ``model`` and ``num_classes``."""
        section = self.data_section()
        return {
            "num_classes": self.num_classes,
            "classes": section["classes"],
            "palette": section["palette"],
            "mean": section["mean"],
            "std": section["std"],
            "ignore_index": self.ignore_index,
            "model": dict(self.model),
            "dataset": self.dataset,
            "data_config": self.data_config,
        }


__all__ = ["MODEL_FILE", "WEIGHTS_FILE", "ModelRecord"]
