"""Kinds through the parquet backend and the run store (`lox_backends/runstore/writer.py`,
`reader.py`, `summary.py`, `table.py`): images, video, audio, histograms and text logged by a
Logger (spool, tap and `logger.log`, vmapped seeds each in their own run) read back with
`lox.load` equal to the arrays logged, and with pyarrow and DuckDB by their ``kind`` column;
text and media never reach summaries or the table of runs; files of schema version 1 load."""

import json
import pathlib

import duckdb
import jax
import jax.numpy as jnp
import numpy as np
import pyarrow.parquet as pq
import pytest
from logs_testing import schema_1_table

import lox
from lox_backends.parquet import ParquetBackend
from lox_backends.plugin import hooks
from lox_core.arrow import to_arrow
from lox_core.media import Histogram, Image, Video

SEEDS = 2
RATE, FPS, BINS = 8000, 5, 4


def inputs(step: int) -> dict[str, np.ndarray]:
    """What the seeds log at `step` (leading axis: the seed)."""
    rng = np.random.default_rng(step)
    return {"pixels": rng.integers(0, 256, (SEEDS, 3, 4, 4, 3)).astype(np.uint8),
            "frames": rng.random((SEEDS, 3, 4, 4, 1)).astype(np.float32),
            "sound": rng.uniform(-1, 1, (SEEDS, 32)).astype(np.float32),
            "values": rng.random((SEEDS, 50)).astype(np.float32)}


def train(x, i):
    lox.log({"img": lox.image(x["pixels"]), "vid": lox.video(x["frames"], fps=FPS),
             "aud": lox.audio(x["sound"], rate=RATE), "h": lox.histogram(x["values"], bins=BINS, range=(0.0, 1.0)),
             "loss": jnp.mean(x["values"])}, step=i)
    return i


def notes(step: int) -> dict:
    """Text: one str for every seed, and each seed's line of two strings."""
    return {"note": f"step {step}: ünïcode", "lines": np.array([[f"seed {s} a", f"seed {s} b"] for s in range(SEEDS)])}


def log_every_way(folder) -> list[str]:
    """Step 0 spooled, step 1 tapped, step 2 text from Python, for two vmapped seeds; the run ids."""
    logger = lox.loggers.from_config(f"parquet:{folder}", name="media")
    states = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), SEEDS))
    jax.jit(jax.vmap(lambda s, x: logger.spool(train, s)(x, 0)))(states, inputs(0))
    jax.block_until_ready(jax.jit(jax.vmap(lambda s, x: logger.tap(train, s)(x, 1)))(states, inputs(1)))
    logger.log(states, notes(2), step=2)
    logger.finish(states)
    return [run.run_id for run in logger.runs()]


def test_every_kind_of_every_seed_reads_back_as_logged(tmp_path):
    run_ids = log_every_way(tmp_path)
    runs = lox.load(tmp_path)
    assert list(runs) == run_ids
    for seed, run_id in enumerate(run_ids):
        logs = runs[run_id]
        assert logs.kind == {"img": "image", "vid": "video", "aud": "audio", "h": "histogram", "loss": "scalar",
                             "note": "text", "lines": "text"}
        x = [inputs(step) for step in (0, 1)]
        np.testing.assert_array_equal(logs["img"].pixels, np.stack([xi["pixels"][seed] for xi in x]))
        np.testing.assert_array_equal(logs["vid"].frames, np.stack([xi["frames"][seed] for xi in x]))
        np.testing.assert_array_equal(logs["aud"].samples, np.stack([xi["sound"][seed] for xi in x]))
        assert logs["vid"].fps == FPS and logs["aud"].rate == RATE and logs["img"].pixels.dtype == np.uint8
        for i, xi in enumerate(x):
            counts, edges = np.histogram(xi["values"][seed], bins=BINS, range=(0.0, 1.0))
            np.testing.assert_array_equal(logs["h"].counts[i], counts)
            np.testing.assert_allclose(logs["h"].edges[i], edges, rtol=1e-6)
        np.testing.assert_allclose(logs["loss"], [xi["values"][seed].mean() for xi in x], rtol=1e-6)
        assert logs["note"].tolist() == ["step 2: ünïcode"] and logs["note"].dtype == np.dtypes.StringDType()
        assert logs["lines"].tolist() == [[f"seed {seed} a", f"seed {seed} b"]]
        assert logs.step["img"].tolist() == [0, 1] and logs.step["note"].tolist() == [2]
        one = lox.load(tmp_path / run_id)  # one run's folder: the same
        assert one.kind == logs.kind and one["vid"] == logs["vid"]


def test_other_readers_see_the_kind_column(tmp_path):
    log_every_way(tmp_path)
    files = f"{tmp_path}/*.batches/batch-*.parquet"
    rows = duckdb.sql(f"SELECT DISTINCT key, kind FROM '{files}'").fetchall()
    assert sorted(rows) == sorted([("img", "image"), ("vid", "video"), ("aud", "audio"), ("h/counts", "histogram"),
                                   ("h/edges", "histogram"), ("loss", "scalar"), ("note", "text"), ("lines", "text")])
    notes_read = duckdb.sql(f"SELECT decode(data) FROM '{files}' WHERE kind = 'text' AND key = 'note'").fetchall()
    assert [t for (t,) in notes_read] == ["step 2: ünïcode"] * SEEDS
    for path in pathlib.Path(tmp_path).glob("*.batches/batch-*.parquet"):
        table = pq.read_table(path)
        meta = table.schema.metadata
        assert meta[b"lox.schema"] == b"2"
        if b"lox.kinds" in meta:  # the spooled and the tapped files: every kind with its options
            assert json.loads(meta[b"lox.kinds"]) == {"img": {"kind": "image"}, "vid": {"kind": "video", "fps": FPS},
                                                      "aud": {"kind": "audio", "rate": RATE},
                                                      "h": {"kind": "histogram"}}


def test_text_and_media_never_reach_summaries_or_the_table_of_runs(tmp_path):
    run_ids = log_every_way(tmp_path)
    for run_id in run_ids:
        summary = json.loads((tmp_path / run_id / "_run.json").read_text())["summary"]
        assert list(summary["keys"]) == ["loss"]
    for path in pathlib.Path(tmp_path).glob("*.batches/batch-*.parquet"):
        footer = json.loads(pq.read_metadata(path).metadata[b"lox.summary"])
        assert all(set(entry["keys"]) <= {"loss"} for entry in footer.values())
    table = lox.runs(tmp_path)
    series_columns = {name.rsplit(".", 1)[0] for name in table.column_names if "." in name}
    assert series_columns == {"loss"}


def open_run(root, run_id):
    backend = ParquetBackend(str(root))
    run = hooks.RunInfo(run_id, name=run_id, group="g")
    backend.open_run(run)
    return backend, run


def test_runs_of_a_group_with_other_kinds_of_one_key_each_keep_theirs(tmp_path):
    backend = ParquetBackend(str(tmp_path))
    runs = [hooks.RunInfo(f"r{i}", name=f"r{i}", group="g") for i in range(4)]
    for run in runs:
        backend.open_run(run)
    frames = np.arange(8, dtype=np.uint8).reshape(1, 2, 2, 2, 1)  # one event: 2 frames of 2 x 2 grey pixels
    values = {
        "r0": Image(frames[:, 0]),  # x: an image
        "r1": Video(frames, fps=2),  # x: a video at 2 fps
        "r2": Video(frames, fps=8),  # x: a video at 8 fps
        "r3": Histogram(np.array([[1, 2]]), np.array([[0.0, 0.5, 1.0]])),  # h: a histogram
    }
    for run in runs:
        key = "h" if run.run_id == "r3" else "x"
        backend.write(run, to_arrow(lox.logdict({key: values[run.run_id]}, {"step": {key: np.array([0])}}),
                                    run=run.run_id))
    for run in runs:
        backend.close_run(run)
    files = sorted(pathlib.Path(tmp_path, "g.batches").glob("batch-*.parquet"))
    kinds = [json.loads(pq.read_schema(f).metadata[b"lox.kinds"]) for f in files]
    # A new file where a key's kind or options change; r3's histogram joins r2's file.
    assert kinds == [{"x": {"kind": "image"}}, {"x": {"kind": "video", "fps": 2}},
                     {"x": {"kind": "video", "fps": 8}, "h": {"kind": "histogram"}}]
    loaded = lox.load(tmp_path)
    for run in runs:
        key = "h" if run.run_id == "r3" else "x"
        assert loaded[run.run_id][key] == values[run.run_id]


def test_a_run_of_schema_version_1_still_loads_and_summarizes(tmp_path):
    backend, run = open_run(tmp_path, "old")
    backend.write(run, schema_1_table("old"))
    backend.close_run(run)
    (path,) = pathlib.Path(tmp_path, "g.batches").glob("batch-*.parquet")
    assert "kind" not in pq.read_schema(path).names and pq.read_schema(path).metadata[b"lox.schema"] == b"1"
    logs = lox.load(tmp_path / "old")
    assert logs.kind == {"loss": "scalar", "w": "array"}
    assert logs["loss"].tolist() == [0.5, 0.25] and logs["w"].tolist() == [[0, 1], [2, 3]]
    assert logs.step["w"].tolist() == [0, 1]
    summary = json.loads((tmp_path / "old" / "_run.json").read_text())["summary"]["keys"]
    assert summary == {"loss": {"last": 0.25, "min": 0.25, "max": 0.5, "count": 2}}


def test_a_resumed_run_that_logs_a_key_as_another_kind_or_fps_says_so_where_it_is_read(tmp_path):
    # A key keeps one kind in a logger's runs, but a restarted program's Logger does not know what the
    # run's files hold: a video at 4 fps, then at 8 after a resume, came back as a plain array, silently.
    def clip(fps):
        return lambda x, i: lox.log({"v": lox.video(x, fps=fps), "img": lox.image(x[0])}, step=i)

    x = jnp.zeros((2, 3, 3, 1))
    for fps, step in ((4, 0), (8, 1)):
        logger = lox.loggers.from_config(f"parquet:{tmp_path}")
        state = logger.init(run_id="job", resume="allow")
        logger.spool(clip(fps), state)(x, step)
        logger.finish(state)
        logger.close()
    with pytest.warns(RuntimeWarning, match=r"key 'v' holds video \(fps=4\) in some tables of run 'job' and "
                                            r"video \(fps=8\) in others.*read as its arrays.*under a new key"):
        logs = lox.load(tmp_path / "job")
    assert logs.kind == {"v": "array", "img": "image"}  # every event kept, as its arrays
    assert logs["v"].shape == (2, 2, 3, 3, 1) and logs.step["v"].tolist() == [0, 1]
