"""Every command that the getting-started, inference, export/predict and models pages show is checked as the
command itself checks it before it runs, without running the job: a documented command with a renamed or
misspelt key, an unknown group option or make target fails here, in seconds.

Which text is a command (``commands``): each line of a fenced shell block (```bash, ```sh, ```shell,
```console or unlabelled; in a console block only the ``$ `` lines), with ``\\`` continuations joined, the
``$ `` prompt and ``# comments`` dropped; and each inline code span that starts (after ``VAR=value``
prefixes) with ``python <script or -m module>`` or ``make <target>``.

How each is checked (``check``), in a temporary folder that is the working directory, where relative paths
resolve:

- ``VAR=value`` prefixes (``OMP_NUM_THREADS=1``) are set in the environment while it is checked.
- A value holding a ``<placeholder>`` (``checkpoint=<ckpt>``, ``init_from=outputs/runs/<run>/...``) becomes,
  whole, the path of an empty file in that folder, named as the value's last part without the brackets:
  the checks name files, they never read them.
- ``--help`` or ``-h``: the command runs in-process as ``python`` runs it (``runpy``) and must exit with 0.
- ``python train.py|eval.py ...`` and ``python -m segattn.<command> ...``, the commands that the first line
  of each ``conf/<name>.yaml`` names: what the command checks before it does anything. train.py and eval.py
  (Hydra applications) first ``cli.check_command_line``; then every one ``cli.compose_command`` with the
  overrides and ``config.check_values``. Data folders are not checked: CI has no datasets.
- ``python -m segattn.bench <part> ...``: as the Hydra commands, ``conf/bench/<part>.yaml`` composed with the
  overrides and ``config.check_values``.
- ``make <target> [VAR=value ...]``: ``make -n`` prints the recipe without running it; the target must exist,
  each VAR must be read by the Makefile, and each python command of the recipe is checked as above, so
  ``make train ARGS="..."`` checks train.py's overrides. A recipe line that carries a value given on the make
  command line must be a form checked here or in ``UNCHECKED``; the recipe's other lines are the Makefile's
  own steps, which CI runs.
- ``UNCHECKED``: the forms known here and not checked, each with the reason; any other program fails.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from segattn.bench.__main__ import PARTS as BENCH_PARTS
from segattn.cli import check_command_line, compose_command, hydra_arguments, refusal
from segattn.config import check_values, config_dir
from segattn.errors import ConfigError, one_line

REPO = Path(__file__).resolve().parents[2]
PAGES = ("getting-started.md", "inference.md", "export-predict.md", "models.md")
SHELL_LABELS = ("", "bash", "sh", "shell", "console")
PYTHON = re.compile(r"(\S*/)?python(3[.\d]*)?")  # python, python3.11, .venv/bin/python
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")
PLACEHOLDER = re.compile(r"<[^<>\s]+>")
HELP = ("--help", "-h")
BENCH = "segattn.bench"
# Forms known here and not checked, with the reason: a documented one is skipped, saying it.
UNCHECKED = {
    "pytest": "pytest's own arguments (paths, -k, -m): checking them collects the whole suite, and CI runs "
    "`make test` itself",
}
# make's own settings that a make running this test (`make test`) hands down: they would reach `make -n`.
# So would its command-line variables (`make test ARGS=...` exports ARGS): `check_make` drops every
# variable the Makefile reads, too.
MAKE_ENVIRONMENT = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")


def config_commands() -> dict[str, str]:
    """The program that each ``conf/<name>.yaml`` says it configures on its first line, ``# python train.py
    ...`` or ``# python -m segattn.export ...``, with the name: {"train.py": "train", "segattn.export":
    "export", ...}."""
    commands = {}
    for path in sorted(config_dir().glob("*.yaml")):
        words = path.read_text().splitlines()[0].removeprefix("#").split()
        commands[words[2] if words[1] == "-m" else words[1]] = path.stem
    return commands


CONFIGURED = config_commands()


def split_program(words: list[str]) -> tuple[dict[str, str], str, list[str]]:
    """(environment prefixes, program, its arguments) of a command's words; the program of ``python X.py``
    is ``X.py``, of ``python -m module`` the module, else the first word (``make``)."""
    count = next((i for i, word in enumerate(words) if not ASSIGNMENT.fullmatch(word)), len(words))
    env, rest = dict(word.split("=", 1) for word in words[:count]), words[count:]
    if len(rest) >= 2 and PYTHON.fullmatch(rest[0]):
        if rest[1] == "-m" and len(rest) >= 3:
            return env, rest[2], rest[3:]
        return env, rest[1], rest[2:]
    return env, (rest[0] if rest else ""), rest[1:]


def is_command(text: str) -> bool:
    """Whether an inline code span is a command: ``python <script or -m module>`` or ``make <target>``."""
    try:
        words = [word for word in shlex.split(text) if not ASSIGNMENT.fullmatch(word)]
    except ValueError:  # unbalanced quotes: prose, not a command
        return False
    return len(words) >= 2 and (PYTHON.fullmatch(words[0]) is not None or words[0] == "make")


def fenced_commands(label: str, lines: list[str]) -> list[tuple[int, str]]:
    """(offset of the first line, command) for each command of a fenced shell block's ``lines``."""
    found, pending, start = [], "", 0
    for offset, line in enumerate(lines):
        if not pending:
            start = offset
            if label == "console":
                if not line.startswith("$ "):
                    continue  # the output a console block shows
                line = line[2:]
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        text = shlex.join(shlex.split(pending + line, comments=True))
        pending = ""
        if text:
            found.append((start, text))
    return found


def commands(markdown: str) -> list[tuple[int, str]]:
    """(line number, command) for every command of a page, fenced ones first (``__doc__``: which text)."""
    found, prose, lines = [], [], markdown.splitlines()
    index = 0
    while index < len(lines):
        fence = re.match(r"\s*```(\w*)", lines[index])
        if fence is None:
            prose.append(lines[index])
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
        if fence[1] in SHELL_LABELS:
            found += [
                (index + 2 + offset, text)
                for offset, text in fenced_commands(fence[1], lines[index + 1 : end])
            ]
        prose += [""] * (end + 1 - index)  # keeps the line numbers of the prose
        index = end + 1
    text = "\n".join(prose)
    for span in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
        if is_command(span[1].replace("\n", " ")):
            found.append((text.count("\n", 0, span.start()) + 1, " ".join(span[1].split())))
    return found


def documented() -> list[Any]:
    """Every command of ``PAGES`` as a test case named by its page and line."""
    return [
        pytest.param(command, id=f"{page}:{line}")
        for page in PAGES
        for line, command in commands((REPO / "docs" / page).read_text())
    ]


def filled(word: str, folder: Path) -> str:
    """``word`` with a value holding a ``<placeholder>`` replaced, whole, by an empty file in ``folder``."""
    key, sep, value = word.rpartition("=") if "=" in word else ("", "", word)
    if not PLACEHOLDER.search(value):
        return word
    path = folder / PLACEHOLDER.sub(lambda m: m[0][1:-1], Path(value).name)
    path.touch()
    return f"{key}{sep}{path}"


def check(command: str, folder: Path, monkeypatch: pytest.MonkeyPatch, in_recipe: bool = False) -> None:
    """Check one command as ``__doc__`` says; a refusal raises as the command raises it (a ConfigError for
    this test's own: an unknown program, make target or variable)."""
    env, program, args = split_program(shlex.split(command))
    args = [filled(word, folder) for word in args]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    if program in UNCHECKED:
        if not in_recipe:
            pytest.skip(f"{program}: {UNCHECKED[program]}")
    elif program == "make":
        check_make(args, folder, monkeypatch)
    elif any(arg in HELP for arg in args):
        check_help(program, args, monkeypatch)
    elif program == BENCH:
        check_bench(args)
    elif program in CONFIGURED:
        name = CONFIGURED[program]
        if program.endswith(".py"):  # a Hydra application (cli.hydra_app)
            check_command_line(name, args)
            args = hydra_arguments().parse_args(args).overrides
        check_values(compose_command(name, args), name)
    else:
        raise ConfigError(f"{command}: no check for {program!r}; add one, or list it in UNCHECKED with why")


def check_help(program: str, args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``program args`` with --help, run in-process as python runs it; any exit status but 0 is refused."""
    if program not in CONFIGURED and program != BENCH:
        raise ConfigError(f"{program} {' '.join(args)}: not a segattn command")
    monkeypatch.setattr(sys, "argv", [program, *args])
    status = 0
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is imported here already
        try:
            if program.endswith(".py"):
                runpy.run_path(str(REPO / program), run_name="__main__")
            else:
                runpy.run_module(program, run_name="__main__", alter_sys=True)
        except SystemExit as ended:
            status = ended.code or 0
    if status:
        raise ConfigError(f"{program} {' '.join(args)}: exit status {status}")


def check_bench(args: list[str]) -> None:
    """The part's config composed with the overrides and its value checks."""
    part = args[0] if args else ""
    if part not in BENCH_PARTS:
        raise ConfigError(f"{BENCH} {part!r}: expected one of {', '.join(BENCH_PARTS)}")
    cfg = compose_command(f"bench/{part}", args[1:])
    check_values(cfg, f"bench/{part}")


def check_make(args: list[str], folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``make args``: the Makefile reads each VAR given, ``make -n`` knows the target, and each command of
    the recipe that carries a given value or runs python is checked."""
    makefile = (REPO / "Makefile").read_text()
    given = dict(arg.split("=", 1) for arg in args if "=" in arg)
    for name in given:
        if f"$({name})" not in makefile:
            raise ConfigError(f"make {' '.join(args)}: the Makefile reads no variable {name}")
    read = set(re.findall(r"\$\((\w+)\)", makefile))
    env = {key: value for key, value in os.environ.items() if key not in (*MAKE_ENVIRONMENT, *read)}
    printed = subprocess.run(
        ["make", "-n", "--no-print-directory", *args], cwd=REPO, env=env, capture_output=True, text=True
    )
    if printed.returncode:
        raise ConfigError(f"make {' '.join(args)}: {one_line(printed.stderr)}")
    for line in printed.stdout.splitlines():
        _, program, _ = split_program(shlex.split(line))
        carried = any(value and value in line for value in given.values())
        if carried or program in CONFIGURED or program == BENCH:
            check(line, folder, monkeypatch, in_recipe=True)


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory of the checks: relative paths and placeholder files go here."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("command", documented())
def test_documented_command_parses(command, folder, monkeypatch):
    check(command, folder, monkeypatch)


def test_every_page_shows_commands():
    """A page whose blocks stop being read (a new fence label, a changed layout) would pass with nothing."""
    for page in PAGES:
        assert commands((REPO / "docs" / page).read_text()), page


PAGE = """Text with `make train ARGS="attention=flatten
model=pvt"` across a line, `OMP_NUM_THREADS=1` and `python` (no commands).

```bash
make setup    # a comment
OMP_NUM_THREADS=1 python -m segattn.predict checkpoint=<ckpt> input="photos/*.jpg" \\
    out=pred inference.mode=slide inference.crop=512
```

```python
model = segattn.open_model("x")  # not shell
```

```console
$ python train.py --help
usage: the output, not a command
```
"""


def test_commands_are_read_as_the_shell_reads_them():
    assert commands(PAGE) == [
        (5, "make setup"),
        (
            6,
            "OMP_NUM_THREADS=1 python -m segattn.predict 'checkpoint=<ckpt>' 'input=photos/*.jpg' out=pred "
            "inference.mode=slide inference.crop=512",
        ),
        (15, "python train.py --help"),
        (1, 'make train ARGS="attention=flatten model=pvt"'),
    ]


@pytest.mark.parametrize(
    "command",
    [
        "python train.py --help",
        "python eval.py --help",
        "python -m segattn.export --help",
        "python -m segattn.bench --help",
        "python -m segattn.bench op grid=smoke variants=[flatten]",
        "python -m segattn.bench traffic model=vit attention=flatten size=1024 loss.chunk_rows=256",
        "python train.py -m experiment=accuracy_smoke",
        "SEGATTN_KERNEL=torch python -m segattn.doctor data=camvid data.root=/nowhere",
    ],
)
def test_forms_no_page_shows_yet_are_checked(command, folder, monkeypatch):
    check(command, folder, monkeypatch)


@pytest.mark.parametrize(
    ("command", "named"),
    [
        ("python train.py data.crop=512", "'data.crop'"),  # data.crop_size
        (".venv/bin/python train.py model=vit attention=tayl0r", "tayl0r"),
        ("python eval.py checkpoint=<ckpt> validation.flip=true", "inference.flip"),  # renamed
        ("python eval.py checkpoint=<ckpt> inference.flip=yes", "inference.flip"),
        ("python -m segattn.predict checkpoint=<ckpt> input=photos/ out=pred inference.mode=slide", "crop"),
        ("python -m segattn.export checkpoint=<ckpt> format=onxx out=exported", "format"),
        ("python -m segattn.export checkpoint=<ckpt> out=exported", "format"),  # required
        ('make train ARGS="data.crop=512"', "'data.crop'"),
        ("make tset", "tset"),
        ("make test ARG=-x", "ARG"),
        ("python -m segattn.bench op sizez=[1k]", "sizez"),
        ("python -m segattn.bench traffic precision=fp8", "precision"),
        ("python train.py -m experiment=accuracy_smoke data.crop=512", "'data.crop'"),
        ("python -m segattn.exprot --help", "segattn.exprot"),
        ("python predict.py checkpoint=<ckpt>", "predict.py"),
        ("SEGATTN_KERNEL=cuda python train.py", "SEGATTN_KERNEL"),
    ],
)
def test_a_broken_command_fails_naming_what_is_wrong(command, named, folder, monkeypatch):
    with pytest.raises(Exception) as refused:
        check(command, folder, monkeypatch)
    assert refusal(refused.value) is not None, refused.value  # a refusal, not a bug of this test
    assert named in str(refused.value)


def test_a_page_with_a_misspelt_key_fails(folder, monkeypatch):
    """The whole path, from a page's text to the refusal."""
    page = "```bash\npython train.py \\\n    data.crop=512  # was data.crop_size\n```\n"
    [(line, command)] = commands(page)
    assert line == 2
    with pytest.raises(Exception, match=r"'data\.crop'"):
        check(command, folder, monkeypatch)
