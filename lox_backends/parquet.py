"""The ``parquet`` backend: runs saved as Parquet files, written append-only.

Config string ``parquet:DIR?compression=snappy&rows_per_file=262144``
(``parquet`` alone writes into ``lox-runs``). Tables wait in memory until the
next `flush` (the Logger flushes every few seconds and when a run finishes) or
until `rows_per_file` rows wait, then become one file per group of runs (the
runs of one Logger, e.g. 1,024 vmapped seeds, share their files).
``lox_backends.runstore.reader`` describes the layout on disk and reads it back
(`lox.load`).

Every file is written under a hidden name (starting with ``.``) and renamed into
place, so a reader never sees a partial file: reading a run while it is being
written, or after its writer was killed, shows whole flushes only. `flush` (and
`close_run`, `close`) also fsyncs what was written, so that flushed batches
survive a power loss too.

``DIR`` may be a folder in a bucket: ``parquet:s3://bucket/runs``,
``parquet:gs://bucket/runs`` (see `lox_backends.runstore.filesystems`). Object stores have
no rename and no fsync; there each file is uploaded whole under its final
name, in one request (or one multipart upload), which the store makes visible
only once complete and stored durably: the same guarantees, by other means.
``_run.json`` files are uploaded a few at a time in the background (a
thousand vmapped seeds open a thousand runs) and waited for at every `flush`.
Any Parquet reader can read the batch files directly; their step columns
differ where runs log with different step names, so read every file's columns
(``lox_backends.runstore.reader`` and docs/backends/parquet.md give each reader's call)::

    duckdb.sql("SELECT * FROM read_parquet('DIR/*/batch-*.parquet', union_by_name = true) WHERE run = 'RUN_ID'")
    files = sorted(glob.glob("DIR/*/batch-*.parquet"))
    polars.concat([polars.scan_parquet(f) for f in files], how="diagonal").collect()
    pandas.concat([pandas.read_parquet(f) for f in files], ignore_index=True)

A tracker backend sends from these files: it follows a `ParquetBackend` (its
own local log, or a parquet backend of the same Logger writing the same
folder) as one of its `listeners`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import datetime
import errno
import functools
import importlib.metadata
import json
import math
import os
import re
import secrets
import socket
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from lox_backends.plugin import hooks
from lox_backends.plugin.config import Option
from lox_backends.runstore import filesystems
from lox_backends.runstore.reader import (
    BATCHES_SUFFIX,
    DEFAULT_DIR,
    RUN_FILE,
    RUNS_METADATA,
    SCALARS_METADATA,
    TIME_METADATA,
    batch_file_name,
    batch_files,
    batches_folder_name,
    fsync,
    load,
    process_alive,
    read_run_json,
    runs,
)
from lox_core import schema
from lox_core.arrow import FLAT, TREES_METADATA, scalars_only

__all__ = [
    "ParquetBackend", "LogListener", "write_table", "check_writable", "load", "runs", "DEFAULT_DIR", "TIME_METADATA",
]

DEFAULT_ROWS_PER_FILE = 262_144  # tables are kept until a flush, or until this many rows wait
COMPRESSIONS = ("snappy", "zstd", "gzip", "brotli", "lz4", "none")  # what pyarrow's Parquet writer takes


def _codec_available(name: str) -> str | None:
    if name == "none" or pa.Codec.is_available(name):
        return None
    usable = ", ".join(c for c in COMPRESSIONS if c == "none" or pa.Codec.is_available(c))
    return f"this pyarrow was built without {name}; use one of {usable}"


OPTIONS = {
    "compression": Option(
        "codec of the Parquet files", "choice", "snappy",
        choices=COMPRESSIONS, check=_codec_available,
    ),
    "rows_per_file": Option(
        "rows that wait before a file is written", "int",
        DEFAULT_ROWS_PER_FILE, minimum=1,
    ),
}
EXAMPLE = "parquet:runs?compression=zstd&rows_per_file=100000"


class LogListener:
    """What follows a `ParquetBackend` (a tracker sending from its files) is
    told, in the backend's thread, in this order per run."""

    def run_opened(self, run: hooks.RunInfo, folder: str) -> None:
        """`open_run` wrote the run's folder."""

    def file_durable(self, run_id: str, path: str) -> None:
        """A batch file of the run is complete and fsynced."""

    def run_closed(self, run: hooks.RunInfo, folder: str) -> None:
        """The run finished; all its files are durable."""

    def log_closed(self) -> None:
        """The backend was closed; nothing more will come."""


class ParquetBackend(hooks.Backend):
    OPTIONS = OPTIONS
    EXAMPLE = EXAMPLE
    heartbeat_every: float = 5.0  # seconds between flushes (set by the Logger): how often a heartbeat is written

    """Writes runs under ``DIR`` as append-only Parquet batch files: ``DIR/<run_id>/_run.json``
    per run, and one file per flush for all the runs of a group in ``DIR/<group>.batches/``.

    `target` is the folder (``lox-runs`` when None), resolved against the
    current directory when the backend is created, or a URI of a folder in a
    bucket (``s3://bucket/runs``), checked when the backend is created: a scheme
    no filesystem serves, a missing package or bucket, refused credentials
    raise here, naming the URI; a local folder is created and must be
    writable (`check_writable`). Options (`OPTIONS`, checked here):
    ``compression`` (``snappy`` by default; ``zstd``, ``gzip``, ``brotli``,
    ``lz4``, ``none``) is passed to Parquet; ``rows_per_file``.
    """

    def __init__(self, target: str | None = None, options: dict[str, str] | None = None):
        super().__init__(target, options)
        self.compression: str = self.settings["compression"]
        self.rows_per_file: int = self.settings["rows_per_file"]
        # Absolute now, so that a later os.chdir does not split a run in two.
        self.root = filesystems.resolve(target or DEFAULT_DIR, check=True)
        self.remote = filesystems.is_uri(self.root)
        if not self.remote:
            check_writable(self.root, "the parquet backend's folder")
        self._uploads = _Uploads() if self.remote else None
        self._existing: set[str] | None = None  # in a bucket: the folders there when the first run opened
        self._runs: dict[str, _RunState] = {}
        self._groups: dict[str, _Group] = {}  # by folder name
        self._unsynced_files: list[tuple[str, list[str]]] = []  # (path, its run ids)
        self._unsynced_dirs: set[str] = set()
        self._retry_at_flush = False  # a file could not be written: `write` leaves the next try to `flush`
        self._writer = secrets.token_hex(4)  # names this writer's heartbeat files
        self.listeners: list[LogListener] = []

    # --- the backend contract ------------------------------------------------------
    def attach(self, backends: list[hooks.Backend]) -> None:
        for other in backends:
            if other is not self and isinstance(other, ParquetBackend) and other.root == self.root:
                raise ValueError(
                    f"two parquet backends write to {self.root!r}; every event would be saved twice. "
                    "Keep one, or give them different folders."
                )

    def open_run(self, run: hooks.RunInfo) -> None:
        state = self._state(run, write_info=False)
        state.info["status"] = "running"
        state.info.pop("ended", None)
        beat = state.group.beat_at
        # Once per group and heartbeat interval, not per run: 1,024 seeds opened at
        # once would cost 1,024 uploads to a bucket, one after the other.
        if beat is None or time.monotonic() - beat >= self.heartbeat_every:
            self._write_heartbeat(state.group)
        self._write_run_json(state)

    def write(self, run: hooks.RunInfo, table: pa.Table) -> None:
        group = self._state(run).group  # raises before taking the table, or takes it
        group.pending.setdefault(run.run_id, []).append(table)
        group.pending_rows += table.num_rows
        if group.pending_rows >= self.rows_per_file and not self._retry_at_flush:
            try:
                self._write_pending(group)
            except OSError:  # the tables are kept: the next `flush` writes them, or raises
                self._retry_at_flush = True

    def flush(self) -> None:
        """Write what waits, make it durable and tell readers this writer is alive;
        an OSError leaves every table not written in memory, for the next flush."""
        for group in self._groups.values():
            self._write_pending(group)
        self._sync()
        if self._uploads is not None:
            self._uploads.wait()
        self._retry_at_flush = False
        for group in {state.group.folder: state.group for state in self._runs.values()}.values():
            self._write_heartbeat(group)

    def close_run(self, run: hooks.RunInfo) -> None:
        """Write the run's last tables and its end: its status ("failed" if the
        Logger says logs were lost), when, and how many rows it has."""
        state = self._state(run)
        try:
            if run.run_id in state.group.pending or state.group.uploads:
                self._write_pending(state.group)
            self._sync()
            state.info["status"] = run.status if run.status in ("finished", "failed") else "finished"
            state.info["ended"] = _now()
            state.info["rows"] = state.rows
            self._write_run_json(state)
            del self._runs[run.run_id]
        except OSError:
            raise  # nothing lost: the Logger calls close_run again once the fault clears
        except BaseException:
            self._closed(run, state)  # a tracker ends the run even if its last local write failed
            raise
        self._closed(run, state)

    def _closed(self, run: hooks.RunInfo, state: _RunState) -> None:
        for listener in self.listeners:
            listener.run_closed(run, state.folder)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self._uploads is not None:
                self._uploads.shutdown()
            for listener in self.listeners:
                listener.log_closed()

    # --- writing -------------------------------------------------------------------
    def _state(self, run: hooks.RunInfo, write_info: bool = True) -> _RunState:
        state = self._runs.get(run.run_id)
        if state is not None:
            return state
        _check_name(run.run_id, "run_id")
        if not self.remote and not self._runs and not self._groups:  # the first run: the folder is opened
            for name, is_dir, path in filesystems.scan(self.root, missing_ok=True):
                if is_dir and name.endswith(BATCHES_SUFFIX):
                    remove_leftovers(path)  # files a killed writer was writing
        folder = filesystems.join(self.root, run.run_id)
        filesystems.makedirs(folder)
        self._unsynced_dirs.add(self.root)
        batches = batches_folder_name(run.group or run.run_id)
        _check_name(batches, "group", hidden=(".", "_"))  # Parquet dataset readers skip those
        if self.remote and self._existing is None:  # one listing, not a request per new run
            self._existing = {name for name, is_dir, _ in filesystems.scan(self.root, missing_ok=True) if is_dir}
        earlier = None
        if self._existing is None or run.run_id in self._existing:
            earlier = read_run_json(folder, missing_ok=True)
        if self._existing is not None:
            self._existing.add(run.run_id)
        info = earlier or {}
        info.update(
            run_id=run.run_id,
            name=run.name,
            group=run.group,
            index=run.index,
            metadata=run.metadata,
            created=info.get("created") or _now(),
            lox_version=_lox_version(),
            status=info.get("status", "running"),
            batches=batches,
            host=_HOST,
            pid=os.getpid(),
            heartbeat={"file": f"{batches}/{HEARTBEAT_PREFIX}{self._writer}.json", "every": self.heartbeat_every},
        )
        state = _RunState(folder, info, self._group(batches), rows=int(info.get("rows") or 0))
        self._runs[run.run_id] = state
        try:
            if write_info and earlier is None:
                self._write_run_json(state)  # a batch without open_run still makes a loadable run
        finally:  # a tracker following this log learns of the run before its first file, whatever failed
            for listener in self.listeners:
                listener.run_opened(run, folder)
        return state

    def _group(self, name: str) -> _Group:
        group = self._groups.get(name)
        if group is None:
            folder = filesystems.join(self.root, name)
            filesystems.makedirs(folder)
            self._unsynced_dirs.add(self.root)
            # A group written to before (by this process or another) continues after its last file.
            sequences = [sequence for sequence, _, _ in batch_files(folder, missing_ok=self.remote)]
            group = self._groups[name] = _Group(folder, next_seq=max(sequences, default=-1) + 1)
        return group

    def _write_pending(self, group: _Group) -> None:
        """What arrived since the last file, as few files as possible: each run's
        tables in arrival order, runs one after the other, a new file only where
        the schema changes (a training loop's tables all have one). Tables whose
        keys hold different pytrees (``lox.trees``) share a file, which
        describes them all; a key that they give different structures (train
        steps logging ``{"m": {"loss": x}}``, eval steps ``{"m": {"acc": y}}``)
        is listed as ``"flat"`` (`lox_core.arrow.FLAT`), and read flat, as
        when its structure differs between files."""
        self._send_uploads(group)  # files an earlier try made first, in order
        queue = [(run_id, table) for run_id, tables in group.pending.items() for table in tables]
        group.pending, group.pending_rows = {}, 0
        written = 0  # tables of `queue` in files
        try:
            part: list[tuple[str, pa.Table]] = []
            trees: dict[str, Any] = {}
            parsed: dict[bytes, dict[str, Any]] = {}  # lox.trees as the tables hold it -> its keys' trees
            for run_id, table in queue:
                if part and not _joinable(table, part[0][1]):
                    self._write_file(group, part, trees)
                    written += len(part)
                    part, trees = [], {}
                part.append((run_id, table))
                raw = (table.schema.metadata or {}).get(_TREES)
                if raw is not None:
                    these = parsed[raw] if raw in parsed else parsed.setdefault(raw, json.loads(raw))
                    for key, tree in these.items():
                        trees[key] = tree if trees.get(key, tree) == tree else FLAT
            if part:
                self._write_file(group, part, trees)
                written += len(part)
        except BaseException:
            for run_id, table in queue[written:]:  # kept, in order, for the next try (nothing is lost)
                group.pending.setdefault(run_id, []).append(table)
                group.pending_rows += table.num_rows
            raise
        self._send_uploads(group)

    def _write_file(self, group: _Group, part: list[tuple[str, pa.Table]], trees: dict[str, Any]) -> None:
        rows: dict[str, list[int]] = {}
        start = 0
        for run_id, table in part:
            rows.setdefault(run_id, [start, 0])[1] += table.num_rows
            start += table.num_rows
        table = pa.concat_tables([t for _, t in part])
        if table.num_rows == 0 and not json.loads((table.schema.metadata or {}).get(b"lox.empty_series", b"{}")):
            return  # nothing to keep (a table without rows may still name series with no events)
        # When the batch was written: the timestamp trackers give its values,
        # the same each time it is sent.
        metadata = {**(table.schema.metadata or {}), TIME_METADATA: str(int(time.time() * 1000)).encode(),
                    RUNS_METADATA: json.dumps(rows).encode()}
        if trees:  # the structures of every table's keys
            metadata[_TREES] = json.dumps(trees).encode()
        if scalars_only(table):
            metadata[SCALARS_METADATA] = b"1"  # lox.load then skips the shape and data columns
        table = table.replace_schema_metadata(metadata)
        name = batch_file_name(group.next_seq, secrets.token_hex(4))
        path = filesystems.join(group.folder, name)
        if self.remote:  # the whole file in memory, then one upload: never visible in part
            sink = pa.BufferOutputStream()
            write_table(table, sink, compression=self.compression)
            # Uploaded by `_send_uploads`, under this name whatever happens: an upload lox
            # stopped waiting for may still land, and its retry then writes the same object.
            group.uploads.append((path, sink.getvalue(), rows))
            group.next_seq += 1
            return
        temp = os.path.join(group.folder, temp_name(name))
        try:
            with named_errors(path):
                write_table(table, temp, compression=self.compression)
                os.replace(temp, path)
        except BaseException:
            _remove_quietly(temp)
            raise
        self._unsynced_dirs.add(group.folder)
        group.next_seq += 1
        self._written(path, rows)

    def _send_uploads(self, group: _Group) -> None:
        """Upload the group's files made for a bucket, in order; one that fails stays
        (with those after it) for the next try, as it is."""
        while group.uploads:
            path, data, rows = group.uploads[0]
            filesystems.put(path, data)
            group.uploads.popleft()
            self._written(path, rows)

    def _written(self, path: str, rows: dict[str, list[int]]) -> None:
        self._unsynced_files.append((path, list(rows)))
        for run_id, (_, count) in rows.items():
            state = self._runs.get(run_id)
            if state is not None:
                state.rows += count

    def _write_run_json(self, state: _RunState) -> None:
        path = filesystems.join(state.folder, RUN_FILE)
        # NumPy and JAX values are plain JSON by then; anything else is shown as its str.
        text = json.dumps(_strict_json(state.info), indent=2, allow_nan=False, default=str)
        if self._uploads is not None:  # in the background, after the run's previous one
            self._uploads.put(state.folder, path, (text + "\n").encode())
            return
        temp = os.path.join(state.folder, temp_name(f"{RUN_FILE}.{secrets.token_hex(4)}"))
        try:
            with named_errors(path):
                with open(temp, "w", encoding="utf-8") as f:
                    f.write(text + "\n")
                    f.flush()
                    os.fsync(f.fileno())  # small, and what makes the folder a run: always durable
                os.replace(temp, path)
        except BaseException:
            _remove_quietly(temp)
            raise
        fsync(state.folder)

    def _write_heartbeat(self, group: _Group) -> None:
        """``<group>.batches/_alive-<writer>.json``: when this writer last said it
        is alive (`lox_backends.runstore.reader.run_status` reads a run as "killed" when
        this is older than 3 flush intervals, or the process is gone)."""
        path = filesystems.join(group.folder, f"{HEARTBEAT_PREFIX}{self._writer}.json")
        data = json.dumps({"time": time.time(), "host": _HOST, "pid": os.getpid()}).encode()
        if self.remote:
            filesystems.put(path, data)
            group.beat_at = time.monotonic()
            return
        temp = os.path.join(group.folder, temp_name(filesystems.basename(path)))
        try:
            with named_errors(path):
                with open(temp, "wb") as f:  # not fsynced: a heartbeat lost with a power cut says nothing wrong
                    f.write(data)
                os.replace(temp, path)
        except BaseException:
            _remove_quietly(temp)
            raise
        group.beat_at = time.monotonic()

    def _sync(self) -> None:
        for path, _ in self._unsynced_files:
            fsync(path)
        for folder in self._unsynced_dirs:
            fsync(folder)  # makes the renames durable
        durable, self._unsynced_files = self._unsynced_files, []
        self._unsynced_dirs.clear()
        for path, run_ids in durable:
            for run_id in run_ids:
                for listener in self.listeners:
                    listener.file_durable(run_id, path)


def write_table(table: pa.Table, where: str | pa.NativeFile, compression: str = "snappy") -> None:
    """Write a table of lox's schema as Parquet, the way the backend does:
    dictionary-encoded where values repeat (run, key, dtype), plain elsewhere
    (a float's or a step's dictionary costs more than it saves), and statistics
    only for the columns readers filter on (run, key, the steps, value)."""
    pq.write_table(
        table,
        where,
        compression=compression,
        # pyarrow's annotations say bool; its documentation (and code) take column names too.
        use_dictionary=["run", "key", "dtype"],  # pyright: ignore[reportArgumentType]
        write_statistics=["run", "key", *schema.step_names(table), "value"],  # pyright: ignore[reportArgumentType]
    )


class _Uploads:
    """``_run.json`` uploads to a bucket, several at once (each waits on the
    network); one run's in order. `wait` returns when all are done and raises
    the first that failed; what failed is uploaded again by the next `wait`
    (unless a newer one of the same run replaced it)."""

    def __init__(self) -> None:
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._last: dict[str, tuple[concurrent.futures.Future, str, bytes]] = {}  # by run folder

    def put(self, folder: str, path: str, data: bytes) -> None:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(16, thread_name_prefix="lox-upload")
        before = self._last.get(folder)
        if before is not None and not before[0].done():
            concurrent.futures.wait([before[0]])  # the run's previous status first (a run opened and closed at once)
        try:
            future = self._pool.submit(filesystems.with_time_limit(filesystems.put), path, data)
        except RuntimeError:  # the interpreter exits (the exit flush): its thread pools take no more work
            future = concurrent.futures.Future()
            try:
                filesystems.put(path, data)
                future.set_result(None)
            except Exception as error:  # noqa: BLE001 - raised by `wait`, as the pool's would be
                future.set_exception(error)
        self._last[folder] = (future, path, data)

    def wait(self) -> None:
        failed = None
        for folder, (future, path, data) in list(self._last.items()):
            error = future.exception()
            if error is None:
                del self._last[folder]
                continue
            failed = failed or error
            self.put(folder, path, data)  # tried again by the next wait
        if failed is not None:
            raise failed

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


class _RunState:
    __slots__ = ("folder", "info", "group", "rows")

    def __init__(self, folder: str, info: dict[str, Any], group: _Group, rows: int = 0):
        self.folder = folder
        self.info = info
        self.group = group
        self.rows = rows  # written to batch files so far


class _Group:
    """The batch files of a group of runs, and their tables not written yet."""

    __slots__ = ("folder", "next_seq", "pending", "pending_rows", "uploads", "beat_at")

    def __init__(self, folder: str, next_seq: int):
        self.folder = folder
        self.next_seq = next_seq
        self.beat_at: float | None = None  # when this writer's heartbeat file was last written (time.monotonic)
        self.pending: dict[str, list[pa.Table]] = {}  # run id -> its tables, in arrival order
        self.pending_rows = 0
        # In a bucket: files made and not uploaded yet (path, bytes, rows per run), in order.
        self.uploads: collections.deque[tuple[str, pa.Buffer, dict[str, list[int]]]] = collections.deque()


# --- helpers ---------------------------------------------------------------------------
_TREES = TREES_METADATA.encode()


def _joinable(table: pa.Table, first: pa.Table) -> bool:
    """Whether `table` can share a file with `first` and the tables after it:
    one schema, metadata but ``lox.trees`` included (the file lists the trees
    of all its tables, a key of several structures as ``"flat"``)."""
    a, b = table.schema, first.schema
    if _TREES in (a.metadata or {}) or _TREES in (b.metadata or {}):
        a, b = _without_trees(a), _without_trees(b)
    return a.equals(b, check_metadata=True)


def _without_trees(schema: pa.Schema) -> pa.Schema:
    return schema.with_metadata({k: v for k, v in (schema.metadata or {}).items() if k != _TREES})


def _check_name(name: str, what: str, hidden: tuple[str, ...] = (".",)) -> None:
    separators = {"/", "\\", os.sep, os.altsep} - {None}
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or ".." in name
        or name.startswith(hidden)
        or "\0" in name
        or any(s in name for s in separators)
    ):
        raise ValueError(
            f"{what} {name!r} cannot be a folder name: it must be a non-empty name without path separators "
            f"or '..' that does not start with {' or '.join(map(repr, hidden))}. lox generates safe run ids "
            "and groups; if you made the RunInfo yourself, use letters, digits, '-' and '_'."
        )


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


@functools.cache  # the installed version does not change; reading package metadata costs a file read per run
def _lox_version() -> str | None:
    try:
        return importlib.metadata.version("jax-lox")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree: _run.json is still worth writing
        return None


_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _strict_json(value: Any) -> Any:
    """`value` with its non-finite floats (anywhere in dicts, lists, NumPy
    values) as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``: JSON has
    no such numbers, and strict readers refuse Python's ``NaN``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else ("NaN" if math.isnan(value) else _NON_FINITE[value])
    if isinstance(value, dict):
        return {k: _strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict_json(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return _strict_json(value.tolist())  # NumPy and JAX scalars and arrays
    return value


def check_writable(folder: str, what: str) -> None:
    """Check that the local `folder` can be made and written, by making and
    removing a uniquely named hidden folder in the nearest part of its path that
    exists; `ValueError` naming `what` (e.g. "the parquet backend's folder"),
    the folder and why where that fails: refused when a backend is created,
    rather than losing every batch later. The folder itself is neither made nor
    removed (the backend makes it when it writes): a backend refused later in
    its creation leaves nothing behind, and processes or threads checking the
    same folder at once never remove one another's folders."""
    path = os.path.abspath(folder)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    try:
        if not os.path.isdir(path):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
        os.rmdir(tempfile.mkdtemp(prefix=".lox-write-check-", dir=path))
    except OSError as e:
        raise ValueError(
            f"{what} {folder!r} cannot be written: {_why_unwritable(folder, e)}. "
            "Give a folder this process can write to."
        ) from e


def _why_unwritable(folder: str, error: OSError) -> str:
    path = folder
    while True:  # the nearest part of the path that exists
        if os.path.lexists(path):
            if not os.path.isdir(path):
                return f"a file is in the way: {path!r}"
            break
        up = os.path.dirname(path)
        if up == path:
            break
        path = up
    if error.errno == errno.EROFS:
        return "read-only file system"
    if error.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return (os.strerror(error.errno) if error.errno else str(error)).lower()


_HOST = socket.gethostname()
HEARTBEAT_PREFIX = "_alive-"
LEFTOVER_AGE = 600.0  # seconds after which a temporary file of an unknown writer is a leftover
_TEMP = re.compile(r"\.(?P<name>.+?)\.(?P<pid>\d+)@(?P<host>[^@/]+)\.tmp")


def temp_name(name: str) -> str:
    """The hidden name a file is written under before it is renamed to `name`;
    it names the writer (pid and host), so that its leftovers, after the
    writer was killed, can be told from files a live writer is writing."""
    return f".{name}.{os.getpid()}@{_HOST}.tmp"


def remove_leftovers(folder: str) -> None:
    """Remove the temporary files in `folder` that writers killed while writing
    left: those of a process of this host that is gone, and those of unknown
    writers older than `LEFTOVER_AGE`."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if not (entry.name.startswith(".") and entry.name.endswith(".tmp")):
            continue
        match = _TEMP.fullmatch(entry.name)
        try:
            if match is not None and match["host"] == _HOST:
                if process_alive(int(match["pid"])):
                    continue
            elif time.time() - entry.stat().st_mtime < LEFTOVER_AGE:
                continue
            os.remove(entry.path)
        except OSError:
            pass  # removed by another process meanwhile, or not ours to remove


@contextlib.contextmanager
def named_errors(path: str) -> Iterator[None]:
    """An OSError raised inside names `path` (pyarrow's and the OS's say "No space
    left on device" without saying where)."""
    try:
        yield
    except OSError as error:
        if error.filename is not None or path in str(error):
            raise
        named = OSError(error.errno, f"{error.strerror or error}", path)
        if error.errno is None:
            named = OSError(f"{error}: {path!r}")
        raise named from error


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


@hooks.hookimpl
def lox_backends():
    return [
        hooks.BackendSpec(
            "parquet",
            "lox_backends.parquet:ParquetBackend",
            description="one folder of append-only Parquet files per run (parquet:DIR, default lox-runs)",
            requires=("pyarrow",),
        )
    ]
