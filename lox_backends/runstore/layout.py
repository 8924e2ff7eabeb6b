"""The run format: every file and folder name, and every metadata key, of a folder of lox runs.

A folder of runs (``DIR``) is what a ``parquet:DIR`` backend and a tracker's
local log write (`lox_backends.runstore.writer`), what `lox.load`, ``lox runs``
and ``lox sync`` read (`lox_backends.runstore.reader`), and where trackers
record what they were sent (`lox_backends.runstore.sent`). This module names
what is in it; the other modules take the names from here.

Folder
------
::

    DIR/                                    DEFAULT_DIR ("lox-runs") where none is given
      <run_id>/                             one folder per run (a run id never starts with ".")
        _run.json                           RUN_FILE: the run (below); a folder without one is no run
        _sent-<tracker>-<hash>.jsonl        `sent_record`: what of the run reached a tracker (below)
        _sending-<tracker>-<hash>.lock      `sending_lock`: held by the process sending the run there
        batch-000000-3f9c01ab.parquet       rows of the run, as lox before 0.2 wrote them (one run per file)
      <group>.batches/                      `batches_folder`: the rows of the runs one Logger opened
                                            (e.g. 1,024 vmapped seeds); a group never starts with "." or "_"
        batch-000000-3f9c01ab.parquet       `batch_file` (`BATCH_FILE`): one file per flush, never modified
        batch-000001-b72e5d10.parquet       again; the sequence number orders them, the eight random hex
        ...                                 digits keep apart two writers that would pick the same name
        _alive-<writer>.json                `heartbeat_file`: the writer's heartbeat (below)
        _runs.parquet                       RUNS_INDEX: the group's runs, one row each (below)
      .<name>.<pid>@<host>.tmp              `temp_name`: a file being written, in any of these folders,
                                            renamed to <name> once whole (names its writer: a killed
                                            writer's are told from a live one's, `TEMP_FILE`)

Names starting with ``.`` or ``_`` are not batch files: readers skip them (Parquet
dataset readers too), and skip folders starting with ``.``.

``DIR`` is a local folder or a folder in a bucket (``s3://bucket/runs``), with the
same names; there, files are uploaded whole under their final name (no temp
names: a filesystem without atomic uploads, fsspec's others or HDFS, moves
`upload_temp_name` into place instead), and a sent record is a folder.

``_run.json``
-------------
A JSON object (non-finite floats written as the strings ``"NaN"``,
``"Infinity"``, ``"-Infinity"``)::

    run_id       the name of its folder
    name         the run's name (``demo-0``)
    group        the Logger's group of runs (its runs' batches folder is named after it)
    index        the run's index in its group
    metadata     what ``logger.init(**metadata)`` was given
    created      when it was opened: ISO-8601, UTC
    lox_version  the lox that wrote it (null from a source tree)
    status       "running", then "finished" (everything logged was written), "failed"
                 (logs lost, or an error) or "killed" (SIGTERM ended the process, e.g. a
                 preemption: everything logged was written; `lox_backends.logger.shutdown`);
                 readers report a "running" run whose writer is gone as "killed" too
    batches      where its rows are: "<group>.batches", relative to DIR (absent: lox 0.1,
                 its rows in its own folder)
    host, pid    its writer's host and process
    heartbeat    {"file": "<group>.batches/_alive-<writer>.json" (relative to DIR),
                  "every": seconds between heartbeats}
    rows         once it ends: how many rows it has in its batch files, superseded ones
                 included (a reader refuses a run with fewer: files were deleted)
    ended        once it ends: when, ISO-8601, UTC
    resumes      once it was resumed (``logger.init(run_id=..., resume=...)``), a list,
                 oldest first, of {"time": ISO-8601, "from_step": N or null,
                 "first_batch": the sequence number of the first batch file written after
                 that resume}; see "Resumed runs"
    summary      once it ends: {"keys": {series: {"last", "min", "max", "count"}},
                 "values": {name: value}}: of each series of scalars (rows with a
                 ``value``), its last value, least and greatest (NaN ignored; null when
                 every value is NaN) and how many events it has, superseded rows
                 excluded; and the values given by ``logger.summary``. While the run is
                 open, the group's index holds it as of the last flush

Keys lox does not know are kept: a run opened again (in a group written to
before) keeps its ``created`` and its earlier keys.

Batch files
-----------
Parquet files holding a table in lox's Arrow schema (`lox_core.arrow`, whose
docstring specifies the columns and the schema metadata of a table) with the
rows of every run of the group that logged since the previous flush, each run's
rows together. Their schema metadata also holds, JSON values::

    lox.time_ms  TIME_METADATA: when the file was written (Unix milliseconds), the
                 timestamp trackers give its values
    lox.runs     RUNS_METADATA: run id -> [first row, rows] of each run in the file
    lox.scalars  SCALARS_METADATA: "1" when every row holds a scalar in ``value``
                 (readers then skip the ``shape`` and ``data`` columns)
    lox.summary  SUMMARY_METADATA: run id -> {"keys": {series: [count, min, max, last]},
                 "steps": [least, greatest step] or null}: the scalar series of each
                 run in the file (min/max null where all are NaN) and the range of its
                 ``step`` column, so that a resumed run's summary is rebuilt from
                 file footers (`lox_backends.runstore.summary`). Only in the Parquet
                 footer's key-value metadata (``pyarrow.parquet.read_metadata``), not
                 in the Arrow schema, which Parquet would store a second time
    lox.trees    TREES_METADATA (`lox_core.arrow`'s, the key of a table): the pytree
                 structures of the keys of every table written into the file; a key
                 they give different structures is listed as "flat"
    lox.kinds    KINDS_METADATA (`lox_core.arrow`'s, the key of a table): the kind and
                 options of the keys logged as images, video, audio or histograms, of
                 every table written into the file (tables that give a key different
                 kinds or options go into different files)

Resumed runs
------------
A run opened again under its id continues its folder and its group's batches
folder (whose files go on numbering after the last). Each resume appends to
``resumes`` in ``_run.json``. One with a ``from_step`` N supersedes the rows of
the run, in batch files numbered below its ``first_batch``, whose ``step``
column holds N or more (rows without a ``step`` are kept):
readers leave them out (`superseded_from` gives the cut of a file). So a job
killed at step 151 and restarted from its checkpoint of step 100 with
``from_step=100`` reads every step once.

The runs index
--------------
``<group>.batches/_runs.parquet`` (RUNS_INDEX) is the group's row of the table
of runs (`lox.runs`): one row per run of the group, the columns that table
documents (`lox_backends.runstore.table`). Its writer replaces it whole (a new
file renamed into place: never torn, also under SIGKILL) when runs of the group
open or resume, at every flush that changed a summary, and when runs end.
Its status column holds the stored status (a run
of an earlier writer found "running" and killed when the index is taken over
is stored "killed"); readers resolve a "running" one as for ``_run.json``, by
its schema metadata, JSON values::

    lox.writer   INDEX_WRITER_METADATA: {"host", "pid", "heartbeat"} of its writer, as in ``_run.json``
    lox.values   INDEX_VALUES_METADATA: run id -> the names of its ``logger.summary`` values

A run whose folder has a ``_run.json`` but no row in an index (killed before
its group's first index, or written by lox before 0.3) is read from its
``_run.json``; an index row whose run folder is gone is not a run. DuckDB,
polars and pandas read the indexes directly (``DIR/*.batches/_runs.parquet``,
columns unified by name).

Heartbeats
----------
``_alive-<writer>.json`` (``<writer>``: eight hex digits a writer draws when it
starts) holds ``{"time": Unix seconds, "host", "pid"}``, rewritten every
``heartbeat.every`` seconds (`DEFAULT_HEARTBEAT_EVERY` where ``_run.json`` does
not say) while the writer lives. A run still ``"running"`` whose heartbeat is
older than `KILLED_AFTER` intervals, or missing that long after the run was
created (or whose process, on its host, is gone), is read as ``"killed"``.

Sent records
------------
``_sent-<tracker>-<hash>.jsonl``, per run and destination (``<hash>``: the first
ten hex digits of the SHA-256 of the destination, `destination_hash`), one JSON
object per line, appended and fsynced line by line (a torn last line is ignored)::

    {"remote": {...}, "destination": "..."}   the tracker's run (what it returned when
                                              the run was opened there), secrets masked
    {"file": "batch-000000-3f9c01ab.parquet"} a batch file that reached the tracker
    {"closed": true}                          the run was ended at the tracker
    {"closed": false}                         it was resumed since: to be ended again

In a bucket, where objects cannot be appended to, the record is a folder
``_sent-<tracker>-<hash>/`` (`sent_folder`) of objects, each written whole::

    remote.json                         SENT_REMOTE: the remote line above (replaced when it changes)
    batch-000000-3f9c01ab.parquet.sent  `sent_marker` per batch file that reached the tracker
    closed                              SENT_CLOSED: the closed line above (replaced when it changes)

``_sending-<tracker>-<hash>.lock`` is the run's sending lock (an advisory lock,
held by the process sending the run to that destination, removed when it lets
go); for a run in a bucket it is ``lox-sending-<tracker>-<hash of the
record>.lock`` in the local temp folder (`bucket_sending_lock`).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

DEFAULT_DIR = "lox-runs"  # the folder of runs where a config string names none

# --- a run's folder --------------------------------------------------------------------
RUN_FILE = "_run.json"

# --- a group's batches folder ----------------------------------------------------------
BATCHES_SUFFIX = ".batches"
BATCH_FILE = re.compile(r"batch-(\d+)-([0-9a-f]{8})\.parquet")  # groups: sequence number, tag
BATCH_FILE_FORM = "batch-<sequence>-<hex>.parquet"  # BATCH_FILE, for messages
TIME_METADATA = b"lox.time_ms"
RUNS_METADATA = b"lox.runs"
SCALARS_METADATA = b"lox.scalars"
TREES_METADATA = b"lox.trees"  # lox_core.arrow.TREES_METADATA (not imported: this module loads no pyarrow)
KINDS_METADATA = b"lox.kinds"  # lox_core.arrow.KINDS_METADATA
SUMMARY_METADATA = b"lox.summary"
PER_FILE_METADATA = (TIME_METADATA, RUNS_METADATA, SCALARS_METADATA, SUMMARY_METADATA)  # differs file to file
RUNS_INDEX = "_runs.parquet"  # in a batches folder: the group's runs, one row each
INDEX_WRITER_METADATA = b"lox.writer"  # of the runs index: its writer's host, pid and heartbeat
INDEX_VALUES_METADATA = b"lox.values"  # of the runs index: run id -> the names of its user summary values
HEARTBEAT_PREFIX = "_alive-"
DEFAULT_HEARTBEAT_EVERY = 5.0  # seconds between heartbeats, where _run.json does not say (and a writer is not told)
KILLED_AFTER = 3  # heartbeat intervals without a heartbeat after which a running run counts as killed

# --- files being written ---------------------------------------------------------------
TEMP_FILE = re.compile(r"\.(?P<name>.+?)\.(?P<pid>\d+)@(?P<host>[^@/]+)\.tmp")  # `temp_name`'s names
TEMP_PREFIX, TEMP_SUFFIX = ".", ".tmp"  # every name a file is written under before it is in place

# --- sent records ----------------------------------------------------------------------
SENT_PREFIX = "_sent-"
SENT_SUFFIX = ".jsonl"
SENT_REMOTE = "remote.json"
SENT_MARKER_SUFFIX = ".sent"
SENT_CLOSED = "closed"
SENDING_LOCK_PREFIX, SENDING_LOCK_SUFFIX = "_sending-", ".lock"


def batches_folder(group: str) -> str:
    """The folder, beside the run folders, that holds the batch files of a group of runs."""
    return group + BATCHES_SUFFIX


def superseded_from(resumes: list[dict[str, Any]], sequence: int) -> int | None:
    """The least step from which a run's rows in its batch file numbered
    `sequence` are superseded by a later resume (`resumes`, as ``_run.json``
    holds them): rows whose ``step`` is at least this are not the run's any
    more. None where no resume supersedes rows of that file.

    >>> resumes = [{"from_step": 100, "first_batch": 7}, {"from_step": None, "first_batch": 9}]
    >>> superseded_from(resumes, 6), superseded_from(resumes, 7)
    (100, None)
    """
    steps = [r["from_step"] for r in resumes if r.get("from_step") is not None and sequence < r["first_batch"]]
    return min(steps, default=None)


def batch_file(sequence: int, tag: str) -> str:
    """A batch file's name: its sequence number in its folder, and eight hex digits (`tag`)."""
    return f"batch-{sequence:06d}-{tag}.parquet"


def heartbeat_file(writer: str) -> str:
    """The heartbeat file of the writer `writer` (eight hex digits), in a batches folder."""
    return f"{HEARTBEAT_PREFIX}{writer}.json"


def temp_name(name: str, pid: int, host: str) -> str:
    """The hidden name a file is written under before it is renamed to `name`,
    naming its writer (the process `pid` of `host`)."""
    return f"{TEMP_PREFIX}{name}.{pid}@{host}{TEMP_SUFFIX}"


def upload_temp_name(name: str, tag: str) -> str:
    """The hidden name a file is uploaded under, then moved to `name`, on a remote
    filesystem whose uploads are not atomic (`tag`: random hex digits)."""
    return f"{TEMP_PREFIX}{name}.{tag}{TEMP_SUFFIX}"


def is_temp(name: str) -> bool:
    """Whether `name` is a file being written (`temp_name`, `upload_temp_name`, or an earlier lox's)."""
    return name.startswith(TEMP_PREFIX) and name.endswith(TEMP_SUFFIX)


def destination_hash(destination: str) -> str:
    """The ``<hash>`` of a destination's sent records and sending locks."""
    return hashlib.sha256(destination.encode()).hexdigest()[:10]


def sent_record(tracker: str, destination: str) -> str:
    """The sent record, in a local run folder, of the run's sending to `destination` of `tracker`."""
    return f"{SENT_PREFIX}{tracker}-{destination_hash(destination)}{SENT_SUFFIX}"


def sent_folder(tracker: str, destination: str) -> str:
    """The sent record, in a run folder in a bucket: a folder of objects."""
    return f"{SENT_PREFIX}{tracker}-{destination_hash(destination)}"


def sent_marker(batch: str) -> str:
    """The object of a bucket's sent record saying that the batch file `batch` reached the tracker."""
    return batch + SENT_MARKER_SUFFIX


def sending_lock(tracker: str, destination: str) -> str:
    """The sending lock, in a local run folder, of the run's sending to `destination` of `tracker`."""
    return f"{SENDING_LOCK_PREFIX}{tracker}-{destination_hash(destination)}{SENDING_LOCK_SUFFIX}"


def is_sending_lock(name: str) -> bool:
    """Whether `name`, in a run folder, is a sending lock."""
    return name.startswith(SENDING_LOCK_PREFIX) and name.endswith(SENDING_LOCK_SUFFIX)


def bucket_sending_lock(tracker: str, record: str) -> str:
    """The sending lock, in the local temp folder, of a run in a bucket whose sent record is at `record`."""
    return f"lox-sending-{tracker}-{hashlib.sha256(record.encode()).hexdigest()[:16]}.lock"
