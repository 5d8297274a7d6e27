"""The run's log file (``<run dir>/train.log``), written only once the run commits to its directory.

Hydra makes the run directory and opens logging before the command's checks run, so a check failing after the
first record (the seed line, a resumed checkpoint's name) would leave a train.log behind, or append to a
resumed run's. The command boundary (``segattn.cli``) therefore holds file records in memory (``hold``): a
refused command drops them (``discard``) and its empty run directory is removed; once every check has passed
the run writes them out and logs to the files directly (``commit``). Records reach stdout as they happen. A
run refused after the commit keeps its directory only where there is something to keep (it trained,
``mark_trained``, or the directory was there before); its train.log then ends with the console's line
(``end_with``).
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
    """This process's run as the boundary sees it: committed to its directory; trained (took an optimizer
    step, which makes its log worth keeping)."""

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
    """Write the held records to their files and log to them directly: the run owns its directory."""
    RunState.committed = True
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, HeldRecords):
            root.removeHandler(handler)
            for record in handler.records:
                handler.target.handle(record)
            root.addHandler(handler.target)


def discard() -> None:
    """Drop the held records and close the log files of a refused command, whose run dir goes (with any file
    written since the commit)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, HeldRecords | logging.FileHandler):
            root.removeHandler(handler)
            (handler.target if isinstance(handler, HeldRecords) else handler).close()


def mark_trained() -> None:
    """Record that the run took an optimizer step: its run dir and log are kept whatever ends it."""
    RunState.trained = True


def end_with(line: str) -> None:
    """Write ``line`` (the console's refusal line) as the last record of the log files; one that cannot be
    written (a full disk) is left as it is."""
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
