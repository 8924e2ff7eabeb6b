"""The table of runs (lox_backends/runstore/table.py): its columns against by-hand
expectations, read from the runs indexes (and from ``_run.json`` where a run has no
index row), in a bucket with a bounded number of requests; the indexes read directly
by DuckDB, polars and pandas; choosing runs (`select`); and the names a summary value
may not take."""

import glob
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import duckdb
import jax
import jax.numpy as jnp
import numpy as np
import pandas
import polars
import pyarrow as pa
import pytest
from paths import DATA, REPO

import lox
from lox_backends.runstore import layout
from lox_backends.runstore.table import RUN_COLUMNS, check_summary_name, flatten, select


def test_metadata_is_flattened_with_dots_and_leaves_lists_and_empty_dicts_whole():
    metadata = {"lr": 0.1, "config": {"model": {"width": 64, "depth": 2}, "opt": "adam"}, "tags": ["a"], "e": {}}
    assert dict(flatten(metadata)) == {"lr": 0.1, "config.model.width": 64, "config.model.depth": 2,
                                       "config.opt": "adam", "tags": ["a"], "e": {}}


@pytest.mark.parametrize(("name", "words"), [
    ("status", "a column of every run"),
    ("config.lr", "a metadata key of a run of this logger"),
    ("loss.min", "the column of a key's min"),
    ("train/acc.count", "the column of a key's count"),
])
def test_a_summary_name_that_clashes_with_a_column_is_refused_naming_it(name, words):
    with pytest.raises(ValueError) as raised:
        check_summary_name(name, {"config.lr"})
    assert f"the name {name!r}" in str(raised.value) and words in str(raised.value)


@pytest.mark.parametrize("name", ["best_acc", "loss.best", "final", "lr.min_seen"])
def test_other_names_are_summary_values(name):
    check_summary_name(name, {"config.lr"})


@pytest.mark.parametrize("name", ["", 3, None])
def test_a_name_that_is_no_string_is_refused(name):
    with pytest.raises(TypeError, match="non-empty strings"):
        check_summary_name(name, set())


# --- the table of runs, read back -----------------------------------------------------------
def sweep(root, lrs=(0.1, 0.01, 1.0), steps=6, group_name="lr", extra=None):
    """Runs logging a loss 1/(1 + lr * step) (NaN at step 2) and an accuracy, each with a
    summary value; returns the by-hand losses by run id."""
    logger = lox.loggers.from_config(f"parquet:{root}")
    losses = {}
    for lr in lrs:
        state = logger.init(name=f"{group_name}{lr}", lr=lr, config={"opt": "sgd", "depth": 2}, **(extra or {}))
        loss = (1.0 / (1.0 + lr * np.arange(steps))).astype(np.float32)
        loss[2] = np.nan
        logger.log(state, lox.logdict({"loss": loss, "acc": np.arange(steps, dtype=np.float32)},
                                      steps={"step": {"loss": np.arange(steps), "acc": np.arange(steps)}}))
        logger.summary(state, {"best_acc": float(steps - 1)})
        logger.finish(state)
        losses[logger.runs()[-1].run_id] = loss.astype(np.float64)
    logger.close()
    return losses


def test_the_table_has_a_row_per_run_with_the_documented_columns_against_a_by_hand_reference(tmp_path):
    losses = sweep(tmp_path)
    table = lox.runs(tmp_path)
    assert table.column_names == [*RUN_COLUMNS, "lr", "config.opt", "config.depth", "loss.last", "loss.min",
                                  "loss.max", "loss.count", "acc.last", "acc.min", "acc.max", "acc.count", "best_acc"]
    assert table.schema.field("start").type == pa.timestamp("ms", tz="UTC")
    assert table.schema.field("duration").type == pa.float64() and table.schema.field("loss.count").type == pa.int64()
    rows = table.to_pylist()
    assert [row["run_id"] for row in rows] == list(losses)  # oldest first
    for row in rows:
        loss = losses[row["run_id"]]
        finite = loss[~np.isnan(loss)]
        assert (row["loss.last"], row["loss.min"], row["loss.max"], row["loss.count"]) == (
            loss[-1], finite.min(), finite.max(), len(loss))
        assert (row["acc.last"], row["acc.min"], row["acc.max"], row["acc.count"]) == (5.0, 0.0, 5.0, 6)
        assert row["status"] == "finished" and row["best_acc"] == 5.0 and row["config.opt"] == "sgd"
        assert row["duration"] == pytest.approx((row["end"] - row["start"]).total_seconds(), abs=1e-3)
    assert [row["lr"] for row in rows] == [0.1, 0.01, 1.0]
    one = lox.runs(tmp_path / rows[1]["run_id"])  # one run's folder
    assert one.to_pylist() == [rows[1]]


def test_runs_without_an_index_row_are_read_from_their_run_json_alike(tmp_path):
    sweep(tmp_path)
    from_index = lox.runs(tmp_path)
    (index,) = tmp_path.glob(f"*{layout.BATCHES_SUFFIX}/{layout.RUNS_INDEX}")
    index.unlink()  # as if killed before its group's first index
    assert lox.runs(tmp_path).equals(from_index)


def test_runs_of_earlier_lox_have_null_summaries_and_groups_of_other_types_are_promoted(tmp_path):
    shutil.copytree(DATA / "lox-0.1-runs", tmp_path, dirs_exist_ok=True)
    sweep(tmp_path, lrs=(0.5,), group_name="a")
    sweep(tmp_path, lrs=(0.25,), group_name="b", extra={"width": 3})
    sweep(tmp_path, lrs=(0.75,), group_name="c", extra={"width": "wide"})  # a string where another group has ints
    table = lox.runs(tmp_path)
    old = [row for row in table.to_pylist() if row["group"] == "old"]
    assert [row["name"] for row in old] == ["old-0", "old-1"] and [row["lr"] for row in old] == [0.1, 0.2]
    assert all(row["loss.min"] is None and row["status"] == "finished" for row in old)
    assert table.schema.field("width").type == pa.string()
    assert [w for w in table["width"].to_pylist() if w is not None] == ["3", "wide"]


def test_a_killed_run_reads_killed_from_its_index(tmp_path):
    script = textwrap.dedent(f"""
        import lox, numpy as np, time
        logger = lox.loggers.from_config("parquet:{tmp_path}")
        state = logger.init(run_id="job", lr=0.1)
        logger.log(state, lox.logdict({{"loss": np.arange(3.0)}}, steps={{"step": {{"loss": np.arange(3)}}}}))
        logger.summary(state, {{"best": 2.0}})
        logger.flush()
        print("flushed", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline() == "flushed\n"
    proc.kill()
    proc.wait()
    proc.stdout.close()
    (row,) = lox.runs(tmp_path).to_pylist()
    assert (row["run_id"], row["status"], row["loss.count"], row["loss.max"], row["best"]) == ("job", "killed", 3,
                                                                                               2.0, 2.0)
    assert row["end"] is None and row["duration"] is None


def test_duckdb_polars_and_pandas_read_the_indexes_directly(tmp_path):
    sweep(tmp_path, lrs=(0.1, 1.0), group_name="a")
    sweep(tmp_path, lrs=(0.5,), group_name="b")
    expected = sorted(lox.runs(tmp_path).select(["name", "lr", "loss.min"]).to_pylist(), key=lambda r: r["name"])
    pattern = f"{tmp_path}/*{layout.BATCHES_SUFFIX}/{layout.RUNS_INDEX}"
    by_duckdb = duckdb.sql(f"SELECT name, lr, \"loss.min\" FROM read_parquet('{pattern}', union_by_name = true) "
                           "ORDER BY name").fetchall()
    files = sorted(glob.glob(pattern))
    by_polars = polars.concat([polars.read_parquet(f) for f in files], how="diagonal_relaxed").sort("name")
    by_pandas = pandas.concat([pandas.read_parquet(f) for f in files]).sort_values("name")
    assert [tuple(r.values()) for r in expected] == by_duckdb
    assert by_polars.select(["name", "lr", "loss.min"]).rows() == by_duckdb
    assert list(by_pandas[["name", "lr", "loss.min"]].itertuples(index=False, name=None)) == by_duckdb


def test_a_bucket_takes_a_bounded_number_of_requests_per_group_not_one_per_run(s3_server, monkeypatch):
    bucket = s3_server.fresh_bucket(monkeypatch)
    logger = lox.loggers.from_config(f"parquet:{bucket}/runs")
    seeds = 64
    state = jax.vmap(lambda k: logger.init(k, run_id="sweep", lr=0.1))(jax.random.split(jax.random.key(0), seeds))
    jax.vmap(lambda s, x: logger.spool(lambda x: lox.log({"loss": x}, step=0), s)(x))(state, jnp.arange(seeds * 1.0))
    logger.finish(state)
    logger.close()
    log = pathlib.Path(s3_server.folder) / f"moto-{s3_server.port}.log"
    before = len(log.read_text().splitlines())
    table = lox.runs(f"{bucket}/runs")
    requests = [line for line in log.read_text().splitlines()[before:] if '"GET ' in line or '"HEAD ' in line]
    last = dict(zip(table["run_id"].to_pylist(), table["loss.last"].to_pylist(), strict=True))
    assert last == {f"sweep-{i}": float(i) for i in range(seeds)}
    assert 2 <= len(requests) <= 6, requests  # a listing (one page) and the group's index: not one per run


# --- choosing runs ------------------------------------------------------------------------
RUNS = pa.table({"name": ["a", "b", "c", "d"], "status": ["finished", "killed", "finished", "finished"],
                 "config.lr": [0.1, 0.01, 1.0, None], "opt.lr": [1, 2, 3, 4],
                 "config.opt": ["sgd", "adam", "sgd", "sgd"],
                 "loss.min": [0.5, 0.2, None, 0.9], "done": [True, False, True, True]})


def names(table):
    return table.column("name").to_pylist()


@pytest.mark.parametrize(("kwargs", "expected"), [
    ({"where": "config.lr < 0.5"}, ["a", "b"]),
    ({"where": "config.lr >= 0.1 and config.opt == 'sgd'"}, ["a", "c"]),
    ({"where": "opt != 'adam'"}, ["a", "c", "d"]),
    ({"where": 'loss.min > 1e-1 AND done == true'}, ["a", "d"]),
    ({"where": "opt.lr <= 2"}, ["a", "b"]),
    ({"status": "finished"}, ["a", "c", "d"]),
    ({"best": (2, "loss.min")}, ["b", "a"]),
    ({"best": (9, "loss.min")}, ["b", "a", "d", "c"]),
    ({"sort": "-loss.min"}, ["d", "a", "b", "c"]),
    ({"sort": "config.lr"}, ["b", "a", "c", "d"]),
    ({"status": "finished", "best": (1, "loss.min")}, ["a"]),
])
def test_select_chooses_the_runs_a_user_chose_by_hand(kwargs, expected):
    assert names(select(RUNS, **kwargs)) == expected


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"where": "momentum < 1"}, ["no column 'momentum'", "config.lr", "loss.min"]),
    ({"where": "lr < 1"}, ["'lr' could be any of the columns 'config.lr', 'opt.lr'"]),
    ({"where": "config.lr ~ 1"}, ["cannot read the condition 'config.lr ~ 1'", "joined by 'and'"]),
    ({"where": "config.lr < 0.1 or name == 'a'"}, ["cannot read the condition"]),
    ({"where": "config.opt < 1"}, ["'config.opt'", "compare it with a quoted string"]),
    ({"where": "config.lr == 'x'"}, ["'config.lr'", "compare it with a number"]),
    ({"best": (0, "loss.min")}, ["positive integer"]),
    ({"best": (2, "loss")}, ["no column 'loss'"]),
    ({"sort": "-nothing"}, ["sort: the runs have no column 'nothing'"]),
    ({"status": "done"}, ["no status 'done'", "running, finished, failed, killed"]),
])
def test_select_refuses_what_it_cannot_choose_by_naming_it(kwargs, words):
    with pytest.raises(ValueError) as raised:
        select(RUNS, **kwargs)
    for word in words:
        assert word in str(raised.value)
