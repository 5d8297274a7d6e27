"""What a trained model is, without torch: ``ModelRecord``, and the one writer and one reader of each form it
takes in a file: a checkpoint's ``ckpt["segattn"]`` (``to_checkpoint`` / ``from_checkpoint``), an exported
directory's ``model.yaml`` + ``classes.json`` (``write_model_yaml`` / ``read_model_yaml``), ``model.onnx``'s
``metadata_props["segattn"]`` (``to_onnx_metadata`` / ``from_onnx_metadata``) and ``model.pt``'s extra file
``segattn.json`` with the same JSON (``to_torchscript_extra`` / ``from_torchscript_extra``).

The checkpoint and ``model.yaml`` hold sections (``model``, ``data``, ``inference``, ``versions``); the JSON
forms hold the flat ``to_dict()``. Every form carries ``format_version``; a reader refuses a newer one, and
any bad value, in one line naming the file and the key. Readers of older files get the same defaults as
before: ImageNet normalisation, the PASCAL palette, ignore index 255, no inference settings or versions.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import FileFormatError, one_line
from .files import atomic_write_text
from .images import (
    CLASSES_FILE,
    IGNORE_INDEX,
    IMAGENET_MEAN,
    IMAGENET_STD,
    Color,
    default_palette,
    read_classes,
    write_classes,
)

FORMAT_VERSION = 1  # of every form below; readers accept it and older files without the key
CHECKPOINT_KEY = "segattn"  # a checkpoint's section
METADATA_KEY = "segattn"  # model.onnx's metadata_props key
TORCHSCRIPT_EXTRA = "segattn.json"  # model.pt's extra file
MODEL_FILE = "model.yaml"  # an exported directory's config and normalisation
WEIGHTS_FILE = "model.safetensors"  # an exported directory's weights
TORCHSCRIPT_FILE = "model.pt"  # a TorchScript export, which torch.jit.load runs
MODEL_SOURCES = "a train.py .ckpt, an exported safetensors directory or a model.onnx"  # what opens
PLAIN_TYPES = (str, int, float, bool, type(None))

# Each field of the record and the key that holds it in the sectioned forms (checkpoint, model.yaml) and
# in the flat JSON form (ONNX, TorchScript).
SECTION_KEYS = {
    "model": "model",
    "classes": "data.classes",
    "palette": "data.palette",
    "mean": "data.mean",
    "std": "data.std",
    "ignore_index": "data.ignore_index",
    "dataset": "data.name",
    "data_config": "data.config",
    "inference": "inference",
    "versions": "versions",
}
FLAT_KEYS = {**{field: field for field in SECTION_KEYS}, "dataset": "dataset"}


def check_plain_config(value: Any, source: str, where: str = "model") -> None:
    """Accept only plain values (str/number/bool/None in lists and str-keyed dicts), no Hydra ``_target_``.

    A saved record names models and attention by registry name; anything that could point at a callable
    (an instantiate key, an object) is refused with the file and key in the message.
    """
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise FileFormatError(f"{source}: key {key!r} in {where} is not a string", source)
            if key.startswith("_") and key.endswith("_"):
                raise FileFormatError(
                    f"{source}: {where}.{key} is refused: saved configs name models by registry name "
                    "(model name, attention name), never by import path or Hydra instantiate keys",
                    source,
                )
            check_plain_config(item, source, f"{where}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_plain_config(item, source, f"{where}[{index}]")
    elif not isinstance(value, PLAIN_TYPES):
        raise FileFormatError(
            f"{source}: {where} holds a {type(value).__name__}; expected plain config values", source
        )


@dataclass(frozen=True)
class ModelRecord:
    """A trained model: the ``build_model`` config that rebuilds it (family ``name``, ``num_classes``,
    ``attention`` and ``attention_options``, the family's size options), the classes it predicts and their
    colours, the normalisation its inputs need (mean and std of RGB / 255), the ignore index it was trained
    with, the dataset it was trained on (name and the recorded ``data`` config eval.py reuses, with its
    ``downsample``), the ``inference`` settings its validation ran with, and the ``versions`` of the code
    that trained it (``training.rundir.environment()``)."""

    model: dict[str, Any]
    classes: list[str]
    palette: list[Color]
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    ignore_index: int = IGNORE_INDEX
    dataset: str | None = None
    data_config: dict[str, Any] | None = None
    inference: dict[str, Any] | None = None
    versions: dict[str, str] | None = None

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

    @property
    def downsample(self) -> int:
        """The factor the training images were shrunk by (``data.downsample``; 1 when not recorded)."""
        return int((self.data_config or {}).get("downsample") or 1)

    # The sectioned form: a checkpoint's section and model.yaml.

    @classmethod
    def from_sections(cls, model: Mapping[str, Any], data: Mapping[str, Any], **rest: Any) -> ModelRecord:
        """A record from ``model`` and ``data`` sections (``rest``: ``inference``, ``versions``); what
        ``data`` leaves out takes the defaults (class names "0".."K-1", the PASCAL palette)."""
        return parse({"model": model, "data": data, **rest}, SECTION_KEYS, "record")

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

    def sections(self) -> dict[str, Any]:
        """The sectioned form: ``format_version``, ``model``, ``data``, ``inference``, ``versions``."""
        return {
            "format_version": FORMAT_VERSION,
            "model": dict(self.model),
            "data": self.data_section(),
            "inference": self.inference,
            "versions": optional_strings(self.versions),  # plain str: a weights_only load refuses subclasses
        }

    def to_checkpoint(self, checkpoint: dict[str, Any], **training: Any) -> None:
        """Write ``checkpoint["segattn"]``: the sections and the training state ``training`` that is not part
        of the record (``wandb_run_id``, read back by ``checkpoint_entry``)."""
        checkpoint[CHECKPOINT_KEY] = {**self.sections(), **training}

    @classmethod
    def from_checkpoint(
        cls, checkpoint: Mapping[str, Any], path: str | Path, setting: str = ""
    ) -> ModelRecord:
        """The record of a checkpoint read from ``path``; errors begin with ``<setting>=<path>`` where a
        setting (``ckpt_path``) named the file."""
        source = f"{setting}={path}" if setting else str(path)
        section = checkpoint.get(CHECKPOINT_KEY)
        if not isinstance(section, dict) or "model" not in section:
            raise FileFormatError(
                f"{source}: no ckpt['{CHECKPOINT_KEY}']['model'] entry, so the model it was trained with is "
                "unknown; expected a checkpoint written by train.py",
                path,
            )
        check_plain_config(section, source, CHECKPOINT_KEY)
        return parse(section, SECTION_KEYS, source, CHECKPOINT_KEY)

    def write_model_yaml(self, directory: Path) -> None:
        """``directory/model.yaml`` (the sections; classes and palette left to ``classes.json``) and
        ``directory/classes.json``, the form a dataset root holds."""
        meta = self.sections()
        meta["data"] = {
            key: value for key, value in meta["data"].items() if key not in ("classes", "palette")
        }
        atomic_write_text(directory / MODEL_FILE, yaml.safe_dump(meta, sort_keys=False))
        write_classes(directory, self.classes, self.palette)

    @classmethod
    def read_model_yaml(cls, directory: Path) -> ModelRecord:
        """The record of an exported directory: ``model.yaml`` (``yaml.safe_load``: no Python tags) and, when
        present, ``classes.json``."""
        source = str(directory / MODEL_FILE)
        try:
            meta = yaml.safe_load((directory / MODEL_FILE).read_text())
        except yaml.YAMLError as error:  # safe_load refuses python/object tags: they could run code
            raise FileFormatError(f"{source}: not a plain YAML mapping: {one_line(error)}", source) from None
        if not isinstance(meta, dict) or "model" not in meta:
            raise FileFormatError(f"{source}: expected a mapping with a 'model' entry", source)
        check_plain_config(meta, source, MODEL_FILE)
        if (directory / CLASSES_FILE).is_file():
            spec = read_classes(directory / CLASSES_FILE)
            data = meta.get("data") if isinstance(meta.get("data"), dict) else {}
            meta = {**meta, "data": {**data, "classes": spec.names, "palette": spec.palette}}
        return parse(meta, SECTION_KEYS, source)

    # The flat form: the JSON embedded in model.onnx and model.pt.

    def to_dict(self) -> dict[str, Any]:
        """The flat form: the data section's entries beside ``model`` and ``num_classes``."""
        section = self.data_section()
        return {
            "format_version": FORMAT_VERSION,
            "num_classes": self.num_classes,
            "classes": section["classes"],
            "palette": section["palette"],
            "mean": section["mean"],
            "std": section["std"],
            "ignore_index": self.ignore_index,
            "model": dict(self.model),
            "dataset": self.dataset,
            "data_config": self.data_config,
            "inference": self.inference,
            "versions": self.versions,
        }

    @classmethod
    def from_dict(cls, meta: Mapping[str, Any], source: str = "record", root: str = "") -> ModelRecord:
        """A record from its flat form (``to_dict``); errors name ``source`` and keys under ``root``."""
        if not isinstance(meta, dict) or "model" not in meta:
            raise FileFormatError(
                f"{source}: {root or 'the record'} is not a mapping with a 'model' entry", source
            )
        check_plain_config(meta, source, root or "record")
        return parse(meta, FLAT_KEYS, source, root)

    def to_onnx_metadata(self, **export: Any) -> str:
        """``metadata_props["segattn"]`` of model.onnx: everything predict needs besides onnxruntime, numpy
        and Pillow, and how the graph was exported (``export``: ``dynamic``, ``exporter``)."""
        return json.dumps(self.to_dict() | export)

    @classmethod
    def from_onnx_metadata(cls, text: str | None, path: str | Path) -> ModelRecord:
        """The record of model.onnx from its ``metadata_props["segattn"]`` (None: it has none)."""
        return from_json(text, path, f"'{METADATA_KEY}' metadata", METADATA_KEY, "onnx")

    def to_torchscript_extra(self, **export: Any) -> dict[str, str]:
        """``_extra_files`` of ``torch.jit.save``: ``segattn.json``, the JSON of the ONNX metadata."""
        return {TORCHSCRIPT_EXTRA: self.to_onnx_metadata(**export)}

    @classmethod
    def from_torchscript_extra(cls, extra: Mapping[str, str | bytes], path: str | Path) -> ModelRecord:
        """The record of model.pt from the ``_extra_files`` that ``torch.jit.load`` filled (asked for as
        ``{"segattn.json": ""}``, which stays empty when the file has none)."""
        text = extra.get(TORCHSCRIPT_EXTRA) or None
        text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        return from_json(text, path, f"extra file {TORCHSCRIPT_EXTRA}", TORCHSCRIPT_EXTRA, "torchscript")


def from_json(text: str | None, path: str | Path, what: str, root: str, fmt: str) -> ModelRecord:
    """The record in the JSON ``text`` that ``path`` carries as ``what`` (None: it carries none)."""
    again = f"export it again with python -m segattn.export format={fmt}"
    if text is None:
        raise FileFormatError(f"{path}: no {what} (classes, mean, std); {again}", path)
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as error:
        raise FileFormatError(f"{path}: its {what} is not JSON ({error}); {again}", path) from None
    return ModelRecord.from_dict(meta, str(path), root)


def checkpoint_entry(checkpoint: Mapping[str, Any], key: str) -> Any:
    """An entry of a checkpoint's ``segattn`` section that is training state, not part of the record
    (``wandb_run_id``); None when absent."""
    section = checkpoint.get(CHECKPOINT_KEY)
    return section.get(key) if isinstance(section, dict) else None


def parse(content: Mapping[str, Any], keys: Mapping[str, str], source: str, root: str = "") -> ModelRecord:
    """A record from one form's ``content`` (its fields under ``keys``); a FileFormatError naming ``source``
    and the key (under ``root``) for a newer ``format_version`` or a value of the wrong kind."""
    where = f"{root}." if root else ""

    def get(field: str) -> Any:
        value: Any = content
        for part in keys[field].split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        return value

    def check(field: str, value: Any, convert: Callable[[Any], Any], expected: str) -> Any:
        try:
            if isinstance(value, bool):
                raise TypeError(value)
            return convert(value)
        except (TypeError, ValueError):
            key = keys.get(field, field)
            raise FileFormatError(f"{source}: {where}{key}={value!r}: expected {expected}", source) from None

    version = content.get("format_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise FileFormatError(
            f"{source}: {where}format_version={version!r} is not supported: this segattn reads "
            f"format_version {FORMAT_VERSION}; open it with the segattn that wrote it, or upgrade segattn",
            source,
        )
    model = check("model", get("model"), named_mapping, "a mapping with a registry 'name'")
    num_classes = check("model.num_classes", model.get("num_classes"), positive, "a whole number >= 1")
    data_config = check("data_config", get("data_config"), optional_mapping, "a mapping or null")
    if data_config and "downsample" in data_config:
        key = f"{keys['data_config']}.downsample"
        check(key, data_config["downsample"], lambda v: v is None or positive(v), "a whole number >= 1")
    classes = get("classes") or [str(index) for index in range(num_classes)]
    palette = get("palette") or default_palette(num_classes)
    return ModelRecord(
        model=model,
        classes=check("classes", classes, names, "a list of class names"),
        palette=check("palette", palette, colours, "a list of [r, g, b] colours (0..255)"),
        mean=check("mean", get("mean") or IMAGENET_MEAN, triple, "3 numbers (RGB / 255)"),
        std=check("std", get("std") or IMAGENET_STD, triple, "3 numbers (RGB / 255)"),
        ignore_index=check("ignore_index", get("ignore_index"), index_or_default, "a whole number"),
        dataset=check("dataset", get("dataset"), lambda v: v if v is None else str(v), "a name"),
        data_config=data_config,
        inference=check("inference", get("inference"), optional_mapping, "a mapping or null"),
        versions=check("versions", get("versions"), optional_strings, "a mapping of names to versions"),
    )


def named_mapping(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not isinstance(value.get("name"), str):
        raise TypeError(value)
    return dict(value)


def whole(value: Any) -> int:
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(value)
    return int(value)


def positive(value: Any) -> int:
    if whole(value) < 1:
        raise ValueError(value)
    return whole(value)


def index_or_default(value: Any) -> int:
    return IGNORE_INDEX if value is None else whole(value)


def optional_mapping(value: Any) -> dict[str, Any] | None:
    if value is not None and not isinstance(value, dict):
        raise TypeError(value)
    return None if value is None else dict(value)


def optional_strings(value: Any) -> dict[str, str] | None:
    mapping = optional_mapping(value)
    return None if mapping is None else {str(key): str(item) for key, item in mapping.items()}


def names(value: Any) -> list[str]:
    if not isinstance(value, list) or any(isinstance(v, (list, dict)) for v in value):
        raise ValueError(value)
    return [str(name) for name in value]


def colours(value: Any) -> list[Color]:
    if not isinstance(value, list):
        raise ValueError(value)
    palette = [triple(colour) for colour in value]
    if any(not v.is_integer() or not 0 <= v <= 255 for colour in palette for v in colour):
        raise ValueError(value)
    return [(int(r), int(g), int(b)) for r, g, b in palette]


def triple(value: Any) -> tuple[float, float, float]:
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise ValueError(value)
    return (float(value[0]), float(value[1]), float(value[2]))


__all__ = [
    "CHECKPOINT_KEY",
    "FORMAT_VERSION",
    "METADATA_KEY",
    "MODEL_FILE",
    "TORCHSCRIPT_EXTRA",
    "WEIGHTS_FILE",
    "ModelRecord",
    "check_plain_config",
    "checkpoint_entry",
]
