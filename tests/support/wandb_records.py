"""Read W&B offline run files (``run-<id>.wandb``), for the tests of the wandb backend.

Written from the file format, with the protobuf classes that ship with wandb
(`wandb.proto.wandb_internal_pb2.Record`), so that the tests check what W&B
itself wrote, without private W&B APIs.

The format: a 7-byte header (``b":W&B"``, uint16 little-endian 0xBEE1, uint8
version 0), then a LevelDB-style log in blocks of 32 KiB. A block holds
chunks: crc32 (LE u32, over the type byte and the payload) | payload length
(LE u16) | type (u8: 1 full, 2 first, 3 middle, 4 last) | payload. A record
is one full chunk, or a first chunk, middle chunks and a last chunk; a block
tail too short for a chunk header (under 7 bytes) is padding. The header
counts as part of the first block.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import struct
import zlib

from wandb.proto import wandb_internal_pb2 as pb

MAGIC = b":W&B"
BLOCK = 32 * 1024
HEADER = 7  # the file header, and each chunk header
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: str) -> list[pb.Record]:
    """Every whole record of a ``.wandb`` file, in order (raises on a damaged
    file; a record cut off at the end, not written yet, is left out)."""
    with open(path, "rb") as f:
        data = f.read()
    magic, ident, version = struct.unpack("<4sHB", data[:HEADER])
    assert (magic, ident, version) == (MAGIC, 0xBEE1, 0), f"{path}: not a W&B run file"
    found, parts, at = [], None, HEADER
    while at < len(data):
        left_in_block = BLOCK - at % BLOCK
        if left_in_block < HEADER:  # padding at the end of a block
            at += left_in_block
            continue
        if at + HEADER > len(data):
            raise ValueError(f"{path}: a chunk header is cut off at byte {at}")
        crc, length, kind = struct.unpack("<IHB", data[at : at + HEADER])
        payload = data[at + HEADER : at + HEADER + length]
        if len(payload) != length or zlib.crc32(bytes([kind]) + payload) != crc:
            raise ValueError(f"{path}: damaged chunk at byte {at}")
        at += HEADER + length
        if kind == FULL:
            assert parts is None, f"{path}: a record was cut off before byte {at}"
            found.append(payload)
        elif kind == FIRST:
            assert parts is None, f"{path}: a record was cut off before byte {at}"
            parts = [payload]
        elif kind in (MIDDLE, LAST):
            assert parts is not None, f"{path}: a record continues that did not start"
            parts.append(payload)
            if kind == LAST:
                found.append(b"".join(parts))
                parts = None
        elif kind == 0 and length == 0 and not any(data[at:]):
            break  # zeros after the last record (a file written in whole blocks)
        else:
            raise ValueError(f"{path}: unknown chunk type {kind} at byte {at}")
    # A record still open at the end (`parts`) is one W&B has not written whole
    # yet: the file of a running or killed process ends with whole blocks.
    out = []
    for payload in found:
        record = pb.Record()
        record.ParseFromString(payload)
        out.append(record)
    return out


@dataclasses.dataclass
class OfflineRun:
    """What an offline run file says about its run."""

    path: str
    run_id: str  # from the file's name
    run: pb.RunRecord | None  # id, project, group, display name, config... (None: not written yet)
    history: list[dict]  # one dict per history row: key -> value (from JSON), with "_step"
    complete: bool  # the file holds W&B's exit record (the run finished)
    config_updates: list = dataclasses.field(default_factory=list)
    summary: dict = dataclasses.field(default_factory=dict)  # key -> value, as the run's summary updates left it

    @property
    def config(self) -> dict:
        """The run's config, values decoded (W&B keeps them as {"value": ...} JSON)."""
        config = {}
        for update in [self.run.config, *self.config_updates]:
            for item in update.update:
                key = item.key or "/".join(item.nested_key)
                value = json.loads(item.value_json)
                config[key] = value.get("value", value) if isinstance(value, dict) else value
        return config

    def series(self, key: str) -> list[tuple[int, object]]:
        """(step, value) for every row that holds `key`, in file order."""
        return [(row["_step"], row[key]) for row in self.history if key in row]


def read_run(path: str) -> OfflineRun:
    """The run, history and completeness of one ``run-<id>.wandb`` file (W&B
    writes it in whole blocks until the run finishes: while it runs, or after
    its process was killed, the file may not even hold the run record yet)."""
    run, history, complete, configs, summary = None, [], False, [], {}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "config":
            configs.append(record.config)
        elif kind == "history":
            row = {}
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            history.append(row)
        elif kind == "summary":
            for item in record.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "exit":
            complete = True
    run_id = os.path.basename(path)[len("run-") : -len(".wandb")]
    assert run is None or run.run_id == run_id, path
    return OfflineRun(path, run_id, run, history, complete, configs, summary)


def offline_runs(wandb_dir: str, run_id: str | None = None) -> list[OfflineRun]:
    """The offline runs under ``WANDB_DIR/wandb`` (of W&B run id `run_id`, if
    given), oldest first (W&B names the folders by start time, then adds -1,
    -2... when one second sees several)."""
    pattern = os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb")
    runs = [read_run(path) for path in sorted(glob.glob(pattern), key=_start_order)]
    return [r for r in runs if run_id is None or r.run_id == run_id]


def _start_order(path: str) -> tuple:
    folder = os.path.basename(os.path.dirname(path))  # offline-run-YYYYMMDD_HHMMSS-<id>[-n]
    return folder[len("offline-run-") :][:15], os.path.getmtime(path), folder
