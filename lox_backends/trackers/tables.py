"""Batch tables as trackers read them: `Batch` (one batch file of a run, to send), and
`scalars` / `arrays` / `media`, which split its table into the events a tracker keeps
as numbers (`Scalars`, as columns), plain arrays and complex scalars (that it keeps as
files or histograms), and the kinds it renders (`MediaEvent`: images, video, audio,
histograms and text, by the table's ``kind`` column).

A tracker's `send` gets a `Batch`; its ``table`` holds rows of lox's Arrow schema
(`lox_core.arrow`), ordered by step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lox_core import arrow, schema
from lox_core.arrow import dictionary_codes
from lox_core.logdict import NO_STEP
from lox_core.media import RENDERED_KINDS


@dataclasses.dataclass(frozen=True)
class Batch:
    """One batch file of a run's local log, to send.

    `name` is the file's name (unique within the run: name what the batch
    becomes at the tracker after it, e.g. an artifact, so that sending it
    again replaces it); `time_ms` is when it was written (Unix milliseconds:
    give its values this timestamp, so that sending it again repeats them
    exactly); `table` holds the rows (lox's Arrow schema).
    """

    name: str
    time_ms: int
    table: pa.Table


@dataclasses.dataclass
class Scalars:
    """The scalar events of a batch table, as columns (one entry per event).

    `steps` maps each step name to int64 steps, `lox.NO_STEP` where an event
    has no step of that name; `primary` is the step name trackers use as their
    step (``step`` if present, else the first), None without steps.
    """

    keys: np.ndarray  # of str (object)
    values: np.ndarray
    steps: dict[str, np.ndarray]
    primary: str | None
    codes: np.ndarray | None = None  # keys as positions in `names` (from the table's dictionary)
    names: list[str] | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def tracker_steps(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Each event's step for a tracker with one step per value: its
        `primary` step, else its first other step name's (`lox.NO_STEP`
        without any); and, per step name, which events also carry that name
        besides the one chosen (to log as a series of its own, e.g. ``epoch``)."""
        names = sorted(self.steps, key=lambda name: name != self.primary)
        chosen = np.full(len(self), NO_STEP, np.int64)
        source = np.full(len(self), -1)
        for j, name in enumerate(names):
            take = (chosen == NO_STEP) & (self.steps[name] != NO_STEP)
            chosen[take], source[take] = self.steps[name][take], j
        besides = {name: (self.steps[name] != NO_STEP) & (source != j) for j, name in enumerate(names)}
        return chosen, besides

    def by_key(self) -> dict[str, np.ndarray]:
        """Each key's event positions (in order), keys in order of first appearance."""
        if not len(self):  # e.g. a batch of text only
            return {}
        if self.codes is None:  # not from a dictionary column: number the keys here
            numbers: dict[str, int] = {}
            codes = np.fromiter((numbers.setdefault(k, len(numbers)) for k in self.keys), np.int64, len(self.keys))
            names = list(numbers)
        else:
            if self.names is None:
                raise TypeError("Scalars.codes are positions in Scalars.names, which is None.")
            codes, names = self.codes, self.names
        order = np.argsort(codes, kind="stable")
        bounds = np.cumsum(np.bincount(codes, minlength=len(names)))[:-1]
        groups = dict(zip(names, np.split(order, bounds), strict=True))
        firsts = {name: group[0] for name, group in groups.items() if len(group)}
        return {name: groups[name] for name in sorted(firsts, key=lambda name: firsts[name])}


def scalars(table: pa.Table) -> Scalars:
    """The events of `table` whose value is a real number (every scalar but
    complex): rows of kind ``scalar``, never text, a histogram... (tables of
    schema version 1: rows of shape ``[]``)."""
    # pyarrow.compute defines its functions at import time, unseen by type checkers.
    scalar = pc.equal(schema.row_kinds(table), "scalar")  # pyright: ignore[reportAttributeAccessIssue]
    rows = table.filter(scalar)
    values = rows.column("value").to_numpy(zero_copy_only=False).astype(np.float64)
    missing = np.flatnonzero(np.isnan(values) & ~rows.column("value").is_valid().to_numpy(zero_copy_only=False))
    keep = np.ones(len(values), bool)
    if missing.size:  # int64 / uint64 scalars are kept as bytes; complex ones are left out
        dtypes = rows.column("dtype").to_pylist()
        data = rows.column("data").to_pylist()
        for i in missing:
            dtype = np.dtype(dtypes[i])
            if dtype.kind in "iu":
                values[i] = float(np.frombuffer(data[i], dtype)[0])
            else:
                keep[i] = False
    names = schema.step_names(table)
    steps = {n: rows.column(n).fill_null(NO_STEP).to_numpy(zero_copy_only=False).astype(np.int64)[keep] for n in names}
    codes, key_names = dictionary_codes(rows.column("key"))
    codes = codes[keep]
    keys = np.asarray(key_names, object)[codes] if key_names else np.empty(0, object)
    return Scalars(keys, values[keep], steps, schema.primary_step(names), codes, key_names)


def arrays(table: pa.Table) -> pa.Table:
    """The rows of plain numbers that `scalars` leaves out: rows of kind
    ``array``, and complex scalars (read them with `lox.logdict.from_arrow`);
    trackers keep them as files, histograms... The kinds they render (`media`)
    are in neither."""
    dtype = table.column("dtype").cast(pa.string())
    kinds = schema.row_kinds(table)
    # pyarrow.compute defines its functions at import time, unseen by type checkers.
    scalar, array = pc.equal(kinds, "scalar"), pc.equal(kinds, "array")  # pyright: ignore[reportAttributeAccessIssue]
    complex_scalar = pc.and_(scalar, pc.starts_with(dtype, "complex"))  # pyright: ignore[reportAttributeAccessIssue]
    return table.filter(pc.or_(array, complex_scalar))  # pyright: ignore[reportAttributeAccessIssue]


@dataclasses.dataclass(frozen=True)
class MediaEvent:
    """One event of a rendered kind (`lox_core.media.RENDERED_KINDS`).

    `value` is a `lox_core.media.Media` of NumPy arrays for an image, video,
    audio clip or histogram (one event: the shape it was logged with), or a
    NumPy array of strings for text (``(n,)`` or
    ``(rows, cols)`` for a table; a Python str for a single text). `steps` are the step names the event
    carried; `step` is the one a tracker uses (the primary step, else the
    first step name the event carried; None without any).
    """

    key: str
    kind: str
    value: Any
    steps: dict[str, int]
    step: int | None


def media(table: pa.Table) -> list[MediaEvent]:
    """The events of `table` whose kind a tracker renders, key by key, each
    key's events in table order (by step)."""
    if "kind" not in table.column_names:
        return []  # a table of schema 1: scalars and arrays only
    rows = table.filter(pc.is_in(table.column("kind").cast(pa.string()),  # pyright: ignore[reportAttributeAccessIssue]
                                 value_set=pa.array(RENDERED_KINDS)))
    if rows.num_rows == 0:
        return []
    logs = arrow.from_arrow(rows)
    names = list(logs.steps)
    primary = schema.primary_step(names)
    order = sorted(names, key=lambda name: name != primary)
    kinds = logs.kind
    out = []
    for key, value in logs.items():
        per_name = {name: np.asarray(logs.steps[name][key]) for name in order if key in logs.steps[name]}
        for i in range(len(value)):
            steps = {name: int(s[i]) for name, s in per_name.items() if s[i] != NO_STEP}
            step = next(iter(steps.values()), None)  # `order`: the primary step first
            event = value[i]
            out.append(MediaEvent(key, kinds[key], event, steps, step))
    return out


def file_stems(events: list[MediaEvent], batch: str) -> list[tuple[str, int]]:
    """For trackers that keep one file per event: each event's file name
    (without extension), the same every time its batch is sent (so that a batch
    sent again replaces its files), and its position among the events of its
    key and step in the batch (0 for the first).

    ``step_<step>`` for the first event of a key at a step in the batch,
    ``step_<step>-<i>`` for the next ones; events without a step are named by
    their batch file, ``<batch>-<i>``.

    >>> events = [MediaEvent("a", "text", "x", {"step": s}, s) for s in (3, 3, 4)]
    >>> file_stems(events + [MediaEvent("a", "text", "y", {}, None)], "batch-000002.parquet")
    [('step_3', 0), ('step_3-1', 1), ('step_4', 0), ('batch-000002-0', 0)]
    """
    seen: dict[tuple[str, int | None], int] = {}
    out = []
    for event in events:
        i = seen[event.key, event.step] = seen.get((event.key, event.step), -1) + 1
        if event.step is None:
            out.append((f"{batch.removesuffix('.parquet')}-{i}", i))
        else:
            out.append((f"step_{event.step}" + (f"-{i}" if i else ""), i))
    return out
