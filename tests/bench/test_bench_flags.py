"""The bench checks its keys as every command does: a bad value is one line on stderr naming the key, the
value and what was expected, status 2, and no output folder (``tokens=[abc]`` used to create it first;
``maxres budget_gib=-1`` reported every probe out of memory and wrote a CSV and an empty plot;
``model models=[{name: pvt, size: b9}]`` exited 0 with the error in every table cell)."""

from __future__ import annotations

import pytest

from segattn.bench.__main__ import main

PROG = "python -m segattn.bench"
CASES = [
    (["op", "tokens=[abc]"], "op: tokens=['abc']: expected a list of token counts"),
    (["op", "variants=[nosuch]"], "op: variants='nosuch': unknown attention; expected one of"),
    (["op", "threads=-3"], "op: threads=-3: expected an integer >= 0"),
    (["op", "kernels=[torch:64x4x4]"], "op: kernels='torch:64x4x4': expected auto"),
    (["op", "kernels=[triton:48x4x4]"], "op: kernels='triton:48x4x4': Triton tuning '48x4x4': the block 48"),
    (["raster", "size=0"], "raster: size=0: expected an integer >= 1"),
    (["maxres", "budget_gib=-1"], "maxres: budget_gib=-1: expected a number > 0"),
    (
        ["model", "models=[{name:pvt,size:b9}]"],
        "model: models=pvt:size=b9: pvt: size='b9'; expected one of ['b0', 'b1', ",
    ),
    (
        ["model", "models=[{name:vit,depht:2}]"],
        "model: models=vit:depht=2: model.depht=2: model 'vit' with head 'linear' has no option",
    ),
]


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=[" ".join(case[0]) for case in CASES])
def test_a_bad_bench_key_is_one_line_before_any_output(argv, expected, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the tuning, not the device, is what these cases refuse
    out = tmp_path / "results"
    status = main([*argv, "grid=smoke", f"out={out}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(err) == 1 and err[0].startswith(f"{PROG} {expected}"), err
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["op", "kernels=[triton]"], "op: kernels='triton': the Triton kernels need a CUDA device"),
        (["nosuch"], ": 'nosuch' is not a part; expected one of op, model, maxres, raster, predict, traffic"),
    ],
)
def test_triton_without_cuda_and_an_unknown_part_are_refused_up_front(
    argv, expected, tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # set by tests/conftest.py
    out = tmp_path / "results"
    assert main([*argv, "grid=smoke", "device=cpu", f"out={out}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{PROG}{'' if argv == ['nosuch'] else ' '}{expected}"), err
    assert not out.exists()


def test_out_naming_an_existing_file_is_one_line(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("")
    assert main(["op", "grid=smoke", f"out={taken}"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"{PROG} op: out={taken}: is an existing file; expected a directory to write into "
        "(created if missing)"
    )
