"""The ``parquet`` backend: runs saved as Parquet files, written append-only.

Config string ``parquet:DIR?compression=snappy&rows_per_file=262144``
(``parquet`` alone writes into ``lox-runs``). Tables wait in memory until the
next `flush` (the Logger flushes every few seconds and when a run finishes) or
until `rows_per_file` rows wait, then become one file per group of runs (the
runs of one Logger, e.g. 1,024 vmapped seeds, share their files).

The backend is a `lox_backends.runstore.writer.RunStoreWriter` over ``DIR``:
``lox_backends.runstore.layout`` specifies the files on disk,
``lox_backends.runstore.writer`` how they are written (never visible in part,
fsynced at every flush; in a bucket, uploaded whole), and
``lox_backends.runstore.reader`` reads them back (`lox.load`).

``DIR`` may be a folder in a bucket: ``parquet:s3://bucket/runs``,
``parquet:gs://bucket/runs`` (see `lox_backends.runstore.filesystems`).
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

from typing import Any

import pyarrow as pa

from lox_backends.plugin import hooks
from lox_backends.plugin.config import Option
from lox_backends.runstore import filesystems, layout
from lox_backends.runstore.writer import LogListener, RunStoreWriter

__all__ = ["ParquetBackend", "OPTIONS", "EXAMPLE", "DEFAULT_ROWS_PER_FILE", "COMPRESSIONS"]

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


class ParquetBackend(hooks.Backend):
    """Writes runs under ``DIR`` as append-only Parquet batch files: ``DIR/<run_id>/_run.json``
    per run, and one file per flush for all the runs of a group in ``DIR/<group>.batches/``.

    `target` is the folder (``lox-runs`` when None), resolved against the
    current directory when the backend is created, or a URI of a folder in a
    bucket (``s3://bucket/runs``), checked when the backend is created: a scheme
    no filesystem serves, a missing package or bucket, refused credentials
    raise here, naming the URI; a local folder is created and must be
    writable (`lox_backends.runstore.filesystems.check_writable`). Options
    (`OPTIONS`, checked here): ``compression`` (``snappy`` by default;
    ``zstd``, ``gzip``, ``brotli``, ``lz4``, ``none``) is passed to Parquet;
    ``rows_per_file``.

    `writer` writes the runs; `root`, `remote`, `compression`, `rows_per_file`,
    `heartbeat_every` (set by the Logger: its flush interval) and `listeners`
    (what follows the files, `LogListener`) are the writer's.
    """

    OPTIONS = OPTIONS
    EXAMPLE = EXAMPLE

    def __init__(self, target: str | None = None, options: dict[str, str] | None = None):
        super().__init__(target, options)
        # Absolute now, so that a later os.chdir does not split a run in two.
        root = filesystems.resolve(target or layout.DEFAULT_DIR, check=True)
        if not filesystems.is_uri(root):
            filesystems.check_writable(root, "the parquet backend's folder")
        self.compression: str = self.settings["compression"]
        self.rows_per_file: int = self.settings["rows_per_file"]
        self.writer = RunStoreWriter(root, self.compression, self.rows_per_file)

    @property
    def root(self) -> str:
        """The folder of runs written: an absolute path, or a URI."""
        return self.writer.root

    @property
    def remote(self) -> bool:
        """Whether `root` is in a bucket."""
        return self.writer.remote

    @property
    def heartbeat_every(self) -> float:
        """Seconds between flushes (set by the Logger): how often the writer's heartbeat is rewritten."""
        return self.writer.heartbeat_every

    @heartbeat_every.setter
    def heartbeat_every(self, seconds: float) -> None:
        self.writer.heartbeat_every = seconds

    @property
    def listeners(self) -> list[LogListener]:
        """What follows the files written (a tracker sending from them)."""
        return self.writer.listeners

    # --- the backend contract ------------------------------------------------------
    def attach(self, backends: list[hooks.Backend]) -> None:
        for other in backends:
            if other is not self and isinstance(other, ParquetBackend) and other.root == self.root:
                raise ValueError(
                    f"two parquet backends write to {self.root!r}; every event would be saved twice. "
                    "Keep one, or give them different folders."
                )

    def open_run(self, run: hooks.RunInfo) -> None:
        self.writer.open_run(run)

    def write(self, run: hooks.RunInfo, table: pa.Table) -> None:
        self.writer.write(run, table)

    def flush(self) -> None:
        self.writer.flush()

    def summarize(self, run: hooks.RunInfo, values: dict[str, Any]) -> None:
        self.writer.summarize(run, values)

    def runs_folder(self) -> str | None:
        return self.writer.root

    def close_run(self, run: hooks.RunInfo) -> None:
        self.writer.close_run(run)

    def close(self) -> None:
        self.writer.close()


@hooks.hookimpl
def lox_backends():
    return [
        hooks.BackendSpec(
            "parquet",
            "lox_backends.parquet:ParquetBackend",
            description=f"one folder of append-only Parquet files per run (parquet:DIR, default {layout.DEFAULT_DIR})",
            requires=("pyarrow",),
        )
    ]


def __getattr__(name: str):
    if name in ("load", "runs"):  # lox 0.2 re-exported the reader's here (docs/backends/parquet.md named them)
        raise ImportError(f"lox_backends.parquet.{name} is now lox_backends.runstore.reader.{name}"
                          f"{' (lox.load is its public name)' if name == 'load' else ''}.",
                          name=f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
