"""Writing runs in the run format (`lox_backends.runstore.layout`): `RunStoreWriter`.

A `RunStoreWriter` writes the runs it is handed into a folder of runs, local or
in a bucket: each run's ``_run.json``, and the tables of a group of runs (the
runs of one Logger, e.g. 1,024 vmapped seeds) as append-only batch files in the
group's batches folder, one file per `flush` (or once ``rows_per_file`` rows
wait), with its writer's heartbeat beside them. The ``parquet`` backend
(`lox_backends.parquet`) is one over its ``DIR``; a tracker's local log is one
too.

Every file is written under a hidden name (`temp_name`) and renamed into
place, so a reader never sees a partial file: reading a run while it is being
written, or after its writer was killed, shows whole flushes only (a killed
writer's hidden files are removed by the next writer of the folder,
`remove_leftovers`). `flush` (and `close_run`, `close`) also fsyncs what was
written, so that flushed batches survive a power loss too.

In a bucket (see `lox_backends.runstore.filesystems`), which has no rename and
no fsync, each file is uploaded whole under its final name, in one request (or
one multipart upload), which the store makes visible only once complete and
stored durably: the same guarantees, by other means. ``_run.json`` files are
uploaded a few at a time in the background (a thousand vmapped seeds open a
thousand runs) and waited for at every `flush`.

What follows the written files (a tracker sending from them) is a `LogListener`
of the writer, told of each run and each durable file.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import datetime
import functools
import importlib.metadata
import json
import math
import os
import secrets
import socket
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from lox_backends.plugin import hooks
from lox_backends.runstore import filesystems, layout
from lox_backends.runstore.reader import Writers, batch_files, footers, process_alive, read_run_json
from lox_backends.runstore.summary import Summary, of_table, rebuild
from lox_backends.runstore.table import index_table, read_index, run_row
from lox_core import schema
from lox_core.arrow import FLAT, scalars_only

LEFTOVER_AGE = 600.0  # seconds after which a temporary file of an unknown writer is a leftover
_HOST = socket.gethostname()


class LogListener:
    """What follows a `RunStoreWriter` (a tracker sending from its files) is
    told, in the writer's thread, in this order per run."""

    def run_opened(self, run: hooks.RunInfo, folder: str) -> None:
        """`open_run` wrote the run's folder."""

    def file_durable(self, run_id: str, path: str) -> None:
        """A batch file of the run is complete and fsynced."""

    def run_closed(self, run: hooks.RunInfo, folder: str) -> None:
        """The run finished; all its files are durable."""

    def log_closed(self) -> None:
        """The writer was closed; nothing more will come."""


class RunStoreWriter:
    """Writes runs into the folder of runs `root` (a local path made absolute, or
    the URI of a folder in a bucket, as `filesystems.resolve` gives it): a
    ``_run.json`` per run, and one batch file per flush for all the runs of a
    group in ``<group>.batches/`` (`lox_backends.runstore.layout`).

    Tables wait in memory until the next `flush`, or until `rows_per_file` rows
    of a group wait; files are written with Parquet's `compression` (one
    pyarrow takes: ``snappy``, ``zstd``, ``none``...). The writer's heartbeat
    is rewritten at every flush, and readers are told (in each ``_run.json``)
    to expect it every `heartbeat_every` seconds. An `OSError` (a full disk, a
    store that does not answer) leaves every table not written in memory, for
    the next `flush` or `close_run`. `listeners` are told of each run and
    durable file (`LogListener`).
    """

    def __init__(self, root: str, compression: str, rows_per_file: int):
        self.root = root
        self.remote = filesystems.is_uri(root)
        self.compression = compression
        self.rows_per_file = rows_per_file
        self.heartbeat_every = layout.DEFAULT_HEARTBEAT_EVERY  # a Logger sets its flush interval (ParquetBackend)
        self.listeners: list[LogListener] = []
        self._uploads = _Uploads() if self.remote else None
        self._existing: set[str] | None = None  # in a bucket: the folders there when the first run opened
        self._runs: dict[str, _RunState] = {}
        self._groups: dict[str, _BatchesFolder] = {}  # by folder name
        self._counted: dict[str, collections.Counter[str]] = {}  # by folder: runs' rows before resumes (`_resume`)
        self._unsynced_files: list[tuple[str, list[str]]] = []  # (path, its run ids)
        self._unsynced_dirs: set[str] = set()
        self._retry_at_flush = False  # a file could not be written: `write` leaves the next try to `flush`
        self._writer = secrets.token_hex(4)  # names this writer's heartbeat files

    def open_run(self, run: hooks.RunInfo) -> None:
        """Write the run's ``_run.json`` (status "running"; a run of the folder
        opened again keeps what its ``_run.json`` held), and the group's heartbeat."""
        state = self._state(run, write_info=False)
        state.info["status"] = "running"
        state.info.pop("ended", None)
        beat = state.group.beat_at
        # Once per group and heartbeat interval, not per run: 1,024 seeds opened at
        # once would cost 1,024 uploads to a bucket, one after the other.
        if beat is None or time.monotonic() - beat >= self.heartbeat_every:
            self._write_heartbeat(state.group)
        self._write_run_json(state)
        state.group.index_dirty = True  # the run's row: now for the group's first, else at the next flush
        index_at = state.group.index_at
        if index_at is None or time.monotonic() - index_at >= self.heartbeat_every:
            self._write_index(state.group)

    def write(self, run: hooks.RunInfo, table: pa.Table) -> None:
        """Keep `table` (lox's Arrow schema) for the run's group's next batch file."""
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
        for group in self._groups.values():
            if group.index_dirty:
                self._write_index(group)
        for group in {state.group.folder: state.group for state in self._runs.values()}.values():
            self._write_heartbeat(group)

    def summarize(self, run: hooks.RunInfo, values: dict[str, Any]) -> None:
        """Keep the run's summary values (`hooks.Backend.summarize`): in its
        group's runs index at the next flush, in ``_run.json`` when it ends."""
        state = self._state(run)
        self._summary(state).values.update(values)
        state.group.index_dirty = True

    def close_run(self, run: hooks.RunInfo) -> None:
        """Write the run's last tables and its end: its status ("failed" if the
        Logger says logs were lost), when, and how many rows it has."""
        state = self._state(run)
        try:
            if run.run_id in state.group.pending or state.group.uploads:
                self._write_pending(state.group)
            self._sync()
            state.info["status"] = run.status if run.status in ("finished", "failed", "killed") else "finished"
            state.info["ended"] = _now()
            state.info["rows"] = state.rows
            summary = self._summary(state)
            state.info["summary"] = summary.to_json()
            self._write_run_json(state)
            if self._uploads is not None and self.listeners:
                # A tracker following this log reads the run's summary from this _run.json
                # once told the run closed: in a bucket, only once its upload is complete.
                self._uploads.wait()
            del self._runs[run.run_id]
            self._index_rows(state.group)[run.run_id] = (run_row(state.info, summary), list(summary.values))
            state.group.index_dirty = True
            if not any(other.group is state.group for other in self._runs.values()):
                with contextlib.suppress(OSError):  # the run has ended all the same: the next flush writes it
                    self._write_index(state.group)  # its last open run: now (else at the flush that follows)
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
        """`flush`, then tell the listeners that nothing more will come."""
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
                if is_dir and name.endswith(layout.BATCHES_SUFFIX):
                    remove_leftovers(path)  # files a killed writer was writing
        folder = filesystems.join(self.root, run.run_id)
        filesystems.makedirs(folder)
        self._unsynced_dirs.add(self.root)
        batches = layout.batches_folder(run.group or run.run_id)
        _check_name(batches, "group", hidden=(".", "_"))  # Parquet dataset readers skip those
        if self.remote and self._existing is None:  # one listing, not a request per new run
            self._existing = {name for name, is_dir, _ in filesystems.scan(self.root, missing_ok=True) if is_dir}
        earlier = None
        if self._existing is None or run.run_id in self._existing:
            earlier = read_run_json(folder, missing_ok=True)
        if self._existing is not None:
            self._existing.add(run.run_id)
        info = earlier or {}
        resumed = run.resumed and earlier is not None
        group_name = run.group
        if resumed and isinstance(info.get("batches"), str):
            # Its rows so far are in its group's folder (one a run opened without a run id, or by
            # lox 0.2, has under its logger's group): it goes on there, else readers lose them.
            batches = info["batches"]
            group_name = info.get("group") or batches.removesuffix(layout.BATCHES_SUFFIX)
        info.update(
            run_id=run.run_id,
            name=run.name,
            group=group_name,
            index=run.index,
            metadata=_resumed_metadata(run, info.get("metadata")) if resumed else run.metadata,
            created=info.get("created") or _now(),
            lox_version=_lox_version(),
            status=info.get("status", "running"),
            batches=batches,
            host=_HOST,
            pid=os.getpid(),
            heartbeat={"file": f"{batches}/{layout.heartbeat_file(self._writer)}", "every": self.heartbeat_every},
        )
        group = self._group(batches)
        rows = self._resume(run, info, group) if resumed else int(info.get("rows") or 0)
        state = _RunState(folder, info, group, rows=rows)
        self._runs[run.run_id] = state
        try:
            if write_info and earlier is None:
                self._write_run_json(state)  # a batch without open_run still makes a loadable run
        finally:  # a tracker following this log learns of the run before its first file, whatever failed
            for listener in self.listeners:
                listener.run_opened(run, folder)
        return state

    def _resume(self, run: hooks.RunInfo, info: dict[str, Any], group: _BatchesFolder) -> int:
        """A resumed run's ``_run.json`` (`info`, as it was) goes on: the resume
        is listed (its ``from_step`` supersedes rows of the group's files so far,
        `layout.superseded_from`). Returns the rows the run has in those files:
        ``rows`` of a run that ended; of a killed one (no ``rows``), counted
        from the files' footers."""
        resumes = info.get("resumes")
        info["resumes"] = [*(resumes if isinstance(resumes, list) else []),
                           {"time": _now(), "from_step": run.from_step, "first_batch": group.next_seq}]
        rows = info.get("rows")
        if "ended" in info and isinstance(rows, int) and not isinstance(rows, bool):
            return rows
        return self._rows_written(group)[run.run_id]

    def _rows_written(self, group: _BatchesFolder) -> collections.Counter[str]:
        """Run id -> its rows in the group's batch files, read from their footers
        once per group (one listing; in a bucket, many files at once): what
        killed runs that are resumed have. A run this writer had open has its
        rows in its ``_run.json`` since it ended, so files written after this
        count need not be counted again."""
        counted = self._counted.get(group.folder)
        if counted is None:
            paths = [path for sequence, _, path in batch_files(group.folder, missing_ok=True)
                     if sequence < group.next_seq]
            counted = self._counted[group.folder] = collections.Counter()
            for metadata in footers(paths):
                for run_id, (_, rows) in json.loads(metadata.get(layout.RUNS_METADATA, b"{}")).items():
                    counted[run_id] += int(rows)
        return counted

    def _group(self, name: str) -> _BatchesFolder:
        group = self._groups.get(name)
        if group is None:
            folder = filesystems.join(self.root, name)
            filesystems.makedirs(folder)
            self._unsynced_dirs.add(self.root)
            # A group written to before (by this process or another) continues after its last file.
            sequences = [sequence for sequence, _, _ in batch_files(folder, missing_ok=self.remote)]
            group = self._groups[name] = _BatchesFolder(folder, next_seq=max(sequences, default=-1) + 1)
        return group

    def _write_pending(self, group: _BatchesFolder) -> None:
        """What arrived since the last file, as few files as possible: each run's
        tables in arrival order, runs one after the other, a new file only where
        the schema changes (a training loop's tables all have one). Tables whose
        keys hold different pytrees (``lox.trees``) share a file, which
        describes them all; a key that they give different structures (train
        steps logging ``{"m": {"loss": x}}``, eval steps ``{"m": {"acc": y}}``)
        is listed as ``"flat"`` (`lox_core.arrow.FLAT`), and read flat, as
        when its structure differs between files. Likewise the kinds of their
        keys (``lox.kinds``: images, video...) are listed together; a table
        that gives a key another kind or other options (a Logger refuses that
        within a run; runs of a group may differ) starts a new file."""
        self._send_uploads(group)  # files an earlier try made first, in order
        queue = [(run_id, table) for run_id, tables in group.pending.items() for table in tables]
        group.pending, group.pending_rows = {}, 0
        written = 0  # tables of `queue` in files
        try:
            part: list[tuple[str, pa.Table]] = []
            trees: dict[str, Any] = {}
            kinds: dict[str, Any] = {}
            parsed: dict[bytes, dict[str, Any]] = {}  # lox.trees / lox.kinds as tables hold them, parsed
            for run_id, table in queue:
                raw_kinds = (table.schema.metadata or {}).get(layout.KINDS_METADATA)
                these_kinds = {} if raw_kinds is None else (
                    parsed[raw_kinds] if raw_kinds in parsed else parsed.setdefault(raw_kinds, json.loads(raw_kinds)))
                clash = any(kinds.get(key, spec) != spec for key, spec in these_kinds.items())
                if part and (clash or not _joinable(table, part[0][1])):
                    self._write_file(group, part, trees, kinds)
                    written += len(part)
                    part, trees, kinds = [], {}, {}
                part.append((run_id, table))
                kinds.update(these_kinds)
                raw = (table.schema.metadata or {}).get(layout.TREES_METADATA)
                if raw is not None:
                    these = parsed[raw] if raw in parsed else parsed.setdefault(raw, json.loads(raw))
                    for key, tree in these.items():
                        trees[key] = tree if trees.get(key, tree) == tree else FLAT
            if part:
                self._write_file(group, part, trees, kinds)
                written += len(part)
        except BaseException:
            for run_id, table in queue[written:]:  # kept, in order, for the next try (nothing is lost)
                group.pending.setdefault(run_id, []).append(table)
                group.pending_rows += table.num_rows
            raise
        self._send_uploads(group)

    def _write_file(self, group: _BatchesFolder, part: list[tuple[str, pa.Table]], trees: dict[str, Any],
                    kinds: dict[str, Any]) -> None:
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
        metadata = {**(table.schema.metadata or {}), layout.TIME_METADATA: str(int(time.time() * 1000)).encode(),
                    layout.RUNS_METADATA: json.dumps(rows).encode()}
        if trees:  # the structures of every table's keys
            metadata[layout.TREES_METADATA] = json.dumps(trees).encode()
        if kinds:  # the kinds of every table's keys (images, video...)
            metadata[layout.KINDS_METADATA] = json.dumps(kinds).encode()
        if scalars_only(table):
            metadata[layout.SCALARS_METADATA] = b"1"  # lox.load then skips the shape and data columns
        summaries = of_table(table)  # each run's summary of this file: its footer, and the running summaries
        footer = {layout.SUMMARY_METADATA: json.dumps(_strict_json(summaries), allow_nan=False).encode()}
        table = table.replace_schema_metadata(metadata)
        name = layout.batch_file(group.next_seq, secrets.token_hex(4))
        path = filesystems.join(group.folder, name)
        if self.remote:  # the whole file in memory, then one upload: never visible in part
            sink = pa.BufferOutputStream()
            write_table(table, sink, compression=self.compression, footer=footer)
            # Uploaded by `_send_uploads`, under this name whatever happens: an upload lox
            # stopped waiting for may still land, and its retry then writes the same object.
            group.uploads.append((path, sink.getvalue(), rows))
            group.next_seq += 1
            self._summarized(group, summaries)
            return
        temp = os.path.join(group.folder, temp_name(name))
        try:
            with named_errors(path):
                write_table(table, temp, compression=self.compression, footer=footer)
                os.replace(temp, path)
        except BaseException:
            _remove_quietly(temp)
            raise
        self._unsynced_dirs.add(group.folder)
        group.next_seq += 1
        self._summarized(group, summaries)
        self._written(path, rows)

    def _summarized(self, group: _BatchesFolder, summaries: dict[str, dict[str, Any]]) -> None:
        """A file of the group is written (or, for a bucket, made: uploaded
        under that name whatever happens): its runs' summaries go on."""
        for run_id, part in summaries.items():
            state = self._runs.get(run_id)
            if state is not None:
                self._summary(state).add(part)
        group.index_dirty = True

    def _summary(self, state: _RunState) -> Summary:
        """The run's running summary; a resumed run's goes on from its group's
        earlier files (`summary.rebuild`, once for all the runs of the group
        resumed by one `init`) and its earlier values."""
        if state.summary is not None:
            return state.summary
        resumes = state.info.get("resumes")
        if not resumes:
            state.summary = Summary()
            return state.summary
        before = resumes[-1]["first_batch"]
        waiting = {run_id: other for run_id, other in self._runs.items() if other.group is state.group
                   and other.summary is None and other.info.get("resumes")
                   and other.info["resumes"][-1]["first_batch"] == before}
        resumes = {run_id: other.info["resumes"] for run_id, other in waiting.items()}
        rebuilt = rebuild(state.group.folder, before, resumes, remote=self.remote)
        carried = self._index_rows(state.group)
        for run_id, other in waiting.items():
            summary = other.summary = rebuilt[run_id]
            stored = Summary.from_json(other.info.get("summary")).values  # the values of a run that ended
            if not stored and run_id in carried:  # of a killed run: as its group's index last held them
                row, names = carried[run_id]
                stored = {name: row[name] for name in names if name in row}
            summary.values.update(stored)
        return state.summary  # type: ignore[return-value]  # set above: `state` is waiting

    def _index_rows(self, group: _BatchesFolder) -> dict[str, tuple[dict[str, Any], list[str]]]:
        """Run id -> (row, its value names) of the group's runs that are not open
        in this writer: those of the index the group had (runs of earlier
        writers, read once; one still "running" whose writer is gone is
        "killed"), and those this writer closed."""
        if group.index_rows is None:
            group.index_rows = {}
            found = read_index(filesystems.join(group.folder, layout.RUNS_INDEX))
            if found is not None:
                rows, values, writer = found
                writers = Writers()
                for row in rows:
                    if row.get("status") == "running":
                        start = row.get("start")
                        info = {**writer, "status": "running",
                                "created": start.isoformat() if isinstance(start, datetime.datetime) else None}
                        row["status"] = writers.status(filesystems.join(self.root, str(row["run_id"])), info)
                    group.index_rows[str(row["run_id"])] = (row, list(values.get(row["run_id"], [])))
        return group.index_rows

    def _write_index(self, group: _BatchesFolder) -> None:
        """The group's runs index (`layout.RUNS_INDEX`), replaced whole: its runs
        closed or from earlier writers, and those open now, as of now."""
        rows = dict(self._index_rows(group))
        for run_id, state in self._runs.items():
            if state.group is group:
                summary = self._summary(state)
                rows[run_id] = (run_row(state.info, summary), list(summary.values))
        batches = filesystems.basename(group.folder)
        writer = {"host": _HOST, "pid": os.getpid(), "heartbeat": {
            "file": f"{batches}/{layout.heartbeat_file(self._writer)}", "every": self.heartbeat_every}}
        table = index_table([row for row, _ in rows.values()],
                            {run_id: names for run_id, (_, names) in rows.items() if names}, writer)
        path = filesystems.join(group.folder, layout.RUNS_INDEX)
        if self.remote:
            sink = pa.BufferOutputStream()
            pq.write_table(table, sink)
            filesystems.put(path, sink.getvalue())
        else:
            temp = os.path.join(group.folder, temp_name(layout.RUNS_INDEX))
            try:
                with named_errors(path):
                    pq.write_table(table, temp)
                    os.replace(temp, path)
            except BaseException:
                _remove_quietly(temp)
                raise
            self._unsynced_files.append((path, []))
            self._unsynced_dirs.add(group.folder)
        group.index_dirty = False
        group.index_at = time.monotonic()

    def _send_uploads(self, group: _BatchesFolder) -> None:
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
        path = filesystems.join(state.folder, layout.RUN_FILE)
        # NumPy and JAX values are plain JSON by then; anything else is shown as its str.
        text = json.dumps(_strict_json(state.info), indent=2, allow_nan=False, default=str)
        if self._uploads is not None:  # in the background, after the run's previous one
            self._uploads.put(state.folder, path, (text + "\n").encode())
            return
        temp = os.path.join(state.folder, temp_name(f"{layout.RUN_FILE}.{secrets.token_hex(4)}"))
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
        filesystems.fsync(state.folder)

    def _write_heartbeat(self, group: _BatchesFolder) -> None:
        """``<group>.batches/_alive-<writer>.json``: when this writer last said it
        is alive (`lox_backends.runstore.reader.run_status` reads a run as "killed" when
        this is older than 3 flush intervals, or the process is gone)."""
        path = filesystems.join(group.folder, layout.heartbeat_file(self._writer))
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
            filesystems.fsync(path)
        for folder in self._unsynced_dirs:
            filesystems.fsync(folder)  # makes the renames durable
        durable, self._unsynced_files = self._unsynced_files, []
        self._unsynced_dirs.clear()
        for path, run_ids in durable:
            for run_id in run_ids:
                for listener in self.listeners:
                    listener.file_durable(run_id, path)


def write_table(table: pa.Table, where: str | pa.NativeFile, compression: str = "snappy",
                footer: dict[bytes, bytes] | None = None) -> None:
    """Write a table of lox's schema as Parquet, as batch files are written:
    dictionary-encoded where values repeat (run, key, dtype), plain elsewhere
    (a float's or a step's dictionary costs more than it saves), and statistics
    only for the columns readers filter on (run, key, the steps, value).
    `footer`: key-value metadata of the Parquet file only (``lox.summary``),
    not of the table's Arrow schema, which Parquet stores twice."""
    with pq.ParquetWriter(
        where,
        table.schema,
        compression=compression,
        # pyarrow's annotations say bool; its documentation (and code) take column names too.
        use_dictionary=["run", "key", "dtype"],  # pyright: ignore[reportArgumentType]
        write_statistics=["run", "key", *schema.step_names(table), "value"],  # pyright: ignore[reportArgumentType]
    ) as writer:
        writer.write_table(table)
        if footer:
            writer.add_key_value_metadata(footer)


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
    __slots__ = ("folder", "info", "group", "rows", "summary")

    def __init__(self, folder: str, info: dict[str, Any], group: _BatchesFolder, rows: int = 0):
        self.folder = folder
        self.info = info
        self.group = group
        self.rows = rows  # written to batch files so far
        self.summary: Summary | None = None  # its running summary (`RunStoreWriter._summary`)


class _BatchesFolder:
    """The batch files of a group of runs, and their tables not written yet."""

    __slots__ = ("folder", "next_seq", "pending", "pending_rows", "uploads", "beat_at", "index_rows", "index_dirty",
                 "index_at")

    def __init__(self, folder: str, next_seq: int):
        self.folder = folder
        self.next_seq = next_seq
        self.beat_at: float | None = None  # when this writer's heartbeat file was last written (time.monotonic)
        self.pending: dict[str, list[pa.Table]] = {}  # run id -> its tables, in arrival order
        self.pending_rows = 0
        # In a bucket: files made and not uploaded yet (path, bytes, rows per run), in order.
        self.uploads: collections.deque[tuple[str, pa.Buffer, dict[str, list[int]]]] = collections.deque()
        # The runs index: rows of runs not open in this writer (None: the earlier index not read yet),
        # whether it changed since written, and when it was last written (time.monotonic).
        self.index_rows: dict[str, tuple[dict[str, Any], list[str]]] | None = None
        self.index_dirty = False
        self.index_at: float | None = None


# --- helpers ---------------------------------------------------------------------------
def _joinable(table: pa.Table, first: pa.Table) -> bool:
    """Whether `table` can share a file with `first` and the tables after it:
    one schema, metadata but ``lox.trees`` and ``lox.kinds`` included (the
    file lists the trees and kinds of all its tables, a key of several
    structures as ``"flat"``)."""
    a, b = table.schema, first.schema
    merged = (layout.TREES_METADATA, layout.KINDS_METADATA)
    if any(name in (a.metadata or {}) or name in (b.metadata or {}) for name in merged):
        a, b = _without(a, merged), _without(b, merged)
    return a.equals(b, check_metadata=True)


def _without(schema: pa.Schema, names: tuple[bytes, ...]) -> pa.Schema:
    return schema.with_metadata({k: v for k, v in (schema.metadata or {}).items() if k not in names})


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


def _resumed_metadata(run: hooks.RunInfo, earlier: Any) -> dict[str, Any]:
    """A resumed run keeps its metadata: what `init` gives now adds keys, and a
    value it changes is warned about and not taken (the run's steps so far were
    made with the earlier one; trackers such as MLflow keep a param's first value too)."""
    earlier = earlier if isinstance(earlier, dict) else {}
    now = json.loads(json.dumps(_strict_json(run.metadata), default=str))  # as _run.json holds it
    changed = [key for key in now if key in earlier and earlier[key] != now[key]]
    if changed:
        shown = ", ".join(f"{key}={now[key]!r} (it was {earlier[key]!r})" for key in changed[:3])
        warnings.warn(
            f"lox: run {run.name!r} was resumed with other metadata than it was opened with: {shown}"
            f"{' and more' if len(changed) > 3 else ''}. The run keeps its earlier values: start a new run "
            "(another run_id) to train with other settings.", RuntimeWarning, stacklevel=2)
    return {**now, **earlier}


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


# --- files being written -----------------------------------------------------------------
def temp_name(name: str) -> str:
    """The hidden name (`layout.temp_name`) this process writes a file under before
    it is renamed to `name`; it names the writer (pid and host), so that its
    leftovers, after the writer was killed, can be told from files a live writer
    is writing."""
    return layout.temp_name(name, os.getpid(), _HOST)


def remove_leftovers(folder: str) -> None:
    """Remove the temporary files in `folder` that writers killed while writing
    left: those of a process of this host that is gone, and those of unknown
    writers older than `LEFTOVER_AGE`."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if not layout.is_temp(entry.name):
            continue
        match = layout.TEMP_FILE.fullmatch(entry.name)
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
