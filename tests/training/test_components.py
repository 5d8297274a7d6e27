"""Callbacks, loggers and the trainer's strategy are built from their config entries' Hydra ``_target_``: a
callback or a logger defined outside segattn joins a run through one YAML file; a ``_target_`` that does not
import, or names a class of another kind, is refused in one line naming the key, before the run creates
anything."""

from __future__ import annotations

import os
import sys
from typing import Any, ClassVar

import pytest
import pytorch_lightning as pl
from pytorch_lightning.callbacks import ProgressBar
from pytorch_lightning.loggers import Logger, MLFlowLogger
from reliability_fixtures import BASE, VIT, compose_run

from segattn.config import plain
from segattn.errors import ConfigError, translate
from segattn.training import run as train
from segattn.training.components import build_group, build_strategy
from segattn.training.spatial import BandParallelStrategy


def target(cls: type) -> str:
    """The ``_target_`` of a class defined here."""
    return f"{cls.__module__}.{cls.__qualname__}"


class CountSteps(pl.Callback):
    """Records the global step after every training batch, and its constructor's argument."""

    runs: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, label: str) -> None:
        self.record: dict[str, Any] = {"label": label, "steps": []}
        self.runs.append(self.record)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.record["steps"].append(trainer.global_step)


class KeepMetrics(Logger):
    """Keeps every metric it is given."""

    logged: ClassVar[list[dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "keep"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logged.append(dict(metrics))


@pytest.fixture
def records(monkeypatch):
    monkeypatch.setattr(CountSteps, "runs", [])
    monkeypatch.setattr(KeepMetrics, "logged", [])


def test_a_callback_and_a_logger_join_a_run_by_one_yaml_file_each(tmp_path, records):
    conf = tmp_path / "conf"
    (conf / "callbacks").mkdir(parents=True)
    (conf / "logger").mkdir()
    (conf / "callbacks" / "count_steps.yaml").write_text(
        f"count_steps:\n  _target_: {target(CountSteps)}\n  label: from yaml\n"
    )
    (conf / "logger" / "keep.yaml").write_text(f"keep:\n  _target_: {target(KeepMetrics)}\n")
    cfg = compose_run(
        tmp_path, *BASE, *VIT, f"hydra.searchpath=[file://{conf}]", "callbacks=[default,count_steps]",
        "logger=[csv,keep]", "trainer.max_epochs=1", "trainer.log_every_n_steps=1",
    )  # fmt: skip
    summary = train.run(cfg)
    assert summary["steps"] == 2  # 8 images, batch 4
    assert CountSteps.runs == [{"label": "from yaml", "steps": [1, 2]}]
    assert any("val/mIoU" in metrics for metrics in KeepMetrics.logged)
    assert (tmp_path / "run" / "csv" / "metrics.csv").is_file()  # beside the group's own file
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()  # and the default callbacks


def test_a_callback_added_on_the_command_line(tmp_path, records):
    cfg = compose_run(
        tmp_path, *BASE, *VIT, f"+callbacks.count._target_={target(CountSteps)}",
        "+callbacks.count.label=cli", "logger=none", "debug=fdr",
    )  # fmt: skip
    train.run(cfg)
    assert CountSteps.runs == [{"label": "cli", "steps": [1]}]


def test_without_the_checkpoint_callback_lightning_saves_no_checkpoint_either(tmp_path, capsys):
    """``callbacks.model_checkpoint=null`` let Lightning's default callback write ``epoch=0-step=2.ckpt``
    outside the run's naming and resume scheme, and the summary named it as the best."""
    cfg = compose_run(
        tmp_path, *BASE, *VIT, "callbacks.model_checkpoint=null", "logger=none", "trainer.max_epochs=1",
        "test_after_fit=false",
    )  # fmt: skip
    summary = train.run(cfg)
    assert summary["steps"] == 2 and summary["best_checkpoint"] is None
    assert not list(tmp_path.rglob("*.ckpt"))
    assert "none: the run saved no checkpoint" in capsys.readouterr().out


NOT_A = "expected the import path (package.module.Class) of a Lightning"
PL = "pytorch_lightning"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["+callbacks.foo._target_=nosuch.Class"],
            "callbacks.foo._target_=nosuch.Class: cannot import it (No module named 'nosuch'); "
            f"{NOT_A} Callback",
        ),
        (
            [f"callbacks.model_checkpoint._target_={PL}.callbacks.NoSuchCheckpoint"],
            f"callbacks.model_checkpoint._target_={PL}.callbacks.NoSuchCheckpoint: cannot import it "
            f"(module {PL}.callbacks has no 'NoSuchCheckpoint')",
        ),
        (
            [f"+callbacks.foo._target_={PL}.loggers.CSVLogger"],
            f"callbacks.foo._target_={PL}.loggers.CSVLogger: CSVLogger is not a Callback; {NOT_A}",
        ),
        (["+callbacks.foo._target_=os.system"], "callbacks.foo._target_=os.system: a builtin_function"),
        (["+callbacks.foo._target_=.Relative"], "callbacks.foo._target_='.Relative' is not a dotted import"),
        (
            [f"logger.wandb._target_={PL}.callbacks.RichProgressBar"],
            f"logger.wandb._target_={PL}.callbacks.RichProgressBar: RichProgressBar is not a Logger; "
            f"{NOT_A} Logger",
        ),
        (
            ["trainer=spatial_cpu", "trainer.strategy._target_=segattn.training.guards.NonFiniteGuard"],
            "trainer.strategy._target_=segattn.training.guards.NonFiniteGuard: NonFiniteGuard is not a "
            "Strategy",
        ),
        (
            ["trainer=spatial_cpu", "trainer.strategy.name=fsdp"],
            "trainer.strategy.name=fsdp but trainer.strategy._target_="
            "segattn.training.spatial.BandParallelStrategy is the 'spatial' strategy; expected "
            "trainer.strategy.name=spatial",
        ),
        (  # the name of a file of the group, without selecting the file
            ["+callbacks.early_stopping.patience=3"],
            "callbacks.early_stopping has no _target_: expected the import path (package.module.Class) of a "
            "Lightning Callback subclass; conf/callbacks/early_stopping.yaml has one: select it beside the "
            "others, callbacks=[default,early_stopping]",
        ),
        (["callbacks.progress_log=true"], "callbacks.progress_log=True: expected a mapping with the"),
        (  # the monitor of any checkpoint or early-stopping callback, whatever its name
            ["callbacks=[default,early_stopping]", "callbacks.early_stopping.monitor=val/miou"],
            "callbacks.early_stopping.monitor=val/miou: the run does not log this metric",
        ),
    ],
)
def test_a_bad_target_is_one_line_before_the_run_creates_anything(tmp_path, monkeypatch, overrides, expected):
    monkeypatch.setattr(train, "build_loggers", pytest.fail)  # no W&B run, no trainer, no checkpoint
    monkeypatch.setattr(train, "fit", pytest.fail)  # not even the data or the model
    cfg = compose_run(tmp_path, *BASE, *VIT, "logger=wandb", *overrides)
    with pytest.raises(ConfigError) as error:
        train.run(cfg)
    assert str(error.value).startswith(expected)
    assert "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


def test_an_error_of_the_class_itself_comes_out_as_it_raised_it(tmp_path):
    cfg = compose_run(tmp_path, *BASE, "callbacks.preemption.signals=[SIGNOPE]")
    with pytest.raises(ValueError, match=r"^callbacks\.preemption\.signals=\['SIGNOPE'\]: expected"):
        build_group("callbacks", plain(cfg.callbacks), pl.Callback)


def test_strategy_arguments_reach_it_and_its_name_does_not(tmp_path):
    cfg = compose_run(tmp_path, *BASE, "trainer=spatial_cpu", "trainer.strategy.bands=3")
    strategy = build_strategy(plain(cfg.trainer.strategy))
    assert isinstance(strategy, BandParallelStrategy) and strategy.bands == 3
    assert build_strategy("ddp") == "ddp"  # a Lightning name stays Lightning's


def test_without_a_terminal_no_progress_bar_is_built(tmp_path):
    cfg = compose_run(tmp_path, *BASE, "trainer=cpu", "logger=none")  # pytest's stdout is no terminal
    trainer = train.build_trainer(cfg, build_group("callbacks", plain(cfg.callbacks), pl.Callback), [])
    assert not [callback for callback in trainer.callbacks if isinstance(callback, ProgressBar)]
    built = {type(callback).__name__ for callback in trainer.callbacks}
    assert built >= {"ResumableModelCheckpoint", "ProgressLog", "NonFiniteGuard", "PreemptionCheckpoint"}


def test_mlflow_logs_the_config_and_metrics_to_a_file_store_in_the_run_dir(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")  # recorded: the value the run sets is undone after
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    cfg = compose_run(
        tmp_path, *BASE, *VIT, "logger=mlflow", "trainer.max_epochs=1", "trainer.log_every_n_steps=1"
    )
    summary = train.run(cfg)
    client = MlflowClient(f"file:{tmp_path / 'run' / 'mlflow'}")
    (logged,) = client.search_runs([client.get_experiment_by_name("segattn").experiment_id])
    assert (logged.info.status, logged.info.run_name) == ("FINISHED", cfg.run_name)
    params, metrics = logged.data.params, logged.data.metrics
    assert (params["model/name"], params["attention/name"]) == ("vit", "linear")
    assert params["model/embed_dim"] == "32"  # MLflow keeps parameters as text
    assert params["paths/output_dir"] == str(tmp_path / "run")  # resolved, not an interpolation
    assert metrics["val/mIoU"] == pytest.approx(summary["best_score"], abs=1e-4) and "train/loss" in metrics
    assert metrics["test/mIoU"] == pytest.approx(summary["test"]["mIoU"], abs=1e-4)  # logged after fit
    assert logged.data.tags["attention"] == "linear"


@pytest.mark.parametrize(
    ("tracking_uri", "expected"),
    [
        (None, "true"),  # conf/logger/mlflow.yaml's file store in the run dir
        ("/some/folder", "true"),
        ("http://127.0.0.1:5000", None),  # a server: not the file store
    ],
)
def test_mlflow_file_store_is_allowed_for_a_local_store(tmp_path, monkeypatch, tracking_uri, expected):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")  # recorded: the value the run sets is undone after
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    overrides = [] if tracking_uri is None else [f"logger.mlflow.tracking_uri={tracking_uri}"]
    (logger,) = train.build_loggers(compose_run(tmp_path, *BASE, "logger=mlflow", *overrides), None)
    assert isinstance(logger, MLFlowLogger)
    assert os.environ.get("MLFLOW_ALLOW_FILE_STORE") == expected


def test_mlflow_file_store_refused_by_the_user_stays_refused_in_one_line(tmp_path, monkeypatch):
    from mlflow.exceptions import MlflowException

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "false")
    with pytest.raises(MlflowException) as raised:
        train.build_loggers(compose_run(tmp_path, *BASE, "logger=mlflow"), None)
    error = translate(raised.value)
    assert isinstance(error, ConfigError) and "\n" not in str(error)
    assert str(error).startswith("MLflow refused logger.mlflow: The filesystem tracking backend")
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "false"


@pytest.mark.parametrize(
    ("logger", "packages", "message"),
    [
        (
            "mlflow",
            ["mlflow"],
            "MLFlowLogger needs mlflow, which is not installed; pip install 'segattn[mlflow]' "
            "(mlflow-skinny)",
        ),
        (
            "tensorboard",
            ["tensorboard", "tensorboardX"],
            "TensorBoardLogger needs tensorboard, which is not installed; pip install 'segattn[tensorboard]'",
        ),
    ],
)
def test_a_logger_without_its_package_is_one_line_naming_the_extra_before_the_run_creates_anything(
    tmp_path, monkeypatch, logger, packages, message
):
    for package in packages:
        monkeypatch.setitem(sys.modules, package, None)  # as if it were not installed
    monkeypatch.setattr(train, "build_loggers", pytest.fail)
    monkeypatch.setattr(train, "fit", pytest.fail)
    with pytest.raises(ConfigError) as error:
        train.run(compose_run(tmp_path, *BASE, *VIT, f"logger={logger}"))
    assert str(error.value) == f"logger.{logger}: {message}"
    assert not (tmp_path / "run").exists()
