"""Run summaries (lox_backends/runstore/summary.py): per batch file, merged as files
are written, stored in ``_run.json`` and the runs index, and rebuilt from file
footers for a resumed run; each against a by-hand NumPy reference."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

import lox
from lox_backends.memory import MemoryBackend
from lox_backends.parquet import ParquetBackend
from lox_backends.plugin import hooks
from lox_backends.runstore import layout
from lox_backends.runstore.summary import Summary, of_table


def by_hand(values):
    """last, min, max (NaN ignored, None if all are), count of a list of floats."""
    values = np.asarray(values, np.float64)
    finite = values[~np.isnan(values)]
    return {"last": float(values[-1]), "min": float(finite.min()) if finite.size else None,
            "max": float(finite.max()) if finite.size else None, "count": int(values.size)}


def same(a, b):
    """Dicts of numbers equal, NaN equal to NaN."""
    assert a.keys() == b.keys(), (a, b)
    for key in a:
        x, y = a[key], b[key]
        assert (x is None and y is None) or x == y or (np.isnan(x) and np.isnan(y)), (key, x, y)


def events(values, steps=None):
    values = np.asarray(values, np.float32)
    return lox.logdict({"loss": values}, steps={"step": {"loss": np.arange(len(values)) if steps is None else steps}})


def test_a_files_summary_is_of_each_run_and_series_nan_ignored_in_min_and_max():
    rng = np.random.default_rng(0)
    a = rng.standard_normal(50).astype(np.float32)
    a[[3, 17]] = np.nan
    b = np.full(4, np.nan, np.float32)
    logs_a = lox.logdict({"loss": a, "w": np.ones((50, 3))}, steps={"step": {"loss": np.arange(50) + 10}})
    table = of_table(__import__("pyarrow").concat_tables([
        logs_a.to_arrow(run="a"), events(b, np.array([1, 2, 3, 9])).to_arrow(run="b")]))
    assert sorted(table) == ["a", "b"]
    assert list(table["a"]["keys"]) == ["loss"]  # "w" holds arrays: no series of scalars
    count, low, high, last = table["a"]["keys"]["loss"]
    same({"last": last, "min": low, "max": high, "count": count}, by_hand(a.astype(np.float64)))
    assert table["b"]["keys"]["loss"][:3] == [4, None, None] and np.isnan(table["b"]["keys"]["loss"][3])
    assert table["a"]["steps"] == [10, 59] and table["b"]["steps"] == [1, 9]


def test_merging_files_summaries_equals_the_summary_of_all_their_values():
    rng = np.random.default_rng(1)
    parts = [rng.standard_normal(n) for n in (5, 1, 7)]
    parts[1][0] = np.nan
    summary = Summary()
    for part in parts:
        summary.add(of_table(events(part).to_arrow(run="r"))["r"])
    reference = by_hand(np.concatenate([p.astype(np.float32) for p in parts]).astype(np.float64))
    same(summary.to_json()["keys"]["loss"], reference)
    assert Summary.from_json(json.loads(json.dumps(summary.to_json()))).columns() == summary.columns()


def flushed_run(root, chunks, values=None, close=True):
    """A run `r` of group `g`, one flush per chunk of losses (steps numbered on)."""
    backend = ParquetBackend(str(root))
    run = hooks.RunInfo("r", name="r", group="g", metadata={"lr": 0.1})
    backend.open_run(run)
    start = 0
    for chunk in chunks:
        backend.write(run, events(chunk, np.arange(start, start + len(chunk))).to_arrow(run="r"))
        backend.flush()
        start += len(chunk)
    if values:
        backend.summarize(run, values)
        backend.flush()
    if close:
        backend.close_run(run)
        backend.close()
    return backend


def test_run_json_and_each_file_hold_the_summary_the_layout_describes(tmp_path):
    rng = np.random.default_rng(2)
    chunks = [rng.standard_normal(n).astype(np.float32) for n in (4, 6, 3)]
    flushed_run(tmp_path, chunks, {"best": 0.5, "model": "mlp"})
    stored = json.loads((tmp_path / "r" / layout.RUN_FILE).read_text())["summary"]
    same(stored["keys"]["loss"], by_hand(np.concatenate(chunks).astype(np.float64)))
    assert stored["values"] == {"best": 0.5, "model": "mlp"}
    files = sorted((tmp_path / layout.batches_folder("g")).glob("batch-*.parquet"))
    footers = [json.loads(pq.read_metadata(f).metadata[layout.SUMMARY_METADATA]) for f in files]
    assert [f["r"]["steps"] for f in footers] == [[0, 3], [4, 9], [10, 12]]
    assert [f["r"]["keys"]["loss"][0] for f in footers] == [4, 6, 3]


def test_non_finite_values_are_stored_as_strict_json_and_read_back(tmp_path):
    flushed_run(tmp_path, [np.array([np.inf, np.nan, -1.0, np.nan])])
    text = (tmp_path / "r" / layout.RUN_FILE).read_text()
    assert "NaN" in text and json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    summary = Summary.from_json(json.loads(text)["summary"])
    count, low, high, last = summary.keys["loss"]
    assert (count, low, high) == (4, -1.0, np.inf) and np.isnan(last)


def test_a_resumed_run_goes_on_from_its_files_footers_without_the_superseded_steps(tmp_path):
    """Killed after step 11 (never closed), resumed from step 6: steps 6-11 of the
    first life are superseded, and the summary is of steps 0-5 and the new ones."""
    rng = np.random.default_rng(3)
    first = rng.standard_normal(12).astype(np.float32)
    flushed_run(tmp_path, [first[:4], first[4:9], first[9:]], {"best": 1.0}, close=False)
    again = rng.standard_normal(5).astype(np.float32)
    backend = ParquetBackend(str(tmp_path))
    run = hooks.RunInfo("r", name="r", group="g", metadata={"lr": 0.1}, resumed=True, from_step=6)
    backend.open_run(run)
    backend.write(run, events(again, np.arange(6, 11)).to_arrow(run="r"))
    backend.flush()
    backend.summarize(run, {"other": 2})
    backend.close_run(run)
    backend.close()
    stored = json.loads((tmp_path / "r" / layout.RUN_FILE).read_text())["summary"]
    same(stored["keys"]["loss"], by_hand(np.concatenate([first[:6], again]).astype(np.float64)))
    assert stored["values"] == {"best": 1.0, "other": 2}  # the killed life's value, from its group's index
    assert lox.load(str(tmp_path / "r"))["loss"].tolist() == np.concatenate([first[:6], again]).tolist()


def test_a_run_resumed_after_it_ended_keeps_its_values_and_a_resume_without_from_step_keeps_every_row(tmp_path):
    flushed_run(tmp_path, [np.array([3.0, 1.0])], {"best": 1.0})
    backend = ParquetBackend(str(tmp_path))
    run = hooks.RunInfo("r", name="r", group="g", resumed=True)
    backend.open_run(run)
    backend.write(run, events([2.0], np.array([2])).to_arrow(run="r"))
    backend.close_run(run)
    backend.close()
    stored = json.loads((tmp_path / "r" / layout.RUN_FILE).read_text())["summary"]
    assert stored == {"keys": {"loss": {"last": 2.0, "min": 1.0, "max": 3.0, "count": 3}}, "values": {"best": 1.0}}


def test_the_memory_backend_keeps_the_same_summary():
    backend = MemoryBackend()
    run = hooks.RunInfo("r", name="r", group="g")
    backend.open_run(run)
    backend.write(run, events([3.0, np.nan]).to_arrow(run="r"))
    backend.write(run, events([1.0]).to_arrow(run="r"))
    backend.summarize(run, {"best": 1.0})
    backend.summarize(run, {"best": 0.5})
    assert backend.summaries["r"] == {"keys": {"loss": {"last": 1.0, "min": 1.0, "max": 3.0, "count": 3}},
                                      "values": {"best": 0.5}}
