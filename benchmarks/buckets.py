"""Writing runs to a bucket through ``parquet:s3://...``, against pyarrow writing the
same tables to the same server, side by side (``python -m benchmarks buckets``).

The server is moto's S3 server on 127.0.0.1 (tests/support/s3_server.py, ``moto[server]``
from the ``test`` extra), reached through pyarrow's S3 client configured from the
standard AWS environment on both sides. Both sides write the same Arrow table
per flush, one object each; lox's side also opens and closes its run
(``_run.json`` uploads) and finds its group's sequence number (a listing).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pathlib
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

import lox
from benchmarks.timing import row, side_by_side
from lox_backends.parquet import ParquetBackend
from lox_backends.plugin import hooks
from lox_backends.runstore.writer import write_table

KEYS = ["loss", "accuracy", "lr", "grad_norm"]


@contextlib.contextmanager
def s3_server(folder: str) -> Iterator[Any]:
    """An S3-compatible server on 127.0.0.1 (moto's, tests/support/s3_server.py), storing in
    `folder`, and the environment that points clients at it while it runs."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "support"))
    from s3_server import S3Server  # needs moto[server]: ModuleNotFoundError otherwise

    server = S3Server(folder).start()
    saved = {name: os.environ.get(name) for name in server.env}
    os.environ.update(server.env)
    try:
        yield server
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def buckets(flushes: int = 16, steps: int = 25_000, rounds: int = 5) -> None:
    print(f"Buckets: {flushes} flushes of {len(KEYS)} keys x {steps:,} steps (scalar float32 events) to a local "
          "S3-compatible server (moto), through parquet:s3://... and by pyarrow")
    rng = np.random.default_rng(0)
    step = np.arange(steps, dtype=np.int32)
    logs = lox.logdict({k: rng.standard_normal(steps).astype(np.float32) for k in KEYS},
                       steps={"step": dict.fromkeys(KEYS, step)})
    table = logs.to_arrow(run="run-0")
    events = flushes * len(KEYS) * steps
    with tempfile.TemporaryDirectory() as folder, s3_server(folder) as server:
        server.create_bucket("bench")
        s3, _ = pafs.FileSystem.from_uri("s3://bench")  # pyarrow's client, from the environment
        counter = itertools.count()

        def by_pyarrow():
            n = next(counter)
            for i in range(flushes):
                pq.write_table(table, f"bench/pyarrow-{n}/batch-{i}.parquet", filesystem=s3)

        def same_bytes():  # pyarrow writing with lox's Parquet options: the same files
            n = next(counter)
            for i in range(flushes):
                with s3.open_output_stream(f"bench/same-{n}/batch-{i}.parquet") as f:
                    write_table(table, f)

        # The same, each file in one PUT as lox uploads it (pyarrow's default: a multipart upload,
        # three requests for a file smaller than a part).
        one_put, _ = pafs.FileSystem.from_uri("s3://bench?allow_delayed_open=true")

        def same_bytes_one_put():
            n = next(counter)
            for i in range(flushes):
                sink = pa.BufferOutputStream()
                write_table(table, sink)
                with one_put.open_output_stream(f"bench/put-{n}/batch-{i}.parquet") as f:
                    f.write(sink.getvalue())

        def through_lox():
            backend = ParquetBackend(f"s3://bench/lox-{next(counter)}")
            run = hooks.RunInfo("run-0", name="bench", group="g")
            backend.open_run(run)
            for _ in range(flushes):
                backend.write(run, table)
                backend.flush()
            backend.close_run(run)
            backend.close()

        by_pyarrow(), same_bytes(), same_bytes_one_put(), through_lox()  # connections open, code paths warm
        t = side_by_side({"pyarrow": by_pyarrow, "same": same_bytes, "put": same_bytes_one_put, "lox": through_lox},
                         reps=1, rounds=rounds)

        def size(prefix):
            infos = s3.get_file_info(pafs.FileSelector(prefix, recursive=True))
            return sum(info.size for info in infos if info.type == pafs.FileType.File and "batch-" in info.path)

        sizes = {name: size(f"bench/{name}-{i}") for i, name in enumerate(["pyarrow", "same", "put", "lox"])}
        read = side_by_side({"pyarrow": lambda: ds.dataset("bench/same-1", filesystem=s3,
                                                             format="parquet").to_table(),
                             "lox": lambda: lox.load("s3://bench/lox-3")}, reps=1, rounds=3)
    mb = {name: f"{value / 1e6:.1f} MB" for name, value in sizes.items()}
    row(f"pyarrow: pq.write_table(table, key, filesystem=s3), {mb['pyarrow']}", f"{events / t['pyarrow']:,.0f} ev/s")
    row(f"pyarrow, lox's Parquet options (the same files), {mb['same']}", f"{events / t['same']:,.0f} ev/s")
    row(f"pyarrow, the same files, each in one PUT, {mb['put']}", f"{events / t['put']:,.0f} ev/s")
    row(f"lox: parquet:s3://... (flushes, run opened/closed), {mb['lox']}", f"{events / t['lox']:,.0f} ev/s",
        t["lox"] / t["pyarrow"], "rate >= 0.8 of pyarrow (ratio <= 1.25)")
    row("  the same, against pyarrow writing the same files", "", t["lox"] / t["same"], "ratio <= 1.25")
    row("  the same, against the same files in one PUT each", "", t["lox"] / t["put"], "ratio <= 1.25")
    row("pyarrow.dataset(bucket folder).to_table()", f"{read['pyarrow'] * 1e3:.0f} ms")
    row("lox.load('s3://...'), the run as a logdict", f"{read['lox'] * 1e3:.0f} ms", read["lox"] / read["pyarrow"])
