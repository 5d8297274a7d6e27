"""The run's log file (``<run dir>/train.log``) is written only once the run commits to its directory.

Hydra makes the run directory and opens logging before the command's checks run, and a check that fails
after the first log record (the seed line, a resumed checkpoint's name) used to leave an 82-byte
train.log behind, or append to the train.log of a run directory that was being resumed. The command
boundary (``segattn.cli``) holds the records meant for log files in memory (``hold``); the run writes them
out and logs to the files directly from the moment every check has passed (``commit``), and a refused
command drops them (``discard``), so its run directory is empty and is removed again. Records still go to
stdout as they happen. A run refused after the commit keeps its directory only where there is something to
keep (it trained, ``mark_trained``, or the directory was there before); its train.log then ends with the
line the console shows (``end_with``).
"""

from __future__ import annotations

import contextlib
import logging


class HeldRecords(logging.Handler):
    """Stands in for a file handler until the run commits: keeps its records, writes nothing."""

    def __init__(self, target: logging.FileHandler) -> None:
        super().__init__(target.level)
        self.target = target
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class RunState:
    """What the boundary needs to know of the run in this process: whether it committed to its directory
    and whether it trained (took an optimizer step), which makes its log worth keeping."""

    committed = False
    trained = False


def hold() -> None:
    """Replace each file handler of the root logger by one that keeps its records in memory."""
    RunState.committed = RunState.trained = False
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, logging.FileHandler):
            root.removeHandler(handler)
            root.addHandler(HeldRecords(handler))


def commit() -> None:
    """The run owns its directory: write the held records to their files and log to them directly."""
    RunState.committed = True
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, HeldRecords):
            root.removeHandler(handler)
            for record in handler.records:
                handler.target.handle(record)
            root.addHandler(handler.target)


def discard() -> None:
    """The command was refused and its run dir goes: drop the held records and close the log files (those
    written since the commit are removed with the run dir)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, HeldRecords | logging.FileHandler):
            root.removeHandler(handler)
            (handler.target if isinstance(handler, HeldRecords) else handler).close()


def mark_trained() -> None:
    """The run took an optimizer step: its run dir and log are kept whatever ends it."""
    RunState.trained = True


def end_with(line: str) -> None:
    """Write ``line`` (what the console shows for a refusal) as the last record of the log files; a log file
    that cannot be written to (a full disk) is left as it is."""
    record = logging.LogRecord("segattn", logging.ERROR, __file__, 0, line, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            with contextlib.suppress(OSError):
                handler.flush()
                with open(handler.baseFilename, "a") as log_file:
                    log_file.write(handler.format(record) + "\n")


def to_files(logger: logging.Logger, message: str) -> None:
    """Log ``message`` at INFO through ``logger`` to the log files alone (held or open), not the console."""
    record = logger.makeRecord(logger.name, logging.INFO, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, HeldRecords | logging.FileHandler):
            handler.handle(record)
