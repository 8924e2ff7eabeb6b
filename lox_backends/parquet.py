"""The ``parquet`` backend: every run is a folder of Parquet files, written append-only.

Config string ``parquet:DIR?compression=snappy&rows_per_file=262144``
(``parquet`` alone writes into ``lox-runs``). Batches and tapped events wait in
memory until the next `flush` (the Logger flushes every few seconds and when a
run finishes) or until `rows_per_file` rows wait, then become one file. The
layout on disk::

    DIR/
      <run_id>/                        one folder per run
        _run.json                      run_id, name, group, index, metadata,
                                       created (ISO-8601, UTC), lox_version,
                                       status ("running", then "finished" with ended)
        batch-000000-3f9c01ab.parquet  one file per flush, never modified again
        batch-000001-b72e5d10.parquet
        ...

Each batch file holds the long-form table of ``lox_core.arrow`` (one row per
event of a key: ``run``, ``key``, one int64 column per step name, ``value``,
``dtype``, ``shape``, ``data``). Files are ordered by their sequence number; the
eight random hex digits keep two writers apart that would otherwise pick the
same name. Keys are data inside the tables and never become file names.

Each file's schema metadata also holds ``lox.time_ms``, when it was written
(Unix milliseconds): the timestamp trackers give its values (lox_backends.tracker).

Every file is written under a hidden name (starting with ``.``) and renamed into
place, so a reader never sees a partial file: reading a run while it is being
written, or after its writer was killed, shows whole flushes only. `flush` (and
`close_run`, `close`) also fsyncs what was written, so that flushed batches
survive a power loss too.

`load` reads a run, or every run of a folder, back into logdicts. Any Parquet
reader can read the files directly (the metadata file starts with ``_``, which
Parquet dataset readers skip, so whole folders read too)::

    pandas.read_parquet("DIR/<run_id>")            # or "DIR": every run
    polars.read_parquet("DIR/<run_id>/batch-*.parquet")
    duckdb.sql("SELECT * FROM 'DIR/*/batch-*.parquet' WHERE key = 'loss'")

This module imports pyarrow (and lox's core) only when it is used, so that
listing backends stays cheap.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import secrets
from typing import TYPE_CHECKING, Any

from lox_backends import hooks

if TYPE_CHECKING:
    import pyarrow as pa

    from lox_core.logdict import logdict

DEFAULT_DIR = "lox-runs"
RUN_FILE = "_run.json"
DEFAULT_ROWS_PER_FILE = 262_144  # batches are kept until a flush, or until this many rows wait
TIME_METADATA = b"lox.time_ms"  # when a batch file was written (Unix ms): the time trackers give its values
_BATCH = re.compile(r"batch-(\d+)-([0-9a-f]{8})\.parquet")


class ParquetBackend(hooks.Backend):
    """Writes each run into ``DIR/<run_id>/`` as append-only Parquet batch files.

    `target` is the folder (``lox-runs`` when None), resolved against the
    current directory when the backend is created. Option ``compression``
    (``snappy`` by default; ``zstd``, ``gzip``, ``none``, ...) is passed to
    Parquet.
    """

    def __init__(self, target: str | None = None, options: dict[str, str] | None = None):
        super().__init__(target, options)
        self.check_options(
            "parquet",
            {"compression": "snappy, zstd, gzip, none...", "rows_per_file": "rows that wait before a file is written"},
            "parquet:runs?compression=zstd&rows_per_file=100000",
        )
        self.compression = self.options.get("compression", "snappy")
        self.rows_per_file = int(self.options.get("rows_per_file", DEFAULT_ROWS_PER_FILE))
        # Imported in the thread that creates the backend: a first import in the
        # writer thread while the interpreter exits (flushing) would fail.
        import pyarrow.parquet  # noqa: F401

        # Absolute now, so that a later os.chdir does not split a run in two.
        self.root = os.path.abspath(target or DEFAULT_DIR)
        self._runs: dict[str, _RunState] = {}
        self._unsynced_files: list[tuple[str, str]] = []  # (path, run_id)
        self._unsynced_dirs: set[str] = set()
        # Called with (run_id, path) for every batch file, once it is durable
        # (trackers send from here: lox_backends.tracker).
        self.on_durable: list = []

    # --- the backend contract ------------------------------------------------------
    def open_run(self, run: hooks.RunInfo) -> None:
        state = self._state(run, write_info=False)
        state.info["status"] = "running"
        state.info.pop("ended", None)
        self._write_run_json(state)

    def write_batch(self, run: hooks.RunInfo, table: "pa.Table") -> None:
        state = self._state(run)
        state.pending.append(table)
        state.pending_rows += table.num_rows
        if state.pending_rows >= self.rows_per_file:
            self._write_pending(state)

    def write_event(self, run: hooks.RunInfo, event: "logdict") -> None:
        import numpy as np

        state = self._state(run)
        # A copy: the callback's arrays may be views of buffers that are reused.
        state.pending.append(event.map_series(np.array))
        state.pending_rows += 1
        if state.pending_rows >= self.rows_per_file:
            self._write_pending(state)

    def write_events(self, run: hooks.RunInfo, events: "logdict") -> None:
        import numpy as np

        state = self._state(run)
        state.pending.append(events.map_series(np.array))  # a block of events: one item
        from lox_core.logdict import event_count

        state.pending_rows += max(map(event_count, events.values()), default=0)
        if state.pending_rows >= self.rows_per_file:
            self._write_pending(state)

    def flush(self) -> None:
        for state in self._runs.values():
            self._write_pending(state)
        self._sync()

    def close_run(self, run: hooks.RunInfo) -> None:
        state = self._state(run)
        self._write_pending(state)
        self._sync()
        state.info["status"] = "finished"
        state.info["ended"] = _now()
        self._write_run_json(state)
        del self._runs[run.run_id]

    def close(self) -> None:
        self.flush()

    # --- writing -------------------------------------------------------------------
    def _state(self, run: hooks.RunInfo, write_info: bool = True) -> _RunState:
        state = self._runs.get(run.run_id)
        if state is not None:
            return state
        _check_run_id(run.run_id)
        folder = os.path.join(self.root, run.run_id)
        os.makedirs(folder, exist_ok=True)
        self._unsynced_dirs.add(self.root)
        info = _read_run_json(folder, missing_ok=True) or {}
        info.update(
            run_id=run.run_id,
            name=run.name,
            group=run.group,
            index=run.index,
            metadata=run.metadata,
            created=info.get("created") or _now(),
            lox_version=_lox_version(),
            status=info.get("status", "running"),
        )
        # A run reopened (or written by a second process) continues after its last file.
        seqs = [seq for seq, _, _ in _batch_files(folder)]
        state = _RunState(folder, info, next_seq=max(seqs, default=-1) + 1)
        self._runs[run.run_id] = state
        if write_info and not os.path.exists(os.path.join(folder, RUN_FILE)):
            self._write_run_json(state)  # a batch without open_run still makes a loadable run
        return state

    def _write_pending(self, state: _RunState) -> None:
        """What arrived since the last file, in arrival order, as few files as
        possible: one per run of batches with the same schema (a training loop's
        batches all have one), tapped events converted together."""
        import pyarrow as pa

        from lox_core.arrow import to_arrow
        from lox_core.logdict import concat, logdict

        pending, state.pending, state.pending_rows = state.pending, [], 0
        tables: list = []
        for item in pending:
            if isinstance(item, logdict):
                if tables and isinstance(tables[-1], list):
                    tables[-1].append(item)
                else:
                    tables.append([item])
            else:
                tables.append(item)
        # A part that fails (e.g. tapped events whose key changed dtype) is
        # reported; every other part is still written.
        failed = None
        converted = []
        for t in tables:
            try:
                converted.append(to_arrow(concat(t), run=state.info["run_id"]) if isinstance(t, list) else t)
            except ValueError as error:
                failed = failed or error
        group: list = []
        for table in converted:
            if group and not table.schema.equals(group[0].schema, check_metadata=True):
                self._write_table(state, pa.concat_tables(group))
                group = []
            group.append(table)
        if group:
            self._write_table(state, pa.concat_tables(group))
        if failed is not None:
            raise failed

    def _write_table(self, state: _RunState, table: "pa.Table") -> None:
        import pyarrow.parquet as pq

        if table.num_rows == 0 and not json.loads((table.schema.metadata or {}).get(b"lox.empty_series", b"{}")):
            return  # nothing to keep (a table without rows may still name series with no events)
        import time

        # When the batch was written: the timestamp trackers give its values,
        # the same each time it is sent.
        metadata = {**(table.schema.metadata or {}), TIME_METADATA: str(int(time.time() * 1000)).encode()}
        table = table.replace_schema_metadata(metadata)
        name = f"batch-{state.next_seq:06d}-{secrets.token_hex(4)}.parquet"
        state.next_seq += 1
        path = os.path.join(state.folder, name)
        temp = os.path.join(state.folder, f".{name}.tmp")
        try:
            pq.write_table(table, temp, compression=self.compression)
            os.replace(temp, path)
        except BaseException:
            _remove_quietly(temp)
            raise
        self._unsynced_files.append((path, state.info["run_id"]))
        self._unsynced_dirs.add(state.folder)

    def _write_run_json(self, state: _RunState) -> None:
        path = os.path.join(state.folder, RUN_FILE)
        temp = os.path.join(state.folder, f".{RUN_FILE}.{secrets.token_hex(4)}.tmp")
        text = json.dumps(state.info, indent=2, default=_json_default)
        try:
            with open(temp, "w", encoding="utf-8") as f:
                f.write(text + "\n")
                f.flush()
                os.fsync(f.fileno())  # small, and what makes the folder a run: always durable
            os.replace(temp, path)
        except BaseException:
            _remove_quietly(temp)
            raise
        fsync(state.folder)

    def _sync(self) -> None:
        for path, _ in self._unsynced_files:
            fsync(path)
        for folder in self._unsynced_dirs:
            fsync(folder)  # makes the renames durable
        durable, self._unsynced_files = self._unsynced_files, []
        self._unsynced_dirs.clear()
        for path, run_id in durable:
            for listener in self.on_durable:
                listener(run_id, path)


class _RunState:
    __slots__ = ("folder", "info", "next_seq", "pending", "pending_rows")

    def __init__(self, folder: str, info: dict[str, Any], next_seq: int):
        self.folder = folder
        self.info = info
        self.next_seq = next_seq
        self.pending: list = []  # tables and tapped events not written yet, in arrival order
        self.pending_rows = 0


# --- reading -------------------------------------------------------------------------
def load(path: str | os.PathLike) -> "logdict | dict[str, logdict]":
    """Read runs written by the parquet backend back into logdicts.

    `path` is a run folder (one holding ``_run.json``): its logdict is returned,
    every batch in order. Or `path` is a folder of run folders (the ``DIR`` of
    ``parquet:DIR``): a dict ``{run_id: logdict}`` is returned, ordered by the
    runs' creation times. Files still being written are skipped, so a run can
    be read while it is written.

    >>> import tempfile, numpy as np, lox
    >>> from lox_backends import hooks, parquet
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     backend = parquet.ParquetBackend(folder)
    ...     run = hooks.RunInfo("run-0", name="demo", group="g")
    ...     backend.open_run(run)
    ...     for step in range(3):
    ...         event = lox.logdict({"loss": np.array([1.0 / (step + 1)])},
    ...                             steps={"step": {"loss": np.array([step])}})
    ...         backend.write_event(run, event)
    ...     backend.close_run(run)
    ...     logs = parquet.load(folder + "/run-0")
    ...     everything = parquet.load(folder)
    >>> logs["loss"].tolist(), logs.step["loss"].tolist()
    ([1.0, 0.5, 0.3333333333333333], [0, 1, 2])
    >>> list(everything)
    ['run-0']
    """
    single, folders = _locate(path)
    if single:
        return _load_run(folders[0][0])
    return {os.path.basename(folder): _load_run(folder) for folder, _ in folders}


def runs(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The ``_run.json`` contents of the runs at `path` (a run folder or a folder of
    them), ordered by creation time: for listing runs without reading their data.

    >>> import tempfile
    >>> from lox_backends import hooks, parquet
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     backend = parquet.ParquetBackend(folder)
    ...     backend.open_run(hooks.RunInfo("run-0", name="demo", group="g", metadata={"lr": 0.1}))
    ...     [(r["run_id"], r["name"], r["metadata"], r["status"]) for r in parquet.runs(folder)]
    [('run-0', 'demo', {'lr': 0.1}, 'running')]
    """
    return [info for _, info in _locate(path)[1]]


def _locate(path) -> tuple[bool, list[tuple[str, dict[str, Any]]]]:
    """Whether `path` is one run, and its run folders with their _run.json, oldest first."""
    path = os.fspath(path)
    expected = (
        "expected a run folder (holding _run.json) or a folder of run folders "
        "(the DIR of a 'parquet:DIR' backend)"
    )
    if not os.path.exists(path):
        raise FileNotFoundError(f"no such folder: {path!r}; {expected}.")
    if not os.path.isdir(path):
        raise ValueError(f"{path!r} is a file; {expected}.")
    info = _read_run_json(path, missing_ok=True)
    if info is not None:
        return True, [(path, info)]
    found = []
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            info = _read_run_json(entry.path, missing_ok=True)
            if info is not None:  # a folder without _run.json is not a run (or not yet one)
                found.append((entry.path, info))
    if not found:
        raise ValueError(f"no lox runs in {path!r}: {expected}.")
    found.sort(key=lambda item: (_created(item[1]), os.path.basename(item[0])))
    return False, found


def _load_run(folder: str) -> "logdict":
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lox_core.arrow import from_arrow
    from lox_core.logdict import concat, logdict

    parts = []
    for _, _, path in _batch_files(folder):
        try:
            table = pq.read_table(path)
        except (OSError, pa.ArrowException) as e:
            raise ValueError(
                f"cannot read {path!r} ({e}). Batch files are renamed into place only once "
                "whole, so this one was damaged after it was written (for example by a power "
                "loss before the run was flushed); move it out of the folder to read the rest."
            ) from e
        # One batch at a time: each file's schema metadata (step dtypes, empty series)
        # describes that file only, and would be lost by concatenating the tables first.
        parts.append(from_arrow(table))
    return concat(parts) if parts else logdict()


def _batch_files(folder: str) -> list[tuple[int, str, str]]:
    """(sequence, name, path) of the batch files of a run, in order; temp files are hidden."""
    files = []
    with os.scandir(folder) as entries:
        for entry in entries:
            match = _BATCH.fullmatch(entry.name)
            if match:
                files.append((int(match.group(1)), entry.name, entry.path))
    files.sort()
    return files


def _read_run_json(folder: str, missing_ok: bool = False) -> dict[str, Any] | None:
    path = os.path.join(folder, RUN_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        if missing_ok:
            return None
        raise
    try:
        info = json.loads(text)
        if not isinstance(info, dict):
            raise ValueError("not a JSON object")
    except ValueError as e:
        raise ValueError(f"{path!r} is not a lox _run.json ({e}); lox writes it as a JSON object.") from e
    return info


def _created(info: dict[str, Any]) -> datetime.datetime:
    try:
        created = datetime.datetime.fromisoformat(info["created"])
    except (KeyError, TypeError, ValueError):
        return datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)
    if created.tzinfo is None:
        created = created.replace(tzinfo=datetime.timezone.utc)
    return created


# --- helpers ---------------------------------------------------------------------------
def _check_run_id(run_id: str) -> None:
    separators = {"/", "\\", os.sep, os.altsep} - {None}
    if (
        not isinstance(run_id, str)
        or run_id in ("", ".", "..")
        or ".." in run_id
        or run_id.startswith(".")
        or "\0" in run_id
        or any(s in run_id for s in separators)
    ):
        raise ValueError(
            f"run_id {run_id!r} cannot be a run folder name: it must be a non-empty name without "
            "path separators or '..' that does not start with '.'. lox generates safe run ids; "
            "if you made the RunInfo yourself, use letters, digits, '-' and '_'."
        )


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def _lox_version() -> str | None:
    try:
        import lox

        return lox.__version__
    except Exception:  # _run.json is still worth writing without it
        return None


def _json_default(value):
    # NumPy and JAX scalars and arrays in metadata become plain JSON values.
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def fsync(path: str) -> None:
    """Flush a file, or a folder's entries (renames into it), to disk."""
    if os.name == "nt" and os.path.isdir(path):  # folders cannot be opened for fsync there
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
