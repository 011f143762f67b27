"""Reads W&B's offline run files (`run-ID.wandb`) back, with W&B's own record schema.

The file is a LevelDB-style log (W&B's datastore): a 7-byte file header (":W&B", magic 0xBEE1, version 0),
then records of a 7-byte header (checksum, length, type) and their bytes, in 32 KiB blocks; a record that
does not fit its block continues in the next (types FIRST, MIDDLE, LAST). Each whole record is a
`wandb_internal_pb2.Record`. wandb 0.25 dropped its Python reader (wandb.sdk.internal.datastore) when
its Go core took over writing; the format stayed (`wandb sync` reads it)."""
from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768
HEADER = struct.Struct("<IHB")  # checksum, length, type
FILE_HEADER = struct.Struct("<4sHB")  # ident, magic, version
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[bytes]:
    """Every whole record's bytes, in order."""
    data = Path(path).read_bytes()
    ident, magic, version = FILE_HEADER.unpack_from(data, 0)
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), f"{path}: not a W&B run file"
    out, pending, index = [], b"", FILE_HEADER.size
    while index + HEADER.size <= len(data):
        if BLOCK - index % BLOCK < HEADER.size:  # the rest of a block too short for a header is padding
            index += BLOCK - index % BLOCK
            continue
        _checksum, length, kind = HEADER.unpack_from(data, index)
        if kind == 0 and length == 0:  # zero padding at the end of a block or the file
            index += BLOCK - index % BLOCK
            continue
        chunk = data[index + HEADER.size:index + HEADER.size + length]
        index += HEADER.size + length
        if kind == FULL:
            out.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            out.append(pending + chunk)
            pending = b""
    return out


def history_rows(path: Path) -> list[dict]:
    """The history rows (`wandb.log` calls) of one run file, decoded with W&B's own protobuf schema."""
    from wandb.proto import wandb_internal_pb2

    rows = []
    for data in records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def train_losses(files: list[Path], steps: int, seconds: float = 30.0) -> list[tuple[int, float]]:
    """(step, train/loss) of every history row in `files`, sorted; read again until `steps` rows are there or
    `seconds` pass: W&B's service may still be writing a run's file after `finish()` returned."""
    import time

    deadline = time.monotonic() + seconds
    while True:
        rows = [row for path in files for row in history_rows(path)]
        losses = sorted((int(r["step"]), r["train/loss"]) for r in rows if "train/loss" in r)
        if len(losses) >= steps or time.monotonic() > deadline:
            return losses
        time.sleep(0.5)
