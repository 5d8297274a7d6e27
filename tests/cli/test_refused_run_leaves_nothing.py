"""A refused ``train.py`` leaves nothing behind, whichever check refuses it (issue 27): one mechanism at
the command boundary (``segattn.cli.hydra_app`` with ``segattn.training.runlog``). Hydra makes the run dir
before the checks run; the records meant for train.log are held in memory until every check has passed, so a
refused run's directory is empty and is removed again, and the train.log of a run dir being resumed is
not appended to. What Hydra itself would write in the wrong place (a ``run_name`` with '/') is refused
before Hydra runs (tests/cli/test_bad_values.py).

Real subprocesses with the real job logging (stdout + train.log): before, each refusal raised after the
seed was set left its run dir with an 82-byte train.log ("Seed set to 42")."""

from __future__ import annotations

import errno
import logging
import sys
from pathlib import Path

import pytest
from data_fixtures import make_folder
from reliability_fixtures import TINY, refuse, run_train
from train_overrides import QUIET as QUIET_IN_PROCESS
from train_overrides import TINY_DATA, TINY_MODEL

from segattn import cli, files
from segattn.errors import EXIT_FAILED, EXIT_INTERRUPTED

QUIET = [*TINY, "logger=none"]
# In-process runs with the real job logging (stdout and train.log): one epoch of two steps, no test.
IN_PROCESS = [
    *TINY_MODEL["vit"],
    *QUIET_IN_PROCESS,
    "hydra/job_logging=segattn",
    "logger=none",
    "trainer.max_epochs=1",
    "trainer.num_sanity_val_steps=0",
    "test_after_fit=false",
]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["+attention.options.nosuch=1"], "attention 'linear' has no option(s) ['nosuch']"),
        (["init_from={text}"], "init_from={text}: not a segattn/Lightning checkpoint"),
    ],
    ids=["attention option", "init_from"],
)
@pytest.mark.slow  # a train.py subprocess
def test_a_refused_run_leaves_no_directory_and_no_log(tmp_path, overrides, expected):
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    logs = tmp_path / "logs"
    overrides = [o.format(text=text) for o in overrides]
    command = [*QUIET, *overrides]
    # no hydra.run.dir: Hydra's own timestamped folder under logs/runs/ (run_train's is replaced below)
    run_dir = "hydra.run.dir=${paths.log_dir}/runs/${now:%H-%M-%S}_${run_name}"
    result = run_train(tmp_path, *command, f"paths.log_dir={logs}", run_dir)
    assert result.returncode == 1, result.stderr[-2000:]
    err = result.stderr.strip().splitlines()
    assert err[-1].startswith(f"train.py: {expected.format(text=text)}"), err[-3:]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]  # not even logs/


@pytest.mark.slow  # a train.py subprocess
def test_a_refused_resume_leaves_the_run_dir_as_it_was(tmp_path):
    run_dir = tmp_path / "logs" / "job42"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "train.log").write_text("[earlier run] epoch 1/2 step 4/8 loss 1.6\n")
    (run_dir / "checkpoints" / "last.ckpt").write_text("not a checkpoint\n")
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    result = run_train(tmp_path / "logs", *QUIET, "ckpt_path=last", run="job42")
    assert result.returncode == 1
    assert f"{run_dir / 'checkpoints' / 'last.ckpt'}: not a segattn/Lightning checkpoint" in result.stderr
    after = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    assert after == before


@pytest.fixture
def job_logging():
    """The root logger's handlers as they were before an in-process run configured Hydra's job logging."""
    root = logging.getLogger()
    before = list(root.handlers)
    yield
    for handler in [handler for handler in root.handlers if handler not in before]:
        root.removeHandler(handler)
        handler.close()


def train_in_process(logs: Path, monkeypatch, *overrides: str, data: list[str] = TINY_DATA) -> int:
    """Exit status of ``train.py`` on ``data``, run in-process into ``logs/run`` with the real job logging."""
    argv = [
        "train.py",
        f"paths.log_dir={logs}",
        f"hydra.run.dir={logs / 'run'}",
        *IN_PROCESS,
        *data,
        *overrides,
    ]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as ended:
        cli.train()
    return ended.value.code


def last_line(capsys) -> str:
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_bad_data_found_after_start_up_leaves_no_run_dir(tmp_path, monkeypatch, job_logging, capsys):
    """A file that decodes badly is met in the first batch, after the run claimed its dir and wrote its
    config: the run dir went on holding .hydra/, environment.json and a train.log without the error."""
    root = make_folder(tmp_path / "ds", {"train": 2, "val": 1, "test": 1})
    (root / "images" / "train" / "train01.png").write_bytes(b"\x89PNG\r\n\x1a\nthis is not an image")
    data = [
        "data=folder",
        f"data.root={root}",
        "data.crop_size=[8,8]",
        "data.batch_size=2",
        "data.num_workers=0",
    ]
    assert train_in_process(tmp_path / "logs", monkeypatch, data=data) == EXIT_FAILED
    assert last_line(capsys).startswith(f"train.py: image {root / 'images' / 'train' / 'train01.png'} cannot")
    assert not (tmp_path / "logs").exists()


def test_a_run_that_trained_keeps_its_dir_and_its_log_ends_with_the_refusal(
    tmp_path, monkeypatch, job_logging, capsys
):
    planted = ["+callbacks.refuse._target_=fault_callbacks.RefuseAtStep", "+callbacks.refuse.step=1"]
    assert train_in_process(tmp_path / "logs", monkeypatch, *planted) == EXIT_FAILED
    line = last_line(capsys)
    assert line == "train.py: image planted/bad.png cannot be decoded (planted by the test)"
    log = (tmp_path / "logs" / "run" / "train.log").read_text().splitlines()
    assert log[-1].endswith(f"[ERROR] - {line}"), log[-3:]


def test_a_full_disk_at_the_first_checkpoint_ends_the_log_with_the_same_line(
    tmp_path, monkeypatch, job_logging, capsys
):
    checkpoints = tmp_path / "logs" / "run" / "checkpoints"
    monkeypatch.setattr(files.os, "open", refuse(errno.ENOSPC, checkpoints))
    assert train_in_process(tmp_path / "logs", monkeypatch) == EXIT_FAILED
    line = last_line(capsys)
    assert line.startswith(f"train.py: no space left on {checkpoints}: writing ")
    assert (tmp_path / "logs" / "run" / "train.log").read_text().splitlines()[-1].endswith(line)


def test_ctrl_c_during_start_up_leaves_no_run_dir(tmp_path, monkeypatch, job_logging, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("segattn.training.run.preflight", interrupted)
    assert train_in_process(tmp_path / "logs", monkeypatch) == EXIT_INTERRUPTED
    assert last_line(capsys) == "train.py: interrupted (Ctrl-C)"
    assert not (tmp_path / "logs").exists()


def test_hydra_full_error_shows_the_traceback_and_leaves_no_run_dir(tmp_path, monkeypatch, job_logging):
    """The refusal's traceback was shown and its (empty) run dir left behind."""
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    bad = ["inference.mode=slide", "inference.crop=16", "inference.stride=32"]
    logs = tmp_path / "logs"
    monkeypatch.setattr(sys, "argv", ["train.py", f"paths.log_dir={logs}", *IN_PROCESS, *TINY_DATA, *bad])
    with pytest.raises(ValueError, match=r"^inference\.stride=32 is larger than inference\.crop=16"):
        cli.train()
    assert not logs.exists()
