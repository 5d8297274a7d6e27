"""One command-line convention for every segattn command: Hydra composes ``conf/<command>.yaml`` and
applies the same overrides everywhere (``key=value``, ``group=option``, lists as ``[512,1024]``), and
``--help`` lists the command's config groups and keys.

``train`` and ``eval`` are Hydra applications (a run directory per invocation, ``-m`` sweeps); export,
predict and the data doctor write only where they are told, so they compose the same way without one.
Console scripts (``segattn-train``, ...) point here, so they work from any directory, also after a
non-editable install, which ships ``conf/`` inside the package.

Every command has one error boundary, here at its entry (``run_command``, ``hydra_app``): a refusal a user
can act on (``segattn.errors``: a ``SegattnError``, a known third-party failure it translates, or a
ValueError / FileNotFoundError / FileExistsError of a check) is one line on stderr and the exit status
``segattn.errors`` documents; anything else is a bug and keeps its traceback, as every error does under
``HYDRA_FULL_ERROR=1``.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict

from .config import (
    NothingToDo,
    check_renamed,
    check_run_name,
    check_values,
    check_writable_dir,
    config_dir,
    register_resolvers,
)
from .errors import EXIT_CONFIG, EXIT_FAILED, EXIT_INTERRUPTED, SegattnError, one_line, translate
from .training import runlog

# What the checks raised before the project's error type: still refusals, said in one line.
CHECK_ERRORS = (ValueError, FileNotFoundError, FileExistsError)
WORKER_TRACEBACK = "\nOriginal Traceback (most recent call last):\n"  # how torch re-raises worker errors
log = logging.getLogger("segattn")


def user_message(error: BaseException) -> str:
    """The message to print for ``error``. An error raised in a DataLoader worker reaches the main process
    wrapped with the worker's traceback; that goes to the log (stdout and train.log) and the message
    keeps only the worker's own error text."""
    text = str(error)
    if WORKER_TRACEBACK not in text:
        return text
    log.error(text)
    lines = text.split(WORKER_TRACEBACK, 1)[1].rstrip().splitlines()
    start = max(index for index, line in enumerate(lines) if line and not line[0].isspace())
    qualified_name, _, message = "\n".join(lines[start:]).partition(": ")
    return message or qualified_name


def full_error() -> bool:
    """``HYDRA_FULL_ERROR=1``: developers get the traceback of a refusal instead of its one line."""
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def refusal(error: BaseException) -> SegattnError | None:
    """``error`` as the refusal a user is told in one line, or None for a bug (its traceback is shown): a
    project error, a known third-party failure (``errors.translate``: a full disk, a read-only folder, a
    file that is no safetensors / ONNX / JSON, a Hydra or Lightning configuration error), or a check's
    ValueError / FileNotFoundError / FileExistsError."""
    said = translate(error)
    if said is None and isinstance(error, CHECK_ERRORS):
        said = SegattnError(str(error))
    return said


def told(name: str, error: Exception) -> SegattnError:
    """The refusal ``error`` is (``refusal``), told as one line on stderr (``<name>: <line>``): every
    command's boundary. A bug, and any error under ``HYDRA_FULL_ERROR=1``, is re-raised with its traceback
    instead; call it while ``error`` is being handled."""
    said = refusal(error)
    if said is None or full_error():
        raise error
    print(f"{name}: {said_line(said)}", file=sys.stderr)
    return said


def said_line(said: SegattnError) -> str:
    """The one line printed for a refusal (a DataLoader worker's error without its traceback)."""
    return one_line(user_message(said))


def usage(config_name: str) -> str:
    """The leading comment block of ``conf/<config_name>.yaml``: what the command does and its synopsis."""
    lines = []
    for line in (config_dir() / f"{config_name}.yaml").read_text().splitlines():
        if not line.startswith("#"):
            break
        if line.startswith("# @package"):  # Hydra's header of a command in a folder (conf/bench/<part>.yaml)
            continue
        lines.append(line.lstrip("#").removeprefix(" "))
    return "\n".join(lines)


def help_text(config_name: str, cfg: DictConfig, groups: Sequence[str]) -> str:
    """``--help``: usage, each config group with its options, and every key with its default."""
    text = [usage(config_name), ""]
    if groups:
        text.append("Config groups (group=option):")
        for group in groups:
            options = sorted(path.stem for path in (config_dir() / group).glob("*.yaml"))
            text.append(f"  {group}: {', '.join(options)}")
        text.append("")
    text += ["Keys (key=value; lists as [a,b]; ??? = required):", OmegaConf.to_yaml(cfg).rstrip()]
    return "\n".join(text)


def compose_command(config_name: str, overrides: Sequence[str], keep_hydra: bool = False) -> DictConfig:
    """``conf/<config_name>.yaml`` with Hydra ``overrides``; ``${hydra:...}`` and ``${repo_root:}``
    resolve as in a Hydra run (``keep_hydra``: with the ``hydra`` node). Overrides that cannot be parsed are
    a ValueError with a hint to quote them; unknown keys and bad values raise Hydra / OmegaConf errors."""
    register_resolvers()
    parse_overrides(config_name, overrides)
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        cfg = compose(config_name, overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    if not keep_hydra:
        with open_dict(cfg):
            del cfg["hydra"]
    return cfg


def defaults_config(config_name: str, overrides: Sequence[str]) -> DictConfig:
    """``conf/<config_name>.yaml`` with the config-group choices among ``overrides`` (``model=vit``,
    ``+experiment=...``) and none of their values: what gives each key its type (``config.check_values``)."""
    choices = [override for override in overrides if is_group_choice(override)]
    if GlobalHydra.instance().is_initialized():  # inside a Hydra application
        return compose(config_name, overrides=choices)
    with initialize_config_dir(str(config_dir()), version_base="1.3"):
        return compose(config_name, overrides=choices)


def is_group_choice(override: str) -> bool:
    """``override`` picks an option of a config group (``data=camvid``, ``hydra/launcher=...``) rather than
    setting a key (``data.root=...``) or deleting one (``~key``)."""
    key = override.lstrip("+").partition("=")[0].partition("@")[0]
    if key.startswith("~"):
        return False
    return "/" in key or ("." not in key and (config_dir() / key).is_dir())


def parse_overrides(config_name: str, overrides: Sequence[str]) -> None:
    """Parse each override as Hydra will. A key the command no longer reads is a ValueError naming the key
    that replaced it (``config.check_renamed``); one Hydra cannot read is a ValueError naming it, with the
    quoting that reads it: the shell splits an unquoted value at its spaces, and Hydra reads non-ASCII
    letters and brackets in a path only between quotes."""
    check_renamed(config_name, overrides)
    parser = OverridesParser.create()
    for index, override in enumerate(overrides):
        try:
            parser.parse_overrides([override])
        except OverrideParseException:
            previous = overrides[index - 1] if index else ""
            key, sep, value = override.partition("=")
            if not sep and "=" in previous:  # 'data.root=/my big data' arrived as 'data.root=/my', 'big', ...
                key, _, value = previous.partition("=")
                pieces = list(itertools.takewhile(lambda piece: "=" not in piece, overrides[index:]))
                raise ValueError(
                    f"{override!r} is not key=value: the shell split the value of {key} at a space; quote "
                    f"the whole override: '{key}=\"{' '.join([value, *pieces])}\"'"
                ) from None
            if not sep:
                raise ValueError(f"{override!r} is not key=value (e.g. data.root=/data/camvid)") from None
            raise ValueError(
                f"{override}: Hydra cannot read this value unquoted (non-ASCII letters, spaces, brackets); "
                f"quote it: '{key}=\"{value}\"'"
            ) from None


def check_command_line(config_name: str, argv: Sequence[str]) -> Path | None:
    """What Hydra itself would fail on, or create in the wrong place, before it makes the run dir: an
    override it cannot parse or apply, a ``run_name`` that is not one folder name, a run dir or
    ``paths.log_dir`` that cannot be created. Returns the run dir's nearest folder that exists now, the run
    dir itself where it does (a refused run removes the folders below it). Sweeps (``-m``) and Hydra's own
    flags are left to Hydra (None)."""
    args = hydra_arguments().parse_args(list(argv))
    parse_overrides(config_name, args.overrides)
    hydra_flags = (
        args.help,
        args.hydra_help,
        args.version,
        args.cfg,
        args.info,
        args.shell_completion,
        args.multirun,
    )
    config_flags = (args.config_path, args.config_name, args.config_dir, args.experimental_rerun)
    if any(hydra_flags) or any(flag is not None for flag in config_flags):
        return None
    cfg = compose_command(config_name, args.overrides, keep_hydra=True)
    if "run_name" in cfg:
        check_run_name(cfg.run_name)
    run_dir, log_dir = Path(str(cfg.hydra.run.dir)).absolute(), Path(str(cfg.paths.log_dir)).absolute()
    if log_dir in run_dir.parents:
        check_writable_dir("paths.log_dir", log_dir)
    check_writable_dir("hydra.run.dir", run_dir)
    return next(folder for folder in (run_dir, *run_dir.parents) if folder.exists())


def hydra_arguments() -> argparse.ArgumentParser:
    """The command line ``@hydra.main`` reads (Hydra 1.3's flags, public as its ``--help`` documents them),
    parsed here to tell a run from Hydra's own actions without importing Hydra's private parser."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("overrides", nargs="*")
    for flags in (["--help", "-h"], ["--hydra-help"], ["--resolve"], ["--run", "-r"], ["--multirun", "-m"]):
        parser.add_argument(*flags, action="store_true")
    parser.add_argument("--shell-completion", "-sc", action="store_true")
    parser.add_argument("--version", action="store_true")
    parser.add_argument("--cfg", "-c", choices=["job", "hydra", "all"])
    parser.add_argument("--info", "-i", nargs="?", const="all")
    for flags in (["--package", "-p"], ["--config-path", "-cp"], ["--config-name", "-cn"]):
        parser.add_argument(*flags)
    parser.add_argument("--config-dir", "-cd")
    parser.add_argument("--experimental-rerun")
    return parser


def run_command(
    name: str,
    config_name: str,
    run: Callable[[DictConfig], int],
    argv: Sequence[str] | None = None,
    groups: Sequence[str] = (),
) -> int:
    """Compose, print ``--help`` or check the values (``config.check_values``), then ``run(cfg)``; returns
    the exit status. The command's error boundary: a bad override, a missing required key or a bad value is
    one line on stderr and status 2; a refusal while it runs (``refusal``) one line and status 1 (or the
    error's own ``status``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    wants_help = any(arg in ("--help", "-h") for arg in argv)
    overrides = [arg for arg in argv if arg not in ("--help", "-h")]
    try:
        cfg = compose_command(config_name, overrides)
        if wants_help:
            print(help_text(config_name, cfg, groups))
            return 0
        check_values(cfg, config_name, defaults_config(config_name, overrides))
    except Exception as error:
        told(name, error)
        return EXIT_CONFIG
    out = OutputFolder(cfg.get("out"))
    status = EXIT_FAILED
    try:
        status = run(cfg)
        return status
    except Exception as error:
        return told(name, error).status
    finally:
        if status != 0:
            out.remove_new_empty_folders()


class OutputFolder:
    """The ``out=`` folder of a command (export, predict), as it was before the command ran: a command that
    fails removes the folders it created there while they are empty (``out/masks`` after a full disk, ``out``
    itself), so nothing but finished files is left; folders that existed before are kept."""

    def __init__(self, out: Any) -> None:
        self.out = None if out is None else Path(str(out)).absolute()
        self.before: set[Path] = set()
        if self.out is not None:
            self.keep = next(folder for folder in (self.out, *self.out.parents) if folder.exists())
            if self.out.is_dir():
                self.before = {Path(root) for root, _, _ in os.walk(self.out)}

    def remove_new_empty_folders(self) -> None:
        if self.out is None or not self.out.is_dir():
            return
        for root, _, _ in sorted(os.walk(self.out), key=lambda entry: -len(Path(entry[0]).parts)):
            folder = Path(root)
            if folder not in self.before and folder != self.out and not any(folder.iterdir()):
                folder.rmdir()
        if self.out not in self.before:
            remove_empty_run_dir(self.out, self.keep)


def hydra_app(config_name: str, run: Callable[[DictConfig, DictConfig], Any]) -> Callable[[], Any]:
    """A Hydra application (run dir, sweeps, Hydra's ``--help``) around ``run``, with one rule at its
    boundary: a refused command leaves nothing behind.

    Before Hydra makes the run dir, ``check_command_line`` refuses what Hydra would fail on or put in the
    wrong place. ``run(cfg, defaults)`` checks the values first, once (``config.check_values``, its keys
    typed by ``defaults``: ``defaults_config``), as a test calling it directly does. Inside the job,
    log-file records are held in memory (``runlog``) until the run commits, once every check has passed.
    Errors a user can fix (``refusal``: bad values, missing files, bad data, a full disk, a run dir another
    run holds) and Ctrl-C are one line on stderr and status 1 (Ctrl-C: 130); the run dir is then left as
    ``leave_refused_run`` says. An error from a DataLoader worker prints the worker's message, its
    traceback goes to the log; ``HYDRA_FULL_ERROR=1`` shows the traceback instead.
    ``NothingToDo`` prints its line, status 0."""

    existed: dict[str, Path | None] = {"folder": None}  # the run dir's nearest folder before the command

    def leave_refused_run(cfg: DictConfig, line: str) -> None:
        """A run dir is kept only where there is something to keep: a run that trained, or a run dir that
        was there before the command (a resumed run; under ``-m`` it is not known, so kept), and the log of
        a run that committed then ends with ``line``. Otherwise the held records are dropped and the run dir
        goes, with the parents it made under ``paths.log_dir``; everything in it is this run's, written
        since the commit."""
        run_dir, before = Path(cfg.paths.output_dir).absolute(), existed["folder"]
        if runlog.RunState.committed and (runlog.RunState.trained or before in (None, run_dir)):
            runlog.end_with(line)
            return
        runlog.discard()
        if runlog.RunState.committed:
            shutil.rmtree(run_dir, ignore_errors=True)
        remove_empty_run_dir(run_dir, before or Path(cfg.paths.log_dir).absolute())

    @hydra.main(config_path=str(config_dir()), config_name=config_name, version_base="1.3")
    def main(cfg: DictConfig) -> Any:
        name = Path(sys.argv[0]).name
        runlog.hold()
        try:
            result = run(cfg, defaults_config(config_name, HydraConfig.get().overrides.task))
        except NothingToDo as done:
            leave_refused_run(cfg, f"{name}: {done}")
            print(f"{name}: {done}")
            return None
        except KeyboardInterrupt:
            leave_refused_run(cfg, f"{name}: interrupted (Ctrl-C)")
            print(f"{name}: interrupted (Ctrl-C)", file=sys.stderr)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as error:
            said = refusal(error)
            if said is None:
                runlog.commit()  # a crash keeps its log
                raise
            line = f"{name}: {said_line(said)}"
            leave_refused_run(cfg, line)
            if full_error():
                raise
            print(line, file=sys.stderr)
            sys.exit(EXIT_FAILED)
        except BaseException:
            runlog.commit()  # a crash or a signal keeps its log
            raise
        runlog.commit()
        return result

    def app() -> Any:
        try:
            existed["folder"] = check_command_line(config_name, sys.argv[1:])
        except Exception as error:
            told(Path(sys.argv[0]).name, error)
            sys.exit(EXIT_FAILED)
        return main()

    register_resolvers()
    return app


def remove_empty_run_dir(run_dir: Path, keep: Path) -> None:
    """Remove ``run_dir`` and its parents below ``keep`` (the log dir, or the run dir's nearest folder that
    existed before the command) while they are empty."""
    for folder in (run_dir, *run_dir.parents):
        if folder == keep or keep not in folder.parents or (folder.is_dir() and any(folder.iterdir())):
            return
        if folder.is_dir():
            folder.rmdir()


def train_run(cfg: DictConfig, defaults: DictConfig) -> float | None:
    """Train; the best val mIoU is the value a Hydra sweeper optimises."""
    from .training.run import run

    return run(cfg, defaults)["best_mIoU"]


def eval_run(cfg: DictConfig, defaults: DictConfig) -> float | None:
    """Evaluate; the mIoU is the value a Hydra sweeper optimises."""
    from .evaluation.command import run

    return run(cfg, defaults)["summary"]["mIoU"]


train = hydra_app("train", train_run)  # train.py, segattn-train
evaluate = hydra_app("eval", eval_run)  # eval.py, segattn-eval
