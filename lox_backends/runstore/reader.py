"""Reading runs back: the folders of runs that `lox_backends.runstore.writer` writes
(the ``parquet`` backend, trackers' local logs), as `lox_backends.runstore.layout`
specifies them, local or in a bucket (`lox_backends.runstore.filesystems`).

`load` reads a run, or every run of a folder, back into logdicts (this is
`lox.load`); `runs` lists them, with their status as `run_status` resolves it
(a run still ``"running"`` whose writer is gone is ``"killed"``); `locate`
finds the run folders at a path, `run_files` a run's batch files (for ``lox
sync``), `batch_files` the batch files of a folder, `runs_in` which runs' rows
a shared batch file holds. Runs written by lox before version 0.2 hold their
batch files in their own folder (one run per file); `load` reads both layouts.

Any Parquet reader reads the batch files directly. Their step columns differ
where runs log with different step names, so read them with each reader's way
of unifying files' columns (names starting with ``_`` or ``.``, and ``*.tmp``
files, are not batch files)::

    duckdb.sql("SELECT * FROM read_parquet('DIR/*/batch-*.parquet', union_by_name = true)")
    files = sorted(glob.glob("DIR/*/batch-*.parquet"))
    polars.concat([polars.scan_parquet(f) for f in files], how="diagonal").collect()
    pandas.concat([pandas.read_parquet(f) for f in files])
    pyarrow.dataset.dataset([pyarrow.dataset.dataset(f) for f in files]).to_table()

The ``run`` column tells the runs apart (``WHERE run = 'RUN_ID'``).
``pandas.read_parquet("DIR")`` and ``pyarrow.dataset.dataset("DIR")`` take
the columns of one file: right only where every file has the same columns.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import datetime
import functools
import gc
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Collection, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lox_backends.runstore import filesystems, layout
from lox_core.arrow import StepRows, concat_read, flat_keys, from_arrow, from_arrow_runs
from lox_core.logdict import logdict


@dataclasses.dataclass(frozen=True)
class BatchFile:
    """A batch file with rows of one run: `rows` is (first row, rows) of the run
    in a file shared by a group of runs, None for a file of the run's own folder.
    `superseded_from`: the step from which the run's rows in this file were
    superseded by a resume (`layout.superseded_from`), None where none were."""

    sequence: int
    name: str
    path: str
    rows: tuple[int, int] | None = None
    superseded_from: int | None = None

    def read(self) -> pa.Table:
        """The run's rows (with the file's schema metadata), but those a resume superseded."""
        table = _read_table(self.path)
        if self.rows is None:
            return table
        table = _without_metadata(table.slice(*self.rows), (layout.RUNS_METADATA,))  # the other runs' rows
        if self.superseded_from is not None:
            keep = _kept(table, [(0, table.num_rows, self.superseded_from)])
            if keep is not None:
                table = table.filter(keep)
        return table

    @property
    def written(self) -> int | None:
        """How many rows of the run the file holds as written (superseded ones
        included), where its footer says: what ``rows`` in ``_run.json`` counts."""
        return None if self.rows is None else self.rows[1]


def load(path: str | os.PathLike[str]) -> logdict | dict[str, logdict]:
    """Read runs written by the parquet backend back into logdicts.

    `path` is a run folder (one holding ``_run.json``): its logdict is returned,
    every batch in order. Or `path` is a folder of run folders (the ``DIR`` of
    ``parquet:DIR``): a dict ``{run_id: logdict}`` is returned, ordered by the
    runs' creation times. Files still being written are skipped, so a run can
    be read while it is written. `path` may be a URI (``s3://bucket/runs``,
    ``gs://...``): see `lox_backends.runstore.filesystems` for the schemes and credentials.

    >>> import tempfile, numpy as np, lox
    >>> from lox_backends import hooks, parquet
    >>> from lox_backends.runstore import reader
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     backend = parquet.ParquetBackend(folder)
    ...     run = hooks.RunInfo("run-0", name="demo", group="g")
    ...     backend.open_run(run)
    ...     for step in range(3):
    ...         event = lox.logdict({"loss": np.array([1.0 / (step + 1)])},
    ...                             steps={"step": {"loss": np.array([step])}})
    ...         backend.write(run, event.to_arrow(run=run.run_id))
    ...     backend.close_run(run)
    ...     logs = reader.load(folder + "/run-0")
    ...     everything = reader.load(folder)
    >>> logs["loss"].tolist(), logs.step["loss"].tolist()
    ([1.0, 0.5, 0.3333333333333333], [0, 1, 2])
    >>> list(everything)
    ['run-0']
    """
    with _gc_paused():
        single, folders = locate(path)
        if single:
            return _load_run(*folders[0], groups=None)
        resumed: dict[str, dict[str, list[dict[str, Any]]]] = {}  # batches folder -> run id -> its resumes
        for folder, info in folders:
            group = _batches_folder(folder, info)
            if group is not None and info.get("resumes"):
                resumed.setdefault(group, {})[info.get("run_id", filesystems.basename(folder))] = info["resumes"]
        with _ConvertedGroups(remote=filesystems.is_uri(folders[0][0]), resumed=resumed) as groups:
            return {filesystems.basename(folder): _load_run(folder, info, groups) for folder, info in folders}


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """No garbage collection while the runs are read: it would find no cycle in
    what `load` builds, and its passes over a large process (JAX loaded, a
    model in memory) cost more than the reading itself."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def runs(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The ``_run.json`` contents of the runs at `path` (a run folder or a folder of
    them), ordered by creation time: for listing runs without reading their data.

    >>> import tempfile
    >>> from lox_backends import hooks, parquet
    >>> from lox_backends.runstore import reader
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     backend = parquet.ParquetBackend(folder)
    ...     backend.open_run(hooks.RunInfo("run-0", name="demo", group="g", metadata={"lr": 0.1}))
    ...     [(r["run_id"], r["name"], r["metadata"], r["status"]) for r in reader.runs(folder)]
    [('run-0', 'demo', {'lr': 0.1}, 'running')]

    Each run's ``status`` is as `run_status` resolves it: a run whose writer is
    gone is ``"killed"``, though its ``_run.json`` still says ``"running"``.
    """
    found = locate(path)[1]
    writers = Writers()  # the runs of a group share their writer: its heartbeat read once
    for folder, info in found:
        info["status"] = writers.status(folder, info)
    return [info for _, info in found]


def run_status(folder: str, info: dict[str, Any]) -> str:
    """The status of the run in `folder` whose ``_run.json`` is `info`:
    ``"finished"`` and ``"failed"`` (or any other stored status but
    ``"running"``) as stored; for a run stored as ``"running"``, ``"killed"``
    when its writer is gone, else ``"running"``.

    The writer is gone when it ran on this host (``host``) and its process
    (``pid``) no longer exists, or when its heartbeat file (``heartbeat``:
    ``{"file": path relative to the folder of run folders, "every": seconds}``)
    holds a ``time`` older than `layout.KILLED_AFTER` heartbeat intervals; a missing
    heartbeat file counts once the run was created that long ago. A running run
    of a lox that wrote none of ``host``, ``pid`` and ``heartbeat`` stays
    ``"running"``. The heartbeat's time is the writer's clock: hosts whose
    clocks differ by more than that interval see each other's runs as killed.

    >>> import tempfile
    >>> from lox_backends.runstore import reader
    >>> reader.run_status(tempfile.gettempdir(), {"status": "finished"})
    'finished'
    >>> reader.run_status(tempfile.gettempdir(), {"status": "running", "host": socket.gethostname(),
    ...                                          "pid": os.getpid()})
    'running'
    """
    return Writers().status(folder, info)


class Writers:
    """What tells whether runs' writers live, each process and heartbeat file
    looked at once however many runs share it (`status`, as `run_status`
    says): for reading the statuses of many runs at once."""

    def __init__(self) -> None:
        self._host = socket.gethostname()
        self._alive: dict[int, bool] = {}
        self._beats: dict[str, float | None] = {}

    def status(self, folder: str, info: dict[str, Any]) -> str:
        """`run_status`."""
        status = info.get("status", "running")
        if status != "running":
            return status
        host, pid, heartbeat = info.get("host"), info.get("pid"), info.get("heartbeat")
        if host is None and pid is None and heartbeat is None:
            return "running"  # written by a lox that left no trace of its writer: nothing to tell by
        if host == self._host and isinstance(pid, int) and not isinstance(pid, bool):
            if pid not in self._alive:
                self._alive[pid] = process_alive(pid)
            if not self._alive[pid]:
                return "killed"
        if isinstance(heartbeat, dict):
            path = _heartbeat_path(folder, heartbeat.get("file"))
            every = heartbeat.get("every")
            if not isinstance(every, (int, float)) or isinstance(every, bool) or not every > 0:
                every = layout.DEFAULT_HEARTBEAT_EVERY
            if path is not None:
                if path not in self._beats:
                    self._beats[path] = _heartbeat_time(path)
                last = self._beats[path]
                if last is None:  # no heartbeat yet, or never: as recent as the run's creation
                    last = _created(info).timestamp()
                if time.time() - last > layout.KILLED_AFTER * every:
                    return "killed"
        return "running"


def process_alive(pid: int) -> bool:
    """Whether a process `pid` exists on this host (and is not a zombie, which
    a killed process is until its parent reaps it)."""
    if pid <= 0 or sys.platform == "win32":  # 0 and negatives name groups; on Windows os.kill terminates
        return True
    try:
        os.kill(pid, 0)  # signal 0: checks only
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    except OSError:
        return True  # cannot tell: not killed
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:  # Linux: the state follows the parenthesized name
            return f.read().rpartition(b")")[2].split()[:1] != [b"Z"]
    except OSError:
        return True


def _heartbeat_path(folder: str, relative: object) -> str | None:
    """The heartbeat file `relative` (to the folder holding the run folders) names, or
    None for a name lox does not write (empty, absolute, or leaving that folder)."""
    if not isinstance(relative, str) or not relative or relative.startswith(("/", "\\")):
        return None
    parts = relative.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return None
    return filesystems.join(filesystems.parent(folder), *parts)


def _heartbeat_time(path: str) -> float | None:
    """The ``time`` a heartbeat file holds (Unix seconds); when it was last
    written where its contents are not lox's; None where it is missing."""
    try:
        data = filesystems.read_bytes(path)
        try:
            beat = json.loads(data.decode("utf-8"))["time"]
            if isinstance(beat, (int, float)) and not isinstance(beat, bool):
                return float(beat)
        except (ValueError, KeyError, TypeError):
            pass
        return filesystems.mtime(path)
    except FileNotFoundError:  # not written yet, or removed since its writer ended
        return None


def existing_runs(root: str, run_ids: Collection[str]) -> set[str]:
    """The ids among `run_ids` of runs in the folder of runs `root` (a local
    path or a bucket URI; one that does not exist holds none): a stat per run
    on a disk, one listing in a bucket."""
    if filesystems.is_uri(root):
        names = {name for name, is_dir, _ in filesystems.scan(root, missing_ok=True) if is_dir}
        return {run_id for run_id in run_ids if run_id in names}
    return {run_id for run_id in run_ids if os.path.isfile(os.path.join(root, run_id, layout.RUN_FILE))}


EXPECTED = ("expected a run folder (holding " + layout.RUN_FILE + ") or a folder of run folders "
            "(the DIR of a 'parquet:DIR' backend)")  # what `lox.load`, `lox.runs`... read, for messages


def open_folder(path) -> tuple[str, bool, dict[str, Any] | None, list[tuple[str, bool, str]]]:
    """`path` (a local path or a URI) resolved; whether it is in a bucket; its
    _run.json if it is one run's folder (else None); else its entries
    (`filesystems.scan`). A clear error where it is no folder."""
    path = os.fspath(path)
    if "://" in path:
        path = filesystems.resolve(path)  # file:// a local path; a scheme no filesystem serves named here
    remote = filesystems.is_uri(path)
    # In a bucket, one listing tells what a stat, a read of _run.json and a scandir tell on a disk.
    entries = filesystems.scan(path, missing_ok=True) if remote else []
    found_kind = "dir" if entries else filesystems.kind(path)
    if found_kind is None:
        bucket = " (or its bucket does not exist, or these credentials cannot see it)" if remote else ""
        raise FileNotFoundError(f"no such folder: {path!r}{bucket}; {EXPECTED}.")
    if found_kind != "dir":
        raise ValueError(f"{path!r} is a file; {EXPECTED}.")
    if not remote or any(name == layout.RUN_FILE for name, _, _ in entries):
        info = read_run_json(path, missing_ok=True)
        if info is not None:
            return path, remote, info, []
    return path, remote, None, entries if remote else filesystems.scan(path)


def locate(path) -> tuple[bool, list[tuple[str, dict[str, Any]]]]:
    """Whether `path` (a local path or a URI) is one run, and its run folders with
    their _run.json, oldest first."""
    path, remote, single, entries = open_folder(path)
    if single is not None:
        return True, [(path, single)]
    folders = [entry for name, is_dir, entry in entries if is_dir and not name.startswith(".")]
    if remote:  # a request each: many at once
        with concurrent.futures.ThreadPoolExecutor(_REMOTE_THREADS) as pool:
            infos = list(pool.map(lambda folder: read_run_json(folder, missing_ok=True), folders))
    else:
        infos = [read_run_json(folder, missing_ok=True) for folder in folders]
    # A folder without _run.json is not a run (or not yet one).
    found = [(folder, info) for folder, info in zip(folders, infos, strict=True) if info is not None]
    if not found:
        raise ValueError(f"no lox runs in {path!r}: {EXPECTED}.")
    found.sort(key=lambda item: (_created(item[1]), filesystems.basename(item[0])))
    return False, found


_REMOTE_THREADS = 32  # requests in flight at once to a bucket: each waits on the network, not the CPU


def _load_run(folder: str, info: dict[str, Any], groups: _ConvertedGroups | None) -> logdict:
    """One run: its files one at a time (each file's schema metadata, step dtypes and
    empty series, describes that file only); with `groups`, its group's shared files
    as converted once for all the runs being loaded."""
    files = run_files(folder, info, shared=groups is None)
    tables = [file.read() for file in files]
    parts = [from_arrow(table) for table in tables]
    flat = set().union(*map(flat_keys, tables))  # keys of several structures in a file: flat in all
    found = sum(table.num_rows if file.written is None else file.written  # as written: superseded rows count
                for file, table in zip(files, tables, strict=True))
    group = _batches_folder(folder, info)
    if groups is not None and group is not None:
        shared, flat_there, rows = groups.parts(group, info.get("run_id", filesystems.basename(folder)))
        parts += shared
        flat |= flat_there
        found += rows
    _check_complete(folder, info, group, found)
    return concat_read(parts, flat, info.get("run_id", filesystems.basename(folder))) if parts else logdict()


def _check_complete(folder: str, info: dict[str, Any], group: str | None, found: int) -> None:
    """Refuse a run whose batch files are gone (`FileNotFoundError` naming it and
    what is missing), rather than load it as a run that logged nothing: its
    batches folder is missing (on a disk, where the writer makes it before the
    run's ``_run.json``; object stores have no folders), or fewer of its rows
    are found than its ``_run.json`` recorded when it ended (``rows``)."""
    if group is None:
        return  # written by lox 0.1: its batch files in its own folder, nothing recorded to check against
    run = f"run {info.get('name', filesystems.basename(folder))!r} ({folder!r})"
    where = filesystems.parent(folder)
    if found == 0 and not filesystems.is_uri(group) and not os.path.isdir(group):
        raise FileNotFoundError(
            f"{run} has lost its logs: its batches folder {group!r} does not exist (deleted or moved), so nothing "
            f"it logged can be read. Put that folder back beside the run's folder, or move the run's folder out "
            f"of {where!r} to load the other runs."
        )
    rows = info.get("rows")
    if isinstance(rows, int) and not isinstance(rows, bool) and found < rows:
        raise FileNotFoundError(
            f"{run} has lost logs: it ended with {rows} rows written, but the batch files in {group!r} hold "
            f"{found} of them; batch files holding the other {rows - found} were deleted or moved. Put them "
            f"back, or move the run's folder out of {where!r} to load the other runs."
        )


def _batches_folder(folder: str, info: dict[str, Any]) -> str | None:
    """The folder of the batch files the run in `folder` shares with its group, if any."""
    return filesystems.join(filesystems.parent(folder), info["batches"]) if info.get("batches") else None


class _ConvertedGroups:
    """The shared batch files of groups of runs, each group read and converted
    once for all its runs (`load` of a folder of runs), its files read in
    parallel."""

    def __init__(self, remote: bool = False, resumed: dict[str, dict[str, list[dict[str, Any]]]] | None = None):
        # pyarrow and NumPy work without the GIL; a bucket's files mostly wait on the network.
        self._pool = concurrent.futures.ThreadPoolExecutor(_REMOTE_THREADS if remote else 8)
        self._resumed = resumed or {}  # batches folder -> run id -> its resumes (`_run.json`)
        self._converted: dict[str, list[tuple[dict[str | None, logdict], set[str]]]] = {}
        self._rows: dict[str, collections.Counter[str]] = {}  # by folder: each run's rows in its files

    def __enter__(self) -> _ConvertedGroups:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(cancel_futures=True)

    def parts(self, folder: str, run_id: str) -> tuple[list[logdict], set[str], int]:
        """The run's logs in the group's files, in order (several parts only
        where the files' schemas differ), the keys that files holding the
        run's rows list as of several structures (``lox_core.arrow.flat_keys``),
        and how many rows of the run the files hold."""
        if folder not in self._converted:
            resumed = self._resumed.get(folder, {})
            found = [(path, _cuts(resumed, sequence)) for sequence, _, path in batch_files(folder, missing_ok=True)]
            files = list(self._pool.map(lambda file: _decode(*file), found))
            self._converted[folder] = _convert(files)
            rows: collections.Counter[str] = collections.Counter()
            for file in files:
                rows.update(file.row_counts())
            self._rows[folder] = rows
        found = [(segment[run_id], flat) for segment, flat in self._converted[folder] if run_id in segment]
        return [part for part, _ in found], set().union(*(flat for _, flat in found)), self._rows[folder][run_id]


def _convert(files: list[_Decoded]) -> list[tuple[dict[str | None, logdict], set[str]]]:
    """The runs of a group's files, with the keys read flat for being of several
    structures (`flat_keys`): consecutive files whose schema (metadata included,
    but for when they were written and which runs they hold) is the same are converted at once."""
    segments: list[list[_Decoded]] = []
    for file in files:
        if not segments or not file.table.schema.equals(segments[-1][0].table.schema, check_metadata=True):
            segments.append([])
        segments[-1].append(file)
    converted = []
    for segment in segments:
        rows = [file.rows for file in segment]
        by_run = StepRows.join(rows) if all(r is not None for r in rows) else None  # type: ignore[arg-type]
        table = pa.concat_tables([file.table for file in segment])
        if by_run is None:
            by_run = from_arrow_runs(table)
        for run in set().union(*(file.runs for file in segment)) - set(by_run):
            by_run[run] = from_arrow(table.slice(0, 0))  # runs without rows: their series without events
        converted.append((by_run, flat_keys(table)))
    return converted


@dataclasses.dataclass
class _Decoded:
    """A shared batch file as read for `load`: its table (without the per-file
    metadata), its runs, and its rows in the common form if they are; and,
    where a resume superseded rows of the file, each run's rows as written."""

    table: pa.Table
    runs: dict[str, list[int]]
    rows: StepRows | None
    written: dict[str, int] | None = None

    def row_counts(self) -> dict[str, int]:
        """Run id -> its rows in the file as written, superseded rows included
        (from ``lox.runs``, or the ``run`` column of a file without it)."""
        if self.written is not None:
            return self.written
        if self.runs or self.table.num_rows == 0:
            return {run: int(rows) for run, (_, rows) in self.runs.items()}
        counts = self.table.column("run").value_counts().to_pylist()
        return {item["values"]: item["counts"] for item in counts if item["values"] is not None}


def _cuts(resumed: dict[str, list[dict[str, Any]]], sequence: int) -> dict[str, int]:
    """Run id -> the step from which its rows in the batch file numbered
    `sequence` are superseded, for the runs of `resumed` (their resumes) that
    have one; worked out once per set of resumes (seeds resumed by one `init` share theirs)."""
    shared: dict[tuple, list[str]] = {}
    for run, resumes in resumed.items():
        key = tuple((r.get("from_step"), r.get("first_batch")) for r in resumes if isinstance(r, dict))
        shared.setdefault(key, []).append(run)
    cuts = {}
    for key, runs in shared.items():
        cut = layout.superseded_from([{"from_step": step, "first_batch": first} for step, first in key], sequence)
        if cut is not None:
            cuts.update(dict.fromkeys(runs, cut))
    return cuts


def _kept(table: pa.Table, cuts: list[tuple[int, int, int]]) -> pa.Array | None:
    """The mask of the rows of `table` to keep, where `cuts` are (first row,
    rows, step) of runs whose rows with a ``step`` of at least that step were
    superseded (rows without a ``step`` are kept); None where every row is kept."""
    if "step" not in table.column_names or not cuts:
        return None
    lowest = np.iinfo(np.int64).min
    limits = np.full(table.num_rows, np.iinfo(np.int64).max)  # each row's cut: none but in the runs of `cuts`
    for first, rows, cut in cuts:
        limits[first : first + rows] = cut
    steps = pc.fill_null(table.column("step").cast(pa.int64()), lowest).to_numpy()  # a row without a step is kept
    keep = steps < limits
    return None if keep.all() else pa.array(keep)


def _supersede(table: pa.Table, runs: dict[str, list[int]], cuts: dict[str, int]) -> _Decoded | None:
    """A shared file's table without the rows that resumes superseded (`cuts`:
    run id -> step), its runs' rows as they are then and as written; None where
    no row of the file was superseded."""
    if runs:
        ranges = [(int(first), int(rows), cuts[run]) for run, (first, rows) in runs.items() if run in cuts]
    else:  # a file without ``lox.runs``: each run's rows told by the run column
        ranges = []
        for run, cut in cuts.items():
            rows = np.flatnonzero(np.array(table.column("run").to_pylist(), object) == run)
            ranges += [(int(row), 1, cut) for row in rows]
    keep = _kept(table, ranges)
    if keep is None:
        return None
    written = _Decoded(table, runs, None).row_counts()
    kept = keep.to_numpy(zero_copy_only=False)
    table = table.filter(keep)
    order = sorted(runs.items(), key=lambda item: item[1][0])  # each run's rows stay together, in this order
    bounds = np.array([[first, first + rows] for _, (first, rows) in order], np.int64).reshape(-1, 2)
    before = np.concatenate([[0], np.cumsum(kept)])  # rows kept before each row
    counts = (before[bounds[:, 1]] - before[bounds[:, 0]]).tolist()
    starts = np.concatenate([[0], np.cumsum(counts)]).tolist()
    now = {run: [starts[i], counts[i]] for i, (run, _) in enumerate(order)}
    return _Decoded(table, now, StepRows.of(table), written)


def _decode(path: str, cuts: dict[str, int] | None = None) -> _Decoded:
    try:  # read once: not worth keeping in _read_table's cache
        file = pq.ParquetFile(pa.BufferReader(filesystems.read_buffer(path)) if filesystems.is_uri(path) else path)
        if (file.schema_arrow.metadata or {}).get(layout.SCALARS_METADATA) == b"1":
            table = _scalars(file)
        else:
            table = file.read()
    except (OSError, pa.ArrowException) as e:
        raise _damaged(path, e) from e
    runs = json.loads((table.schema.metadata or {}).get(layout.RUNS_METADATA, b"{}"))
    table = _without_metadata(table, layout.PER_FILE_METADATA)
    if cuts:  # rows that a resume superseded: left out before the group's files are converted
        superseded = _supersede(table, runs, cuts)
        if superseded is not None:
            return superseded
    return _Decoded(table, runs, StepRows.of(table))


def _scalars(file: pq.ParquetFile) -> pa.Table:
    """A file of scalar rows without reading its shape and data columns: they are
    empty lists and nulls on every row."""
    whole = file.schema_arrow
    table = file.read(columns=[name for name in whole.names if name not in ("shape", "data")])
    rows = table.num_rows
    shape = whole.field("shape")
    empty = pa.ListArray.from_arrays(pa.array(np.zeros(rows + 1, np.int32)), pa.array([], shape.type.value_type),
                                     type=shape.type)
    table = table.add_column(whole.get_field_index("shape"), shape, empty)
    data = whole.field("data")
    return table.add_column(whole.get_field_index("data"), data, pa.nulls(rows, data.type))


def _without_metadata(table: pa.Table, keys: tuple[bytes, ...]) -> pa.Table:
    return table.replace_schema_metadata({k: v for k, v in (table.schema.metadata or {}).items() if k not in keys})


def batch_file(path: str, run_id: str, resumes: list[dict[str, Any]] | None = None) -> BatchFile:
    """The batch file at `path`, as it holds rows of `run_id` (whose resumes,
    as ``_run.json`` lists them, are `resumes`: rows they superseded are left out)."""
    name = filesystems.basename(path)
    match = layout.BATCH_FILE.fullmatch(name)
    if match is None:
        raise ValueError(f"{path!r} is not a lox batch file ({layout.BATCH_FILE_FORM}).")
    if not filesystems.parent(path).endswith(layout.BATCHES_SUFFIX):
        return BatchFile(int(match.group(1)), name, path)
    rows = runs_in(path).get(run_id)
    if rows is None:
        raise ValueError(f"the batch file {path!r} holds no rows of run {run_id!r}.")
    sequence = int(match.group(1))
    return BatchFile(sequence, name, path, (int(rows[0]), int(rows[1])),
                     layout.superseded_from(resumes or [], sequence))


def run_files(folder: str, info: dict[str, Any] | None = None, shared: bool = True) -> list[BatchFile]:
    """The batch files holding rows of the run in `folder` (whose ``_run.json``
    is `info`), in order: files of its own folder (written by lox before 0.2),
    then (if `shared`) files of its group's batches folder that hold rows of the run;
    reading them (`BatchFile.read`) leaves out the rows its resumes superseded."""
    files = [BatchFile(sequence, name, path) for sequence, name, path in batch_files(folder)]
    if not shared:
        return files
    info = info if info is not None else read_run_json(folder, missing_ok=True) or {}
    group = _batches_folder(folder, info)
    if group is not None:
        run_id = info.get("run_id", filesystems.basename(folder))
        resumes = info.get("resumes") or []
        found = batch_files(group, missing_ok=True)
        if filesystems.is_uri(group) and len(found) > 1:  # a request each: many at once
            with concurrent.futures.ThreadPoolExecutor(_REMOTE_THREADS) as pool:
                held = list(pool.map(lambda file: runs_in(file[2]), found))
        else:
            held = [runs_in(path) for _, _, path in found]
        for (sequence, name, path), runs in zip(found, held, strict=True):
            rows = runs.get(run_id)
            if rows is not None:
                cut = layout.superseded_from(resumes, sequence)
                files.append(BatchFile(sequence, name, path, (int(rows[0]), int(rows[1])), cut))
    return files


@functools.lru_cache(maxsize=256)  # read file by file: the last few files suffice
def runs_in(path: str) -> dict[str, list[int]]:
    """Run id -> [first row, rows] of a shared batch file (read from its footer
    once: batch files never change once in place)."""
    try:
        if filesystems.is_uri(path):  # the whole file in one request, kept for the read of its rows that follows
            metadata = pq.read_schema(pa.BufferReader(_remote_files.read(path))).metadata or {}
        else:
            metadata = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowException) as e:
        raise _damaged(path, e) from e
    return json.loads(metadata.get(layout.RUNS_METADATA, b"{}"))


def footers(paths: list[str]) -> list[dict[bytes, bytes]]:
    """The schema metadata of the batch files at `paths` (``lox.runs``,
    ``lox.summary``...), in order: read from each file's footer (a request
    per file in a bucket, many at once), nothing kept."""

    def footer(path: str) -> dict[bytes, bytes]:
        try:
            where = pa.BufferReader(filesystems.read_buffer(path)) if filesystems.is_uri(path) else path
            return pq.read_schema(where).metadata or {}
        except (OSError, pa.ArrowException) as e:
            raise _damaged(path, e) from e

    if len(paths) < 2:
        return [footer(path) for path in paths]
    remote = filesystems.is_uri(paths[0])
    with concurrent.futures.ThreadPoolExecutor(min(len(paths), _REMOTE_THREADS if remote else 8)) as pool:
        return list(pool.map(footer, paths))


# Runs of a shared file are read one after the other (a tracker sending a flush's file);
# `lox sync` goes run by run through a group's files, which this many files keeps in memory.
@functools.lru_cache(maxsize=16)
def _read_table(path: str) -> pa.Table:
    return _read_uncached(path)


def _read_uncached(path: str) -> pa.Table:
    try:
        return pq.read_table(pa.BufferReader(_remote_files.read(path)) if filesystems.is_uri(path) else path)
    except (OSError, pa.ArrowException) as e:
        raise _damaged(path, e) from e


class _RemoteFiles:
    """The bytes of batch files read from a bucket, the last read kept up to a
    total size: `lox sync` goes run by run through a group's files, and reading
    a file again from a bucket costs a request (from a local disk, the page cache)."""

    def __init__(self, budget: int) -> None:
        self._budget = budget
        self._kept: collections.OrderedDict[str, pa.Buffer] = collections.OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def read(self, path: str) -> pa.Buffer:
        with self._lock:
            data = self._kept.get(path)
            if data is not None:
                self._kept.move_to_end(path)
                return data
        data = filesystems.read_buffer(path)
        with self._lock:
            if path not in self._kept and data.size <= self._budget:
                self._kept[path] = data
                self._size += data.size
                while self._size > self._budget:
                    self._size -= self._kept.popitem(last=False)[1].size
        return data


_remote_files = _RemoteFiles(128 * 2**20)  # batch files never change once in place


def _damaged(path: str, error: BaseException) -> ValueError:
    return ValueError(
        f"cannot read {path!r} ({error}). Batch files are renamed into place only once "
        "whole, so this one was damaged after it was written (for example by a power "
        "loss before the run was flushed); move it out of the folder to read the rest."
    )


def batch_files(folder: str, missing_ok: bool = False) -> list[tuple[int, str, str]]:
    """(sequence, name, path) of the batch files in a folder, in order; temp files are hidden."""
    files = []
    for name, _, path in filesystems.scan(folder, missing_ok):
        match = layout.BATCH_FILE.fullmatch(name)
        if match:
            files.append((int(match.group(1)), name, path))
    files.sort()
    return files


def read_run_json(folder: str, missing_ok: bool = False) -> dict[str, Any] | None:
    path = filesystems.join(folder, layout.RUN_FILE)
    try:
        data = filesystems.read_bytes(path)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise
    try:
        info = json.loads(data.decode("utf-8"))
        if not isinstance(info, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        raise ValueError(f"{path!r} is not a lox {layout.RUN_FILE} ({e}); lox writes it as a JSON object.") from e
    return info


def _created(info: dict[str, Any]) -> datetime.datetime:
    try:
        created = datetime.datetime.fromisoformat(info["created"])
    except (KeyError, TypeError, ValueError):
        return datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)
    if created.tzinfo is None:
        created = created.replace(tzinfo=datetime.timezone.utc)
    return created
