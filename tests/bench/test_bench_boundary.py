"""The bench's error boundary (issue 34): SEGATTN_KERNEL and the accuracy experiment with its
``overrides`` are checked before the output folder exists (``experiment=missing`` was a 69-line
traceback and left the folder), a refusal is one line with status 2, and ``bench accuracy`` exits 1 naming
the runs that failed (it exited 0 with ``only=train``, or when every run failed)."""

from __future__ import annotations

import pytest

from segattn.bench import accuracy
from segattn.bench.__main__ import main
from segattn.errors import EXIT_CONFIG, EXIT_FAILED

PROG = "python -m segattn.bench"


def ended(argv: list[str], capsys) -> tuple[int, str]:
    """The exit status of the bench and its one line on stderr."""
    status = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return status, err[0]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["train_experiment=nosuch"], "accuracy: In 'train': Could not find 'experiment/nosuch'"),
        (
            ['overrides=["trainer.max_epochs=abc"]'],
            "accuracy: trainer.max_epochs='abc': expected an integer",
        ),
        (['overrides=["trainer.max_epoch=1"]'], "accuracy: Could not override 'trainer.max_epoch'."),
    ],
)
def test_the_experiment_and_overrides_are_checked_before_the_out_dir(argv, expected, tmp_path, capsys):
    out = tmp_path / "results"
    status, line = ended(["accuracy", "grid=smoke", f"out={out}", *argv], capsys)
    assert status == EXIT_CONFIG and line.startswith(f"{PROG} {expected}"), line
    assert not out.exists()


def test_segattn_kernel_is_checked_before_the_out_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SEGATTN_KERNEL", "nonsense")
    out = tmp_path / "results"
    status, line = ended(["op", "grid=smoke", f"out={out}"], capsys)
    assert status == EXIT_CONFIG
    assert line == f"{PROG} op: SEGATTN_KERNEL='nonsense'; expected auto (the default), torch or triton"
    assert not out.exists()


@pytest.mark.parametrize("only", [["only=train"], []])
def test_failed_runs_exit_non_zero_naming_them(only, tmp_path, monkeypatch, capsys):
    def train_all(settings, out_dir):
        run_dir = out_dir / "runs" / "linear-seed0"
        return [
            {"variant": "linear", "seed": 0, "run_dir": str(run_dir), "status": "failed"}
            | {"note": "exit 1, see train_stdout.log"}
        ]

    def no_costs(*args):
        raise AssertionError("no table to make: every run failed")

    monkeypatch.setattr(accuracy, "train_all", train_all)
    monkeypatch.setattr(accuracy, "measure_costs", no_costs)
    argv = ["accuracy", "grid=smoke", "variants=[linear]", "maxres=false", f"out={tmp_path}", *only]
    status, line = ended(argv, capsys)
    assert status == EXIT_FAILED
    assert line == (
        f"{PROG} accuracy: 1 run(s) failed: linear-seed0 (exit 1, see train_stdout.log); rerun the command "
        "to retry"
    )
