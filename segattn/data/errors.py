"""The one exception bad data raises, so callers (the doctor, ``validate``) can collect instead of crash."""

from __future__ import annotations

from pathlib import Path


class DataError(ValueError):
    """A dataset file or folder is unusable; the message names it and says what was expected."""

    def __init__(self, message: str, path: str | Path | None = None):
        super().__init__(message)
        self.path = None if path is None else str(path)
