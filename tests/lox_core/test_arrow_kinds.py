"""Kinds in lox's Arrow tables (`lox_core/arrow.py`, `lox_core/arrow_codec.py`, schema version 2):
the ``kind`` column, the ``lox.kinds`` metadata and text rows, checked against the bytes and
arrays written by hand; every kind round-trips (also through Parquet, and read by polars and
DuckDB); vmapped runs each keep their own media; tables of schema version 1 still read."""

import json

import duckdb
import jax
import numpy as np
import polars
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from logs_testing import schema_1_table

import lox
from lox_core import schema
from lox_core.arrow import from_arrow, from_arrow_runs, to_arrow, to_arrow_runs
from lox_core.media import Audio, Histogram, Image, Video

S = np.dtypes.StringDType()
RNG = np.random.default_rng(0)


def every_kind(events: int = 2) -> tuple[lox.logdict, dict[str, np.ndarray]]:
    """A logdict of every kind, and each series' arrays as logged (the references)."""
    pixels = RNG.random((events, 5, 6, 3)).astype(np.float32)
    frames = RNG.integers(0, 256, (events, 3, 4, 4, 1), dtype=np.uint8)
    samples = RNG.uniform(-1, 1, (events, 50, 2)).astype(np.float32)
    counts = RNG.integers(0, 9, (events, 4)).astype(np.int32)
    edges = np.tile(np.linspace(-1, 1, 5, dtype=np.float32), (events, 1))
    text = np.array([f"sample {i}: ünï" for i in range(events)], S)
    table = np.array([[["a", "b"], ["c", f"d{i}"]] for i in range(events)], S).reshape(events, 2, 2)
    loss = np.arange(events, dtype=np.float32) / 2
    w = RNG.random((events, 3))
    logs = lox.logdict(
        {"loss": loss, "w": w, "img": Image(pixels), "vid": Video(frames, fps=12), "aud": Audio(samples, rate=8000),
         "h": Histogram(counts, edges), "t": text, "tab": table},
        steps={"step": {k: np.arange(events) * 10 for k in ("loss", "w", "img", "vid", "aud", "h", "t", "tab")}},
    )
    series = {"loss": loss, "w": w, "img": pixels, "vid": frames, "aud": samples, "h/counts": counts,
              "h/edges": edges, "t": text, "tab": table}
    return logs, series


KINDS = {"loss": "scalar", "w": "array", "img": "image", "vid": "video", "aud": "audio", "h/counts": "histogram",
         "h/edges": "histogram", "t": "text", "tab": "text"}


def check_every_kind(back: lox.logdict, series: dict[str, np.ndarray]) -> None:
    assert back.kind == {"loss": "scalar", "w": "array", "img": "image", "vid": "video", "aud": "audio",
                         "h": "histogram", "t": "text", "tab": "text"}
    assert isinstance(back["img"], Image) and isinstance(back["h"], Histogram)
    assert back["vid"].fps == 12 and back["aud"].rate == 8000
    got = {"loss": back["loss"], "w": back["w"], "img": back["img"].pixels, "vid": back["vid"].frames,
           "aud": back["aud"].samples, "h/counts": back["h"].counts, "h/edges": back["h"].edges, "t": back["t"],
           "tab": back["tab"]}
    for name, want in series.items():
        assert got[name].dtype == want.dtype, name
        np.testing.assert_array_equal(got[name], want)
    assert back["t"].dtype == S and back["tab"].shape == series["tab"].shape
    assert back.step["img"].tolist() == back.step["h"].tolist() == list(range(0, 10 * len(series["t"]), 10))


def test_columns_hold_each_kind_as_specified():
    logs, series = every_kind()
    table = to_arrow(logs, run="r")
    assert table.column_names[-1] == "kind"
    assert table.schema.field("kind").type == pa.dictionary(pa.int32(), pa.string())
    rows = table.select(["key", "kind", "dtype", "shape", "value", "data"]).to_pylist()
    assert [(r["key"], r["kind"]) for r in rows] == [(k, KINDS[k]) for k in series for _ in range(2)]
    for r in rows:
        want = series[r["key"]]
        if r["kind"] == "text":
            assert r["dtype"] == "str" and r["value"] is None and r["shape"] == list(want.shape[1:])
        else:
            assert r["dtype"] == want.dtype.name and r["shape"] == list(want.shape[1:])
    by_row = {(r["key"], i % 2): r for i, r in enumerate(rows)}
    assert by_row[("t", 1)]["data"] == "sample 1: ünï".encode()
    assert json.loads(by_row[("tab", 1)]["data"]) == ["a", "b", "c", "d1"]  # C order
    assert by_row[("img", 0)]["data"] == series["img"][0].tobytes()
    assert by_row[("h/edges", 1)]["data"] == series["h/edges"][1].tobytes()
    meta = table.schema.metadata
    assert meta[b"lox.schema"] == b"2"
    assert json.loads(meta[b"lox.kinds"]) == {"img": {"kind": "image"}, "vid": {"kind": "video", "fps": 12},
                                              "aud": {"kind": "audio", "rate": 8000}, "h": {"kind": "histogram"}}
    assert "lox.trees" not in {k.decode() for k in meta}
    assert schema.row_kinds(table).to_pylist() == [KINDS[r["key"]] for r in rows]


def test_every_kind_round_trips():
    logs, series = every_kind()
    back = from_arrow(to_arrow(logs))
    check_every_kind(back, series)
    assert list(back) == list(logs)
    flat = from_arrow(to_arrow(logs), flat=True)  # trackers: the series as the key column names them
    assert list(flat) == list(series)
    assert all(type(v) is np.ndarray for v in flat.values()) and flat["t"].dtype == S
    np.testing.assert_array_equal(flat["h/counts"], series["h/counts"])


def test_fixed_width_strings_are_written_as_text():
    table = to_arrow(lox.logdict({"t": np.array([["x", "yy"], ["é", ""]])}))  # <U2: two events of shape (2,)
    assert table.column("kind").to_pylist() == ["text", "text"] and table.column("dtype").to_pylist() == ["str"] * 2
    assert [json.loads(d) for d in table.column("data").to_pylist()] == [["x", "yy"], ["é", ""]]
    back = from_arrow(table)["t"]
    assert back.dtype == S and back.tolist() == [["x", "yy"], ["é", ""]]


def test_through_parquet_and_other_readers(tmp_path):
    logs, series = every_kind(3)
    path = str(tmp_path / "kinds.parquet")
    pq.write_table(to_arrow(logs, run="r"), path)
    check_every_kind(from_arrow(pq.read_table(path)), series)
    rows = duckdb.sql(f"SELECT key, kind, count(*) AS n FROM '{path}' GROUP BY ALL").fetchall()
    assert sorted(rows) == sorted((k, kind, 3) for k, kind in KINDS.items())
    text = duckdb.sql(f"SELECT decode(data) FROM '{path}' WHERE kind = 'text' AND key = 't'").fetchall()
    assert [t for (t,) in text] == series["t"].tolist()
    frame = polars.read_parquet(path)
    assert frame.filter(polars.col("kind") == "scalar")["value"].to_list() == series["loss"].tolist()
    assert frame.filter(polars.col("kind") == "image")["shape"].to_list() == [[5, 6, 3]] * 3
    # Arrow from polars keeps the columns; its schema metadata is gone, so kinds come back as arrays.
    plain = from_arrow(frame.to_arrow())
    assert plain.kind["img"] == "array" and plain["t"].tolist() == series["t"].tolist()
    np.testing.assert_array_equal(plain["h/counts"], series["h/counts"])


def test_empty_series_of_each_kind():
    logs, _ = every_kind(0)
    back = from_arrow(to_arrow(logs))
    assert back.kind == {"loss": "scalar", "w": "array", "img": "image", "vid": "video", "aud": "audio",
                         "h": "histogram", "t": "text", "tab": "text"}
    assert back["img"].pixels.shape == (0, 5, 6, 3) and back["vid"].fps == 12 and back["tab"].shape == (0, 2, 2)
    assert back["t"].dtype == S


def test_runs_of_vmapped_seeds_each_keep_their_media():
    seeds = 3
    pixels = RNG.random((seeds, 2, 4, 4, 1)).astype(np.float32)  # (runs, events, H, W, C)
    counts = RNG.integers(0, 5, (seeds, 2, 3)).astype(np.int32)
    edges = RNG.random((seeds, 2, 4)).astype(np.float32)
    logs = lox.logdict({"img": Image(pixels), "h": Histogram(counts, edges), "loss": RNG.random((seeds, 2))},
                       {"step": {k: np.tile(np.arange(2), (seeds, 1)) for k in ("img", "h", "loss")}})
    names = [f"seed{i}" for i in range(seeds)]
    table, offsets = to_arrow_runs(logs, names, batch_ndim=1)
    for i in range(seeds):
        one = from_arrow(table.slice(offsets[i], offsets[i + 1] - offsets[i]))
        np.testing.assert_array_equal(one["img"].pixels, pixels[i])
        np.testing.assert_array_equal(one["h"].counts, counts[i])
        np.testing.assert_array_equal(one["h"].edges, edges[i])
    runs = from_arrow_runs(table)
    assert list(runs) == names
    for i, name in enumerate(names):
        assert runs[name].kind == {"img": "image", "h": "histogram", "loss": "scalar"}
        np.testing.assert_array_equal(runs[name]["img"].pixels, pixels[i])
        np.testing.assert_array_equal(runs[name]["h"].edges, edges[i])


def test_spooled_kinds_under_vmap_round_trip():
    def f(x):
        lox.log({"img": lox.image(x), "h": lox.histogram(x, bins=3)}, step=0)
        return x

    x = RNG.random((2, 4, 4, 1)).astype(np.float32)
    _, logs = lox.spool(jax.vmap(f))(x)  # the vmap axis after the event axis
    back = from_arrow(to_arrow(logs))
    np.testing.assert_array_equal(back["img"].pixels, np.asarray(logs["img"].pixels))
    np.testing.assert_array_equal(back["h"].counts, np.asarray(logs["h"].counts))
    assert back["h"].counts.shape == (1, 2, 3) and back.kind["img"] == "image"
    for i in range(2):
        want, _ = np.histogram(x[i], bins=3)
        np.testing.assert_array_equal(back["h"].counts[0, i], want)


def test_schema_1_tables_still_read(tmp_path):
    table = schema_1_table("old")
    pq.write_table(table, tmp_path / "old.parquet")
    back = from_arrow(pq.read_table(tmp_path / "old.parquet"))
    assert back.kind == {"loss": "scalar", "w": "array"}
    assert back["loss"].tolist() == [0.5, 0.25] and back["w"].tolist() == [[0, 1], [2, 3]]
    assert schema.row_kinds(table).to_pylist() == ["scalar", "array", "scalar", "array"]


def test_bad_kinds_metadata_and_text_say_what_to_do():
    logs, _ = every_kind(1)
    table = to_arrow(logs)
    meta = dict(table.schema.metadata)
    newer = table.replace_schema_metadata({**meta, b"lox.kinds": json.dumps({"img": {"kind": "mesh"}}).encode()})
    with pytest.raises(ValueError, match=r"describes key 'img' with \{\"kind\": \"mesh\"\}; this lox knows the kinds "
                                         r"image, video, audio, histogram .*upgrade lox.*remove that entry"):
        from_arrow(newer)
    odd = table.replace_schema_metadata({**meta, b"lox.kinds": json.dumps({"vid": {"kind": "video", "x": 1}}).encode()})
    with pytest.raises(ValueError, match=r"gives key 'vid' the options \{'x': 1\}.*remove that entry"):
        from_arrow(odd)
    without = table.replace_schema_metadata({k: v for k, v in meta.items() if k != b"lox.kinds"})
    assert from_arrow(without).kind["img"] == "array"  # read as its arrays
    rows = to_arrow(lox.logdict({"tab": np.array([["a", "b"]], S)}))
    broken = rows.set_column(rows.column_names.index("data"), "data", pa.array([b'["a"]'], pa.large_binary()))
    with pytest.raises(ValueError, match=r"text key 'tab' does not hold a JSON list of 2 strings per event"):
        from_arrow(broken)
