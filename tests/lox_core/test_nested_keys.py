"""Nested keys: a logdict holds a key's pytree as it was logged — from `lox.spool`,
from a tap, from the memory backend, from `lox.load` — and the flat ``key/path``
names are the series names where a namespace is flat: the Arrow ``key`` column,
trackers' metrics, the console, `lox plot --key` (named by `lox_core/series.py`). References
are computed by hand."""

import collections
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow.parquet as pq
import pytest
from logs_testing import assert_logs_equal, tapped
from mlflow.tracking import MlflowClient
from mlflow_server import CLIENT_ENV
from tensorboard.backend.event_processing import event_accumulator as ea

import lox
from lox_backends.parquet import ParquetBackend
from lox_backends.plugin import hooks
from lox_backends.tools import cli
from lox_backends.tools.plot import plot_figure
from lox_core import arrow as lox_arrow
from lox_core.arrow import to_arrow

STEPS = 4  # steps per epoch
W0S = np.array([[1.0, 2.0], [3.0, -4.0], [0.5, 8.0]], np.float32)  # one seed each; every value below is exact
SERIES = ["norms/l1/bias", "norms/l1/kernel", "pair/0", "pair/1/0", "pair/1/1", "loss"]  # the flat names


def train(w, epoch):
    """Halves w (a 2-vector) every step, logging a nested dict, a list holding a
    tuple, and a plain scalar."""

    def step(w, i):
        s = epoch * STEPS + i
        lox.log({"norms": {"l1": {"kernel": jnp.abs(w).sum(), "bias": jnp.stack([w[0], -w[0]])}},
                 "pair": [2 * w[0], (w[1], s)], "loss": (w * w).sum()}, step=s, epoch=epoch)
        return w * 0.5, None

    return jax.lax.scan(step, w, jnp.arange(STEPS))[0]


def by_hand(w0, epochs, first_epoch=0):
    """The logs `train` gives over `epochs` calls from w0, built by hand with NumPy."""
    ws, w = [], np.asarray(w0, np.float32)
    for _ in range(epochs * STEPS):
        ws.append(w)
        w = w * np.float32(0.5)
    ws = np.stack(ws)
    steps = np.arange(first_epoch * STEPS, (first_epoch + epochs) * STEPS, dtype=np.int32)
    data = {
        "norms": {"l1": {"kernel": np.abs(ws).sum(axis=1), "bias": np.stack([ws[:, 0], -ws[:, 0]], axis=1)}},
        "pair": [2 * ws[:, 0], (ws[:, 1], steps)],
        "loss": (ws * ws).sum(axis=1),
    }
    return lox.logdict(data, {"step": dict.fromkeys(data, steps), "epoch": dict.fromkeys(data, steps // STEPS)})


def train_seeds(logger, epochs):
    states = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), len(W0S)))
    one_epoch = jax.jit(jax.vmap(lambda s, w, e: logger.spool(train, s)(w, e), in_axes=(0, 0, None)))
    w = jnp.asarray(W0S)
    for epoch in range(epochs):
        w = one_epoch(states, w, epoch)
        logger.flush(states)  # a batch file per epoch, holding every seed's rows
    return states


# --- spool -> Logger -> Parquet -> lox.load --------------------------------------------------------
def test_spooled_logs_saved_and_loaded_keep_the_structure_as_logged(tmp_path):
    logger = lox.loggers.from_config(f"parquet:{tmp_path / 'runs'}", name="seed")
    logger.finish(train_seeds(logger, epochs=2))

    files = sorted((tmp_path / "runs" / f"{logger.group}.batches").glob("batch-*.parquet"))
    assert len(files) == 2  # two batches, each of the three seeds
    for file in files:
        table = pq.read_table(file)
        assert sorted(set(table.column("key").to_pylist())) == sorted(SERIES)  # the flat names
        assert sorted(set(table.column("run").to_pylist())) == sorted(run.run_id for run in logger.runs())
        assert json.loads(table.schema.metadata[b"lox.trees"]) == {
            "norms": {"dict": {"l1": {"dict": {"bias": None, "kernel": None}}}},
            "pair": {"list": [None, {"tuple": [None, None]}]},
        }
    loaded = lox.load(tmp_path / "runs")
    assert list(loaded) == [run.run_id for run in logger.runs()]
    for logs, w0 in zip(loaded.values(), W0S, strict=True):
        want = by_hand(w0, epochs=2)
        assert_logs_equal(logs, want)
        w = jnp.asarray(w0)
        spooled = []
        for epoch in range(2):
            w, part = lox.spool(train)(w, epoch)
            spooled.append(part)
        assert_logs_equal(logs, spooled[0] + spooled[1])  # what lox.spool gives, key for key
        np.testing.assert_array_equal(logs["norms"]["l1"]["kernel"], np.abs(w0).sum() * 0.5 ** np.arange(8))
        assert isinstance(logs["pair"], list) and isinstance(logs["pair"][1], tuple)
        assert logs.step["norms"].tolist() == list(range(8)) and logs.epoch["pair"].tolist() == [0] * 4 + [1] * 4
        assert not any("/" in key for key in logs)
    one = lox.load(tmp_path / "runs" / logger.runs()[1].run_id)  # a run folder alone
    assert_logs_equal(one, by_hand(W0S[1], epochs=2))


def test_tapped_events_and_blocks_hold_the_structure_as_logged(tmp_path):
    w0 = W0S[1]
    events = []
    lox.tap(train, events.append)(jnp.asarray(w0), 0)
    want = by_hand(w0, epochs=1)
    assert [e.step for e in events] == list(range(STEPS))
    first = events[0]
    assert set(first) == {"norms", "pair", "loss"} and list(first["norms"]["l1"]) == ["bias", "kernel"]
    assert float(first["norms"]["l1"]["kernel"]) == 7.0 and first["norms"]["l1"]["bias"].tolist() == [3.0, -3.0]
    assert float(first["pair"][0]) == 6.0 and float(first["pair"][1][0]) == -4.0 and int(first["pair"][1][1]) == 0
    assert_logs_equal(tapped(events), want, ordered=False)
    blocks = []
    lox.tap(train, blocks.append, buffer=3)(jnp.asarray(w0), 0)
    assert [block["norms"]["l1"]["kernel"].shape for block in blocks] == [(3,), (1,)]
    assert_logs_equal(tapped(blocks), want, ordered=False)
    assert [float(e["norms"]["l1"]["kernel"]) for b in blocks for e in b.events()] == [7.0, 3.5, 1.75, 0.875]

    logger = lox.loggers.from_config(f"parquet:{tmp_path / 'runs'}")  # tapped into a run, then loaded
    state = logger.init(name="tapped")
    logger.tap(train, state)(jnp.asarray(w0), 0)
    logger.tap(train, state, buffer=3)(jnp.asarray(w0 * np.float32(0.5**STEPS)), 1)
    logger.finish(state)
    (logs,) = lox.load(tmp_path / "runs").values()
    assert_logs_equal(logs, by_hand(w0, epochs=2), ordered=False)


def test_the_memory_backend_holds_flat_tables_and_gives_the_logs_as_logged():
    logger = lox.loggers.MemoryLogger()
    state = logger.init(name="memory")
    w = logger.spool(train, state)(jnp.asarray(W0S[0]), 0)
    logger.tap(train, state)(w, 1)
    logger.finish(state)
    backend = logger.backends[0]
    for table in backend.tables():
        assert sorted(set(table.column("key").to_pylist())) == sorted(SERIES)
    assert_logs_equal(backend.logs(), by_hand(W0S[0], epochs=2), ordered=False)


# --- the flat names: trackers, the console, lox plot --------------------------------------------
def test_mlflow_metrics_are_named_key_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, value in CLIENT_ENV.items():
        monkeypatch.setenv(name, value)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    logger = lox.loggers.from_config(f"mlflow:{uri}?experiment=nested", name="nested")
    state = logger.init()
    logger.spool(train, state)(jnp.asarray(W0S[2]), 0)
    logger.finish(state)

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("nested").experiment_id])
    want = by_hand(W0S[2], epochs=1)
    history = lambda key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))  # noqa: E731
    assert history("norms/l1/kernel") == list(enumerate(want["norms"]["l1"]["kernel"].tolist()))
    assert history("pair/1/0") == list(enumerate(want["pair"][1][0].tolist()))
    assert history("pair/1/1") == [(s, float(s)) for s in range(STEPS)]
    assert history("norms") == [] and history("norms/l1") == []
    (local,) = lox.load(tmp_path / "lox-runs").values()  # the local log it was sent from
    assert_logs_equal(local, want)


def test_tensorboard_tags_are_key_path_written_and_synced(tmp_path):
    logger = lox.loggers.from_config(f"tensorboard:{tmp_path / 'tb'}?local={tmp_path / 'runs'}", name="seed")
    logger.finish(train_seeds(logger, epochs=1))
    out = tmp_path / "synced"
    assert cli.main(["sync", str(tmp_path / "runs"), "--to", f"tensorboard:{out}"]) in (None, 0)
    for root in (tmp_path / "tb", out):  # written by the logger, and by `lox sync` from its local log
        for index, w0 in enumerate(W0S):
            tb = ea.EventAccumulator(str(root / logger.group / f"seed-{index}"),
                                     size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0, ea.TENSORS: 0})
            tb.Reload()
            want = by_hand(w0, epochs=1)
            logged = sorted(tag for tag in tb.Tags()["scalars"] if not tag.startswith("summary/"))  # not its summary
            assert logged == ["epoch", "loss", "norms/l1/kernel", "pair/0", "pair/1/0", "pair/1/1"]
            assert tb.Tags()["histograms"] == ["norms/l1/bias"]
            kernel = [(e.step, e.value) for e in tb.Scalars("norms/l1/kernel")]
            assert kernel == list(enumerate(want["norms"]["l1"]["kernel"].tolist()))
            bias = tb.Histograms("norms/l1/bias")
            assert [(h.step, h.histogram_value.max) for h in bias] == list(
                enumerate(want["norms"]["l1"]["bias"].max(axis=1).tolist()))


def test_the_console_shows_key_path(capsys):
    logger = lox.loggers.from_config("console?plain=1")
    state = logger.init(name="shown")
    logger.spool(train, state)(jnp.asarray(W0S[0]), 0)
    logger.finish(state)
    out = capsys.readouterr().out
    assert all(f"{name}=" in out for name in SERIES), out


def test_lox_plot_takes_key_path(tmp_path):
    logger = lox.loggers.from_config(f"parquet:{tmp_path / 'runs'}", name="seed")
    logger.finish(train_seeds(logger, epochs=1))
    figure = plot_figure(tmp_path / "runs", key="norms/l1/kernel")
    lines = figure.axes[0].get_lines()
    assert len(lines) == len(W0S)
    for line, w0 in zip(lines, W0S, strict=True):
        np.testing.assert_array_equal(line.get_ydata(), np.abs(w0).sum() * 0.5 ** np.arange(STEPS))
    with pytest.raises(LookupError, match=r"logged 'norms'; the keys logged are: .*norms/l1/kernel, pair/0"):
        plot_figure(tmp_path / "runs", key="norms")


def test_scalar_pytrees_of_vmapped_seeds_load_through_the_common_form(tmp_path):
    """Scalars only, one `lox.log` per step: the form `lox.load` reads without a sort (StepRows)."""
    def scalars(w, start):
        def step(w, i):
            lox.log({"m": {"a": w, "b": (2 * w, -w)}}, step=start + i)
            return w * 0.5, None

        return jax.lax.scan(step, w, jnp.arange(3))[0]

    logger = lox.loggers.from_config(f"parquet:{tmp_path / 'runs'}")
    states = jax.vmap(logger.init)(jax.random.split(jax.random.key(1), 2))
    for start in (0, 3):  # two files of the same schema, joined
        jax.vmap(lambda s, w, start=start: logger.spool(scalars, s)(w, start))(states, jnp.array([1.0, 4.0]))
        logger.flush(states)
    logger.finish(states)
    files = sorted((tmp_path / "runs").glob("*.batches/batch-*.parquet"))
    assert len(files) == 2 and all(lox_arrow.StepRows.of(pq.read_table(f)) is not None for f in files)
    for logs, w0 in zip(lox.load(tmp_path / "runs").values(), [1.0, 4.0], strict=True):
        w = np.tile(w0 * 0.5 ** np.arange(3, dtype=np.float32), 2)
        steps = np.arange(6, dtype=np.int32)
        assert_logs_equal(logs, lox.logdict({"m": {"a": w, "b": (2 * w, -w)}}, {"step": {"m": steps}}))


def test_tables_of_different_pytrees_share_a_batch_file_also_where_a_key_changes_structure(tmp_path):
    backend = ParquetBackend(str(tmp_path))
    run = hooks.RunInfo("run-0", name="r", group="g")
    backend.open_run(run)
    step = lambda n: {"step": dict.fromkeys(["loss", "norms", "g"], np.array([n]))}  # noqa: E731
    for n in range(3):  # tapped events of two `lox.log` calls, alternating
        backend.write(run, to_arrow(lox.logdict({"loss": np.array([n / 2])}, step(n)), run="run-0"))
        backend.write(run, to_arrow(lox.logdict({"norms": {"l1": np.array([n])}}, step(n)), run="run-0"))
    backend.flush()
    (file,) = sorted((tmp_path / "g.batches").glob("batch-*.parquet"))
    assert json.loads(pq.read_table(file).schema.metadata[b"lox.trees"]) == {"norms": {"dict": {"l1": None}}}
    backend.write(run, to_arrow(lox.logdict({"g": {"a": np.array([1.0])}}, step(3)), run="run-0"))
    backend.write(run, to_arrow(lox.logdict({"g": [np.array([2.0])]}, step(4)), run="run-0"))
    backend.flush()
    backend.close_run(run)
    files = sorted((tmp_path / "g.batches").glob("batch-*.parquet"))
    assert len(files) == 2  # one key, two structures: still one file per flush, the key listed as flat
    assert json.loads(pq.read_table(files[1]).schema.metadata[b"lox.trees"]) == {"g": "flat"}
    logs = lox.load(tmp_path / "run-0")
    assert list(logs) == ["loss", "norms", "g/a", "g/0"]
    assert logs["norms"]["l1"].tolist() == [0, 1, 2] and logs.step["norms"].tolist() == [0, 1, 2]
    assert logs["g/a"].tolist() == [1.0] and logs.step["g/0"].tolist() == [4]
    assert_logs_equal(lox.load(tmp_path)["run-0"], logs)


# --- collisions, changes of structure, other pytrees, older files ----------------------------------
def test_a_key_path_that_another_key_gives_is_refused_naming_both():
    def both(x):
        lox.log({"a/b": x, "a": {"b": 2 * x}})
        return x

    _, logs = lox.spool(both)(1.0)  # one logdict holds both keys
    assert logs["a/b"].tolist() == [1.0] and logs["a"]["b"].tolist() == [2.0]
    with pytest.raises(ValueError, match=r"key 'a' and key 'a/b' both give a series named 'a/b'.*rename one"):
        logs.to_arrow()
    logger = lox.loggers.MemoryLogger()
    state = logger.init()
    with pytest.raises(ValueError, match=r"key 'a' gives the series 'a/b', which key 'a/b' gave before.*rename one"):
        logger.spool(both, state)(1.0)
    logger.log(state, lox.logdict({"x/y": np.zeros(1)}))  # and across calls
    with pytest.raises(ValueError, match=r"key 'x' gives the series 'x/y', which key 'x/y' gave before"):
        logger.log(state, lox.logdict({"x": {"y": np.zeros(1)}}))
    logger.finish(state)
    assert list(logger.backends[0].logs()) == ["x/y"]


def test_a_key_logged_with_two_structures_comes_back_flat(tmp_path):
    logger = lox.loggers.from_config(f"memory,parquet:{tmp_path / 'runs'}")
    state = logger.init()
    logger.log(state, lox.logdict({"m": {"a": np.array([1.0])}, "n": {"k": np.array([5.0])}}))
    logger.log(state, lox.logdict({"m": {"a": np.array([2.0]), "b": np.array([3.0])}, "n": {"k": np.array([6.0])}}))
    logger.finish(state)
    (loaded,) = lox.load(tmp_path / "runs").values()
    for logs in (loaded, logger.backends[0].logs()):
        assert list(logs) == ["m/a", "n", "m/b"]  # one structure for n: as logged
        assert logs["m/a"].tolist() == [1.0, 2.0] and logs["m/b"].tolist() == [3.0]
        assert logs["n"]["k"].tolist() == [5.0, 6.0]


def test_pytrees_of_other_classes_and_files_of_earlier_lox_load_flat(tmp_path):
    Pair = collections.namedtuple("Pair", ["lo", "hi"])
    logger = lox.loggers.from_config(f"parquet:{tmp_path / 'runs'}")
    state = logger.init()
    logger.log(state, lox.logdict({"p": Pair(np.array([1.0]), np.array([2.0])), "g": {"w": np.array([3.0])}},
                                  {"step": {"p": np.array([7]), "g": np.array([7])}}))
    logger.finish(state)
    (logs,) = lox.load(tmp_path / "runs").values()
    assert list(logs) == ["p/lo", "p/hi", "g"] and logs.step["p/hi"].tolist() == [7]  # a namedtuple: flat
    assert logs["g"]["w"].tolist() == [3.0] and logs.step["g"].tolist() == [7]
    # The same file as lox wrote it before lox.trees: the key path names.
    (file,) = pathlib.Path(tmp_path / "runs").glob("*.batches/batch-*.parquet")
    table = pq.read_table(file)
    pq.write_table(table.replace_schema_metadata(
        {k: v for k, v in table.schema.metadata.items() if k != b"lox.trees"}), file)
    (logs,) = lox.load(tmp_path / "runs").values()
    assert list(logs) == ["p/lo", "p/hi", "g/w"] and logs["g/w"].tolist() == [3.0] and logs.step["g/w"].tolist() == [7]


def _train_and_eval(tmp_path, name, seeds, evaluate):
    """Vmapped seeds: every step logs ``{"m": {"loss": ..}}``, every 5th step
    (with `evaluate`) also ``{"m": {"acc": ..}}``; a flush every 5 steps, then
    two steps of training alone and a last flush. Returns the batch files and
    the w of each seed at each of the 12 steps."""
    logger = lox.loggers.from_config(f"parquet:{tmp_path / name}")
    states = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), len(seeds)))
    train = jax.jit(jax.vmap(lambda s, w, i: logger.spool(
        lambda w: (lox.log({"m": {"loss": (w * w).sum()}}, step=i), w * 0.5)[1], s)(w), in_axes=(0, 0, None)))
    ev = jax.jit(jax.vmap(lambda s, w, i: logger.spool(lambda w: lox.log({"m": {"acc": w.sum()}}, step=i), s)(w),
                          in_axes=(0, 0, None)))
    w = jnp.asarray(seeds)
    for i in range(12):
        w2 = train(states, w, i)
        if evaluate and i % 5 == 4:
            ev(states, w, i)
        w = w2
        if i % 5 == 4 or i == 11:
            logger.flush(states)
    logger.finish(states)
    return sorted((tmp_path / name).glob("*.batches/batch-*.parquet")), logger


def test_a_key_that_changes_structure_within_a_flush_shares_its_file_and_loads_flat(tmp_path):
    """Training logs {"m": {"loss"}} every step, evaluation {"m": {"acc"}} every 5th: one file per flush
    (as with one structure), the key listed as "flat" there, and flat in the run's other files too."""
    seeds = W0S[:, :2]
    files, logger = _train_and_eval(tmp_path, "both", seeds, evaluate=True)
    alone, _ = _train_and_eval(tmp_path, "train", seeds, evaluate=False)
    assert len(files) == len(alone) == 3  # a file per flush, with every seed's rows
    trees = [json.loads(pq.read_table(f).schema.metadata[b"lox.trees"]) for f in files]
    assert trees == [{"m": "flat"}, {"m": "flat"}, {"m": {"dict": {"loss": None}}}]  # the last: training alone
    ws = W0S[:, None, :2] * np.float32(0.5) ** np.arange(12, dtype=np.float32)[None, :, None]  # seed, step, 2
    loaded = lox.load(tmp_path / "both")
    assert list(loaded) == [run.run_id for run in logger.runs()]
    for index, logs in enumerate(loaded.values()):
        want = lox.logdict({"m/loss": (ws[index] ** 2).sum(axis=1), "m/acc": ws[index, [4, 9]].sum(axis=1)},
                           {"step": {"m/loss": np.arange(12, dtype=np.int32), "m/acc": np.array([4, 9], np.int32)}})
        assert_logs_equal(logs, want)
        assert_logs_equal(lox.load(tmp_path / "both" / logger.runs()[index].run_id), want)  # a run folder alone
    (train_alone, *_) = lox.load(tmp_path / "train").values()
    assert train_alone["m"]["loss"].tolist() == (ws[0] ** 2).sum(axis=1).tolist()  # one structure: as logged


def test_a_flat_key_in_one_file_loads_flat_from_files_of_any_other_structure(tmp_path):
    backend = ParquetBackend(str(tmp_path))
    run = hooks.RunInfo("run-0", name="r", group="g")
    backend.open_run(run)
    write = lambda value, n: backend.write(run, to_arrow(  # noqa: E731
        lox.logdict({"m": value}, {"step": {"m": np.array([n])}}), run="run-0"))
    write({"a": np.array([1.0])}, 0)
    write({"b": np.array([2.0])}, 1)
    backend.flush()  # m listed as flat
    write({"c": np.array([3.0])}, 2)  # a third structure, alone in its file
    backend.flush()
    backend.close_run(run)
    for logs in (lox.load(tmp_path / "run-0"), lox.load(tmp_path)["run-0"]):
        assert list(logs) == ["m/a", "m/b", "m/c"]
        assert [logs[k].tolist() for k in logs] == [[1.0], [2.0], [3.0]]
        assert [logs.step[k].tolist() for k in logs] == [[0], [1], [2]]


def test_a_key_whose_own_leaves_give_one_series_name_is_refused_at_the_call(tmp_path):
    clash = {"c": {"d/e": 1.0, "d": {"e": 2.0}}, "ok": 2.0}
    message = r"key 'c' gives the series 'c/d/e' from two of its leaves \(c\['d'\]\['e'\] and c\['d/e'\]\).*Rename"
    with pytest.raises(ValueError, match=message):
        lox.spool(lambda: lox.log(clash, step=1))()
    with pytest.raises(ValueError, match=message):
        lox.log(clash)  # also with nothing to take the logs
    by_hand = lox.logdict({"c": {"d/e": np.ones(1), "d": {"e": np.ones(1)}}})
    with pytest.raises(ValueError, match=message):
        by_hand.to_arrow()

    logger = lox.loggers.from_config(f"parquet:{tmp_path / 'runs'}")
    states = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), 2))
    log = lambda d, i: jax.vmap(lambda s: logger.spool(lambda: lox.log(d, step=i), s)())(states)  # noqa: E731
    log({"ok": 1.0}, 0)
    with pytest.raises(ValueError, match=message):
        log(clash, 1)
    with pytest.raises(ValueError, match="lox logger: " + message):  # a logdict made by hand
        logger.log(states, lox.logdict({"c": {"d/e": np.ones((2, 1)), "d": {"e": np.ones((2, 1))}},
                                        "ok": np.ones((2, 1), np.float32)}))
    log({"ok": 3.0}, 2)
    logger.finish(states)  # nothing failed in the background
    for logs in lox.load(tmp_path / "runs").values():
        assert_logs_equal(logs, lox.logdict({"ok": np.array([1.0, 3.0], np.float32)},
                                            {"step": {"ok": np.array([0, 2], np.int32)}}))


def test_a_refused_call_leaves_the_loggers_names_and_kinds_as_they_were():
    logger = lox.loggers.MemoryLogger()
    state = logger.init()
    logger.spool(lambda: lox.log({"c": jnp.ones(3)}, step=0), state)()
    with pytest.raises(ValueError, match=r"'c' was logged as float32\[3\] and now as float32\[2\]"):
        logger.spool(lambda: lox.log({"a": {"b": 1.0}, "n": jnp.ones(2), "c": jnp.ones(2)}, step=1), state)()
    logger.spool(lambda: lox.log({"a/b": 2.0, "n": jnp.ones(5)}, step=2), state)()  # 'a' and 'n' were never logged
    with pytest.raises(ValueError, match=r"key 'a' gives the series 'a/b', which key 'a/b' gave before"):
        logger.spool(lambda: lox.log({"a": {"b": 1.0}}, step=3), state)()
    logger.finish(state)
    want = lox.logdict({"c": np.ones((1, 3), np.float32), "a/b": np.array([2.0], np.float32),
                        "n": np.ones((1, 5), np.float32)},
                       {"step": {"c": np.array([0], np.int32), "a/b": np.array([2], np.int32),
                                 "n": np.array([2], np.int32)}})
    assert_logs_equal(logger.backends[0].logs(), want)
