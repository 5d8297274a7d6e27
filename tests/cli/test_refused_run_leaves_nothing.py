"""A refused ``train.py`` leaves nothing behind, whichever check refuses it (issue 27): one mechanism at
the command boundary (``segattn.cli.hydra_app`` with ``segattn.runlog``). Hydra makes the run dir before
the checks run; the records meant for train.log are held in memory until every check has passed, so a
refused run's directory is empty and is removed again, and the train.log of a run dir being resumed is
not appended to. What Hydra itself would write in the wrong place (a ``run_name`` with '/') is refused
before Hydra runs (tests/cli/test_bad_values.py).

Real subprocesses with the real job logging (stdout + train.log): before, each refusal raised after the
seed was set left its run dir with an 82-byte train.log ("Seed set to 42")."""

from __future__ import annotations

import pytest
from reliability_fixtures import TINY, run_train

pytestmark = pytest.mark.slow  # a train.py subprocess per case
QUIET = [*TINY, "logger=none"]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["+attention.options.nosuch=1"], "attention 'linear' has no option(s) ['nosuch']"),
        (["init_from={text}"], "init_from={text}: not a segattn/Lightning checkpoint"),
    ],
    ids=["attention option", "init_from"],
)
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
