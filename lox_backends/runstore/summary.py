"""Run summaries: of each series of scalars a run logged, its last, least and
greatest value and its count, kept up to date as batch files are written.

A batch file's summary (`of_table`, one pyarrow ``group_by`` over the file's
table, by run and key) goes into its ``lox.summary`` metadata
(`lox_backends.runstore.layout`), and is merged (`Summary.add`) into the
running summary of each of its runs: nothing is read again. A resumed run's
summary is rebuilt from the footers of its group's earlier files
(`rebuild`), reading the rows only of files part of whose rows a
``from_step`` superseded. `Summary.to_json` is the ``summary`` of
``_run.json``; `Summary.columns`, its columns in the table of runs.

>>> import numpy as np, lox
>>> logs = lox.logdict({"loss": np.array([3.0, np.nan, 1.0, 2.0])}, steps={"step": {"loss": np.arange(4)}})
>>> per_file = of_table(logs.to_arrow(run="a"))
>>> per_file
{'a': {'keys': {'loss': [4, 1.0, 3.0, 2.0]}, 'steps': [0, 3]}}
>>> summary = Summary()
>>> summary.add(per_file["a"])
>>> summary.values["best"] = 1.0
>>> summary.columns()
{'loss.last': 2.0, 'loss.min': 1.0, 'loss.max': 3.0, 'loss.count': 4, 'best': 1.0}
"""

from __future__ import annotations

import concurrent.futures
import json
import math
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lox_backends.runstore import filesystems, layout

STATISTICS = ("last", "min", "max", "count")  # of each series of scalars: column <series>.<statistic>
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}  # as _run.json writes them


def of_table(table: pa.Table) -> dict[str, dict[str, Any]]:
    """Run id -> ``{"keys": {series: [count, min, max, last]}, "steps": [least,
    greatest step] or None}`` of a table in lox's Arrow schema (rows with a
    ``value`` are scalars; min and max ignore NaN, and are None where every
    value is NaN; "last" is the series' last row). Runs whose rows hold no
    scalar have no "keys" entries; "steps" are of the ``step`` column, of every row."""
    found: dict[str, dict[str, Any]] = {}
    if table.num_rows == 0:
        return found
    table = table.unify_dictionaries()  # tables concatenated into a file: one dictionary per column, to group by
    scalars = table.select(["run", "key", "value"])
    scalars = scalars.filter(pc.call_function("is_valid", [scalars["value"]]))
    if scalars.num_rows:
        # use_threads=False: "last" is the last row of each group, in table order
        grouped = scalars.group_by(["run", "key"], use_threads=False).aggregate(
            [("value", "count"), ("value", "min"), ("value", "max"), ("value", "last")])
        for run, key, count, low, high, last in zip(*(grouped[name].to_pylist() for name in (
                "run", "key", "value_count", "value_min", "value_max", "value_last")), strict=True):
            entry = found.setdefault(run, {"keys": {}, "steps": None})
            entry["keys"][key] = [count, None if _nan(low) else low, None if _nan(high) else high, last]
    steps = None
    if "step" in table.column_names:
        steps = table.select(["run", "step"]).group_by("run", use_threads=False).aggregate(
            [("step", "min"), ("step", "max")])
    for run in (steps["run"].to_pylist() if steps is not None else table["run"].unique().to_pylist()):
        found.setdefault(run, {"keys": {}, "steps": None})
    if steps is not None:
        for run, low, high in zip(*(steps[name].to_pylist() for name in ("run", "step_min", "step_max")),
                                  strict=True):
            if low is not None:
                found[run]["steps"] = [low, high]
    found.pop(None, None)  # type: ignore[call-overload]  # rows of no run (a table handed without one)
    return found


class Summary:
    """The running summary of one run: per series ``[count, min, max, last]``
    (`keys`), and the user's values by name (`values`, the last given)."""

    __slots__ = ("keys", "values")

    def __init__(self) -> None:
        self.keys: dict[str, list[Any]] = {}
        self.values: dict[str, Any] = {}

    def add(self, part: Mapping[str, Any]) -> None:
        """Merge a later file's summary of the run (an `of_table` entry)."""
        for series, (count, low, high, last) in part.get("keys", {}).items():
            kept = self.keys.get(series)
            if kept is None:
                self.keys[series] = [count, low, high, last]
                continue
            kept[0] += count
            kept[1] = low if kept[1] is None else kept[1] if low is None else min(kept[1], low)
            kept[2] = high if kept[2] is None else kept[2] if high is None else max(kept[2], high)
            kept[3] = last

    def to_json(self) -> dict[str, Any]:
        """As ``_run.json`` holds it: ``{"keys": {series: {"last", "min", "max", "count"}}, "values": {...}}``."""
        return {"keys": {series: {"last": last, "min": low, "max": high, "count": count}
                         for series, (count, low, high, last) in self.keys.items()},
                "values": dict(self.values)}

    @classmethod
    def from_json(cls, stored: Any) -> Summary:
        """A summary as `to_json` wrote it (non-finite floats as ``_run.json``'s strings); empty where none."""
        summary = cls()
        if not isinstance(stored, Mapping):
            return summary
        for series, stats in (stored.get("keys") or {}).items():
            if isinstance(stats, Mapping):
                low, high, last = (_number(stats.get(s)) for s in ("min", "max", "last"))
                summary.keys[series] = [stats.get("count") or 0, low, high, last]
        values = stored.get("values")
        if isinstance(values, Mapping):
            summary.values.update(values)
        return summary

    def columns(self) -> dict[str, Any]:
        """Its columns in the table of runs: ``<series>.last/min/max/count``, then the user's values."""
        columns: dict[str, Any] = {}
        for series, (count, low, high, last) in self.keys.items():
            stats = {"last": last, "min": low, "max": high, "count": count}
            columns.update((f"{series}.{statistic}", stats[statistic]) for statistic in STATISTICS)
        columns.update(self.values)
        return columns


def rebuild(folder: str, before: int, resumes: dict[str, list[dict[str, Any]]],
            remote: bool = False) -> dict[str, Summary]:
    """The summaries of runs (`resumes`: run id -> its ``resumes``) from the batch
    files of the group folder `folder` numbered below `before`: from each file's
    ``lox.summary``, but from its rows (those a resume leaves) where a resume's
    ``from_step`` supersedes some of them, or where the file has no summary
    (written by lox 0.2). One footer read per file, several at once in a bucket."""
    files = []
    for name, _, path in filesystems.scan(folder, missing_ok=True):
        match = layout.BATCH_FILE.fullmatch(name)
        if match is not None and int(match.group(1)) < before:
            files.append((int(match.group(1)), path))
    files.sort()
    summaries = {run_id: Summary() for run_id in resumes}
    if remote and len(files) > 1:
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            footers = list(pool.map(lambda file: _footer(file[1], remote), files))
    else:
        footers = [_footer(path, remote) for _, path in files]
    for (sequence, path), (metadata, data) in zip(files, footers, strict=True):
        held = json.loads(metadata.get(layout.RUNS_METADATA, b"{}"))
        stored = json.loads(metadata[layout.SUMMARY_METADATA]) if layout.SUMMARY_METADATA in metadata else None
        for run_id, summary in summaries.items():
            if run_id not in held:
                continue
            part = stored.get(run_id) if stored is not None else None
            if part is not None:  # non-finite floats as ``_run.json`` writes them
                part = {"keys": {series: [stats[0], *map(_number, stats[1:])]
                                 for series, stats in (part.get("keys") or {}).items()}, "steps": part.get("steps")}
            cut = layout.superseded_from(resumes[run_id], sequence)
            if part is None or (cut is not None and part.get("steps") and part["steps"][1] >= cut):
                table = _rows(path, data, held[run_id])
                if cut is not None and "step" in table.column_names:
                    step = table["step"]
                    kept = pc.call_function("or_kleene", [pc.call_function("is_null", [step]),
                                                          pc.call_function("less", [step, pa.scalar(cut)])])
                    table = table.filter(kept)
                part = of_table(table).get(run_id, {})
            summary.add(part)
    return summaries


def _footer(path: str, remote: bool) -> tuple[dict[bytes, bytes], pa.Buffer | None]:
    """A batch file's footer metadata, ``lox.summary`` included (from a bucket, its bytes too: one request)."""
    if remote:
        data = filesystems.read_buffer(path)
        return pq.read_metadata(pa.BufferReader(data)).metadata or {}, data
    return pq.read_metadata(path).metadata or {}, None


def _rows(path: str, data: pa.Buffer | None, rows: list[int]) -> pa.Table:
    """The rows of one run in a batch file, the columns a summary needs."""
    file = pq.ParquetFile(pa.BufferReader(data) if data is not None else path)
    names = [name for name in ("run", "key", "step", "value") if name in file.schema_arrow.names]
    return file.read(columns=names).slice(int(rows[0]), int(rows[1]))


def _nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _number(value: Any) -> Any:
    return _NON_FINITE.get(value, value) if isinstance(value, str) else value
