"""The boundary between a Logger and its backends: one `write` method, a thread per
backend (a hanging or failing plugin never costs another backend its data). The
contract itself (options, names of earlier releases) is tested in test_hooks.py, the
import graph in tests/test_import_cycles.py."""

import threading
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from logs_testing import assert_logs_equal

import lox
from lox_backends import hooks
from lox_backends.logger import worker
from lox_backends.logger.logger import BackendError, Logger
from lox_backends.memory import MemoryBackend
from lox_backends.plugin.registry import registry
from lox_core.logdict import concat


def train(w, xs, start=0):
    def step(w, ix):
        i, x = ix
        lox.log({"loss": (w * x - 1.0) ** 2, "w2": jnp.stack([w, -w])}, step=i)
        return w - 0.1 * x * (w * x - 1.0), None

    return jax.lax.scan(step, w, (start + jnp.arange(xs.shape[0]), xs))[0]


class _HangPlugin:
    """A plugin whose backend's `write` blocks until released (a tracker that stopped answering)."""

    release = threading.Event()
    entered = threading.Event()

    class HangBackend(hooks.Backend):
        def write(self, run, table):
            _HangPlugin.entered.set()
            _HangPlugin.release.wait(120)

    @hooks.hookimpl
    def lox_backends(self):
        return [hooks.BackendSpec("hang", self.HangBackend, description="hangs in write (a test plugin)")]


@pytest.fixture(scope="module")
def hang_plugin():
    registry.register(_HangPlugin(), name="lox-tests:hang")
    yield _HangPlugin
    _HangPlugin.release.set()


def test_a_hanging_plugin_beside_parquet_keeps_every_parquet_row(tmp_path, hang_plugin):
    logger = lox.loggers.from_config(f"parquet:{tmp_path},hang", timeout=2)
    state = logger.init(name="beside-a-hang")
    xs = jnp.linspace(0.1, 1.0, 5)
    want = []
    w = jnp.float32(0.5)
    for epoch in range(20):  # 20 epochs, each spooled, while the plugin hangs from the first
        want.append(lox.spool(train)(w, xs, 5 * epoch)[1])
        w = logger.spool(train, state)(w, xs, 5 * epoch)
    with pytest.raises(TimeoutError, match=r"hang of logger 'lox' did not finish within 2 s"):
        logger.finish(state)
    assert hang_plugin.entered.is_set()
    (saved,) = lox.load(tmp_path).values()
    assert_logs_equal(saved, concat(want), rtol=1e-6)
    hang_plugin.release.set()
    logger.close(timeout=30)


def test_a_failing_backend_warns_at_once_and_raises_at_the_next_call_naming_it():
    class Broken(hooks.Backend):
        def write(self, run, table):
            raise ValueError("quota exceeded")

    working = MemoryBackend()
    logger = Logger([Broken(), working])
    state = logger.init()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger.log(state, lox.logdict({"x": np.zeros(1)}))
        with pytest.raises(BackendError, match=r"Broken: ValueError\('quota exceeded'\)"):
            logger.flush()
    assert any("backend Broken failed: ValueError('quota exceeded')" in str(w.message) for w in caught)
    logger.log(state, lox.logdict({"x": np.ones(1)}))  # raised once: the logger goes on
    with pytest.raises(BackendError, match="quota exceeded"):
        logger.finish(state)
    assert working.logs()["x"].tolist() == [0.0, 1.0]  # the other backend has everything


def test_a_hanging_backend_holding_max_pending_stops_the_logger_at_its_next_call(monkeypatch):
    monkeypatch.setattr(worker, "HANGS_AFTER", 0.2)
    release = threading.Event()

    class Stuck(hooks.Backend):
        def write(self, run, table):
            release.wait(60)

    memory = MemoryBackend()
    logger = Logger([Stuck(), memory], max_pending=1000)
    state = logger.init(name="stuck")
    logs = lox.logdict({"x": np.arange(100.0)})
    logger.log(state, logs)
    deadline = time.monotonic() + 30
    with pytest.raises(BackendError, match=r"backend Stuck holds \d+ batch\(es\) \(.* KiB\) of run\(s\) 'stuck-.*' "
                                           r"that it could not write \(a call to it has run more than 0.2 s: it hangs, "
                                           r"or cannot keep up\); that is more than the logger's max_pending \(1000 "
                                           r"bytes\)"):
        while time.monotonic() < deadline:
            logger.log(state, logs)
            time.sleep(0.05)
    release.set()
    logger.finish(state)
    assert memory.logs()["x"].size % 100 == 0 and memory.logs()["x"].size >= 200  # nothing accepted was lost


def test_a_logger_refuses_what_is_not_a_backend_naming_the_class_to_subclass():
    with pytest.raises(TypeError, match=r"^a lox Logger takes backends \(subclasses of lox_backends\.hooks\.Backend\), "
                                        r"got str\.$"):
        Logger(["parquet"])


# --- what arrives late or shared: runs still close, rows still in step order ----------------------------
def test_finish_closes_its_runs_even_when_late_logs_of_a_finished_run_are_refused():
    backend = MemoryBackend()
    logger = Logger([backend])
    first, second = logger.init(name="first"), logger.init(name="second")
    logger.finish(first)
    logger.log(first, lox.logdict({"x": np.zeros(1)}))  # too late: refused in the background
    logger.log(second, lox.logdict({"x": np.ones(1)}))
    with pytest.raises(BackendError, match=r"logs for run 'first' arrived after `logger.finish` closed it"):
        logger.finish(second)
    assert backend.closed == {run.run_id: True for run in logger.runs()}
    assert backend.logs(logger.runs()[1].run_id)["x"].tolist() == [1.0]


def test_one_run_logged_from_every_element_of_a_vmap_keeps_its_rows_in_step_order():
    backend = MemoryBackend()
    logger = Logger([backend])
    state = logger.init(name="shared")  # not vmapped: every element logs to this one run
    xs = jnp.linspace(0.1, 1.0, 4)
    for epoch in range(3):
        jax.vmap(lambda w, epoch=epoch: logger.spool(train, state)(w, xs, 4 * epoch))(jnp.arange(3.0))
    logger.finish(state)
    steps = np.concatenate([t.column("step").to_numpy() for t in backend.tables()])
    assert len(steps) == 2 * 3 * 3 * 4 and (np.diff(steps) >= 0).all()  # 2 keys, 3 elements, 3 calls, 4 steps


def test_a_vmapped_state_logged_under_jit_without_vmap_reaches_each_run():
    backend = MemoryBackend()
    logger = Logger([backend])
    states = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), 3))
    logs = lox.logdict({"w": np.arange(3.0)[:, None]}, {"step": {"w": np.zeros((3, 1), np.int32)}})  # runs, events
    jax.jit(lambda s, logs: logger.log(s, logs))(states, logs)
    with pytest.raises(ValueError, match=r"runs of shape \(3,\) \(one per seed\), but 'w' has shape \(1,\)"):
        jax.jit(lambda s: logger.log(s, lox.logdict({"w": jnp.zeros(1)})))(states)  # refused at the call
    logger.finish(states)
    assert [backend.logs(run.run_id)["w"].tolist() for run in logger.runs()] == [[0.0], [1.0], [2.0]]
