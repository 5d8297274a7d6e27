"""One command-line convention: every command is composed by Hydra from conf/, answers --help with its
config groups and keys, and names a misspelled key; the console scripts work after a non-editable install,
from a directory outside the repository."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

from segattn.bench.__main__ import main as bench_main
from segattn.doctor import main as doctor_main
from segattn.export import main as export_main
from segattn.predict import main as predict_main

REPO = Path(__file__).resolve().parents[2]
IN_PROCESS = {"segattn.export": export_main, "segattn.predict": predict_main, "data doctor": doctor_main}


def run(*args: str, cwd: Path = REPO, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("segattn.export", ["checkpoint: ???", "format: ???", "opset: 18"]),
        ("segattn.predict", ["checkpoint: ???", "input: ???", "mode: whole"]),
        (
            "data doctor",
            [
                "Config groups",
                "  data: ade20k, camvid, cityscapes, folder, idrid, raster, synthetic, voc",
                "root:",
            ],
        ),
    ],
)
def test_help_lists_groups_and_keys(name, expected, capsys):
    assert IN_PROCESS[name](["--help"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("python -m segattn.")  # the usage line from the config file's header
    for text in expected:
        assert text in printed


@pytest.mark.parametrize(
    ("name", "argv", "key"),
    [
        ("segattn.export", ["checkpoint=x", "format=onnx", "out=y", "opsett=17"], "opsett"),
        (
            "segattn.predict",
            ["checkpoint=x", "input=y", "out=z", "inference.crop_batchsize=2"],
            "inference.crop_batchsize",
        ),
        ("data doctor", ["data.rooot=/tmp"], "data.rooot"),
    ],
)
def test_misspelled_key_is_one_line_naming_it(name, argv, key, capsys):
    assert IN_PROCESS[name](argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"{name}: ") and f"'{key}'" in err[0]


def test_required_keys_are_named(capsys):
    assert export_main(["format=onnx"]) == 2
    assert (
        capsys.readouterr().err.strip() == "segattn.export: missing required key(s): checkpoint=..., out=..."
    )


def test_bench_help_lists_its_parts(capsys):
    assert bench_main(["--help"]) == 0 and "traffic" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "groups", "typo"),
    [
        ("train.py", ["attention:", "model:", "data:", "inference:", "trainer:"], "trainer.max_epoch=1"),
        ("eval.py", ["data:", "inference:", "checkpoint: ???", "split: test"], "splitt=val"),
    ],
)
def test_hydra_apps_help_and_typos(script, groups, typo, tmp_path):
    helped = run(sys.executable, str(REPO / script), "--help", cwd=tmp_path)
    assert helped.returncode == 0
    for group in groups:
        assert group in helped.stdout
    failed = run(sys.executable, str(REPO / script), typo, f"paths.log_dir={tmp_path}", cwd=tmp_path)
    assert failed.returncode == 1 and typo.split("=")[0] in failed.stderr


@pytest.mark.slow
def test_non_editable_install_trains_from_outside_the_repository(tmp_path):
    """Wheel built from the checkout, installed into a fresh venv that sees the dependencies of .venv but
    not its editable segattn: configs come from the package, outputs go to the working directory."""
    wheel_dir = tmp_path / "wheel"
    built = run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheel_dir), "."
    )
    assert built.returncode == 0, built.stderr[-2000:]
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    site = next(env_dir.glob("lib/python*/site-packages"))
    dependencies = [p for p in sys.path if p.endswith("site-packages")]
    (site / "dependencies.pth").write_text("\n".join(dependencies) + "\n")  # plain paths, no editable hook
    wheel = next(wheel_dir.glob("segattn-*.whl"))
    installed = run(
        str(env_dir / "bin/python"), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)
    )
    assert installed.returncode == 0, installed.stderr[-2000:]

    work = tmp_path / "elsewhere"
    work.mkdir()
    where = run(str(env_dir / "bin/python"), "-c", "import segattn; print(segattn.__file__)", cwd=work)
    assert str(site) in where.stdout  # the installed copy, not the checkout
    helped = run(str(env_dir / "bin/segattn-train"), "--help", cwd=work)
    assert helped.returncode == 0 and "attention: agent, efficient, flatten" in helped.stdout
    trained = run(
        str(env_dir / "bin/segattn-train"),
        "debug=fdr",
        "logger=none",
        "trainer=cpu",
        "callbacks.rich_progress_bar=null",
        "callbacks.rich_model_summary=null",
        "data.image_size=[32,32]",
        "data.crop_size=[32,32]",
        "model.embed_dims=[16,16,32,32]",
        "model.depths=[1,1,1,1]",
        "model.num_heads=[1,1,2,2]",
        "model.head_channels=16",
        cwd=work,
    )
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-2000:]
    assert list(
        (work / "outputs" / "debug").glob("*/train.log")
    )  # outputs beside the user, not in site-packages
