"""What a trained model is, without torch: ``ModelRecord``, and the one document that carries it in files.

The document (``ModelRecord.document``) holds ``format_version``, ``model``, ``data``, ``inference`` and
``versions``. One writer (``to_json``; ``to_checkpoint``) and one reader (``ModelRecord.read``) put it in a
checkpoint's ``ckpt["segattn"]``, beside an exported ``model.safetensors`` as ``segattn.json``, in
``model.onnx``'s ``metadata_props["segattn"]`` and in ``model.pt``'s extra file ``segattn.json``. The reader
refuses a newer ``format_version``, and any bad value, in one line naming the file and the key. It also reads
what earlier segattn wrote: the flat JSON of its ONNX and TorchScript exports, and files without
``inference`` or ``versions``, with the same defaults as before: ImageNet normalisation, the PASCAL palette,
ignore index 255.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import FileFormatError
from .images import IGNORE_INDEX, IMAGENET_MEAN, IMAGENET_STD, Color, default_palette

FORMAT_VERSION = 1  # of the document; the reader accepts it and older files without the key
RECORD_KEY = "segattn"  # ckpt["segattn"] and model.onnx's metadata_props["segattn"]
RECORD_FILE = "segattn.json"  # the document beside model.safetensors, and model.pt's extra file
WEIGHTS_FILE = "model.safetensors"  # an exported directory's weights
TORCHSCRIPT_FILE = "model.pt"  # a TorchScript export, which torch.jit.load runs
MODEL_SOURCES = (  # what open_model opens
    "a train.py .ckpt, an exported safetensors directory, a model.onnx or a TorchScript model.pt"
)
PLAIN_TYPES = (str, int, float, bool, type(None))

# Each field of the record and the key of the document that holds it; FLAT_KEYS: where the flat JSON that
# earlier ONNX and TorchScript exports carried holds it.
DOCUMENT_KEYS = {
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
FLAT_KEYS = {**{field: field for field in DOCUMENT_KEYS}, "dataset": "dataset"}


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

    @classmethod
    def from_sections(cls, model: Mapping[str, Any], data: Mapping[str, Any]) -> ModelRecord:
        """A record from a ``model`` config and a ``data`` section of the document; what ``data`` leaves out
        takes the defaults (class names "0".."K-1", the PASCAL palette)."""
        return parse({"model": model, "data": data}, "record")

    def document(self) -> dict[str, Any]:
        """The record on disk: ``format_version``, ``model``, ``data``, ``inference``, ``versions`` (plain
        lists, numbers and strings only)."""
        return {
            "format_version": FORMAT_VERSION,
            "model": dict(self.model),
            "data": {
                "name": self.dataset,
                "config": self.data_config,
                "classes": list(self.classes),
                "palette": [list(colour) for colour in self.palette],
                "ignore_index": self.ignore_index,
                "mean": list(self.mean),
                "std": list(self.std),
            },
            "inference": self.inference,
            "versions": optional_strings(self.versions),  # plain str: a weights_only load refuses subclasses
        }

    def to_json(self) -> str:
        """The document as JSON: ``segattn.json`` beside model.safetensors and in model.pt, model.onnx's
        ``metadata_props["segattn"]``."""
        return json.dumps(self.document())

    def to_checkpoint(self, checkpoint: dict[str, Any], **training: Any) -> None:
        """Write ``checkpoint["segattn"]``: the document and the training state ``training`` that is not part
        of the record (``wandb_run_id``, read back by ``checkpoint_entry``)."""
        checkpoint[RECORD_KEY] = {**self.document(), **training}

    @classmethod
    def from_checkpoint(
        cls, checkpoint: Mapping[str, Any], path: str | Path, setting: str = ""
    ) -> ModelRecord:
        """The record of a checkpoint read from ``path``; errors begin with ``<setting>=<path>`` where a
        setting (``ckpt_path``) named the file."""
        source = f"{setting}={path}" if setting else str(path)
        return cls.read(
            checkpoint.get(RECORD_KEY),
            source,
            RECORD_KEY,
            f"ckpt['{RECORD_KEY}']['model'] entry, so the model it was trained with is unknown",
            "expected a checkpoint written by train.py",
        )

    @classmethod
    def read(
        cls, content: Mapping[str, Any] | str | bytes | None, source: str, root: str, what: str, remedy: str
    ) -> ModelRecord:
        """The record in ``content`` (the document, or its JSON text) that ``source`` holds as ``what``
        (``'segattn' metadata``), its keys named under ``root`` in errors (``segattn``; "" for a file that
        is the document). None or a document without ``model``: a FileFormatError ending with ``remedy``,
        like every other refusal, in one line naming ``source``."""
        if isinstance(content, bytes):
            content = content.decode("utf-8", "replace")
        if isinstance(content, str):
            try:
                content = json.loads(content)
            except json.JSONDecodeError as error:
                message = f"{source}: its {what} is not JSON ({error}); {remedy}"
                raise FileFormatError(message, source) from None
        if not isinstance(content, dict) or "model" not in content:
            raise FileFormatError(f"{source}: no {what}; {remedy}", source)
        check_plain_config(content, source, root or Path(source).name)
        return parse(content, source, root)


def checkpoint_entry(checkpoint: Mapping[str, Any], key: str) -> Any:
    """An entry of a checkpoint's ``segattn`` section that is training state, not part of the record
    (``wandb_run_id``); None when absent."""
    section = checkpoint.get(RECORD_KEY)
    return section.get(key) if isinstance(section, dict) else None


def parse(content: Mapping[str, Any], source: str, root: str = "") -> ModelRecord:
    """A record from a document (or the flat JSON of earlier exports: no ``data`` section); a FileFormatError
    naming ``source`` and the key (under ``root``) for a newer ``format_version`` or a value of the wrong
    kind."""
    where = f"{root}." if root else ""
    keys = DOCUMENT_KEYS if "data" in content else FLAT_KEYS

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
    "FORMAT_VERSION",
    "RECORD_FILE",
    "RECORD_KEY",
    "TORCHSCRIPT_FILE",
    "WEIGHTS_FILE",
    "ModelRecord",
    "check_plain_config",
    "checkpoint_entry",
]
