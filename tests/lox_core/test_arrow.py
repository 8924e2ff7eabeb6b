"""`logdict` <-> Arrow: exact round trips (also through Parquet), the schema, and its errors
(`lox_core/arrow.py`, and the encoding it shares with `logdict.to_arrow` / `from_arrow`,
`lox_core/arrow_codec.py`; the columns and step rules of `lox_core/schema.py`)."""

import collections
import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lox
from lox_core import arrow as lox_arrow
from lox_core import schema
from lox_core.arrow import StepRows, from_arrow, from_arrow_runs, to_arrow, to_arrow_runs
from lox_core.logdict import concat

DTYPES = [np.bool_, np.int8, np.int32, np.int64, np.uint64, np.float16, ml_dtypes.bfloat16, np.float32, np.float64,
          np.complex64]
SHAPES = [(), (3,), (2, 2)]
ODD_KEYS = ["loss", "../../x", "a/b", "ünïcødé λ", "", " ", "🙂", "key\nwith newline"]
STEP_NAMES = ["step", "epoch", "ép/och"]


# --- strategies and comparison ----------------------------------------------------------------
@st.composite
def logdicts(draw):
    keys = draw(st.lists(st.one_of(st.sampled_from(ODD_KEYS), st.text(max_size=6)), min_size=1, max_size=4,
                         unique=True))
    names = draw(st.lists(st.sampled_from(STEP_NAMES), unique=True, max_size=2))
    step_dtypes = {name: draw(st.sampled_from([np.int32, np.int64])) for name in names}
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    data, steps = {}, {}
    for key in keys:
        dtype, shape = np.dtype(draw(st.sampled_from(DTYPES))), draw(st.sampled_from(SHAPES))
        n = draw(st.integers(0, 50))
        if dtype == np.bool_:
            data[key] = rng.integers(0, 2, (n, *shape)).astype(bool)
        else:  # every bit pattern: full integer ranges, NaNs, infinities, subnormals
            raw = rng.integers(0, 256, n * int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
            data[key] = raw.view(dtype).reshape(n, *shape)
        for name in names:
            if draw(st.booleans()):
                s = rng.integers(-5, 1_000, n).astype(step_dtypes[name])
                s[rng.random(n) < 0.3] = lox.NO_STEP
                if n:
                    s[rng.integers(n)] = 7  # a key whose steps are all NO_STEP has no such steps
                steps.setdefault(name, {})[key] = s
    return lox.logdict(data, steps)


def _through_float64(dtype):
    return dtype.kind == "f" or dtype == ml_dtypes.bfloat16


def assert_same_bits(x, y, scalar):
    assert x.dtype == y.dtype and x.shape == y.shape
    u = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
    if x.dtype.itemsize in u:
        xb, yb = x.view(u[x.dtype.itemsize]), y.view(u[y.dtype.itemsize])
    else:  # complex64: compare its two float32 halves
        xb, yb = x.view(np.uint32), y.view(np.uint32)
    if scalar and _through_float64(x.dtype):
        # The value column is float64: a NaN keeps its sign but not necessarily its payload.
        with np.errstate(invalid="ignore"):  # signalling NaNs
            x64, y64 = x.astype(np.float64), y.astype(np.float64)
        nan = np.isnan(x64)
        np.testing.assert_array_equal(xb[~nan], yb[~nan])
        assert np.isnan(y64[nan]).all()
        np.testing.assert_array_equal(np.signbit(x64), np.signbit(y64))
    else:
        np.testing.assert_array_equal(xb, yb)


def assert_same_logs(a, b):
    assert list(a) == list(b)
    for key in a:
        x, y = np.asarray(a[key]), np.asarray(b[key])
        assert isinstance(b[key], np.ndarray)
        assert_same_bits(x, y, scalar=x.ndim == 1)
        assert a.step_names(key) == b.step_names(key)
        for name in a.step_names(key):
            sa, sb = np.asarray(a.steps[name][key]), np.asarray(b.steps[name][key])
            assert sa.dtype == sb.dtype and sa.shape == sb.shape
            np.testing.assert_array_equal(sa, sb)
    assert list(a.steps) == list(b.steps)


# --- round trips ------------------------------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(logdicts(), st.sampled_from([None, "run-0", "ü"]))
def test_round_trip_is_exact(logs, run):
    table = to_arrow(logs, run=run)
    assert table.num_rows == sum(len(v) for v in logs.values())
    assert_same_logs(logs, from_arrow(table))
    assert_same_logs(logs, from_arrow(table, run=run))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(logdicts(), st.sampled_from([None, 7]))
def test_round_trip_through_parquet_is_exact(tmp_path, logs, row_group_size):
    path = tmp_path / "logs.parquet"
    # Small row groups: the columns come back in many chunks, with one dictionary per chunk.
    pq.write_table(to_arrow(logs, run="r"), path, row_group_size=row_group_size)
    assert_same_logs(logs, from_arrow(pq.read_table(path)))


@settings(max_examples=60, deadline=None)
@given(logdicts())
def test_plain_string_columns_interleaved_rows_and_chunks_read_back(logs):
    table = to_arrow(logs, run="r")
    # What other writers hand back: strings instead of dictionaries, binary instead of
    # large_binary, keys interleaved (each key's rows still in order), many chunks.
    keys = table.column("key").combine_chunks().indices.to_numpy()
    within = np.zeros(len(keys), np.int64)
    for code in np.unique(keys):
        within[keys == code] = np.arange((keys == code).sum())
    table = table.take(pa.array(np.lexsort((keys, within))))
    for name in ("run", "key", "dtype"):
        table = table.set_column(table.column_names.index(name), name, pc.cast(table.column(name), pa.string()))
    table = table.set_column(table.column_names.index("data"), "data", pc.cast(table.column("data"), pa.binary()))
    table = pa.Table.from_batches(table.to_batches(max_chunksize=5), table.schema)
    assert_same_logs(logs, from_arrow(table))


# --- keys that hold pytrees: the structure as logged ---------------------------------------------
INNER_KEYS = ["l1", "kernel", "0", "b", "ü", " "]


@st.composite
def nested_logdicts(draw):
    """Logdicts whose keys hold pytrees of dicts, lists, tuples and None (leaves of
    one event count per key, any dtype and shape), and some plain arrays."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    names = draw(st.lists(st.sampled_from(STEP_NAMES), unique=True, max_size=2))

    def tree(n, depth):
        kind = draw(st.sampled_from(["leaf", "dict", "list", "tuple", "none"] if depth < 3 else ["leaf"]))
        if kind == "leaf":
            dtype, shape = np.dtype(draw(st.sampled_from(DTYPES))), draw(st.sampled_from(SHAPES))
            if dtype == np.bool_:
                return rng.integers(0, 2, (n, *shape)).astype(bool)
            raw = rng.integers(0, 256, n * int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
            return raw.view(dtype).reshape(n, *shape)
        if kind == "none":
            return None
        if kind == "dict":
            keys = draw(st.lists(st.sampled_from(INNER_KEYS), max_size=3, unique=True))
            return {k: tree(n, depth + 1) for k in keys}
        items = [tree(n, depth + 1) for _ in range(draw(st.integers(0, 3)))]
        return items if kind == "list" else tuple(items)

    data, steps = {}, {}
    for key in draw(st.lists(st.sampled_from(["norms", "grad", "loss", "a", "a/b", ""]), min_size=1, max_size=3,
                             unique=True)):
        n = draw(st.integers(0, 6))
        data[key] = tree(n, 0 if draw(st.booleans()) else 1)
        for name in names:
            if draw(st.booleans()) and jax.tree_util.tree_leaves(data[key]):
                # In order, as a training loop logs them: ordering rows by step keeps each key's events.
                steps.setdefault(name, {})[key] = np.sort(rng.integers(-5, 100, n)).astype(np.int32)
    return lox.logdict(data, steps)


def assert_same_trees(logs, back, ordered=True):
    """`back` holds the keys of `logs` that have leaves (in order, if `ordered`),
    each with its structure, leaves and steps."""
    kept = [key for key in logs if jax.tree_util.tree_leaves(logs[key])]  # a pytree without leaves has no rows
    assert list(back) == kept if ordered else sorted(back) == sorted(kept)
    for key in kept:
        assert jax.tree_util.tree_structure(back[key]) == jax.tree_util.tree_structure(logs[key])
        for x, y in zip(jax.tree_util.tree_leaves(logs[key]), jax.tree_util.tree_leaves(back[key]), strict=True):
            assert_same_bits(x, y, scalar=x.ndim == 1)
        assert back.step_names(key) == logs.step_names(key)
        for name in logs.step_names(key):
            np.testing.assert_array_equal(back.steps[name][key], logs.steps[name][key])


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(nested_logdicts())
def test_pytrees_round_trip_with_their_structure_and_flat_under_key_paths(tmp_path, logs):
    try:
        table = to_arrow(logs, run="r")
    except ValueError as error:  # "a/b" beside {"a": {"b": ...}}: refused, naming both keys
        assert "both give a series named" in str(error)
        return
    assert_same_trees(logs, from_arrow(table))
    pq.write_table(table, tmp_path / "logs.parquet", row_group_size=3)
    assert_same_trees(logs, from_arrow(pq.read_table(tmp_path / "logs.parquet")))
    assert_same_logs(lox_arrow.flatten_keys(logs), from_arrow(table, flat=True))
    # Several runs in one table, rows ordered by step as a Logger hands them over (keys interleave).
    both = pa.concat_tables([schema.order_by_step(table), schema.order_by_step(to_arrow(logs, run="s"))])
    for back in from_arrow_runs(both).values():
        assert_same_trees(logs, back, ordered=False)


def test_pytrees_read_flat_where_described_otherwise():
    n = 2
    logs = lox.logdict({"g": {"w": np.ones(n), "b": np.zeros(n)}}, {"step": {"g": np.array([3, 4])}})
    table = to_arrow(logs)
    without = table.replace_schema_metadata({k: v for k, v in table.schema.metadata.items() if k != b"lox.trees"})
    assert list(from_arrow(without)) == ["g/b", "g/w"]  # as earlier lox wrote them
    # A leaf's steps that differ from its sibling's (a table edited by another tool): left flat.
    steps = table.column("step").to_numpy().copy()
    steps[0] = 99
    edited = table.set_column(table.column_names.index("step"), "step", pa.array(steps))
    assert list(from_arrow(edited)) == ["g/b", "g/w"]
    broken = table.replace_schema_metadata({**table.schema.metadata, b"lox.trees": b'{"g": {"set": [null]}}'})
    with pytest.raises(ValueError, match=r"lox.trees metadata describes key 'g' .*remove that entry"):
        from_arrow(broken)


# --- many runs at once (vmapped seeds): against one run at a time -------------------------------
def _runs_of(logs, count, rng):
    """`count` runs with the structure of `logs` and values of their own (steps shared)."""
    return [lox.logdict({k: rng.permutation(np.asarray(v)) for k, v in logs.items()}, logs.steps) for _ in range(count)]


@settings(max_examples=80, deadline=None)
@given(logdicts(), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_to_arrow_runs_gives_each_run_the_table_to_arrow_gives_it(logs, count, seed):
    runs = _runs_of(logs, count, np.random.default_rng(seed))
    names = [f"seed-{i}" for i in range(count)]
    batched = lox.logdict({k: np.stack([np.asarray(r[k]) for r in runs]) for k in logs},
                          {n: {k: np.stack([np.asarray(s)] * count) for k, s in per_key.items()}
                           for n, per_key in logs.steps.items()})
    table, offsets = to_arrow_runs(batched, names, batch_ndim=1)
    assert offsets.tolist() == [i * table.num_rows // count for i in range(count + 1)]
    for i, (name, run) in enumerate(zip(names, runs, strict=True)):
        want = schema.order_by_step(to_arrow(run, run=name))
        got = table.slice(offsets[i], offsets[i + 1] - offsets[i])
        assert got.column("run").to_pylist() == [name] * want.num_rows
        assert got.schema.equals(want.schema, check_metadata=True) and got.num_rows == want.num_rows
        for column in want.column_names[1:]:  # rows in the same order
            if column == "value":  # NaNs compare equal
                assert got.column(column).is_valid().equals(want.column(column).is_valid())
                np.testing.assert_array_equal(got.column(column).to_numpy(zero_copy_only=False),
                                              want.column(column).to_numpy(zero_copy_only=False))
            else:
                assert got.column(column).to_pylist() == want.column(column).to_pylist(), column
        assert_same_logs(from_arrow(got), from_arrow(want))


@settings(max_examples=80, deadline=None)
@given(logdicts(), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_from_arrow_runs_gives_each_run_what_from_arrow_gives_it(logs, count, seed):
    rng = np.random.default_rng(seed)
    tables = [schema.order_by_step(to_arrow(r, run=f"r{i}")) for i, r in enumerate(_runs_of(logs, count, rng))]
    # The runs' rows interleaved at random, each run's in its order.
    sizes = [t.num_rows for t in tables]
    starts, taken = np.concatenate([[0], np.cumsum(sizes)]), [0] * count
    rows = []
    for i in rng.permutation(np.repeat(np.arange(count), sizes)):
        rows.append(starts[i] + taken[i])
        taken[i] += 1
    table = pa.concat_tables(tables).take(pa.array(rows, pa.int64()))
    got = from_arrow_runs(table)
    present = [f"r{i}" for i in range(count) if tables[i].num_rows]
    assert sorted(got) == sorted(present)
    for run in present:
        assert_same_logs(from_arrow(table, run=run), got[run])


SCALAR_DTYPES = [np.bool_, np.int8, np.int32, np.int64, np.float16, ml_dtypes.bfloat16, np.float32, np.float64]


@st.composite
def batch_files(draw):
    """Tables as a group's batch files hold them: runs logging the same scalar keys at
    every step (one `lox.log` per step), each file a stretch of steps of every run,
    the runs in any order and with any number of steps; sometimes with a step missing."""
    keys = draw(st.lists(st.sampled_from(ODD_KEYS), min_size=1, max_size=3, unique=True))
    dtypes = {key: np.dtype(draw(st.sampled_from(SCALAR_DTYPES))) for key in keys}
    names = draw(st.lists(st.sampled_from(STEP_NAMES), unique=True, max_size=2))
    step_dtypes = {name: draw(st.sampled_from([np.int32, np.int64])) for name in names}
    runs, files, hole = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    tables = []
    for f in range(files):
        per_run = []
        for r in rng.permutation(runs):
            n = int(rng.integers(1, 6))
            data = {key: rng.integers(0, 256, n * d.itemsize, dtype=np.uint8).view(d) if d != np.bool_
                    else rng.integers(0, 2, n).astype(bool) for key, d in dtypes.items()}
            at = (10 * f + np.arange(n)).astype(np.int64)
            steps = {name: {key: at.astype(step_dtypes[name]) for key in keys} for name in names}
            if hole and names:
                steps[names[0]][keys[0]] = np.where(np.arange(n) == 0, lox.NO_STEP, at).astype(step_dtypes[names[0]])
            per_run.append(schema.order_by_step(to_arrow(lox.logdict(data, steps), run=f"r{r}")))
        tables.append(pa.concat_tables(per_run))
    common = bool(names) and not hole and all(d.kind in "bf" or d.itemsize <= 4 for d in dtypes.values())
    return tables, common


@settings(max_examples=150, deadline=None)
@given(batch_files())
def test_batch_files_read_at_once_give_each_run_what_from_arrow_gives_it(files):
    tables, common = files
    rows = [StepRows.of(t) for t in tables]
    if common:  # the form lox writes most is read without a sort
        assert all(r is not None for r in rows)
    whole = pa.concat_tables(tables)
    runs = list(dict.fromkeys(whole.column("run").to_pylist()))
    expected = {run: from_arrow(whole, run=run) for run in runs}  # one run at a time, sorting its rows by key
    if all(r is not None for r in rows):
        joined = StepRows.join(rows)  # type: ignore[arg-type]
        assert joined is not None
        for run in runs:  # also what the files give one by one
            assert_same_logs(concat([from_arrow(t, run=run) for t in tables]), joined[run])
    else:
        joined = from_arrow_runs(whole)
    for got in (joined, from_arrow_runs(whole)):
        assert list(got) == runs  # in order of first appearance
        for run in runs:
            assert_same_logs(expected[run], got[run])


def test_empty_logdict_and_empty_series_round_trip():
    empty = lox.logdict()
    assert to_arrow(empty).num_rows == 0
    assert_same_logs(empty, from_arrow(to_arrow(empty)))
    logs = lox.logdict(
        {"a": np.zeros((0, 3), np.float32), "b": np.arange(2.0), "c": np.zeros(0, np.int8)},
        steps={"step": {"a": np.zeros(0, np.int32), "b": np.array([4, 5], np.int32)}},
    )
    assert_same_logs(logs, from_arrow(to_arrow(logs)))


def test_spooled_logs_round_trip():
    def train(xs):
        def body(loss, i):
            lox.log({"loss": loss, "v": jnp.stack([loss, -loss, 2 * loss])}, step=i)
            return loss * 0.5, None

        return jax.lax.scan(body, 1.0, xs)[0]

    _, logs = lox.spool(train)(jnp.arange(6))
    assert isinstance(logs["loss"], jax.Array)
    table = logs.to_arrow(run="train")
    back = lox.logdict.from_arrow(table)
    assert_same_logs(logs, back)
    assert back["loss"].tolist() == [1.0, 0.5, 0.25, 0.125, 0.0625, 0.03125]
    assert back.step["v"].dtype == np.int32 and back.step["v"].tolist() == list(range(6))


def test_steps_broadcast_over_vmap_axes_round_trip():
    def train(x):
        def body(c, i):
            lox.log({"loss": c * x, "w": jnp.full(2, c)}, step=i)
            return c + 1.0, None

        return jax.lax.scan(body, 0.0, jnp.arange(4))[0]

    _, logs = lox.spool(jax.vmap(train))(jnp.arange(3.0))
    assert logs["loss"].shape == (4, 3) and logs.step["loss"].shape == (4, 3)
    table = to_arrow(logs)
    assert table.column("step").to_pylist() == [0, 1, 2, 3] * 2
    assert json.loads(table.schema.metadata[b"lox.step_batch_ndim"]) == {"loss": 1, "w": 1}
    assert_same_logs(logs, from_arrow(table))


def test_several_runs_concatenated_and_chosen():
    a = lox.logdict({"loss": np.array([1.0, 2.0])}, steps={"step": {"loss": np.array([0, 1])}})
    b = lox.logdict({"loss": np.array([3.0])}, steps={"step": {"loss": np.array([9])}})
    table = pa.concat_tables([to_arrow(a, run="a"), to_arrow(b, run="b")])
    assert_same_logs(a, from_arrow(table, run="a"))
    assert_same_logs(b, from_arrow(table, run="b"))


def test_pytree_values_come_back_as_logged_or_flat_under_key_paths():
    Pair = collections.namedtuple("Pair", ["lo", "hi"])
    n = 3
    grad = {"w": np.arange(n * 2, dtype=np.float32).reshape(n, 2), "b": [np.arange(n), np.ones(n, np.int8)]}
    logs = lox.logdict(
        {"grad": grad, "pair": Pair(np.zeros(n), np.ones(n)), "t": (np.arange(n, dtype=np.int16),)},
        steps={"step": {"grad": np.array([5, 6, 7])}},
    )
    table = to_arrow(logs)
    assert json.loads(table.schema.metadata[b"lox.trees"]) == {  # the namedtuple is not described: flat
        "grad": {"dict": {"w": None, "b": {"list": [None, None]}}}, "t": {"tuple": [None]}}
    nested = from_arrow(table)
    assert list(nested) == ["grad", "pair/lo", "pair/hi", "t"]
    assert list(nested["grad"]) == ["w", "b"] and isinstance(nested["grad"]["b"], list)
    assert isinstance(nested["t"], tuple) and len(nested["t"]) == 1
    for got, leaf in [(nested["grad"]["w"], grad["w"]), (nested["grad"]["b"][0], grad["b"][0]),
                      (nested["grad"]["b"][1], grad["b"][1]), (nested["t"][0], np.arange(n, dtype=np.int16))]:
        assert got.dtype == leaf.dtype
        np.testing.assert_array_equal(got, leaf)
    assert nested.step["grad"].tolist() == [5, 6, 7] and nested.step_names("t") == []
    back = from_arrow(table, flat=True)
    assert list(back) == ["grad/b/0", "grad/b/1", "grad/w", "pair/lo", "pair/hi", "t/0"]
    for name, leaf in [("grad/b/0", grad["b"][0]), ("grad/b/1", grad["b"][1]), ("grad/w", grad["w"]),
                       ("pair/lo", np.zeros(n)), ("pair/hi", np.ones(n)), ("t/0", np.arange(n, dtype=np.int16))]:
        assert back[name].dtype == leaf.dtype
        np.testing.assert_array_equal(back[name], leaf)
    assert back.step_names("grad/w") == ["step"] and back.step["grad/b/1"].tolist() == [5, 6, 7]
    assert back.step_names("pair/lo") == []


# --- schema -----------------------------------------------------------------------------------
def test_schema_columns_types_order_and_metadata():
    logs = lox.logdict(
        {"loss": np.array([0.5, 0.25], np.float32), "big": np.array([2**40], np.int64), "v": np.ones((1, 3))},
        steps={"step": {"loss": np.array([0, lox.NO_STEP], np.int32)}, "epoch": {"v": np.array([3])}},
    )
    table = to_arrow(logs, run="r")
    dictionary = pa.dictionary(pa.int32(), pa.string())
    assert table.schema.names == ["run", "key", "step", "epoch", "value", "dtype", "shape", "data", "kind"]
    assert [table.schema.field(n).type for n in table.schema.names] == [
        dictionary, dictionary, pa.int64(), pa.int64(), pa.float64(), dictionary, pa.list_(pa.int32()),
        pa.large_binary(), dictionary,
    ]
    kind = table.column("kind").combine_chunks()
    assert kind.dictionary.to_pylist() == ["scalar", "array"] and kind.indices.to_pylist() == [0, 0, 0, 1]
    assert not table.schema.field("kind").nullable
    key = table.column("key").combine_chunks()
    assert key.dictionary.to_pylist() == ["loss", "big", "v"] and key.indices.to_pylist() == [0, 0, 1, 2]
    assert table.column("key").null_count == 0 and not table.schema.field("key").nullable
    assert table.column("run").to_pylist() == ["r"] * 4
    assert table.column("step").to_pylist() == [0, None, None, None]
    assert table.column("epoch").to_pylist() == [None, None, None, 3]
    assert table.column("value").to_pylist() == [0.5, 0.25, None, None]
    assert table.column("dtype").to_pylist() == ["float32", "float32", "int64", "float64"]
    assert table.column("shape").to_pylist() == [[], [], [], [3]]
    assert table.column("data").to_pylist() == [None, None, np.int64(2**40).tobytes(), np.ones(3).tobytes()]
    meta = table.schema.metadata
    assert meta[b"lox.schema"] == b"2" and b"lox.kinds" not in meta
    assert json.loads(meta[b"lox.step_dtypes"]) == {"step": "int32", "epoch": "int64"}
    assert json.loads(meta[b"lox.step_batch_ndim"]) == {} and json.loads(meta[b"lox.empty_series"]) == {}
    assert to_arrow(logs).column("run").to_pylist() == [None] * 4


# --- other readers ----------------------------------------------------------------------------
@pytest.fixture
def parquet_file(tmp_path):
    logs = lox.logdict(
        {"loss": np.array([1.5, 0.75, 0.5], np.float32), "acc": np.array([0.25, 0.5]), "v": np.ones((2, 3))},
        steps={"step": {"loss": np.array([0, 1, 2], np.int32), "v": np.array([0, 2], np.int32)}},
    )
    path = tmp_path / "logs.parquet"
    pq.write_table(logs.to_arrow(run="seed0"), path)
    return logs, path


def test_pandas_reads_the_parquet_file(parquet_file):
    import pandas as pd
    logs, path = parquet_file
    df = pd.read_parquet(path)
    loss = df[df["key"] == "loss"]
    assert loss["value"].tolist() == logs["loss"].tolist() and loss["step"].tolist() == [0, 1, 2]
    assert df[df["key"] == "acc"]["value"].tolist() == [0.25, 0.5]
    assert df[df["key"] == "acc"]["step"].isna().all() and df[df["key"] == "v"]["value"].isna().all()
    assert set(df["run"]) == {"seed0"}


def test_polars_reads_the_parquet_file(parquet_file):
    import polars as pl
    logs, path = parquet_file
    df = pl.read_parquet(path)
    loss = df.filter(pl.col("key").cast(pl.String) == "loss")
    assert loss["value"].to_list() == logs["loss"].tolist() and loss["step"].to_list() == [0, 1, 2]
    v = df.filter(pl.col("key").cast(pl.String) == "v")
    assert v["shape"].to_list() == [[3], [3]] and v["data"].to_list() == [np.ones(3).tobytes()] * 2


def test_duckdb_reads_the_parquet_file(parquet_file):
    import duckdb
    logs, path = parquet_file
    rows = duckdb.sql(f"select key, step, value from '{path}' where value is not null order by key, step").fetchall()
    assert rows == [("acc", None, 0.25), ("acc", None, 0.5), ("loss", 0, 1.5), ("loss", 1, 0.75), ("loss", 2, 0.5)]
    assert duckdb.sql(f"select count(*) from '{path}' where data is not null").fetchall() == [(2,)]


def test_tables_from_polars_and_duckdb_read_back(tmp_path):
    import duckdb
    import polars as pl
    logs = lox.logdict(
        {"loss": np.array([1.5, 0.5], np.float32), "v": np.arange(6, dtype=np.int64).reshape(2, 3)},
        steps={"step": {"loss": np.array([3, 4]), "v": np.array([3, lox.NO_STEP])}},
    )
    # Polars: categorical (uint32, large_string dictionaries), large_list; its own Parquet file.
    path = tmp_path / "polars.parquet"
    pl.from_arrow(to_arrow(logs, run="r")).write_parquet(path)
    assert_same_logs(logs, from_arrow(pq.read_table(path), run="r"))
    two_runs = pl.from_arrow(pa.concat_tables([to_arrow(logs), to_arrow(logs, run="b")])).to_arrow()
    assert two_runs.schema.field("run").type.index_type == pa.uint32()
    assert_same_logs(logs, from_arrow(two_runs, run="b"))
    # DuckDB: plain strings, binary, no schema metadata (steps come back int64, as here).
    pq.write_table(to_arrow(logs, run="r"), tmp_path / "lox.parquet")
    result = duckdb.sql(f"select * from '{tmp_path / 'lox.parquet'}'").arrow()
    table = result.read_all() if isinstance(result, pa.RecordBatchReader) else result
    assert table.schema.field("key").type == pa.string() and table.schema.metadata is None
    assert_same_logs(logs, from_arrow(table))


# --- errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", schema.COLUMNS)
def test_reserved_step_name_says_to_rename(name):
    logs = lox.logdict({"loss": np.zeros(2)}, steps={name: {"loss": np.arange(2)}})
    with pytest.raises(ValueError, match=rf"step name '{name}' is a column of the lox Arrow schema .*rename the step"):
        to_arrow(logs)


def test_several_runs_need_run_argument():
    logs = lox.logdict({"loss": np.zeros(1)})
    table = pa.concat_tables([to_arrow(logs, run=f"seed{i}") for i in range(7)])
    with pytest.raises(ValueError, match=r"holds 7 runs \('seed0', 'seed1', 'seed2', 'seed3', 'seed4', \.\.\.\); "
                                         r"pass run= to choose one, e.g. from_arrow\(table, run='seed0'\)"):
        from_arrow(table)
    with pytest.raises(ValueError, match=r"holds 2 runs \(None, 'a'\); pass run="):
        from_arrow(pa.concat_tables([to_arrow(logs), to_arrow(logs, run="a")]))


def test_unknown_run_names_the_known_ones():
    table = pa.concat_tables([to_arrow(lox.logdict({"x": np.zeros(1)}), run=r) for r in ("a", "b")])
    with pytest.raises(ValueError, match=r"no run 'c' in the table; its runs are: 'a', 'b'\."):
        from_arrow(table, run="c")
    assert from_arrow(to_arrow(lox.logdict({"x": np.zeros(0)}), run="a"), run="c")["x"].shape == (0,)


@pytest.mark.parametrize("column", schema.REQUIRED)
def test_missing_column_is_named(column):
    table = to_arrow(lox.logdict({"x": np.zeros(1)}))
    with pytest.raises(ValueError, match=rf"lacks the column\(s\) '{column}' of the lox Arrow schema"):
        from_arrow(table.drop_columns([column]))


def test_other_errors_say_what_to_do():
    with pytest.raises(ValueError, match=r"key 'a/b' and key 'a' both give a series named 'a/b'.*rename one"):
        to_arrow(lox.logdict({"a": {"b": np.zeros(1)}, "a/b": np.zeros(1)}))
    with pytest.raises(TypeError, match=r"series 's' has dtype object, which the lox Arrow schema cannot store"):
        to_arrow(lox.logdict({"s": np.array([None])}))
    with pytest.raises(ValueError, match=r"series 'x' has no event axis"):
        to_arrow(lox.logdict({"x": np.float32(1.0)}))
    with pytest.raises(TypeError, match=r"`run` must be a string or None, got int"):
        to_arrow(lox.logdict({"x": np.zeros(1)}), run=3)
    batched = lox.logdict({"x": np.zeros((2, 3))}, steps={"step": {"x": np.arange(6).reshape(2, 3)}})
    with pytest.raises(ValueError, match=r"differ along the axes after the event axis.*x\[i\]"):
        to_arrow(batched)
    table = to_arrow(lox.logdict({"x": np.zeros(1)}))
    newer = table.replace_schema_metadata({**table.schema.metadata, b"lox.schema": b"3"})
    with pytest.raises(ValueError, match=r"schema version '3'; this lox reads versions 1 and 2\. Upgrade lox"):
        from_arrow(newer)
    floats = table.add_column(2, "step", pa.array([1.0]))
    with pytest.raises(TypeError, match=r"step column 'step' has type double; steps must be integers"):
        from_arrow(floats)


def test_a_key_named_like_a_leaf_of_another_keys_pytree_comes_back_as_its_pytree():
    # "a/b" holds a list (series a/b/0) beside "a" holding {"b": x} (series a/b): found by hypothesis.
    for n in (0, 2):
        logs = lox.logdict({"a/b": [np.arange(n, dtype=np.int32)], "a": {"b": np.ones(n, bool)}})
        back = from_arrow(to_arrow(logs))
        assert list(back) == ["a/b", "a"]
        assert back["a/b"][0].tolist() == list(range(n)) and back["a"]["b"].tolist() == [True] * n
