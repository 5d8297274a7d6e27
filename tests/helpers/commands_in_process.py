"""The user-facing commands run in-process by the tests of their refusals (tests/cli/): one function that
returns a command's exit status as the shell would see it.

A plain module in tests/helpers/ (on sys.path through pyproject.toml's ``pythonpath``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from segattn import cli
from segattn.export import main as export_main
from segattn.predict import main as predict_main

HYDRA_APPS = {"train.py": cli.train, "eval.py": cli.evaluate}
IN_PROCESS = {"segattn.export": export_main, "segattn.predict": predict_main}


def run_command(command: str, argv: list[str], logs: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """Exit status of ``command argv`` run in-process, train.py and eval.py logging under ``logs``."""
    if command in IN_PROCESS:
        return IN_PROCESS[command](argv)
    monkeypatch.setattr(sys, "argv", [command, f"paths.log_dir={logs}", "hydra/job_logging=none", *argv])
    with pytest.raises(SystemExit) as ended:
        HYDRA_APPS[command]()
    return ended.value.code
