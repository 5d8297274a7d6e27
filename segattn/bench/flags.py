"""Checked values for the bench command's flags, as the Hydra commands check their keys: argparse calls
these ``type=`` functions while it parses, so a bad value is one line on stderr and status 2 before any
output folder exists (``--sizes abc``, ``--budget-gib -1``, ``--variants nosuch``,
``--models pvt:size=b9``)."""

from __future__ import annotations

import argparse
from typing import NoReturn

from .specs import Spec, parse_count, parse_image_size, parse_spec


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``<prog>: argument --x: why``) without the usage block
    (``--help`` still shows it). Subcommand parsers take the same class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}; see {self.prog} --help\n")


def positive_int(text: str) -> int:
    """An integer >= 1: counts, sizes in pixels, threads."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 1")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0: seeds, warm-up calls."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 0")
    return value


def positive_float(text: str) -> float:
    """A number > 0: seconds, GiB."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number > 0")
    return value


def count(text: str) -> str:
    """A token count as ``4096``, ``4k`` or ``1m`` (kept as text: the op presets are text too)."""
    try:
        parse_count(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def image_size(text: str) -> str:
    """An image size: a side (``2048``) or ``WIDTHxHEIGHT`` (``4288x2848``); kept as text."""
    try:
        parse_image_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def variant(text: str) -> str:
    """An attention spec whose name is a registered variant (``flatten``, ``linear:feature_map=relu``)."""
    from ..attention import attention_class

    try:
        attention_class(parse_spec(text).name)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def kernel(text: str) -> str:
    """A SEGATTN_KERNEL value (``auto``, ``torch``, ``triton``), or ``triton:BxWxP`` with a launch tuning."""
    from ..attention.triton.launch import Tuning

    backend, _, tuning = text.partition(":")
    if backend not in ("auto", "torch", "triton") or (tuning and backend != "triton"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected auto, torch, triton or triton:BxWxP")
    if tuning:
        try:
            Tuning.parse(tuning)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    return text


def kernel_path(text: str) -> str:
    """A SEGATTN_KERNEL value a whole model is built under: ``auto``, ``torch`` or ``triton``."""
    if text not in ("auto", "torch", "triton"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected auto, torch or triton (SEGATTN_KERNEL)")
    return text


def model(text: str) -> str:
    """A model spec that builds: the family, its named size and its options are checked by building the
    model on the meta device (no memory, no weights), with the errors ``build_model`` gives train.py."""
    import torch

    from ..models import build_model

    try:
        spec: Spec = parse_spec(text)
        with torch.device("meta"):
            build_model(spec.name, num_classes=2, attention="linear", **spec.options)
    except (ValueError, TypeError) as error:
        raise argparse.ArgumentTypeError(f"{text}: {error}") from None
    return text
