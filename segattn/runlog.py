"""The run's log file (``<run dir>/train.log``) is written only once the run commits to its directory.

Hydra makes the run directory and opens logging before the command's checks run, and a check that fails
after the first log record (the seed line, a resumed checkpoint's name) used to leave an 82-byte
train.log behind, or append to the train.log of a run directory that was being resumed. The command
boundary (``segattn.cli``) holds the records meant for log files in memory (``hold``); the run writes them
out and logs to the files directly from the moment every check has passed (``commit``), and a refused
command drops them (``discard``), so its run directory is empty and is removed again. Records still go to
stdout as they happen.
"""

from __future__ import annotations

import logging


class HeldRecords(logging.Handler):
    """Stands in for a file handler until the run commits: keeps its records, writes nothing."""

    def __init__(self, target: logging.FileHandler) -> None:
        super().__init__(target.level)
        self.target = target
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def hold() -> None:
    """Replace each file handler of the root logger by one that keeps its records in memory."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler):
            root.removeHandler(handler)
            root.addHandler(HeldRecords(handler))


def _release(write: bool) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, HeldRecords):
            root.removeHandler(handler)
            if write:
                for record in handler.records:
                    handler.target.handle(record)
                root.addHandler(handler.target)
            else:
                handler.target.close()


def commit() -> None:
    """The run owns its directory: write the held records to their files and log to them directly."""
    _release(write=True)


def discard() -> None:
    """The command was refused: drop the held records; no log file is created."""
    _release(write=False)
