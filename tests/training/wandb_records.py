"""Read an offline W&B run file (run-<id>.wandb) without the W&B service, for the tests.

The file is a LevelDB-style log: a 7-byte header (":W&B", magic 0xBEE1, version 0), then 32 KiB blocks
of chunks, each with a 7-byte header (crc32 u32, length u16, type u8: 1 full, 2 first, 3 middle,
4 last); a block tail shorter than a chunk header is padding. Each reassembled record is a protobuf
``Record`` from wandb.proto.wandb_internal_pb2.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path) -> list[wandb_internal_pb2.Record]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    records, pending, offset = [], b"", HEADER
    while offset + HEADER <= len(data):
        if BLOCK - offset % BLOCK < HEADER:  # padding at the end of a block
            offset += BLOCK - offset % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[offset : offset + HEADER])
        chunk = data[offset + HEADER : offset + HEADER + length]
        if len(chunk) < length:  # a chunk the writer has not finished yet
            break
        offset += HEADER + length
        if kind in (FULL, FIRST):
            pending = chunk
        elif kind in (MIDDLE, LAST):
            pending += chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wait_for_record(path: Path, record_type: str, timeout: float = 60.0) -> list[wandb_internal_pb2.Record]:
    """All records once one of ``record_type`` is in the file. wandb-core writes the file from its own
    process and may flush the last records after ``wandb.finish`` has returned in this one."""
    deadline = time.monotonic() + timeout
    while True:
        records = read_records(path)
        if any(record.WhichOneof("record_type") == record_type for record in records):
            return records
        if time.monotonic() > deadline:
            raise AssertionError(f"no {record_type!r} record in {path} after {timeout:.0f} s")
        time.sleep(0.2)


def history(path: Path) -> list[dict]:
    """Every logged step as {key: value} with JSON-decoded values."""
    rows = []
    for record in read_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    ".".join(item.nested_key) or item.key: json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


def config(path: Path) -> dict:
    """The run config as {top-level key: value} (JSON-decoded)."""
    return updates(path, "config")


def summary(path: Path) -> dict:
    """The run summary as W&B shows it at the end: every summary update applied in order (JSON-decoded)."""
    return updates(path, "summary")


def updates(path: Path, record_type: str) -> dict:
    """Every ``config`` or ``summary`` record's updates applied in order, JSON-decoded."""
    values = {}
    for record in read_records(path):
        if record.WhichOneof("record_type") == record_type:
            for item in getattr(record, record_type).update:
                values[item.key or ".".join(item.nested_key)] = json.loads(item.value_json)
    return values


def artifacts(path: Path) -> dict[str, tuple[str, list[str]]]:
    """The logged artifacts as {name: (type, [file paths in it])}."""
    found = {}
    for record in read_records(path):
        if record.WhichOneof("record_type") == "artifact":
            artifact = record.artifact
            found[artifact.name] = (artifact.type, [entry.path for entry in artifact.manifest.contents])
    return found
