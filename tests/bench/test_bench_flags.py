"""The bench command checks its flags as the Hydra commands check their keys: a bad value is one line on
stderr naming the flag, the value and what was expected, status 2, and no output folder (``--sizes abc``
used to create it first; ``maxres --budget-gib -1`` reported every probe out of memory and wrote a CSV and
an empty plot; ``model --models pvt:size=b9`` exited 0 with the error in every table cell)."""

from __future__ import annotations

import pytest

from segattn.bench.__main__ import main

PROG = "python -m segattn.bench"
CASES = [
    (["op", "--sizes", "abc"], "op: argument --sizes: 'abc' is not a count; expected an integer"),
    (["op", "--variants", "nosuch"], "op: argument --variants: unknown attention 'nosuch'; expected one of"),
    (["op", "--threads", "-3"], "op: argument --threads: '-3': expected an integer >= 1"),
    (["op", "--kernels", "torch:64x4x4"], "op: argument --kernels: 'torch:64x4x4': expected auto"),
    (["op", "--kernels", "triton:48x4x4"], "op: argument --kernels: Triton tuning '48x4x4': the block 48"),
    (["raster", "--size", "0"], "raster: argument --size: '0': expected an integer >= 1"),
    (["maxres", "--budget-gib", "-1"], "maxres: argument --budget-gib: '-1': expected a number > 0"),
    (
        ["model", "--models", "pvt:size=b9"],
        "model: argument --models: pvt:size=b9: pvt: size='b9'; expected one of ['b0', 'b1', ",
    ),
    (
        ["model", "--models", "vit:depht=2"],
        "model: argument --models: vit:depht=2: model.depht=2: model 'vit' with head 'linear' has no option",
    ),
]


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=[" ".join(case[0]) for case in CASES])
def test_a_bad_bench_flag_is_one_line_before_any_output(argv, expected, tmp_path, capsys):
    out = tmp_path / "results"
    with pytest.raises(SystemExit) as ended:
        main([*argv, "--smoke", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert ended.value.code == 2
    assert len(err) == 1 and err[0].startswith(f"{PROG} {expected}"), err
    assert not out.exists()
