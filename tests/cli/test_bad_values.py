"""Bad values across train, eval, export and predict: exit non-zero with one line on stderr naming the key
or file, the value and what was expected; no traceback; nothing created (no run dir, no out dir).

train.py and eval.py run their real Hydra applications in-process (``sys.argv`` set as the shell would)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from commands_in_process import run_command
from omegaconf import OmegaConf
from torch._utils import ExceptionWrapper

from segattn import cli, config
from segattn.config import checks
from segattn.evaluation.command import data_config
from segattn.export.command import FORMATS
from segattn.images import DataError


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    """A log dir to stay empty, a text file posing as a checkpoint, a plain file where a folder belongs."""
    paths = {"logs": tmp_path / "logs", "text": tmp_path / "notes.txt", "file": tmp_path / "afile"}
    paths["logs"].mkdir()
    paths["text"].write_text("not a checkpoint\n")
    paths["file"].write_text("x")
    return paths


TEXT_CKPT = "not a segattn/Lightning checkpoint: a file of 17 bytes starting with b'not '"
CASES = [  # command, arguments ({text}, {file}, {tmp} filled in), expected line after "<command>: "
    ("train.py", ["trainer.max_epochs=abc"], "trainer.max_epochs='abc': expected an integer >= -1"),
    ("train.py", ["data.batch_size=-1"], "data.batch_size=-1: expected an integer >= 1"),
    ("train.py", ["data.crop_size=[0,0]"], "data.crop_size=[0, 0]: expected a positive size: H or [H, W]"),
    ("train.py", ["data=folder"], "missing required key(s): data.root=..."),
    (
        "train.py",
        ["data=camvid", "data.root={tmp}/nope"],
        "data.root={tmp}/nope: does not exist; expected the folder holding dataset 'camvid'",
    ),
    ("train.py", ["optimizer.lr=-1"], "optimizer.lr=-1: expected a number >= 0"),
    (
        "train.py",
        ["data=folder", "data.root={tmp}", "data.downsample=0"],
        "data.downsample=0: expected an integer >= 1 (1: full resolution)",
    ),
    (  # a boolean key takes true or false only: 'no' would be a string, read as true
        "train.py",
        ["loss.dice_present_only=no", "check_memory=abc"],
        "check_memory='abc': expected true or false; loss.dice_present_only='no': expected true or false",
    ),
    ("train.py", ["model.head_channels=abc"], "model.head_channels='abc': expected an integer"),
    ("eval.py", ["checkpoint={text}", "inference.flip=off"], "inference.flip='off': expected true or false"),
    (
        "segattn.predict",
        ["checkpoint={text}", "input={tmp}", "out={tmp}/o", "stream=yes"],
        "stream='yes': expected true or false",
    ),
    ("train.py", ["trainer.precision=bf17"], "trainer.precision='bf17': expected one of 64-true, 32-true"),
    (
        "train.py",
        ["trainer.limit_train_batches=1.5"],
        "trainer.limit_train_batches=1.5: expected null, a batch",
    ),
    (
        "train.py",
        ["data.num_workers=-2", "data.hflip=2"],  # every bad key, in one line
        "data.num_workers=-2: expected an integer >= 0; data.hflip=2: expected a probability in [0, 1]",
    ),
    (
        "train.py",
        ["data.augment=[{{_target_:albumentations.HorizontalFlip,pp:0.5}}]"],  # {{ }}: the case is formatted
        "data.augment[0] HorizontalFlip: unexpected argument 'pp'; it takes p",
    ),
    (  # albumentations' serialised form (A.to_dict's) with a misspelt transform
        "train.py",
        [
            "data.augment={{__version__:'2.0.8',transform:{{__class_fullname__:Compose,p:1.0,"
            "transforms:[{{__class_fullname__:HorizontalFlipp,p:0.5}}]}}}}"
        ],
        "data.augment.transform.transforms[0]: albumentations has no transform 'HorizontalFlipp'; did you "
        "mean HorizontalFlip",
    ),
    ("train.py", ["ckpt_path={text}"], f"ckpt_path={{text}}: {TEXT_CKPT}"),
    ("train.py", ["init_from={tmp}/nope.ckpt"], "init_from={tmp}/nope.ckpt: no such checkpoint file"),
    (
        "train.py",
        ["run_name=../../escape"],
        "run_name=../../escape: expected a name without '/' or '\\' (it names the run's folder",
    ),
    (
        "train.py",
        ["data=camvid", "data.root={tmp}/my", "data"],  # data.root={tmp}/my data, unquoted
        "'data' is not key=value: the shell split the value of data.root at a space; quote the whole "
        "override: 'data.root=\"{tmp}/my data\"'",
    ),
    (
        "train.py",
        ["data=camvid", "data.root={tmp}/données"],
        "data.root={tmp}/données: Hydra cannot read this value unquoted (non-ASCII letters, spaces, "
        "brackets); quote it: 'data.root=\"{tmp}/données\"'",
    ),
    (
        "train.py",
        ["paths.log_dir={file}"],
        "paths.log_dir={file}: is an existing file; expected a directory to write into",
    ),
    (
        "train.py",
        ["hydra.run.dir={file}/run"],
        "hydra.run.dir={file}/run: cannot be created: {file} is a file; expected a directory path",
    ),
    ("train.py", ["trainer.max_epoch=1"], "Could not override 'trainer.max_epoch'. To append to your config"),
    (
        "segattn.predict",
        ["checkpoint={text}", "input={tmp}/my", "image", "out={tmp}/o"],
        "'image' is not key=value: the shell split the value of input at a space; quote the whole "
        "override: 'input=\"{tmp}/my image\"'",
    ),
    (
        "segattn.predict",
        ["checkpoint={text}", "input={tmp}/my", "big", "image", "out={tmp}/o"],
        "'big' is not key=value: the shell split the value of input at a space; quote the whole "
        "override: 'input=\"{tmp}/my big image\"'",
    ),
    (
        "train.py",
        ["inference.mode=slide", "inference.crop=[0,0]"],
        "inference.crop=[0, 0]: expected null or a positive size: H or [H, W] in pixels",
    ),
    (
        "segattn.predict",
        ["checkpoint={text}", "input={tmp}", "out={tmp}/o", "inference.mode=bogus"],
        "inference.mode='bogus': expected one of whole, slide",
    ),
    (
        "segattn.predict",
        ["checkpoint={text}", "input={tmp}", "out={tmp}/o", "inference.mode=slide"],
        "inference.mode=slide needs inference.crop=H or inference.crop=[H,W] (the window size)",
    ),
    (
        "segattn.export",
        ["checkpoint={text}", "format=tflite", "out={tmp}/o"],
        "format='tflite': expected one of onnx, torchscript, safetensors",
    ),
    ("eval.py", ["checkpoint={text}", "num_examples=-1"], "num_examples=-1: expected an integer >= 0"),
    (
        "eval.py",
        ["checkpoint={text}", "inference.crop_batch_size=0"],
        "inference.crop_batch_size=0: expected",
    ),
    ("eval.py", ["checkpoint={text}"], f"checkpoint={{text}}: {TEXT_CKPT}"),
    (
        "segattn.export",
        ["checkpoint={text}", "format=onnx", "out={file}"],
        "out={file}: is an existing file; expected a directory to write into (created if missing)",
    ),
    (
        "segattn.export",
        ["checkpoint={text}", "format=onnx", "out={file}/sub"],
        "out={file}/sub: cannot be created: {file} is a file; expected a directory path",
    ),
    (
        "segattn.export",
        ["checkpoint={text}", "format=onnx", "out={tmp}/o", "opset=abc"],
        "opset='abc': expected",
    ),
    (
        "segattn.export",
        ["checkpoint={text}", "format=onnx", "out={tmp}/o"],
        f"checkpoint={{text}}: {TEXT_CKPT}",
    ),
    (
        "segattn.predict",
        ["checkpoint={text}", "input={tmp}", "out={file}"],
        "out={file}: is an existing file; expected a directory",
    ),
    (
        "segattn.predict",
        ["checkpoint={text}", "input={tmp}", "out={tmp}/o", "inference.crop_batch_size=0"],
        "inference.crop_batch_size=0: expected an integer >= 1",
    ),
    (
        "segattn.predict",
        ["checkpoint={text}", "input={tmp}", "out={tmp}/o", "alpha=2"],
        "alpha=2: expected an opacity",
    ),
    (  # keys renamed when validation and predict's settings became the inference group
        "train.py",
        ["validation.mode=slide", "validation.crop_size=[512,512]"],
        "validation.mode is now inference.mode: write inference.mode=slide; validation.crop_size is now "
        "inference.crop: write inference.crop=[512,512]",
    ),
    ("eval.py", ["checkpoint={text}", "validation=default"], "validation is now inference: write inference="),
    (
        "segattn.predict",
        ["checkpoint={text}", "input={tmp}", "out={tmp}/o", "crop=512"],
        "crop is now inference.crop: write inference.crop=512",
    ),
]


@pytest.mark.parametrize(("command", "argv", "expected"), CASES, ids=[" ".join(case[1]) for case in CASES])
def test_bad_value_is_one_line_and_creates_nothing(
    command, argv, expected, files, tmp_path, monkeypatch, capsys
):
    fill = {"text": files["text"], "file": files["file"], "tmp": tmp_path}
    status = run_command(command, [arg.format(**fill) for arg in argv], files["logs"], monkeypatch)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == (1 if command.endswith(".py") or "checkpoint=" in expected else 2)
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith(f"{command}: {expected.format(**fill)}"), err[0]
    assert not any(files["logs"].iterdir()) and not (tmp_path / "o").exists()


def test_a_dataloader_workers_error_is_its_own_message_with_the_traceback_logged(monkeypatch):
    """torch re-raises a worker's error with the worker's traceback in its message: one line is printed,
    the traceback is logged (stdout and train.log)."""
    problem = "image data/images/train/0042.png cannot be decoded; the file is corrupt or truncated"
    try:
        raise DataError(problem, "data/images/train/0042.png")
    except DataError:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
    with pytest.raises(DataError) as reraised:
        wrapped.reraise()
    assert "Original Traceback" in str(reraised.value)  # what torch hands the main process
    logged = []
    monkeypatch.setattr(cli.log, "error", logged.append)
    assert cli.user_message(reraised.value) == problem
    assert logged == [str(reraised.value)]
    assert cli.user_message(ValueError("data.batch_size=-1: expected")) == "data.batch_size=-1: expected"


def test_a_read_only_log_dir_is_one_line_before_hydra_writes(files, tmp_path, monkeypatch, capsys):
    """As a user without write access sees a chmod 555 folder (root, which runs CI, writes anywhere)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(checks.os, "access", lambda path, mode: Path(path) != locked)
    status = run_command("train.py", [f"paths.log_dir={locked}"], files["logs"], monkeypatch)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and len(err) == 1, err
    expected = f"paths.log_dir={locked}: cannot be written: {locked} is not writable by this user"
    assert err[0] == f"train.py: {expected}"
    assert not any(locked.iterdir())


def test_eval_names_a_missing_data_root_as_train_does(tmp_path):
    """eval.py with a dataset read from disk: the folder is checked before the dataset reads it (it said
    "has no classes.json" for data=folder)."""
    cfg = cli.compose_command("eval", ["checkpoint=x.ckpt", "data=folder", f"data.root={tmp_path}/nope"])
    with pytest.raises(FileNotFoundError) as error:
        data_config(cfg, {"mean": [0.5] * 3, "std": [0.5] * 3})
    assert str(error.value) == (
        f"data.root={tmp_path}/nope: does not exist; expected the folder holding dataset 'folder' "
        "(see data/README.md)"
    )


@pytest.mark.parametrize("command", sorted(config.SCHEMAS))
def test_every_checked_key_is_a_key_of_its_command(command):
    """A schema is keyed by full paths of the command's own config: a rule for a key the command does not
    have (a rename the schema missed) checks nothing. ``data.*`` rules cover options some datasets lack."""
    cfg = cli.compose_command(command, [])

    def has(key: str) -> bool:
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        return node is not None and leaf in node.keys()  # noqa: SIM118 (`in` skips "???" values)

    assert [
        key for key in config.SCHEMAS[command].rules if not key.startswith("data.") and not has(key)
    ] == []


def test_a_key_is_checked_by_its_own_commands_rule_only():
    """export's ``height`` rule does not apply to a ``height`` key elsewhere, as the one global table did."""
    config.check_values(cli.compose_command("train", ["+height=0", "+format=tflite"]), "train")
    with pytest.raises(ValueError, match=r"^height=0: expected an integer >= 1 \(pixels\)$"):
        config.check_values(
            cli.compose_command("export", ["checkpoint=x", "format=onnx", "out=x", "height=0"]), "export"
        )


COMMANDS = {  # each command's required keys, filled
    "train": [],
    "eval": ["checkpoint=x.ckpt"],
    "predict": ["checkpoint=x.ckpt", "input=x.png", "out=masks"],
    "export": ["checkpoint=x.ckpt", "format=onnx", "out=exported"],
    "doctor": [],
    **{f"bench/{part}": [] for part in ("op", "model", "maxres", "raster", "traffic", "predict")},
}
WRONG_TYPE = {bool: "no", int: "abc", float: "abc", str: ["a", "b"]}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_typed_key_of_every_command_refuses_a_value_of_another_type(command):
    """Walks every key of the composed config whose default is a boolean, an integer, a number or a string,
    sets it to a value of another type, and expects one problem naming that key and value."""
    assert sorted(COMMANDS) == sorted(config.SCHEMAS)
    cfg = cli.compose_command(command, COMMANDS[command])
    defaults = cli.defaults_config(command, COMMANDS[command])
    typed = [
        (key, value)
        for key, value in checks.leaves(OmegaConf.to_container(defaults))
        if type(value) in WRONG_TYPE
    ]
    assert len(typed) >= 5
    for key, default in typed:
        wrong = copy.deepcopy(cfg)
        OmegaConf.update(wrong, key, WRONG_TYPE[type(default)], merge=False)
        with pytest.raises(ValueError) as refused:
            config.check_values(wrong, command, defaults)
        assert f"{key}={checks.shown(WRONG_TYPE[type(default)])}: expected" in str(refused.value), key
    config.check_values(cfg, command, defaults)  # the defaults themselves pass


def test_the_export_formats_checked_are_the_ones_export_writes():
    assert config.EXPORT_FORMATS == FORMATS


@pytest.mark.parametrize(
    ("trainer", "hint"),
    [
        ("spatial", "trainer=spatial_cpu is the CPU form of trainer=spatial"),
        ("ddp", "trainer=ddp_cpu is the CPU form of trainer=ddp"),
        ("gpu", "use trainer.accelerator=cpu (or auto)"),
    ],
)
def test_a_gpu_trainer_without_a_gpu_names_its_cpu_form(trainer, hint, files, monkeypatch, capsys):
    """Lightning ended in "No supported gpu backend found!" (a traceback)."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    status = run_command("train.py", [f"trainer={trainer}"], files["logs"], monkeypatch)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and len(err) == 1, err
    assert err[0] == f"train.py: trainer.accelerator=gpu: no CUDA GPU is available on this machine; {hint}"
    assert not any(files["logs"].iterdir())


@pytest.mark.parametrize(
    ("command", "argv", "checked_in"),
    [
        ("train.py", ["data.batch_size=0"], "segattn.training.config_checks"),
        ("eval.py", ["checkpoint={text}", "num_examples=-1"], "segattn.evaluation.command"),
    ],
)
def test_values_are_checked_once_per_run(command, argv, checked_in, files, monkeypatch, capsys):
    """train.py and eval.py check their values once, in the run (given the typed defaults by the command
    boundary), not again after the boundary's check."""
    calls = []

    def counted(cfg, name, defaults=None):
        calls.append((name, defaults is not None))
        return config.check_values(cfg, name, defaults)

    monkeypatch.setattr(f"{checked_in}.check_values", counted)
    monkeypatch.setattr(cli, "check_values", counted)
    status = run_command(
        command, [arg.format(text=files["text"]) for arg in argv], files["logs"], monkeypatch
    )
    assert status == 1 and "expected an integer" in capsys.readouterr().err
    assert calls == [(command.removesuffix(".py"), True)]
