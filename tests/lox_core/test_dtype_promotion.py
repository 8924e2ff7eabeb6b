"""A key logged as ints and later as floats (``{"a": 3}`` then ``{"a": 5e-07}``,
as CLU's metric writers are tested) is one series of NumPy's common dtype where
that dtype holds every value exactly (`lox_core/dtypes.py`): int32 and float32
events give float64. Dtypes that no dtype holds exactly stay refused, naming
the key. References are written by hand.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lox
from lox_core.arrow import from_arrow, from_arrow_runs, to_arrow

BIG = 2**24 + 1  # an int32 that float32 does not hold (float32(BIG) == 2**24)
EVENTS = [3, 5e-07, BIG, 0.25]  # Python numbers: int32, float32, int32, float32 events
WANT = np.array([3.0, 4.999999987376214e-07, 16777217.0, 0.25])  # float64; 5e-07 as float32 holds it


def scalar_logs(value, step):
    """What `lox.log({"a": value}, step=step)` spools."""
    return lox.spool(lambda: lox.log({"a": value}, step=step))()[1]


def test_ints_then_floats_are_one_float64_series_in_memory_parquet_and_files(tmp_path):
    assert [scalar_logs(v, i)["a"].dtype.name for i, v in enumerate(EVENTS)] == ["int32", "float32"] * 2
    logger = lox.loggers.from_config(f"memory,parquet:{tmp_path}")
    state = logger.init(name="clu")
    for step, value in enumerate(EVENTS):
        logger.log(state, scalar_logs(value, step))
        logger.flush()  # each event a table and a file of its own
    logger.finish(state)
    memory = logger.backends[0]
    assert [t.column("dtype").to_pylist() for t in memory.tables()] == [["int32"], ["float32"], ["int32"], ["float32"]]
    (saved,) = lox.load(tmp_path).values()
    for logs in (memory.logs(), saved):
        assert logs["a"].dtype == np.float64
        np.testing.assert_array_equal(logs["a"], WANT)
        assert logs.step["a"].tolist() == [0, 1, 2, 3]
    # The files, as pyarrow reads them: each row with the dtype it was logged with, its value exact in float64.
    files = sorted(tmp_path.glob("*.batches/batch-*.parquet"))
    assert len(files) == 4
    tables = [pq.read_table(f) for f in files]
    assert [t.column("dtype").to_pylist() for t in tables] == [["int32"], ["float32"], ["int32"], ["float32"]]
    assert [t.column("value").to_pylist() for t in tables] == [[v] for v in WANT.tolist()]
    assert [from_arrow(t)["a"].tolist() for t in tables] == [[3], [np.float32(5e-07)], [BIG], [0.25]]


def test_vmapped_seeds_and_jit_log_ints_then_floats(tmp_path):
    logger = lox.loggers.from_config(f"memory,parquet:{tmp_path}")
    states = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), 2))
    log = jax.jit(jax.vmap(lambda run, x, step: logger.spool(lambda x: lox.log({"a": x}, step=step), run)(x)))
    log(states, jnp.array([3, BIG], jnp.int32), jnp.array([0, 0]))
    log(states, jnp.array([5e-07, 0.25], jnp.float32), jnp.array([1, 1]))  # maybe sent with the ints, maybe not
    logger.finish(states)
    want = {0: [3.0, 4.999999987376214e-07], 1: [16777217.0, 0.25]}
    saved = lox.load(tmp_path)
    for run in logger.runs():
        for logs in (logger.backends[0].logs(run.run_id), saved[run.run_id]):
            assert logs["a"].dtype == np.float64, run.name
            assert logs["a"].tolist() == want[run.index], run.name
            assert logs.step["a"].tolist() == [0, 1], run.name


def test_tapped_ints_then_floats(tmp_path):
    logger = lox.loggers.from_config(f"memory,parquet:{tmp_path}")
    state = logger.init(name="tapped")
    tapped = logger.tap(lambda x, step: lox.log({"a": x}, step=step), state)
    for step, value in enumerate(EVENTS):
        tapped(value, step)
    logger.finish(state)
    (saved,) = lox.load(tmp_path).values()
    for logs in (logger.backends[0].logs(), saved):
        assert logs["a"].dtype == np.float64
        np.testing.assert_array_equal(logs["a"], WANT)
        assert logs.step["a"].tolist() == [0, 1, 2, 3]


def test_tables_and_logdicts_with_rows_of_several_dtypes_read_back_in_the_common_one(tmp_path):
    first = lox.logdict(
        {"a": np.array([3], np.int32), "v": np.array([[1, BIG]], np.int32), "n": np.array([BIG], np.int32),
         "b": np.array([True])},
        {"step": {"a": np.array([0]), "v": np.array([0]), "n": np.array([0]), "b": np.array([0])}},
    )
    second = lox.logdict(
        {"a": np.array([0.5], np.float32), "v": np.array([[0.5, 1.5]], np.float32), "n": np.array([2**40]),
         "b": np.array([7], np.int8)},
        {"step": {"a": np.array([1]), "v": np.array([1]), "n": np.array([1]), "b": np.array([1])}},
    )
    table = pa.concat_tables([to_arrow(first, run="r"), to_arrow(second, run="r")])
    pq.write_table(table, tmp_path / "mixed.parquet")
    read = pq.read_table(tmp_path / "mixed.parquet")
    # int32 scalars in the value column with int64 ones in data; int32 arrays with float32 ones.
    dtypes = ["int32", "int32", "int32", "bool", "float32", "float32", "int64", "int8"]
    assert read.column("dtype").to_pylist() == dtypes
    for logs in (from_arrow(table), from_arrow(read), from_arrow_runs(read)["r"], first + second):
        assert {k: v.dtype.name for k, v in logs.items()} == {"a": "float64", "v": "float64", "n": "int64", "b": "int8"}
        assert logs["a"].tolist() == [3.0, 0.5]
        assert logs["v"].tolist() == [[1.0, 16777217.0], [0.5, 1.5]]
        assert logs["n"].tolist() == [BIG, 2**40]
        assert logs["b"].tolist() == [1, 7]
        assert logs.step["a"].tolist() == [0, 1]


def test_a_key_whose_dtypes_no_dtype_holds_exactly_is_refused_when_logged():
    logger = lox.loggers.MemoryLogger()
    state = logger.init()
    logger.log(state, lox.logdict({"z": np.array([0.5], np.float32), "i": np.array([3]), "b": np.zeros((1, 3), bool)}))
    with pytest.raises(ValueError, match=r"'z' was logged as float32\[\] and now as complex64\[\], and no dtype holds "
                                         r"the values of both exactly .* Cast the values to one dtype"):
        logger.log(state, lox.logdict({"z": np.array([1j], np.complex64)}))
    with pytest.raises(ValueError, match=r"'i' was logged as int64\[\] and now as float64\[\], and no dtype holds"):
        logger.log(state, lox.logdict({"i": np.array([0.5])}))  # float64 holds integers up to 2**53 only
    with pytest.raises(ValueError, match=r"'b' was logged as bool\[3\] and now as float32\[\]; a key keeps one "
                                         r"event shape"):
        logger.log(state, lox.logdict({"b": np.array([0.5], np.float32)}))
    # Once promoted, a key holds the common dtype: int64 events no longer mix with it.
    logger.log(state, lox.logdict({"a": np.array([3], np.int32)}))
    logger.log(state, lox.logdict({"a": np.array([0.5], np.float32)}))
    with pytest.raises(ValueError, match=r"'a' was logged as float64\[\] and now as int64\[\], and no dtype holds"):
        logger.log(state, lox.logdict({"a": np.array([2**40])}))
    logger.finish(state)
    logs = logger.backends[0].logs()  # what was accepted, as it was
    assert {k: v.dtype.name for k, v in logs.items()} == {"z": "float32", "i": "int64", "b": "bool", "a": "float64"}
    assert logs["z"].tolist() == [0.5] and logs["i"].tolist() == [3] and logs["b"].tolist() == [[False] * 3]
    assert logs["a"].tolist() == [3.0, 0.5]


def test_logdicts_and_tables_whose_dtypes_do_not_mix_are_refused():
    ints, floats = lox.logdict({"a": np.array([2**40])}), lox.logdict({"a": np.array([0.5])})
    with pytest.raises(ValueError, match=r"key 'a' was logged with different shapes or dtypes: int64\[\] and "
                                         r"float64\[\]\. A key must keep one shape, and dtypes one dtype holds"):
        ints + floats
    # On the device JAX would round int32 to float32: device arrays keep one dtype.
    with pytest.raises(ValueError, match=r"key 'a' was logged with different shapes or dtypes: int32\[\] and "
                                         r"float32\[\]"):
        lox.logdict({"a": jnp.array([3])}) + lox.logdict({"a": jnp.array([0.5])})
    with pytest.raises(ValueError, match=r"the rows of key 'a' have dtypes int64 and float64, which no dtype holds "
                                         r"exactly"):
        from_arrow(pa.concat_tables([to_arrow(ints), to_arrow(floats)]))


def test_logger_tap_refuses_at_the_call_what_logger_log_refuses(tmp_path):
    # Checked while the tapped function is traced: nothing reaches the runs in a form no run can hold.
    logger = lox.loggers.from_config(f"memory,parquet:{tmp_path}")
    state = logger.init(name="tapped")
    logger.tap(lambda x: lox.log({"z": x, "b": jnp.zeros(3, bool)}, step=0), state)(jnp.float32(0.5))
    with pytest.raises(ValueError, match=r"'z' was logged as float32\[\] and now as complex64\[\], and no dtype holds"):
        logger.tap(lambda x: lox.log({"z": x}, step=1), state)(jnp.complex64(1j))
    with pytest.raises(ValueError, match=r"'b' was logged as bool\[3\] and now as bool\[2\]; a key keeps one event"):
        jax.jit(logger.tap(lambda x: lox.log({"b": x}, step=1), state))(jnp.zeros(2, bool))
    with pytest.raises(ValueError, match=r"key 'z' gives the series 'z/w', which key 'z/w' gave before"):
        logger.tap(lambda x: (lox.log({"z/w": x}, step=2), lox.log({"z": {"w": x}}, step=3)), state)(1.0)
    runs = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), 2))  # vmapped inside the tap: refused
    with pytest.raises(ValueError, match=r"the state holds runs of shape \(2,\) \(one per seed\), but 'v' has shape"):
        logger.tap(jax.vmap(lambda x: lox.log({"v": x}, step=0)), runs)(jnp.arange(2.0))
    logger.finish(state)
    logger.finish(runs)
    (saved,) = [logs for logs in lox.load(tmp_path).values() if "z" in logs]
    for logs in (logger.backends[0].logs(logger.runs()[0].run_id), saved):
        assert {k: v.dtype.name for k, v in logs.items()} == {"z": "float32", "b": "bool"}
        assert logs["z"].tolist() == [0.5] and logs["b"].tolist() == [[False] * 3]
