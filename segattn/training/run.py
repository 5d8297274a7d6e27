"""Training run from a composed Hydra config: builders turn config groups into plain objects, then
Lightning fits and (``test_after_fit``) tests the best checkpoint. ``run(cfg)`` is what ``python
train.py`` calls."""

from __future__ import annotations

import functools
import io
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pytorch_lightning as pl
from omegaconf import DictConfig
from pytorch_lightning.callbacks import ModelCheckpoint, ProgressBar
from pytorch_lightning.loggers import Logger, MLFlowLogger, WandbLogger
from pytorch_lightning.utilities import rank_zero_info, rank_zero_only

from ..checkpoints.compat import check_resumable, describe_init_differences
from ..checkpoints.resume import (
    load_weights,
    nothing_left_to_train,
    read_checkpoint,
    resolve_ckpt_path,
    wandb_run_id,
)
from ..config import NothingToDo, plain
from ..cpu_memory import reuse_freed_memory
from ..data import SegDataModule
from ..evaluation.average_precision import class_ids
from ..files import atomic_write, write_json
from ..images import DataError
from ..models import build_model
from ..record import ModelRecord
from .checkpointing import AtomicCheckpointIO
from .components import build, build_group, build_strategy, check_components, entries, target_class
from .config_checks import check_config
from .losses import SegLoss
from .module import SegmentationModule
from .optim import build_optimizer, build_scheduler
from .preflight import preflight
from .rundir import claim_run_dir, environment, save_environment, save_run_config
from .runlog import commit as commit_log
from .runlog import mark_trained
from .summary import print_summary, summarize


def build_module(cfg: DictConfig, datamodule: SegDataModule) -> SegmentationModule:
    """Model, loss, optimizer and schedule factories from their config groups."""
    model_options = plain(cfg.model)
    compile_network = model_options.pop("compile", False)  # how to train it, not the architecture
    if not isinstance(compile_network, bool):
        raise ValueError(f"model.compile={compile_network!r}; expected true or false")
    if compile_network:
        check_compile_support()
    model = build_model(
        **model_options,
        num_classes=datamodule.num_classes,
        attention=cfg.attention.name,
        attention_options=plain(cfg.attention.options),
    )
    if cfg.init_from:
        report = load_weights(model, cfg.init_from)
        differences = describe_init_differences(read_checkpoint(cfg.init_from, "init_from"), model.config)
        rank_zero_info(
            f"init_from={cfg.init_from}: {differences}loaded {len(report['loaded'])} tensors; "
            f"skipped (shape) {report['skipped']}; missing {report['missing']}; "
            f"unexpected {report['unexpected']}"
        )
    record = ModelRecord(
        model=model.config,
        classes=list(datamodule.classes),
        palette=[(int(r), int(g), int(b)) for r, g, b in datamodule.palette],
        mean=tuple(float(v) for v in datamodule.mean),
        std=tuple(float(v) for v in datamodule.std),
        ignore_index=int(datamodule.ignore_index),
        dataset=cfg.data.name,
        data_config=recorded_data_config(cfg),
        inference=plain(cfg.inference),  # what validation ran with
        versions=environment(),
    )
    return SegmentationModule(
        model=model,
        criterion=SegLoss(num_classes=model.num_classes, ignore_index=record.ignore_index, **plain(cfg.loss)),
        optimizer=functools.partial(build_optimizer, **plain(cfg.optimizer)),
        scheduler=functools.partial(build_scheduler, **plain(cfg.scheduler)),
        record=record,
        inference=plain(cfg.inference),
        compile_network=compile_network,
        average_precision={
            "bins": int(cfg.metrics.ap_bins),
            "mean_classes": class_ids(
                cfg.metrics.ap_mean_classes, datamodule.classes, "metrics.ap_mean_classes"
            ),
        },
    )


def check_compile_support() -> None:
    """``model.compile=true`` needs ``torch.library.custom_op`` (torch 2.4 and later): the Triton kernels are
    operators of it, and without them a compiled model would fall back to the slower plain formula."""
    import torch

    if not hasattr(torch.library, "custom_op"):
        raise ValueError(
            f"model.compile=true needs torch 2.4 or later (torch.library.custom_op keeps the Triton kernels "
            f"in the compiled graph); this is torch {torch.__version__}: set model.compile=false, or install "
            "the torch pinned in the Makefile"
        )


def recorded_data_config(cfg: DictConfig) -> dict[str, Any]:
    """``cfg.data`` as plain values with an absolute root: what eval.py reuses to score the checkpoint on
    the same dataset, split names and evaluation size as validation did. ``data.augment`` is left out:
    evaluation does not augment, and a record refuses the ``_target_`` of its entries."""
    data = plain(cfg.data)
    data.pop("augment", None)
    if data.get("root") is not None:
        data["root"] = str(Path(data["root"]).resolve())
    return data


def build_loggers(cfg: DictConfig, resumed: dict[str, Any] | None) -> list[Logger]:
    """Loggers from ``cfg.logger``; a resumed run continues the W&B run stored in its checkpoint. MLflow 3
    refuses its local file store (``file:`` or a path; the default of conf/logger/mlflow.yaml) unless
    MLFLOW_ALLOW_FILE_STORE is true: for such a store this process sets it, where the user has not."""
    run_id = wandb_run_id(resumed) if resumed is not None else None
    loggers = []
    for key, spec in entries("logger", plain(cfg.logger)):
        extra: dict[str, Any] = {}
        found = target_class(key, spec, Logger)
        if run_id and issubclass(found, WandbLogger):
            extra = {"id": run_id, "resume": "allow"}
            rank_zero_info(f"W&B: continuing run {run_id} from the resumed checkpoint")
        local_store = urlparse(spec.get("tracking_uri") or "").scheme in ("", "file")  # file: or a path
        if issubclass(found, MLFlowLogger) and local_store:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        loggers.append(build(key, spec, Logger, **extra))
    return loggers


def build_trainer(cfg: DictConfig, callbacks: list[pl.Callback], loggers: list[Logger]) -> pl.Trainer:
    """The Trainer; without a terminal (nohup, a scheduler) there is no progress bar, whose redraws would
    fill the log file: the ``progress_log`` lines say the same. Without the project's checkpoint callback
    (``callbacks.model_checkpoint=null``) Lightning's own is off too: it would write ``epoch=0-step=2.ckpt``
    outside the run's naming and resume scheme."""
    kwargs = plain(cfg.trainer)
    kwargs["strategy"] = build_strategy(kwargs.get("strategy", "auto"))
    if not any(isinstance(callback, ModelCheckpoint) for callback in callbacks):
        kwargs["enable_checkpointing"] = False
    if not sys.stdout.isatty():
        callbacks = [callback for callback in callbacks if not isinstance(callback, ProgressBar)]
        kwargs.setdefault("enable_progress_bar", False)
    plugins = [AtomicCheckpointIO()]  # checkpoints are written to a temp file, fsync'ed, then renamed
    return pl.Trainer(**kwargs, logger=loggers or False, callbacks=callbacks, plugins=plugins)


def run(cfg: DictConfig, defaults: DictConfig | None = None) -> dict[str, Any]:
    """Check ``cfg`` (``config_checks.check_config``, keys typed by ``defaults`` where given), build
    everything from it, fit (resuming when ``ckpt_path`` is set) and return the summary. The run directory
    is held by this run alone while it trains (``rundir.run_dir_lock``)."""
    check_config(cfg, defaults)
    check_components(cfg)  # every _target_ imports, before the run dir is claimed
    run_dir = Path(cfg.paths.output_dir)
    resume_from = resolve_ckpt_path(cfg.ckpt_path, cfg.paths.log_dir, run_dir)
    resumed = read_checkpoint(resume_from, "ckpt_path") if resume_from else None
    # built before the claim: a class that refuses its arguments is refused with nothing written
    callbacks = build_group("callbacks", plain(cfg.callbacks), pl.Callback)
    with claim_run_dir(run_dir):
        return fit(cfg, run_dir, (resume_from, resumed), callbacks)


def fit(
    cfg: DictConfig,
    run_dir: Path,
    resume: tuple[Path | None, dict[str, Any] | None],
    callbacks: list[pl.Callback],
) -> dict[str, Any]:
    """Preflight, then train (from ``resume``: the checkpoint's path and contents, or None twice), test and
    summarise into ``run_dir``."""
    resume_from, resumed = resume
    reuse_freed_memory()  # opt-in: no page faults on every large activation of every step
    pl.seed_everything(cfg.seed, workers=True)
    datamodule = SegDataModule(**plain(cfg.data))
    module = build_module(cfg, datamodule)
    datamodule.size_divisor = module.model.stride  # whole-image batches are padded as the model pads
    if resumed is not None:  # the same architecture, or one line naming each difference
        check_resumable(resumed, module.model.config, resume_from)
        finished = nothing_left_to_train(resumed, cfg.trainer.max_epochs, cfg.trainer.max_steps)
        if finished and untested_own_checkpoint(cfg, resume_from, run_dir):
            rank_zero_info(f"ckpt_path={cfg.ckpt_path}: nothing left to train ({finished}); testing it")
        elif finished:
            raise NothingToDo(
                f"ckpt_path={cfg.ckpt_path}: nothing left to train: {finished}; raise trainer.max_epochs "
                f"(or trainer.max_steps) to train on, or score it with eval.py checkpoint={resume_from}"
            )
        rank_zero_info(f"ckpt_path={cfg.ckpt_path}: resuming from {resume_from}")
    preflight(cfg, datamodule, module)  # bad files / sizes fail before any logger or output
    commit_log()  # every check passed: train.log is written from here on (segattn.runlog)
    if rank_zero_only.rank == 0:
        save_run_config(cfg, run_dir)
        save_environment(run_dir)
    loggers = build_loggers(cfg, resumed)
    failed, trainer = True, None
    try:
        trainer = build_trainer(cfg, callbacks, loggers)
        for logger in trainer.loggers:
            logger.log_hyperparams(plain(cfg))
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from, weights_only=True)
        summary = summarize(trainer, module, run_dir)
        if cfg.test_after_fit:
            summary.update(run_test(trainer, module, datamodule, run_dir, bool(cfg.get("test_last"))))
        failed = False
    finally:
        if trainer is not None and trainer.global_step > 0:
            mark_trained()  # whatever ends the run now, its run dir and log are kept
        finish_wandb(loggers, exit_code=int(failed))
    if trainer.is_global_zero:
        write_json(run_dir / "summary.json", summary)
        print_summary(summary)
    return summary


def untested_own_checkpoint(cfg: DictConfig, checkpoint: Path, run_dir: Path) -> bool:
    """Whether ``checkpoint`` is this run directory's own and the run was stopped after training but before
    its test step wrote ``summary.json`` (a job killed while testing): resuming it then only tests."""
    if not cfg.test_after_fit or not Path(checkpoint).resolve().is_relative_to(run_dir.resolve()):
        return False
    summary = run_dir / "summary.json"
    return not (summary.is_file() and json.loads(summary.read_text()).get("test"))


def run_test(
    trainer: pl.Trainer,
    module: SegmentationModule,
    datamodule: SegDataModule,
    run_dir: Path,
    test_last: bool = False,
) -> dict[str, Any]:
    """Score this run's best checkpoint (the final weights without one) on the test split, scored as
    validation is; ``test`` holds the scores, or ``test_note`` says why there are none. Only a checkpoint
    inside ``run_dir`` counts: another run's file may hold another model by now.

    With ``test_last`` the final weights are scored too (``test_last``), so a table can say how much the
    choice of checkpoint by a few validation images moved the test score. Each test's per-class AP
    histograms go to ``test_ap_best.npz`` / ``test_ap_last.npz``: the positives and negatives per score
    bin from which AP (of any class subset) is recomputed without running the model again.
    """
    split = datamodule.splits["test"]
    try:
        datamodule.setup("test")
        count = len(datamodule.datasets["test"])
    except (DataError, ValueError) as error:
        return {"test": {}, "test_note": f"no test split {split!r}: {error}"}
    if count == 0:
        return {"test": {}, "test_note": f"test split {split!r} is empty"}
    best = getattr(trainer.checkpoint_callback, "best_model_path", "")
    if best and not Path(best).resolve().is_relative_to(run_dir.resolve()):
        best = ""  # only this run's own checkpoints (see ResumableModelCheckpoint.load_state_dict)
    final_state = {k: v.detach().clone() for k, v in module.state_dict().items()} if test_last else None
    trainer.test(module, datamodule=datamodule, ckpt_path=best or None, weights_only=True)
    save_histograms(trainer, module, run_dir / "test_ap_best.npz")
    weights = best or "the final weights"
    result = {"test": dict(module.test_scores), "test_note": f"{count} images of split {split!r}, {weights}"}
    if final_state is None:
        return result
    if best and checkpoint_step(best) == trainer.global_step:  # the best is the final weights: same scores
        shutil.copyfile(run_dir / "test_ap_best.npz", run_dir / "test_ap_last.npz")
        return result | {"test_last": result["test"]}
    module.load_state_dict(final_state)
    trainer.test(module, datamodule=datamodule, weights_only=True)
    save_histograms(trainer, module, run_dir / "test_ap_last.npz")
    return result | {"test_last": dict(module.test_scores)}


def checkpoint_step(path: str) -> int | None:
    """The optimizer step a Lightning checkpoint was saved at (None where it does not say)."""
    import torch

    step = torch.load(path, map_location="cpu", weights_only=True).get("global_step")
    return None if step is None else int(step)


def save_histograms(trainer: pl.Trainer, module: SegmentationModule, path: Path) -> None:
    """The last test's AP histograms as a compressed ``.npz`` (``positives``, ``negatives``: [K, bins]),
    written by rank zero, crash-safe."""
    if not trainer.is_global_zero or not module.test_histograms:
        return
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **{k: v.numpy() for k, v in module.test_histograms.items()})
    atomic_write(path, lambda handle: handle.write(buffer.getvalue()))


def finish_wandb(loggers: list[Logger], exit_code: int) -> None:
    """Close the W&B run (flushes the offline files) also when training failed; rank zero only."""
    if any(isinstance(logger, WandbLogger) for logger in loggers):
        import wandb

        if wandb.run is not None:
            wandb.finish(exit_code=exit_code)
