"""The bench's error boundary (issue 34): SEGATTN_KERNEL is checked before the output folder exists, and a
refusal is one line with status 2. (The accuracy study is a ``train.py -m`` sweep now: train.py checks its
experiment and overrides, tests/tools/ its table.)"""

from __future__ import annotations

from segattn.bench.__main__ import main
from segattn.errors import EXIT_CONFIG

PROG = "python -m segattn.bench"


def ended(argv: list[str], capsys) -> tuple[int, str]:
    """The exit status of the bench and its one line on stderr."""
    status = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return status, err[0]


def test_segattn_kernel_is_checked_before_the_out_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SEGATTN_KERNEL", "nonsense")
    out = tmp_path / "results"
    status, line = ended(["op", "grid=smoke", f"out={out}"], capsys)
    assert status == EXIT_CONFIG
    assert line == (
        f"{PROG} op: SEGATTN_KERNEL='nonsense'; expected auto (the default), torch, triton, loss, "
        "upsample, head, ffn or residual (auto and that form)"
    )
    assert not out.exists()
