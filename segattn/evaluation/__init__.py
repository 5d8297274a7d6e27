"""Evaluation: score a trained or exported model on a dataset split (``python eval.py``)."""

from .command import run

__all__ = ["run"]
