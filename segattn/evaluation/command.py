"""``python eval.py checkpoint=... [split=test] [data=...] [inference.*=...]``: ``run(cfg)``.

The split is predicted batch by batch exactly as validation predicts it (same transform, collate and
``infer`` options), and only the confusion matrix is kept, so memory is bounded by one batch of images
whatever the split's size. The dataset config (name, root, evaluation size, split names) comes from the
checkpoint unless the command line names it; classes and normalisation always come from the model.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from rich.progress import Progress
from torch.utils.data import DataLoader, Subset

from ..config import check_data_root, check_values, config_dir, plain, workers
from ..data import SegDataModule
from ..data.datamodule import seg_collate
from ..data.raster import RasterLayout
from ..files import write_json
from ..images import DataError, as_hw
from ..inference.device import torch_device
from ..inference.trained import open_model
from ..record import ModelRecord
from . import report
from .average_precision import AveragePrecisionMetric, class_ids, score_logits
from .metrics import SegmentationMetric
from .predictors import Predictor, predictor
from .rasters import score_rasters


def data_config(cfg: DictConfig, record: ModelRecord) -> dict[str, Any]:
    """The data config to evaluate on, with the command line's ``data.*`` keys on top. The base is
    ``data=<name>``'s file if given, else the checkpoint's recorded config (an export without one: its
    dataset's file). A recorded ``num_workers`` is capped at this machine's cores; the model's normalisation
    always wins."""
    given = {key: value for key, value in plain(cfg.data).items() if value is not None}
    if "mean" in cfg.data:  # data=<name> merged a complete dataset file over eval.yaml's two keys
        data = given
    else:
        data = dict(record.data_config or recorded_dataset_file(cfg, record)) | given
        if "num_workers" not in given:  # resolved on the training machine, which may have more cores
            data["num_workers"] = workers(int(data.get("num_workers", 0)))
    if data.get("root") == "???":
        raise ValueError(
            f"data.root is not set; dataset {data.get('name')!r} needs the folder holding its files"
        )
    check_data_root(data)  # a missing folder is named as train.py names it
    return data | {"mean": list(record.mean), "std": list(record.std), "num_classes": None, "validate": False}


def recorded_dataset_file(cfg: DictConfig, record: ModelRecord) -> dict[str, Any]:
    """conf/data/<the checkpoint's dataset>.yaml, resolved against this config's paths."""
    name = record.dataset
    if not name:
        raise ValueError(f"checkpoint={cfg.checkpoint} does not record its dataset; name it with data=<name>")
    path = config_dir() / "data" / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"checkpoint={cfg.checkpoint} was trained on dataset {name!r}, which has no {path}")
    merged = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))  # an open copy to graft onto
    merged.data = OmegaConf.load(path)
    return plain(merged.data)


def check_classes(datamodule: SegDataModule, record: ModelRecord, cfg: DictConfig) -> None:
    if datamodule.num_classes != record.num_classes:
        raise ValueError(
            f"checkpoint={cfg.checkpoint} predicts {record.num_classes} classes but dataset "
            f"{datamodule.name!r} has {datamodule.num_classes} ({', '.join(datamodule.classes[:12])}); "
            "evaluate it on the dataset it was trained for (data=<name> data.root=<path>)"
        )


def build_loader(datamodule: SegDataModule, split: str, share: tuple[int, int] = (0, 1)) -> DataLoader:
    """A loader of ``split`` with the evaluation transform, batched as validation batches it. ``share`` =
    (index, count): every count-th image from the index-th, one of ``count`` processes' share."""
    try:
        dataset = datamodule.source.dataset(split, datamodule.eval_transform)
    except (DataError, ValueError) as error:
        raise ValueError(f"split={split!r}: {error}") from None
    if len(dataset) == 0:
        raise ValueError(f"split={split!r} of dataset {datamodule.name!r} has no images")
    index, count = share
    return DataLoader(
        dataset if count == 1 else Subset(dataset, range(index, len(dataset), count)),
        batch_size=datamodule.val_batch_size,
        shuffle=False,
        num_workers=datamodule.num_workers,
        collate_fn=partial(seg_collate, ignore_index=datamodule.ignore_index),
    )


def to_rgb(image: torch.Tensor, mean: list[float], std: list[float]) -> np.ndarray:
    """A normalised [3, H, W] image back to uint8 [H, W, 3]."""
    rgb = image.permute(1, 2, 0).numpy() * np.asarray(std) + np.asarray(mean)
    return (rgb * 255).clip(0, 255).round().astype(np.uint8)


def resized(image: torch.Tensor, size: torch.Size) -> torch.Tensor:
    """A [3, h, w] image at ``size`` (bilinear), so a reduced-resolution image lines up with its mask."""
    if image.shape[-2:] == size:
        return image
    return F.interpolate(image[None], size, mode="bilinear", align_corners=False)[0]


def score_loader(
    predict: Predictor,
    loader: DataLoader,
    metric: SegmentationMetric,
    ap: AveragePrecisionMetric,
    record: ModelRecord,
    num_examples: int,
    split: str,
    show_progress: bool = True,
) -> list[dict[str, Any]]:
    """Add every batch of ``loader`` to ``metric`` and ``ap``; returns the first ``num_examples`` images as
    examples (image resized to its mask)."""
    examples: list[dict[str, Any]] = []
    with Progress(transient=False, disable=not show_progress) as bar:
        task = bar.add_task(f"evaluating {split}", total=len(loader.dataset))
        for batch in loader:
            preds = score_logits(predict(batch["image"]), batch["mask"], metric, ap)
            size = preds.shape[-2:]
            for index in range(len(preds)):
                if len(examples) < num_examples:
                    examples.append(
                        {
                            "name": Path(str(batch["path"][index])).name,
                            "rgb": to_rgb(resized(batch["image"][index], size), record.mean, record.std),
                            "mask": batch["mask"][index].numpy(),
                            "pred": preds[index].numpy(),
                        }
                    )
            bar.advance(task, len(preds))
    return examples


def run(cfg: DictConfig, defaults: DictConfig | None = None) -> dict[str, Any]:
    """Evaluate ``cfg.checkpoint`` on ``cfg.split`` and write the report into the run dir; returns
    metrics.json's content. The values are checked here, once (``defaults`` types the keys)."""
    check_values(cfg, "eval", defaults)
    inference = plain(cfg.inference)
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    devices = process_devices(str(cfg.device), int(cfg.devices))
    model = open_model(Path(str(cfg.checkpoint)), int(cfg.threads), devices[0])
    predict, record = predictor(model, inference), model.record
    data = data_config(cfg, record)
    if inference["batch_size"] is not None:  # images per forward pass; null: as validation batches them
        data["val_batch_size"] = inference["batch_size"]
    datamodule = SegDataModule(**data)
    check_classes(datamodule, record, cfg)
    ap_options = {
        "bins": int(cfg.metrics.ap_bins),
        "mean_classes": class_ids(cfg.metrics.ap_mean_classes, datamodule.classes, "metrics.ap_mean_classes"),
    }
    metric = SegmentationMetric(record.num_classes, datamodule.ignore_index)
    ap = AveragePrecisionMetric(record.num_classes, datamodule.ignore_index, **ap_options)
    examples: list[dict[str, Any]] = []
    if isinstance(datamodule.source, RasterLayout):
        with Progress(transient=False) as bar:
            task = bar.add_task(f"evaluating {cfg.split} (rasters, strip by strip)", total=None)
            images = score_rasters(
                model, datamodule.source, str(cfg.split), inference, metric, ap,
                lambda name: bar.update(task, description=f"evaluating {cfg.split}: {name}"),
            )  # fmt: skip
    else:
        task = {"checkpoint": str(cfg.checkpoint), "threads": int(cfg.threads), "inference": inference}
        task |= {"data": data, "split": str(cfg.split), "ap": ap_options, "devices": devices}
        with OtherShares(task) as others:
            loader = build_loader(datamodule, str(cfg.split), (0, len(devices)))
            split, shown = str(cfg.split), int(cfg.num_examples)
            examples = score_loader(predict, loader, metric, ap, record, shown, split)
            images = len(loader.dataset) + others.add_to(metric, ap)
    confusion = metric.confusion.numpy()
    scores = report.scores_record({**metric.compute(), **ap.compute()}, confusion, datamodule.classes)
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    mode = describe_inference(inference)
    payload = {
        "checkpoint": str(cfg.checkpoint),
        "format": model.format,
        "dataset": datamodule.name,
        "root": None if data.get("root") is None else str(data["root"]),
        "split": str(cfg.split),
        "images": images,
        "inference": inference,
        **scores,
        "confusion": confusion.tolist(),
    }
    write_json(out_dir / "metrics.json", payload)
    report.write_per_class_csv(scores, out_dir / "per_class.csv")
    title = f"{datamodule.name} {cfg.split}, {images} images, {mode}"
    report.plot_confusion(confusion, datamodule.classes, out_dir / "confusion.png", title)
    if examples:
        report.plot_examples(examples, record.palette, out_dir / "examples.png")
    report.print_scores(scores, f"{model.format} {cfg.checkpoint} on {title}")
    written = "metrics.json, per_class.csv, confusion.png" + (", examples.png" if examples else "")
    print(f"eval: wrote {written} to {out_dir}")
    return payload


def process_devices(device: str, count: int) -> list[str]:
    """The device of each of ``count`` evaluating processes: cuda:0..cuda:<count - 1> when ``device`` is
    cuda (or auto with CUDA), else the CPU for all. More processes than CUDA devices, or several with a
    named cuda:N, is a ValueError naming the settings."""
    first = torch_device(device)
    if count == 1 or first == "cpu":
        return [first] * count
    if device not in ("auto", "cuda"):
        raise ValueError(
            f"devices={count} with device={device}: several processes take device=cuda (or auto)"
        )
    available = torch.cuda.device_count()
    if count > available:
        raise ValueError(
            f"devices={count}: this machine has {available} CUDA device(s); expected at most {available}"
        )
    return [f"cuda:{index}" for index in range(count)]


def score_share(task: dict[str, Any], index: int, results: Any) -> None:
    """Score the ``index``-th share of the split in this spawned process, on ``task["devices"][index]``:
    puts (index, the metrics' summed states) on ``results``, or (index, the error's line)."""
    try:
        model = open_model(Path(task["checkpoint"]), task["threads"], task["devices"][index])
        datamodule = SegDataModule(**task["data"])
        metric = SegmentationMetric(model.record.num_classes, datamodule.ignore_index)
        ap = AveragePrecisionMetric(model.record.num_classes, datamodule.ignore_index, **task["ap"])
        loader = build_loader(datamodule, task["split"], (index, len(task["devices"])))
        predict = predictor(model, task["inference"])
        score_loader(predict, loader, metric, ap, model.record, 0, task["split"], show_progress=False)
        counts = (metric.confusion, ap.positives, ap.negatives)  # as arrays: a tensor would be shared by a
        results.put((index, (len(loader.dataset), *(c.numpy() for c in counts))))  # descriptor gone at exit
    except Exception as error:  # said by the main process, which owns the command's boundary
        results.put((index, f"{type(error).__name__}: {error}"))


class OtherShares:
    """The split's other shares, scored by ``len(task["devices"]) - 1`` spawned processes beside this one;
    ``add_to`` sums their counts (confusion, AP histograms) into this process's metrics, as validation's
    synced sums add up over ranks."""

    def __init__(self, task: dict[str, Any]) -> None:
        self.task, self.processes = task, []
        self.results: Any = None

    def __enter__(self) -> OtherShares:
        count = len(self.task["devices"])
        if count > 1:
            context = torch.multiprocessing.get_context("spawn")
            self.results = context.Queue()
            for index in range(1, count):
                process = context.Process(target=score_share, args=(self.task, index, self.results))
                process.start()
                self.processes.append(process)
        return self

    def add_to(self, metric: SegmentationMetric, ap: AveragePrecisionMetric) -> int:
        """Wait for every other share and add its counts to ``metric`` and ``ap``; returns their images."""
        images = 0
        for _ in self.processes:
            index, result = self.results.get()
            if isinstance(result, str):
                raise ValueError(f"devices: the process scoring share {index} failed: {result}")
            count, confusion, positives, negatives = result
            images += count
            metric.confusion += torch.from_numpy(confusion)
            ap.positives += torch.from_numpy(positives)
            ap.negatives += torch.from_numpy(negatives)
        return images

    def __exit__(self, *exc: object) -> None:
        for process in self.processes:
            process.join(timeout=None if exc[0] is None else 5)
            if process.is_alive():
                process.kill()


def describe_inference(inference: dict[str, Any]) -> str:
    """``whole``, or ``slide 512x512 stride 341x341``, plus scales and flip when used."""
    text = inference["mode"]
    if text == "slide":
        crop = as_hw(inference["crop"], "inference.crop")
        text += f" {crop[0]}x{crop[1]}"
        if inference.get("stride") is not None:
            stride = as_hw(inference["stride"], "inference.stride")
            text += f" stride {stride[0]}x{stride[1]}"
    if list(inference.get("scales") or [1.0]) != [1.0]:
        text += f", scales {list(inference['scales'])}"
    if inference.get("flip"):
        text += ", flip"
    return text
