"""Other Parquet readers read a folder of runs (``parquet:DIR``) with the calls
docs/backends/parquet.md shows, and see what `lox.load` (`lox_backends/runstore/reader.py`)
sees; `lox.load` refuses a run whose batch files are gone, naming it, rather than loading
it empty.

The folder is written by real Loggers: vmapped seeds, several flushes, runs whose
batch files have different step columns (``step``, ``epoch``, both), and the
files lox and its trackers keep beside the batches (temp files of a killed
writer, heartbeats, send records and locks)."""

import collections
import glob
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow.parquet as pq
import pytest
from logs_testing import assert_logs_equal, log_epochs

import lox
from lox_core.arrow import flatten_keys
from lox_core.schema import COLUMNS

PAGE = pathlib.Path(__file__).resolve().parents[3] / "docs" / "backends" / "parquet.md"

# The calls of docs/backends/parquet.md, run here as written there (in the folder holding "runs").
FILES = 'files = sorted(glob.glob("runs/*/batch-*.parquet"))'
READ_ALL = {
    "duckdb": "duckdb.sql(\"SELECT * FROM read_parquet('runs/*/batch-*.parquet', union_by_name = true)\")",
    "polars": 'polars.concat([polars.scan_parquet(f) for f in files], how="diagonal").collect()',
    "pandas": "pandas.concat([pandas.read_parquet(f) for f in files], ignore_index=True)",
    "pyarrow": "pyarrow.dataset.dataset([pyarrow.dataset.dataset(f) for f in files]).to_table()",
}
READ_RUN = {
    "duckdb": "duckdb.sql(f\"SELECT * FROM read_parquet('runs/*/batch-*.parquet', union_by_name = true) "
              "WHERE run = '{run_id}'\")",
    "polars": 'polars.concat([polars.scan_parquet(f) for f in files], how="diagonal")'
              '.filter(polars.col("run") == run_id).collect()',
    "pandas": 'pandas.concat([pandas.read_parquet(f, filters=[("run", "==", run_id)]) for f in files], '
              "ignore_index=True)",
    "pyarrow": "pyarrow.dataset.dataset([pyarrow.dataset.dataset(f) for f in files])"
               '.to_table(filter=pyarrow.dataset.field("run") == run_id)',
}


def write_runs(root):
    """Three Loggers into `root`: 3 vmapped seeds logging with `step` (a scalar,
    an array, a pytree) over 3 flushes; one run logging with `epoch` only
    (float32 and int32 scalars) over 2 flushes; one with `step` and `epoch`."""
    sweep = lox.loggers.from_config(f"parquet:{root}", name="sweep")
    runs = jax.vmap(sweep.init)(jax.random.split(jax.random.key(0), 3))

    def train(w, start):
        def step(w, i):
            lox.log({"loss": w * w, "w": jnp.stack([w, -w]), "opt": {"lr": w / 10}}, step=i)
            return w * 0.5 + 1.0, None

        return jax.lax.scan(step, w, start + jnp.arange(4))[0]

    w = jnp.arange(3.0)
    for flush in range(3):
        w = jax.vmap(lambda run, w, flush=flush: sweep.spool(train, run)(w, 4 * flush))(runs, w)
        sweep.flush()
    sweep.finish(runs)

    evaluate = lox.loggers.from_config(f"parquet:{root}", name="eval")
    state = evaluate.init(jax.random.key(1))

    def score(acc, epoch):
        lox.log({"acc": acc, "seen": jnp.int32(100) * epoch}, epoch=epoch)
        return acc + 0.25

    acc = jnp.float32(0.5)
    for epoch in range(2):
        acc = evaluate.spool(score, state)(acc, epoch)
        evaluate.flush()
    evaluate.finish(state)

    both = lox.loggers.from_config(f"parquet:{root}", name="both")
    state = both.init(jax.random.key(2))
    log_epochs(both, state)
    both.finish(state)


def add_other_files(root):
    """What may lie beside the batch files: a killed writer's temp files (a
    partial batch file, a partial _run.json), a writer's heartbeat, a tracker's
    send record and lock."""
    for batches in sorted(root.glob("*.batches")):
        first = sorted(batches.glob("batch-*.parquet"))[0].read_bytes()
        (batches / ".batch-000099-0123abcd.parquet.tmp").write_bytes(first[: len(first) // 2])
        (batches / "_alive-89abcdef.json").write_text(json.dumps({"time": 1.0, "host": "h", "pid": 1}))
    for run in sorted(path for path in root.iterdir() if (path / "_run.json").exists()):
        (run / "._run.json.0123abcd.tmp").write_text('{"run_id": "par')
        (run / "_sent-mlflow-1a2b3c4d.jsonl").write_text('{"batch": "batch-000000-3f9c01ab.parquet"}\n')
        (run / "_sending-mlflow-1a2b3c4d.lock").write_text("")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The folder holding ``runs``, as written and as `lox.load` reads it."""
    parent = tmp_path_factory.mktemp("readers")
    write_runs(parent / "runs")
    add_other_files(parent / "runs")
    return parent, lox.load(parent / "runs")


def rows_of(loaded):
    """What `lox.load` gives, as rows: (run, series, steps, dtype, shape, raw bytes) per event."""
    rows = []
    for run, logs in loaded.items():
        flat = flatten_keys(logs)
        for key, values in flat.items():
            values = np.asarray(values)
            for i in range(values.shape[0]):
                steps = {name: int(np.asarray(flat.steps[name][key]).reshape(values.shape[0], -1)[i, 0])
                         for name in flat.step_names(key)}
                steps = tuple(sorted((name, s) for name, s in steps.items() if s != lox.NO_STEP))
                event = values[i]
                rows.append((run, key, steps, event.dtype.name, event.shape, event.tobytes(order="C")))
    return collections.Counter(rows)


def missing(x):
    return x is None or (isinstance(x, float) and np.isnan(x))


def rows_read(records):
    """A reader's rows (dicts of column -> value) in the same form, decoded by
    the schema: `data` holds the raw bytes where `value` holds no scalar."""
    rows = []
    for record in records:
        steps = tuple(sorted((name, int(s)) for name, s in record.items() if name not in COLUMNS and not missing(s)))
        shape = tuple(int(n) for n in record["shape"])
        data = record["data"]
        raw = bytes(data) if not missing(data) else np.asarray(record["value"], dtype=record["dtype"]).tobytes()
        rows.append((str(record["run"]), str(record["key"]), steps, str(record["dtype"]), shape, raw))
    return collections.Counter(rows)


def records(result):
    """The rows of what a reader returned, as dicts."""
    if hasattr(result, "fetchall"):  # a DuckDB relation
        names = result.columns
        return [dict(zip(names, row, strict=True)) for row in result.fetchall()]
    if hasattr(result, "to_dicts"):  # polars
        return result.to_dicts()
    if hasattr(result, "to_pylist"):  # a pyarrow table
        return result.to_pylist()
    return result.to_dict("records")  # pandas


def run_call(call, parent, monkeypatch, **names):
    """Run a documented call in the folder holding ``runs``."""
    import duckdb
    import pandas
    import polars
    import pyarrow.dataset

    monkeypatch.chdir(parent)
    scope = {"glob": glob, "duckdb": duckdb, "pandas": pandas, "polars": polars, "pyarrow": pyarrow, **names}
    exec(FILES, scope)
    return records(eval(call, scope))


def test_the_folder_has_what_the_readers_must_cope_with(folder):
    parent, loaded = folder
    runs = parent / "runs"
    columns = {tuple(pq.read_schema(path).names) for path in runs.glob("*.batches/batch-*.parquet")}
    assert {tuple(name for name in c if name not in COLUMNS) for c in columns} == {("step",), ("epoch",),
                                                                                    ("step", "epoch")}
    assert len(list(runs.glob("sweep-*.batches/batch-*.parquet"))) == 3
    assert len(loaded) == 5 and all(len(logs) for logs in loaded.values())
    assert list(runs.glob("*/.*.tmp")) and list(runs.glob("*/_*.json*")) and list(runs.glob("*/_*.lock"))


@pytest.mark.parametrize("reader", sorted(READ_ALL))
def test_each_reader_reads_every_run_as_lox_load_does(reader, folder, monkeypatch):
    parent, loaded = folder
    got = run_call(READ_ALL[reader], parent, monkeypatch)
    want = rows_of(loaded)
    assert {r["run"] for r in got} == set(loaded)
    assert {(r["run"], r["key"]) for r in got} == {(run, key) for run, logs in loaded.items()
                                                   for key in flatten_keys(logs)}
    assert rows_read(got) == want
    assert len(got) == sum(want.values())


@pytest.mark.parametrize("reader", sorted(READ_RUN))
def test_each_reader_reads_one_run_as_lox_load_does(reader, folder, monkeypatch):
    parent, loaded = folder
    for run_id in [next(r for r in loaded if r.startswith("sweep")), next(r for r in loaded if r.startswith("eval"))]:
        got = run_call(READ_RUN[reader], parent, monkeypatch, run_id=run_id)
        assert rows_read(got) == rows_of({run_id: loaded[run_id]})


def test_the_docs_show_these_calls():
    page = "".join(PAGE.read_text().split())  # the page may break a call across lines
    for call in [FILES, *READ_ALL.values(), *READ_RUN.values()]:
        assert "".join(call.split()) in page, call


def test_the_directory_calls_take_one_files_columns(folder, tmp_path):
    """Why the docs show those calls: `pandas.read_parquet(DIR)` and
    `pyarrow.dataset.dataset(DIR)` read every row but the step columns of one
    file only (here the `epoch` of the first, not the `step` of the others), and
    polars refuses the folder (it holds _run.json files)."""
    import pandas
    import polars
    import pyarrow.dataset

    parent, loaded = folder
    runs = tmp_path / "runs"
    shutil.copytree(parent / "runs", runs)
    for run_id in [r for r in loaded if r.startswith("both")]:  # its files have both step columns
        shutil.rmtree(runs / json.loads((runs / run_id / "_run.json").read_text())["batches"])
        shutil.rmtree(runs / run_id)
    assert sorted(runs.glob("*/batch-*.parquet"))[0].parent.name.startswith("eval")
    frame = pandas.read_parquet(runs)
    assert "epoch" in frame.columns and "step" not in frame.columns
    assert len(frame) == sum(rows_of({r: logs for r, logs in loaded.items() if not r.startswith("both")}).values())
    assert "step" not in pyarrow.dataset.dataset(runs, format="parquet").schema.names
    with pytest.raises(polars.exceptions.PolarsError, match="different file extensions"):
        polars.scan_parquet(runs).collect()


# --- runs whose batch files are gone -------------------------------------------------
def copy_of(folder, tmp_path):
    parent, loaded = folder
    shutil.copytree(parent / "runs", tmp_path / "runs")
    return tmp_path / "runs", loaded


def run_folder(runs, loaded, prefix):
    run_id = next(r for r in loaded if r.startswith(prefix))
    return runs / run_id, json.loads((runs / run_id / "_run.json").read_text())


def test_a_run_whose_batches_folder_was_deleted_is_an_error_naming_it(folder, tmp_path):
    runs, loaded = copy_of(folder, tmp_path)
    run, info = run_folder(runs, loaded, "eval")
    shutil.rmtree(runs / info["batches"])
    message = rf"run '{info['name']}' \({str(run)!r}\) has lost its logs: its batches folder .*{info['batches']}"
    with pytest.raises(FileNotFoundError, match=message):
        lox.load(run)
    with pytest.raises(FileNotFoundError, match=message + ".* does not exist .*move the run's folder out of"):
        lox.load(runs)
    shutil.move(run, tmp_path / "aside")  # as the message says: the other runs load
    again = lox.load(runs)
    assert list(again) == [r for r in loaded if r != run.name]
    for run_id, logs in again.items():
        assert_logs_equal(logs, loaded[run_id])


def with_rows(run, info, rows):
    """The run's _run.json as the writer leaves it when the run ends: the rows it wrote."""
    (run / "_run.json").write_text(json.dumps({**info, "status": "finished", "rows": rows}))


def test_a_run_missing_some_of_its_rows_is_an_error_naming_it(folder, tmp_path):
    runs, loaded = copy_of(folder, tmp_path)
    run, info = run_folder(runs, loaded, "sweep")
    want = sum(rows_of({run.name: loaded[run.name]}).values())
    with_rows(run, info, want)
    assert_logs_equal(lox.load(run), loaded[run.name])  # everything there: loads
    assert_logs_equal(lox.load(runs)[run.name], loaded[run.name])

    files = sorted((runs / info["batches"]).glob("batch-*.parquet"))
    lost = json.loads(pq.read_schema(files[1]).metadata[b"lox.runs"])[run.name][1]
    files[1].unlink()
    message = (rf"run '{info['name']}' \({str(run)!r}\) has lost logs: it ended with {want} rows written, but the "
               rf"batch files in .*{info['batches']}' hold {want - lost} of them; batch files holding the other "
               rf"{lost} were deleted or moved")
    with pytest.raises(FileNotFoundError, match=message):
        lox.load(run)
    with pytest.raises(FileNotFoundError, match=message):
        lox.load(runs)

    for path in files[::2]:  # every file gone, the folder left
        path.unlink()
    with pytest.raises(FileNotFoundError, match=rf"it ended with {want} rows written, .* hold 0 of them"):
        lox.load(runs)


def test_runs_without_a_row_count_load_as_before(folder, tmp_path):
    """A run still running, or ended by an older lox, records no rows: what is there loads."""
    runs, loaded = copy_of(folder, tmp_path)
    run, info = run_folder(runs, loaded, "eval")
    info.pop("rows", None)
    (run / "_run.json").write_text(json.dumps({**info, "status": "running"}))
    for path in (runs / info["batches"]).glob("batch-*.parquet"):
        path.unlink()
    got = lox.load(runs)
    assert list(got) == list(loaded)
    assert all(len(got[run.name][key]) == 0 for key in got[run.name])
    for run_id in loaded:
        if run_id != run.name:
            assert_logs_equal(got[run_id], loaded[run_id])
    with_rows(run, info, 0)  # a run that ended having written nothing
    assert list(lox.load(run)) == list(got[run.name])


def test_rows_recorded_by_the_writer_match_what_loads(folder):
    """The rows the writer records for a run that ended are the rows `lox.load`
    finds, and the Parquet files' own row counts."""
    parent, loaded = folder
    runs = parent / "runs"
    for run_id in loaded:
        info = json.loads((runs / run_id / "_run.json").read_text())
        held = sum(json.loads(pq.read_schema(path).metadata[b"lox.runs"]).get(run_id, [0, 0])[1]
                   for path in (runs / info["batches"]).glob("batch-*.parquet"))
        assert held == sum(rows_of({run_id: loaded[run_id]}).values())
        assert (info["status"], info["rows"]) == ("finished", held), run_id
