"""A wandb run's logged rows, read from its files: the history records of the run's transaction
log, ``<wandb dir>/[offline-]run-<time>-<id>/run-<id>.wandb``, which wandb writes on the machine
the run ran on, online and offline alike.

The file is wandb's record log: a 7-byte header (``:W&B``, magic ``0xBEE1``, version 0), then
LevelDB's log format (32 KiB blocks of records, each a CRC-32 of its type and data, its length
and type, a record larger than its block's room split into first / middle / last pieces); each
record is one of wandb's own ``Record`` protocol buffers (:mod:`wandb.proto`), a history record
one ``wandb.log`` row. (wandb's own Python reader of these files left the package when its
service moved to Go.)
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32768
RECORD_HEADER = struct.Struct("<IHB")  # CRC-32 of type + data, data length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[bytes]:
    """The records of a wandb transaction log, in order; the torn end of a run still writing or
    killed (a record cut short or failing its CRC) ends them. A ValueError when the file is not
    a wandb log."""
    data = path.read_bytes()
    if not data.startswith(HEADER):
        raise ValueError(f"{path.name} is not a wandb transaction log")
    offset, pieces = len(HEADER), None
    while offset + RECORD_HEADER.size <= len(data):
        room = BLOCK - offset % BLOCK
        if room < RECORD_HEADER.size:  # (a block's last bytes: padding)
            offset += room
            continue
        crc, length, kind = RECORD_HEADER.unpack_from(data, offset)
        start = offset + RECORD_HEADER.size
        payload = data[start : start + length]
        if kind == 0 and length == 0:  # (the zeros of a block never written)
            offset += room
            continue
        if len(payload) < length or zlib.crc32(payload, zlib.crc32(bytes([kind]))) != crc:
            return
        offset = start + length
        if kind == FULL:
            yield payload
        elif kind == FIRST:
            pieces = [payload]
        elif kind == MIDDLE and pieces is not None:
            pieces.append(payload)
        elif kind == LAST and pieces is not None:
            yield b"".join([*pieces, payload])
            pieces = None
        else:
            return


def history(path: Path) -> list[dict[str, Any]]:
    """The rows the run logged (``wandb.log``: the key -> its value), in order. A ValueError
    when the file cannot be read."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    rows = []
    try:
        for payload in records(path):
            record = wandb_internal_pb2.Record()
            try:
                record.ParseFromString(payload)
            except DecodeError:
                break
            if record.WhichOneof("record_type") != "history":
                continue
            row = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                try:
                    row[key] = json.loads(item.value_json)
                except ValueError:
                    row[key] = None
            rows.append(row)
    except OSError as err:
        raise ValueError(f"{path.name} cannot be read ({type(err).__name__})") from None
    return rows


def run_logs(wandb_dir: Path, run_id: str) -> list[Path]:
    """The transaction logs of run ``run_id`` under a wandb directory (``wandb/``), oldest first
    (a resumed run adds a directory of the same id, named by its start time)."""
    if not run_id or not wandb_dir.is_dir():
        return []
    name = f"run-{run_id}.wandb"
    found = [d / name for d in wandb_dir.iterdir() if _is_run_dir(d.name, run_id)]
    return sorted((p for p in found if p.is_file()), key=lambda p: _started(p.parent.name))


def _is_run_dir(name: str, run_id: str) -> bool:
    """``run-<YYYYmmdd_HHMMSS>-<id>`` or ``offline-run-<...>-<id>``."""
    rest = name.removeprefix("offline-")
    return rest.startswith("run-") and rest.endswith(f"-{run_id}")


def _started(name: str) -> str:
    return name.removeprefix("offline-").removeprefix("run-")[:15]
