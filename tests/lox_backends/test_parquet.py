"""The parquet backend, and the run store's writer it is (`lox_backends/runstore/writer.py`):
what it writes reads back equal, in order, from lox and from other Parquet readers, with
concurrent writers and after a writer is killed."""

import concurrent.futures
import datetime
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow.parquet as pq
import pytest
from logs_testing import assert_logs_equal, event, kill_after_confirmed
from paths import DATA

import lox
from lox_backends import parquet
from lox_backends.parquet import ParquetBackend
from lox_backends.plugin import hooks
from lox_backends.runstore import reader
from lox_core import schema
from lox_core.arrow import to_arrow
from lox_core.logdict import concat

REPO = pathlib.Path(__file__).resolve().parents[2]


def make_logs(start, n):
    """n events of three keys, at steps start..start+n-1, with values derived from the step."""
    step = np.arange(start, start + n)
    return lox.logdict(
        {
            "loss": (step * 0.5).astype(np.float32),
            "w": np.stack([step, -step, 2 * step], axis=1).astype(np.float64),
            "count": step.astype(np.int32),
        },
        steps={"step": {"loss": step, "w": step, "count": step}},
    )


def files_under(root):
    return sorted(str(p.relative_to(root)) for p in pathlib.Path(root).rglob("*") if p.is_file())


def open_run(root, run_id="run-0", **kw):
    backend = ParquetBackend(str(root))
    run = hooks.RunInfo(run_id, name=kw.pop("name", run_id), group=kw.pop("group", "g"), **kw)
    backend.open_run(run)
    return backend, run


def run_python(script, *args, **kw):
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, **kw,
    )


# --- round trips -------------------------------------------------------------------
def test_batches_round_trip_with_values_dtypes_and_steps(tmp_path):
    backend, run = open_run(tmp_path)
    parts = [make_logs(0, 5), make_logs(5, 3)]
    for part in parts:
        backend.write(run, to_arrow(part, run=run.run_id))
    backend.flush()
    assert_logs_equal(reader.load(tmp_path / "run-0"), concat(parts))
    backend.close_run(run)
    backend.close()
    assert_logs_equal(reader.load(tmp_path)["run-0"], concat(parts))


def test_a_spooled_and_a_tapped_training_loop_round_trip(tmp_path):
    def train(w):
        def step(w, i):
            loss = jnp.sum(w**2)
            lox.log({"loss": loss, "w": w}, step=i)
            return w * 0.9, None

        return jax.lax.scan(step, w, jnp.arange(10))[0]

    _, spooled = lox.spool(train)(jnp.ones(3))
    backend, run = open_run(tmp_path, "spooled")
    backend.write(run, to_arrow(spooled, run=run.run_id))
    backend.close_run(run)
    assert_logs_equal(reader.load(tmp_path / "spooled"), spooled)

    tap_backend, tap_run = open_run(tmp_path, "tapped")
    write = lambda e: tap_backend.write(tap_run, to_arrow(e.to_logdict(), run="tapped"))  # noqa: E731
    jax.block_until_ready(lox.tap(train, write)(jnp.ones(3)))
    tap_backend.close_run(tap_run)
    tapped = reader.load(tmp_path / "tapped")
    np.testing.assert_allclose(tapped["loss"], spooled["loss"], rtol=1e-6)
    np.testing.assert_allclose(tapped["w"], spooled["w"], rtol=1e-6)
    np.testing.assert_array_equal(tapped.step["loss"], np.arange(10))


def test_batches_and_events_keep_arrival_order(tmp_path):
    backend, run = open_run(tmp_path)
    writes = [make_logs(0, 2), event(2, loss=np.float32(1.0)), event(3, loss=np.float32(1.5)),
              make_logs(4, 2), event(6, loss=np.float32(3.0))]
    for w in writes:
        backend.write(run, to_arrow(w, run=run.run_id))
    backend.flush()
    logs = reader.load(tmp_path / "run-0")
    np.testing.assert_array_equal(logs.step["loss"], [0, 1, 2, 3, 4, 5, 6])
    np.testing.assert_array_equal(logs["loss"], concat(writes)["loss"])
    np.testing.assert_array_equal(logs.step["w"], [0, 1, 4, 5])
    # Everything waits for the flush, which writes it as one file, in arrival order.
    batches = sorted(p.name for p in (tmp_path / "g.batches").glob("batch-*.parquet"))
    assert [int(name.split("-")[1]) for name in batches] == [0]
    assert pq.read_table(tmp_path / "g.batches" / batches[0]).num_rows == 15


def test_one_file_per_flush_or_per_rows_per_file(tmp_path):
    backend = ParquetBackend(str(tmp_path), {"rows_per_file": "12"})
    run = hooks.RunInfo("r", name="r", group="g")
    backend.open_run(run)
    for i in range(5):
        backend.write(run, to_arrow(make_logs(2 * i, 2), run="r"))  # 6 rows each
    assert len(list((tmp_path / "g.batches").glob("batch-*.parquet"))) == 2  # 12 rows waited twice
    backend.flush()
    files = sorted((tmp_path / "g.batches").glob("batch-*.parquet"))
    assert [pq.read_table(f).num_rows for f in files] == [12, 12, 6]
    np.testing.assert_array_equal(reader.load(tmp_path / "r").step["loss"], np.arange(10))


def test_empty_tables_write_no_file_unless_they_name_series(tmp_path):
    backend, run = open_run(tmp_path)
    backend.write(run, to_arrow(lox.logdict(), run=run.run_id))
    assert not list(tmp_path.rglob("batch-*"))
    empty = lox.logdict({"x": np.zeros((0, 2), np.float32)}, steps={"step": {"x": np.zeros(0, np.int32)}})
    backend.write(run, to_arrow(empty, run=run.run_id))
    backend.write(run, to_arrow(make_logs(0, 2), run=run.run_id))
    backend.close_run(run)
    loaded = reader.load(tmp_path / "run-0")
    assert list(loaded) == ["x", "loss", "w", "count"] and loaded["x"].shape == (0, 2)


def test_events_are_written_on_flush_not_before(tmp_path):
    backend, run = open_run(tmp_path)
    backend.write(run, to_arrow(event(0, loss=1.0), run=run.run_id))
    assert not list(tmp_path.rglob("batch-*"))
    assert reader.load(tmp_path / "run-0") == {}
    backend.flush()
    assert reader.load(tmp_path / "run-0")["loss"].tolist() == [1.0]


# --- _run.json ----------------------------------------------------------------------
def test_run_json_records_the_run_and_its_status(tmp_path):
    before = datetime.datetime.now(datetime.timezone.utc)
    backend, run = open_run(tmp_path, "r1", name="baseline", group="sweep", index=2,
                            metadata={"lr": 0.1, "layers": [1, 2], "seed": np.int64(3)})
    info = json.loads((tmp_path / "r1" / "_run.json").read_text())
    assert {k: info[k] for k in ("run_id", "name", "group", "index", "metadata", "status", "lox_version")} == {
        "run_id": "r1", "name": "baseline", "group": "sweep", "index": 2,
        "metadata": {"lr": 0.1, "layers": [1, 2], "seed": 3}, "status": "running", "lox_version": lox.__version__,
    }
    created = datetime.datetime.fromisoformat(info["created"])
    assert created.utcoffset() == datetime.timedelta(0) and created >= before
    backend.close_run(run)
    info = json.loads((tmp_path / "r1" / "_run.json").read_text())
    assert info["status"] == "finished"
    assert datetime.datetime.fromisoformat(info["ended"]) >= created
    assert reader.runs(tmp_path) == [info] == reader.runs(tmp_path / "r1")


def test_runs_and_load_order_runs_by_creation_time(tmp_path):
    for run_id in ["zeta", "alpha", "mid"]:
        backend, run = open_run(tmp_path, run_id)
        backend.write(run, to_arrow(event(0, x=float(len(run_id))), run=run.run_id))
        backend.close_run(run)
        time.sleep(0.01)
    assert [r["run_id"] for r in reader.runs(tmp_path)] == ["zeta", "alpha", "mid"]
    loaded = reader.load(tmp_path)
    assert list(loaded) == ["zeta", "alpha", "mid"]
    assert loaded["alpha"]["x"].tolist() == [5.0]


def test_default_folder_is_lox_runs_in_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    backend = ParquetBackend()
    monkeypatch.chdir("/")  # resolved when created: a later chdir changes nothing
    backend.open_run(hooks.RunInfo("r", name="r", group="g"))
    assert (tmp_path / "lox-runs" / "r" / "_run.json").exists()


# --- what is on disk ---------------------------------------------------------------
def test_hidden_temp_files_and_strangers_are_ignored(tmp_path):
    backend, run = open_run(tmp_path)
    backend.write(run, to_arrow(make_logs(0, 3), run=run.run_id))
    backend.close_run(run)
    folder = tmp_path / "run-0"
    (folder / ".batch-000001-0123abcd.parquet.tmp").write_bytes(b"PAR1 half a file")
    (folder / "._run.json.0badf00d.tmp").write_text("{")
    (folder / "notes.txt").write_text("not a batch")
    (tmp_path / ".trash").mkdir()
    (tmp_path / ".trash" / "_run.json").write_text("{}")
    (tmp_path / "not-a-run").mkdir()
    assert_logs_equal(reader.load(folder), make_logs(0, 3))
    assert list(reader.load(tmp_path)) == ["run-0"]


def test_keys_are_data_never_paths(tmp_path):
    root = tmp_path / "runs"
    backend, run = open_run(root)
    keys = ["../../x", "a/b", "/abs", "..", "c\\d"]
    logs = lox.logdict({k: np.arange(3.0) + i for i, k in enumerate(keys)},
                       steps={"step": {k: np.arange(3) for k in keys}})
    backend.write(run, to_arrow(logs, run=run.run_id))
    backend.write(run, to_arrow(event(3, **{"../../x": 9.0, "a/b": 9.0}), run=run.run_id))
    backend.close_run(run)
    tree = files_under(tmp_path)
    assert "runs/run-0/_run.json" in tree
    batches = [f.removeprefix("runs/g.batches/") for f in tree if f != "runs/run-0/_run.json"]
    assert all(re.fullmatch(r"batch-\d{6}-[0-9a-f]{8}\.parquet|_alive-[0-9a-f]{8}\.json|_runs\.parquet", n)
               for n in batches), tree
    loaded = reader.load(root / "run-0")
    assert sorted(loaded) == sorted(keys)
    assert loaded["../../x"].tolist() == [0.0, 1.0, 2.0, 9.0]


def test_other_parquet_readers_see_the_same_values(tmp_path):
    import duckdb
    import pandas as pd
    import polars as pl

    backend, run = open_run(tmp_path)
    parts = [make_logs(0, 4), make_logs(4, 4)]
    for part in parts:
        backend.write(run, to_arrow(part, run=run.run_id))
    backend.close_run(run)
    folder = tmp_path / "g.batches"
    files = sorted(str(p) for p in folder.glob("batch-*.parquet"))
    want = [(float(s), float(s) * 0.5) for s in range(8)]

    frame = pd.read_parquet(files)
    loss = frame[frame["key"] == "loss"].sort_values("step")
    assert list(zip(loss["step"].astype(float), loss["value"], strict=True)) == want
    assert set(frame["run"].astype(str)) == {"run-0"}

    frame = pl.read_parquet(str(folder / "batch-*.parquet"))
    loss = frame.filter(pl.col("key").cast(pl.Utf8) == "loss").sort("step")
    assert list(zip(loss["step"].cast(pl.Float64), loss["value"], strict=True)) == want

    rows = duckdb.sql(
        f"SELECT step, value FROM read_parquet('{folder}/batch-*.parquet') WHERE key = 'loss' ORDER BY step"
    ).fetchall()
    assert [(float(s), v) for s, v in rows] == want

    # Whole folders too: the group's batches, and the folder of all runs, filtered to one
    # run (its _run.json starts with "_", which Parquet dataset readers skip).
    frame = pd.read_parquet(tmp_path, filters=[("run", "==", "run-0")])
    loss = frame[frame["key"] == "loss"]
    assert sorted(zip(loss["step"].astype(float), loss["value"], strict=True)) == want
    import pyarrow.dataset as ds

    assert ds.dataset(str(tmp_path), format="parquet").to_table().num_rows == sum(to_arrow(p).num_rows for p in parts)


# --- several processes -------------------------------------------------------------
WRITER = """
import os, sys, time
import numpy as np
from lox_backends.plugin import hooks
from lox_backends.parquet import ParquetBackend
from lox_core.arrow import to_arrow
from lox_core.logdict import logdict

root, run_id, go, offset = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
backend = ParquetBackend(root)
run = hooks.RunInfo(run_id, name=run_id, group="g")
backend.open_run(run)
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.005)
for i in range(20):
    step = np.arange(offset + 3 * i, offset + 3 * i + 3)
    logs = logdict({"loss": step * 1.0}, steps={"step": {"loss": step}})
    backend.write(run, to_arrow(logs, run=run_id))
    if i % 5 == 4:
        backend.flush()
backend.close_run(run)
backend.close()
print("done", flush=True)
"""


def start_writers(root, go, runs):
    procs = [run_python(WRITER, root, run_id, go, offset) for run_id, offset in runs]
    for proc in procs:
        line = proc.stdout.readline()
        assert line == "ready\n", proc.stderr.read()
    go.touch()  # both start writing at once
    return procs


def finish(proc):
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out == "done\n", err


def test_two_processes_write_different_runs_into_one_folder(tmp_path):
    root = tmp_path / "runs"
    procs = start_writers(root, tmp_path / "go", [("run-a", 0), ("run-b", 1000)])
    # Reading while they write sees whole batches only, in order.
    while any(p.poll() is None for p in procs):
        for run_id, logs in reader.load(root).items():
            if logs:
                start = 0 if run_id == "run-a" else 1000
                np.testing.assert_array_equal(logs.step["loss"], start + np.arange(len(logs["loss"])))
                assert len(logs["loss"]) % 3 == 0
        time.sleep(0.05)
    for proc in procs:
        finish(proc)
    loaded = reader.load(root)
    assert sorted(loaded) == ["run-a", "run-b"]
    np.testing.assert_array_equal(loaded["run-a"].step["loss"], np.arange(60))
    np.testing.assert_array_equal(loaded["run-b"].step["loss"], 1000 + np.arange(60))
    np.testing.assert_array_equal(loaded["run-b"]["loss"], 1000.0 + np.arange(60))
    assert [r["status"] for r in reader.runs(root)] == ["finished", "finished"]
    assert not [f for f in files_under(root) if os.path.basename(f).startswith(".")]


def test_two_processes_writing_one_run_lose_nothing(tmp_path):
    root = tmp_path / "runs"
    procs = start_writers(root, tmp_path / "go", [("shared", 0), ("shared", 1000)])
    for proc in procs:
        finish(proc)
    assert len(list((root / "g.batches").glob("batch-*.parquet"))) == 8  # 4 flushes per writer
    steps = reader.load(root / "shared").step["loss"]
    np.testing.assert_array_equal(np.sort(steps), np.concatenate([np.arange(60), 1000 + np.arange(60)]))


CRASHER = """
import sys
import numpy as np
from lox_backends.plugin import hooks
from lox_backends.parquet import ParquetBackend
from lox_core.arrow import to_arrow
from lox_core.logdict import logdict

N = 2000
backend = ParquetBackend(sys.argv[1])
run = hooks.RunInfo("crash", name="crash", group="g")
backend.open_run(run)
i = 0
while True:
    step = np.arange(N * i, N * (i + 1))
    w = np.stack([step, step + 1, step + 2], axis=1).astype(np.float32)
    logs = logdict({"loss": step * 0.25, "w": w}, steps={"step": {"loss": step, "w": step}})
    backend.write(run, to_arrow(logs, run="crash"))
    backend.flush()
    print(i, flush=True)
    i += 1
"""


def test_a_killed_writer_leaves_every_confirmed_batch_readable(tmp_path):
    proc = run_python(CRASHER, tmp_path)
    confirmed = kill_after_confirmed(proc)
    assert confirmed == list(range(len(confirmed)))
    folder = tmp_path / "crash"
    for path in (tmp_path / "g.batches").glob("batch-*.parquet"):
        pq.read_table(path)  # every visible file is whole
    logs = reader.load(folder)
    n = len(logs["loss"])
    assert n >= 2000 * len(confirmed) and n % 2000 == 0
    np.testing.assert_array_equal(logs.step["loss"], np.arange(n))
    np.testing.assert_array_equal(logs["loss"], np.arange(n) * 0.25)
    np.testing.assert_array_equal(logs["w"][:, 2], np.arange(n, dtype=np.float32) + 2)
    assert reader.runs(folder)[0]["status"] == "killed"  # its writer is gone (lox_backends.runstore.reader.run_status)


# --- errors ------------------------------------------------------------------------
@pytest.mark.parametrize("run_id", ["../evil", "a/b", "..", "", ".hidden", "a\\b", "x/../../y"])
def test_a_run_id_that_is_not_a_folder_name_is_refused(tmp_path, run_id):
    backend = ParquetBackend(str(tmp_path / "runs"))
    with pytest.raises(ValueError, match="run_id .* cannot be a folder name"):
        backend.open_run(hooks.RunInfo(run_id, name="n", group="g"))
    assert files_under(tmp_path) == []


def test_load_says_what_it_expected(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder.*expected a run folder"):
        reader.load(tmp_path / "missing")
    (tmp_path / "file.parquet").write_bytes(b"")
    with pytest.raises(ValueError, match="is a file; expected a run folder"):
        reader.load(tmp_path / "file.parquet")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no lox runs in .*folder of run folders"):
        reader.runs(tmp_path / "empty")


def test_a_damaged_batch_file_is_named(tmp_path):
    backend, run = open_run(tmp_path)
    backend.write(run, to_arrow(make_logs(0, 3), run=run.run_id))
    backend.close_run(run)
    (tmp_path / "g.batches" / "batch-000001-00000000.parquet").write_bytes(b"")
    with pytest.raises(ValueError, match="cannot read .*batch-000001-00000000.parquet.*move it out"):
        reader.load(tmp_path / "run-0")


def test_unknown_options_are_refused():
    with pytest.raises(ValueError, match="no option 'compresion'; did you mean 'compression'\\? Its options are: "
                                         "compression .*; rows_per_file "):
        ParquetBackend("runs", {"compresion": "zstd"})


@pytest.mark.parametrize("option, message", [
    ("compression=bogus", "option compression='bogus' is refused: it must be one of snappy, zstd, gzip, brotli, "
                          "lz4, none"),
    ("rows_per_file=abc", "option rows_per_file='abc' is refused: it must be an integer >= 1"),
    ("rows_per_file=0", "option rows_per_file='0' is refused: it must be an integer >= 1"),
    ("rows_per_file=-1", "option rows_per_file='-1' is refused: it must be an integer >= 1"),
    ("rows_per_file=1.5", "option rows_per_file='1.5' is refused: it must be an integer >= 1"),
])
def test_option_values_are_checked_when_the_logger_is_created(tmp_path, option, message):
    with pytest.raises(ValueError, match=re.escape(f"the parquet backend's {message} (")):
        lox.loggers.from_config(f"parquet:{tmp_path}/runs?{option}")
    assert not (tmp_path / "runs").exists()  # refused before anything was written


def test_option_values_are_typed_and_case_does_not_matter(tmp_path):
    (backend,) = lox.loggers.from_config(f"parquet:{tmp_path}?compression=ZSTD&rows_per_file=10").backends
    assert backend.compression == "zstd" and backend.rows_per_file == 10
    (backend,) = lox.loggers.from_config(f"parquet:{tmp_path}").backends
    assert backend.compression == "snappy" and backend.rows_per_file == parquet.DEFAULT_ROWS_PER_FILE


def test_a_folder_behind_a_file_is_refused_when_the_logger_is_created(tmp_path):
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    target = tmp_path / "notes.txt" / "runs"
    with pytest.raises(ValueError, match=re.escape(
        f"the parquet backend's folder '{target}' cannot be written: a file is in the way: "
        f"'{tmp_path / 'notes.txt'}'. Give a folder this process can write to."
    )):
        lox.loggers.from_config(f"parquet:{target}")
    with pytest.raises(ValueError, match=re.escape(f"a file is in the way: '{tmp_path / 'notes.txt'}'")):
        lox.loggers.SaveLogger(tmp_path / "notes.txt")


def test_a_folder_no_one_may_write_is_refused_when_the_logger_is_created():
    # sysfs refuses new folders to every user, root included.
    with pytest.raises(ValueError, match=r"the parquet backend's folder '/sys/lox-runs' cannot be written: "
                                         r"(permission denied|read-only file system)\."):
        lox.loggers.from_config("parquet:/sys/lox-runs")


def test_the_write_check_leaves_nothing_behind(tmp_path):
    (tmp_path / "existing").mkdir()
    lox.loggers.from_config(f"parquet:{tmp_path}/existing")
    lox.loggers.from_config(f"parquet:{tmp_path}/new/runs")
    assert os.listdir(tmp_path) == ["existing"] and os.listdir(tmp_path / "existing") == []  # made when written


def test_run_json_is_strict_json_with_non_finite_metadata_as_strings(tmp_path):
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    state = logger.init(lr=float("nan"), clip=float("inf"), floor=-np.inf, betas=np.array([0.5, np.nan]),
                        nested={"eps": float("-inf"), "ok": 1.5})
    logger.finish(state)

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    (folder,) = [p for p in tmp_path.iterdir() if (p / "_run.json").exists()]
    info = json.loads((folder / "_run.json").read_text(), parse_constant=refuse)
    expected = {"lr": "NaN", "clip": "Infinity", "floor": "-Infinity", "betas": [0.5, "NaN"],
                "nested": {"eps": "-Infinity", "ok": 1.5}}
    assert info["metadata"] == expected
    assert reader.runs(tmp_path)[0]["metadata"] == expected


def test_compression_option(tmp_path):
    backend = ParquetBackend(str(tmp_path), {"compression": "zstd"})
    run = hooks.RunInfo("r", name="r", group="g")
    backend.write(run, to_arrow(make_logs(0, 3), run="r"))  # also: no open_run needed
    backend.flush()
    path = next((tmp_path / "g.batches").glob("batch-*.parquet"))
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).compression == "ZSTD"
    assert reader.runs(tmp_path)[0]["status"] == "running"


# --- the plugin --------------------------------------------------------------------
def test_the_plugin_offers_the_backend_and_imports_cheaply():
    import pluggy

    manager = pluggy.PluginManager(hooks.PROJECT)
    manager.add_hookspecs(hooks.Hooks)
    manager.register(parquet)
    (spec,) = [s for specs in manager.hook.lox_backends() for s in specs]
    assert spec.name == "parquet" and spec.load() is ParquetBackend and spec.missing() == []


def test_every_table_is_kept_even_one_lox_load_cannot_join(tmp_path):
    backend, run = open_run(tmp_path)
    backend.write(run, to_arrow(make_logs(0, 2), run=run.run_id))
    backend.write(run, to_arrow(event(2, loss=np.float32(1.0)), run=run.run_id))
    backend.write(run, to_arrow(event(3, loss=np.complex64(1.0)), run=run.run_id))  # a dtype that does not mix
    backend.flush()
    rows = pq.read_table(tmp_path / "g.batches").to_pydict()
    assert [(k, s) for k, s in zip(rows["key"], rows["step"], strict=True) if k == "loss"] == [
        ("loss", 0), ("loss", 1), ("loss", 2), ("loss", 3)]
    with pytest.raises(ValueError, match="the rows of key 'loss' have dtypes float32 and complex64, which no dtype"):
        reader.load(tmp_path / "run-0")


# --- the layout: one file per flush for every run of a group; runs written by lox 0.1 ------------
OLD_RUNS = DATA / "lox-0.1-runs"  # written by lox 0.1's parquet backend


def old_run(r):
    """What tests/support/data/lox-0.1-runs/old-R holds, by hand (two flushes of steps 0-2 and 3-5)."""
    step = np.arange(6)
    return lox.logdict({"loss": (step * 0.5 + r).astype(np.float32),
                        "w": np.stack([step, -step], axis=1).astype(np.float64) + r},
                       steps={"step": {"loss": step, "w": step}})


def test_runs_written_by_lox_0_1_still_load_and_read_with_other_readers(tmp_path):
    import pandas as pd

    shutil.copytree(OLD_RUNS, tmp_path / "runs")
    loaded = reader.load(tmp_path / "runs")
    assert list(loaded) == ["old-0", "old-1"]
    for r in range(2):
        assert_logs_equal(loaded[f"old-{r}"], old_run(r))
        assert_logs_equal(reader.load(tmp_path / "runs" / f"old-{r}"), old_run(r))
    assert [info["metadata"]["lr"] for info in reader.runs(tmp_path / "runs")] == [0.1, 0.2]
    frame = pd.read_parquet(tmp_path / "runs", filters=[("run", "==", "old-1")])
    assert sorted(frame[frame["key"] == "loss"]["value"]) == (np.arange(6) * 0.5 + 1).tolist()


def test_the_runs_of_a_group_share_one_file_per_flush(tmp_path):
    import pandas as pd

    backend = ParquetBackend(str(tmp_path))
    runs = [hooks.RunInfo(f"seed-{i}", name=f"seed-{i}", group="sweep", index=i) for i in range(64)]
    want = {run.run_id: [] for run in runs}
    for flush in range(3):
        for i, run in enumerate(runs):
            if flush == 0:
                backend.open_run(run)
            for part in (make_logs(4 * flush, 2), make_logs(4 * flush + 2, 2)):
                logs = part.map_series(lambda x, i=i: x + i)
                want[run.run_id].append(logs)
                backend.write(run, to_arrow(logs, run=run.run_id))
        backend.flush()
    for run in runs:
        backend.close_run(run)
    files = sorted((tmp_path / "sweep.batches").glob("batch-*.parquet"))
    assert len(files) == 3  # one per flush, however many runs
    assert sorted(os.listdir(tmp_path / "seed-0")) == ["_run.json"]
    loaded = reader.load(tmp_path)
    assert list(loaded) == [run.run_id for run in runs]
    for run in runs:
        assert_logs_equal(loaded[run.run_id], concat(want[run.run_id]))
    assert_logs_equal(reader.load(tmp_path / "seed-63"), concat(want["seed-63"]))
    frame = pd.read_parquet(tmp_path, filters=[("run", "==", "seed-5"), ("key", "==", "count")])
    assert sorted(frame["value"]) == [float(s + 5) for s in range(12)]


@pytest.mark.parametrize("with_arrays", [False, True])
def test_a_group_read_back_whatever_its_flushes_hold(tmp_path, with_arrays):
    # Flushes of scalars only (read without their shape and data columns, and without a
    # sort), flushes with arrays, runs in a different order in each flush, some runs
    # missing from some.
    backend = ParquetBackend(str(tmp_path))
    runs = [hooks.RunInfo(f"seed-{i}", name=f"seed-{i}", group="sweep", index=i) for i in range(5)]
    want = {run.run_id: [] for run in runs}
    for run in runs:
        backend.open_run(run)
    rng = np.random.default_rng(0)
    for flush in range(6):
        for i in rng.permutation(len(runs))[: 3 + flush % 3]:
            n = int(rng.integers(1, 4))
            logs = make_logs(10 * flush + i, n)
            if flush % 2 == 0 or not with_arrays:  # scalars only: loss and count, one step of each after the other
                logs = lox.logdict({"loss": logs["loss"], "count": logs["count"]},
                                   steps={"step": {"loss": logs.step["loss"], "count": logs.step["count"]}})
            want[runs[i].run_id].append(logs)
            backend.write(runs[i], schema.order_by_step(to_arrow(logs, run=runs[i].run_id)))
        backend.flush()
    backend.close()
    files = sorted((tmp_path / "sweep.batches").glob("batch-*.parquet"))
    scalars = [pq.read_schema(f).metadata.get(b"lox.scalars") == b"1" for f in files]
    assert scalars == ([True, False] * 3 if with_arrays else [True] * 6)
    loaded = reader.load(tmp_path)
    for run in runs:
        assert_logs_equal(loaded[run.run_id], concat(want[run.run_id]))
        assert_logs_equal(reader.load(tmp_path / run.run_id), concat(want[run.run_id]))


def test_old_and_new_runs_side_by_side_and_an_old_run_continued(tmp_path):
    shutil.copytree(OLD_RUNS, tmp_path / "runs")
    backend = ParquetBackend(str(tmp_path / "runs"))
    continued = hooks.RunInfo("old-0", name="old-0", group="old", index=0)
    backend.open_run(continued)
    more = lox.logdict({"loss": (np.arange(6, 8) * 0.5).astype(np.float32),
                        "w": np.stack([np.arange(6, 8), -np.arange(6, 8)], axis=1).astype(np.float64)},
                       steps={"step": {"loss": np.arange(6, 8), "w": np.arange(6, 8)}})
    backend.write(continued, to_arrow(more, run="old-0"))
    new, new_logs = hooks.RunInfo("new-0", name="new-0", group="new"), make_logs(0, 3)
    backend.open_run(new)
    backend.write(new, to_arrow(new_logs, run="new-0"))
    backend.close()
    loaded = reader.load(tmp_path / "runs")
    assert sorted(loaded) == ["new-0", "old-0", "old-1"]
    assert_logs_equal(loaded["old-0"], concat([old_run(0), more]))  # its old files first, then the new
    assert_logs_equal(loaded["old-1"], old_run(1))
    assert_logs_equal(loaded["new-0"], new_logs)


def test_loggers_made_at_once_on_one_new_folder_are_all_accepted(tmp_path):
    # The processes of a job (or threads) create their loggers on one new folder at the same moment:
    # the write check of one must never remove the folder another is checking or writing.
    def make(folder):
        lox.loggers.from_config(f"parquet:{folder}")

    for attempt in range(20):
        folder = tmp_path / f"attempt{attempt}" / "runs"
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(make, [folder] * 8))
    assert sorted(os.listdir(tmp_path)) == []  # made when written, as before


def test_a_run_named_at_init_has_its_folder_named_so(tmp_path):
    logger = lox.loggers.from_config(f"parquet:{tmp_path}", name="sweep")
    named = logger.init(name="mlp")
    seeds = jax.vmap(lambda k: logger.init(k, name="my model/v2"))(jax.random.split(jax.random.key(0), 3))
    unnamed = logger.init()
    for state in (named, unnamed):
        logger.log(state, lox.logdict({"x": np.array([1.0])}))
    logger.log(seeds, lox.logdict({"x": np.ones((3, 1))}))
    logger.finish(named), logger.finish(seeds), logger.finish(unnamed)
    stamp = logger.group.removeprefix("sweep-")  # when the logger was made, and random digits
    ids = [run.run_id for run in logger.runs()]
    assert ids == [f"mlp-{stamp}-0", *(f"my-model-v2-{stamp}-{i}" for i in (1, 2, 3)), f"sweep-{stamp}-4"]
    assert [run.name for run in logger.runs()] == ["mlp", "my model/v2-0", "my model/v2-1", "my model/v2-2", "sweep-4"]
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".batches")) == sorted(ids)
    assert list(lox.load(tmp_path)) == ids
    # Names a folder cannot be: `..` and very long names are shortened in the id, never refused.
    odd = [logger.init(name="steps 0..100"), logger.init(name="x" * 300)]
    for state in odd:
        logger.log(state, lox.logdict({"x": np.array([2.0])}))
        logger.finish(state)
    assert [run.run_id for run in logger.runs()[-2:]] == [f"steps-0.100-{stamp}-5", f"{'x' * 64}-{stamp}-6"]
    assert [lox.load(tmp_path / run.run_id)["x"].tolist() for run in logger.runs()[-2:]] == [[2.0], [2.0]]
