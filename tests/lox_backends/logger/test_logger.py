"""The Logger API: runs, vmapped seeds as separate runs, spool/tap/log, the background writer.

Covers lox/loggers.py, the facade users make Loggers from."""

import os
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from logs_testing import assert_logs_equal, event

import lox
from lox_backends.logger.logger import BackendError, Logger
from lox_backends.memory import MemoryBackend
from lox_backends.plugin import hooks
from lox_core import host


def train(w, xs):
    def step(w, ix):
        i, x = ix
        loss = (w * x - 1.0) ** 2
        lox.log({"loss": loss, "w3": jnp.stack([w, w, w])}, step=i)
        return w - 0.1 * x * (w * x - 1.0), None

    w, _ = jax.lax.scan(step, w, (jnp.arange(xs.shape[0]), xs))
    lox.log({"final": w}, step=xs.shape[0], tags=["summary"])
    return w


def assert_same_logs(got, expected):
    assert_logs_equal(got, expected, rtol=1e-6, dtypes=False)


class CountingHostCalls:
    """Counts host calls made by lox (one per event / batch, whatever the batch size)."""

    def __enter__(self):
        self.count = 0
        self._original = host._Callback.__call__
        counter = self

        def counting(callback, *args):
            counter.count += 1
            return counter._original(callback, *args)

        host._Callback.__call__ = counting
        return self

    def __exit__(self, *exc):
        host._Callback.__call__ = self._original


def test_spool_writes_one_batch_per_call_with_metadata():
    logger = lox.loggers.from_config("memory", name="exp")
    xs = jnp.linspace(0.1, 1.0, 5)
    state = logger.init(jax.random.key(7), lr=0.1, model="linear")
    w = logger.spool(train, state)(0.5, xs)
    logger.finish(state)
    backend = logger.backends[0]
    (run,) = logger.runs()
    assert run.name == "exp-0" and run.metadata["lr"] == 0.1 and run.metadata["model"] == "linear"
    assert run.metadata["key"] == jax.random.key_data(jax.random.key(7)).tolist()
    assert backend.closed[run.run_id] and len(backend.tables(run.run_id)) == 1
    ref_w, ref_logs = lox.spool(train)(0.5, xs)
    np.testing.assert_allclose(w, ref_w)
    assert_same_logs(backend.logs(run.run_id), ref_logs)


def test_vmapped_seeds_become_separate_runs_with_one_host_call_per_batch():
    logger = lox.loggers.from_config("memory", name="seeds")
    seeds = 16
    keys = jax.random.split(jax.random.key(0), seeds)
    states = jax.vmap(lambda k, lr: logger.init(k, lr=lr, name="sweep"))(keys, jnp.linspace(0.0, 1.0, seeds))
    w0 = jnp.linspace(-1.0, 1.0, seeds)
    xs = jnp.linspace(0.1, 1.0, 6)
    step = jax.jit(jax.vmap(lambda s, w: logger.spool(train, s)(w, xs)))
    with CountingHostCalls() as calls:
        step(states, w0)
        logger.flush()
    assert calls.count == 1  # all 16 seeds in one host call
    logger.finish(states)
    runs = logger.runs()
    assert [r.name for r in runs] == [f"sweep-{i}" for i in range(seeds)]
    assert len({r.run_id for r in runs}) == seeds and len({r.group for r in runs}) == 1
    assert [r.metadata["lr"] for r in runs] == pytest.approx(np.linspace(0.0, 1.0, seeds).tolist())
    backend = logger.backends[0]
    for i in (0, 5, seeds - 1):
        assert_same_logs(backend.logs(runs[i].run_id), lox.spool(train)(w0[i], xs)[1])


def test_tap_streams_each_seeds_events_to_its_run_in_one_host_call_per_event():
    logger = lox.loggers.from_config("memory")
    seeds = 8
    states = jax.vmap(logger.init)(jax.random.split(jax.random.key(1), seeds))
    w0 = jnp.linspace(-1.0, 1.0, seeds)
    xs = jnp.linspace(0.1, 1.0, 4)
    with CountingHostCalls() as calls:
        jax.vmap(lambda s, w: logger.tap(train, s)(w, xs))(states, w0)
        logger.flush()
    assert calls.count == xs.shape[0] + 1  # one per event, for all seeds
    logger.finish(states)
    backend = logger.backends[0]
    for i, run in enumerate(logger.runs()):
        assert_same_logs(backend.logs(run.run_id), lox.spool(train)(w0[i], xs)[1])


def test_log_inside_jit_and_eagerly():
    logger = lox.loggers.from_config("memory")
    state = logger.init()

    @jax.jit
    def step(state, x):
        logger.log(state, lox.logdict({"x": x[None]}, {"step": {"x": jnp.array([3])}}))
        return x + 1

    step(state, jnp.float32(2.0))
    logger.log(state, lox.logdict({"x": np.array([5.0], np.float32)}, {"step": {"x": np.array([4])}}))
    logger.finish(state)
    logs = logger.backends[0].logs()
    assert logs["x"].tolist() == [2.0, 5.0] and logs.step["x"].tolist() == [3, 4]


@pytest.mark.filterwarnings("ignore:lox. in run")  # both calls log steps 0-3
def test_writing_happens_in_the_background():
    release = threading.Event()
    received = threading.Event()

    class Blocking(hooks.Backend):
        def write(self, run, table):
            received.set()
            assert release.wait(30), "the test never released the backend"

    logger = Logger([Blocking()])
    state = logger.init()
    xs = jnp.linspace(0.1, 1.0, 3)
    logger.spool(train, state)(0.5, xs)  # returns although the backend is blocked
    logger.spool(train, state)(0.5, xs)
    assert received.wait(30)
    release.set()
    logger.finish(state)


def test_flush_takes_a_state_like_finish_and_a_timeout():
    logger = lox.loggers.from_config("memory")
    state = logger.init()
    logger.log(state, event(0, loss=1.0))
    logger.flush(state)  # as `finish(state)` takes one: every run is flushed
    assert logger.backends[0].logs()["loss"].tolist() == [1.0]
    logger.log(state, event(1, loss=0.5))
    logger.flush(30)
    logger.flush(state, timeout=30)
    assert logger.backends[0].logs()["loss"].tolist() == [1.0, 0.5]
    with pytest.raises(TypeError, match=r"`logger.flush` takes a state from `logger.init` and/or a timeout in "
                                        r"seconds, got 'soon'"):
        logger.flush("soon")
    logger.finish(state)


def test_backend_errors_surface_on_the_next_call_and_at_finish():
    class Failing(hooks.Backend):  # refuses tables for good (an OSError would be retried: test_backend_faults)
        def write(self, run, table):
            raise ValueError("table refused")

    working = MemoryBackend()
    logger = Logger([Failing(), working])
    states = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), 2))
    jax.vmap(lambda s, w: logger.spool(train, s)(w, jnp.ones(3)))(states, jnp.ones(2))
    with pytest.raises(BackendError, match=r"background failed: Failing: ValueError\('table refused'\)"):
        logger.finish(states)
    # The other backend got every seed's batch.
    assert [len(working.tables(r.run_id)) for r in logger.runs()] == [1, 1]


def test_under_jit_a_backend_error_is_warned_about_when_it_happens_and_raised_by_the_next_call():
    # The jitted step's Python wrapper runs only when it is traced: the error cannot wait for it.
    class FailsOnce(hooks.Backend):
        failed = False

        def write(self, run, table):
            if not self.failed:
                self.failed = True
                raise ValueError("refused once")

    memory = MemoryBackend()
    logger = Logger([FailsOnce(), memory])
    state = logger.init()

    def train_step(w, i):
        lox.log({"loss": w * w}, step=i)
        return w * 0.5

    step = jax.jit(lambda w, i: logger.spool(train_step, state)(w, i))
    w, i = jnp.float32(1.0), 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        deadline = time.monotonic() + 30
        while not caught and time.monotonic() < deadline:
            w, i = step(w, i), i + 1  # training goes on, compiled: no Python-side logger call
            time.sleep(0.05)
    assert [str(c.message) for c in caught] == [
        "lox: backend FailsOnce failed: ValueError('refused once'). The other backends keep their data; this error "
        "is raised by the logger's next call or `finish`."
    ]
    with pytest.raises(BackendError, match=r"FailsOnce: ValueError\('refused once'\)"):
        logger.log(state, event(9, loss=0.0))  # the next Python-side call
    logger.finish(state)
    assert memory.logs()["loss"].size == i  # the other backend had every batch


def test_rows_are_ordered_by_step_and_a_backwards_step_warns_once():
    logger = lox.loggers.from_config("memory")
    state = logger.init(name="r")
    logs = lox.logdict({"loss": np.array([3.0, 1.0, 2.0])}, {"step": {"loss": np.array([30, 10, 20])}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger.log(state, logs)
        logger.log(state, logs)
        logger.finish(state)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1
    assert "in run 'r' the step of 'loss' goes backwards (30 then 10)" in messages[0]
    # The two calls reached the backend together, as one table ordered by step.
    (table,) = logger.backends[0].tables()
    assert table.column("step").to_pylist() == [10, 10, 20, 20, 30, 30]
    assert table.column("value").to_pylist() == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]


def test_bad_calls_raise_clearly():
    logger = lox.loggers.from_config("memory")
    state = logger.init()
    with pytest.raises(TypeError, match=r"takes a lox.logdict .* or a plain dict of one event .* got list"):
        logger.log(state, [("x", 1.0)])  # a plain dict is one event (issue 30): taken
    with pytest.raises(TypeError, match="the state returned by `logger.init`"):
        logger.log(0, lox.logdict({"x": np.ones(1)}))
    states = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), 3))
    with pytest.raises(ValueError, match=r"runs of shape \(3,\).*'x' has shape \(1,\)"):
        logger.log(states, lox.logdict({"x": np.ones(1)}))
    with pytest.raises(TypeError, match="outside jax.jit"):
        jax.jit(logger.finish)(state)
    with pytest.raises(ValueError, match="at least one backend"):
        Logger([])
    logger.close()
    with pytest.raises(RuntimeError, match="was closed"):
        logger.init()


def test_multi_console_and_save_loggers(tmp_path, capsys):
    path = tmp_path / "runs"
    logger = lox.loggers.MultiLogger(
        lox.loggers.ConsoleLogger(), lox.loggers.SaveLogger(path), lox.loggers.MemoryLogger()
    )
    state = logger.init(name="both")
    xs = jnp.linspace(0.1, 1.0, 5)
    logger.spool(train, state)(0.5, xs)
    logger.finish(state)
    (run,) = logger.runs()
    expected = lox.spool(train)(0.5, xs)[1]
    assert_same_logs(lox.load(path)[run.run_id], expected)
    assert_same_logs(lox.load(path / run.run_id), expected)
    assert_same_logs(logger.backends[2].logs(), expected)
    out = capsys.readouterr().out
    # Plain lines (not a terminal): the latest value of each key with its step.
    assert f"[both] [step=4] loss={float(expected['loss'][-1]):g}" in out or "[both] [step=4] loss=" in out
    assert "[step=5] final=" in out


def test_pending_logs_are_flushed_at_interpreter_exit(tmp_path):
    code = textwrap.dedent(
        f"""
        import jax, jax.numpy as jnp, lox
        logger = lox.loggers.SaveLogger({str(tmp_path)!r})
        state = logger.init(name="exit")
        for i in range(5):
            lox.log  # nothing else: the logger must flush on its own
            logger.log(state, lox.logdict({{"i": jnp.array([float(i)])}}, {{"step": {{"i": jnp.array([i])}}}}))
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ, LOX_DEFAULT="off"))
    (logs,) = lox.load(tmp_path).values()
    assert logs["i"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_every_flushed_batch_survives_a_killed_training_process(tmp_path):
    code = textwrap.dedent(
        f"""
        import jax, jax.numpy as jnp, lox
        logger = lox.loggers.SaveLogger({str(tmp_path)!r})
        state = logger.init(name="killed")
        i = 0
        while True:
            logger.log(state, lox.logdict({{"i": jnp.array([float(i)])}}, {{"step": {{"i": jnp.array([i])}}}}))
            logger.flush()
            print(i, flush=True)
            i += 1
        """
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    confirmed = [int(process.stdout.readline()) for _ in range(5)]
    process.kill()
    process.wait()
    (logs,) = lox.load(tmp_path).values()
    got = logs["i"].tolist()
    assert got[: len(confirmed)] == [float(i) for i in confirmed]
    assert got == [float(i) for i in range(len(got))]  # in order, nothing partial


def test_batches_of_many_calls_travel_together_and_keep_their_order_with_events():
    logger = lox.loggers.from_config("memory")
    state = logger.init()
    for i in range(50):
        logger.log(state, lox.logdict({"x": np.array([i], np.float32)}, {"step": {"x": np.array([i])}}))
    logger.tap(lambda: lox.log({"x": jnp.float32(50.0)}, step=50), state)()
    logger.log(state, lox.logdict({"x": np.array([51], np.float32)}, {"step": {"x": np.array([51])}}))
    logger.finish(state)
    backend = logger.backends[0]
    assert len(backend.tables()) < 50  # not one table per call
    assert backend.logs()["x"].tolist() == [float(i) for i in range(52)]  # the tapped event between the batches


def test_numpy_arrays_are_copied_when_logged():
    logger = lox.loggers.from_config("memory")
    state = logger.init()
    buffer = np.zeros(1, np.float32)
    for i in range(20):
        buffer[0] = i  # the caller reuses its buffer
        logger.log(state, lox.logdict({"x": buffer}, {"step": {"x": np.array([i])}}))
    logger.finish(state)
    assert logger.backends[0].logs()["x"].tolist() == [float(i) for i in range(20)]


def test_a_key_that_changes_dtype_or_shape_is_refused_in_the_callers_thread():
    logger = lox.loggers.from_config("memory")
    state = logger.init()
    logger.log(state, lox.logdict({"preds": np.zeros((1, 8), np.float32)}))
    with pytest.raises(ValueError, match=r"'preds' was logged as float32\[8\] and now as float32\[5\]"):
        logger.log(state, lox.logdict({"preds": np.zeros((1, 5), np.float32)}))
    with pytest.raises(ValueError, match=r"the step name 'key' is reserved"):
        logger.log(state, lox.logdict({"x": np.zeros(1)}, {"key": {"x": np.zeros(1, np.int32)}}))
    logger.finish(state)


def test_logger_log_in_a_vmapped_cond_is_refused():
    logger = lox.loggers.from_config("memory")
    states = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), 2))

    def f(state, x):
        def log_it(x):
            logger.log(state, lox.logdict({"x": x[None]}))
            return x

        return jax.lax.cond(x > 0, log_it, lambda x: x, x)

    with pytest.raises(ValueError, match=r"`logger.log`\) sits in a `jax.lax.cond` whose predicate is batched"):
        jax.vmap(f)(states, jnp.array([1.0, -1.0]))


def test_finish_closes_the_runs_even_after_a_backend_failed():
    class FailsOnce(MemoryBackend):
        def write(self, run, table):
            raise ValueError("quota")

    backend = FailsOnce()
    logger = Logger([backend])
    state = logger.init()
    logger.log(state, lox.logdict({"x": np.zeros(1)}))

    with pytest.raises(BackendError, match="quota"):
        logger.finish(state)
    assert backend.closed[logger.runs()[0].run_id]
    # The error was raised once; the logger can go on.
    logger.finish(logger.init())


def test_a_stuck_backend_times_out_instead_of_hanging_and_close_stops_the_writer():
    release = threading.Event()

    class Stuck(hooks.Backend):
        def write(self, run, table):
            release.wait(60)

    logger = Logger([Stuck()], timeout=0.5)
    state = logger.init()
    logger.log(state, lox.logdict({"x": np.zeros(1)}))
    with pytest.raises(TimeoutError, match="did not finish within 0.5 s"):
        logger.finish(state)
    release.set()
    logger.close(timeout=30)
    assert not logger._router.alive() and not any(o.alive() for o in logger._outlets)  # no thread left behind


def test_multilogger_takes_fresh_loggers_only_and_logger_options_are_not_backend_options(tmp_path):
    used = lox.loggers.MemoryLogger()
    used.init()
    with pytest.raises(ValueError, match="takes fresh loggers, but 'lox' has opened runs"):
        lox.loggers.MultiLogger(used, lox.loggers.MemoryLogger())
    saver = lox.loggers.SaveLogger(tmp_path, timeout=5, compression="zstd")
    assert saver.timeout == 5 and saver.backends[0].compression == "zstd"
    with pytest.raises(ValueError, match="the parquet backend has no option 'colour'"):
        lox.loggers.SaveLogger(tmp_path, colour="red")


def test_config_from_the_environment_and_the_embedded_default(tmp_path, monkeypatch):
    monkeypatch.setenv("LOX_BACKENDS", "console,memory")
    assert [type(b).__name__ for b in lox.loggers.from_config().backends] == ["ConsoleBackend", "MemoryBackend"]
    monkeypatch.delenv("LOX_BACKENDS")
    monkeypatch.chdir(tmp_path)
    (backend,) = lox.loggers.from_config().backends
    assert type(backend).__name__ == "ParquetBackend" and backend.root == str(tmp_path / "lox-runs")


def test_logs_for_a_finished_run_are_refused_not_written_after_it_closed():
    logger = lox.loggers.from_config("memory")
    state = logger.init()
    xs = jnp.linspace(0.1, 1.0, 3)
    logger.spool(train, state)(0.5, xs)
    logger.finish(state)
    logger.spool(train, state)(0.5, xs)
    with pytest.raises(BackendError, match=r"logs for run 'lox-0' arrived after `logger.finish` closed it"):
        logger.flush()
    assert len(logger.backends[0].tables()) == 1


def test_the_console_backend_refuses_unknown_options():
    with pytest.raises(ValueError, match=r"the console backend has no option 'intervall'"):
        lox.loggers.from_config("console?intervall=2")


@pytest.mark.filterwarnings("ignore:lox. in run")  # the spooled steps start again at 0
def test_logger_tap_and_spool_take_static_arguments():
    logger = lox.loggers.from_config("memory")
    state = logger.init()

    def f(x, n):
        for i in range(n):  # n must be static
            lox.log({"x": x + i}, step=i)
        return x

    logger.tap(f, state, static_argnums=1)(jnp.float32(1.0), 3)
    logger.spool(f, state, static_argnames="n")(jnp.float32(10.0), n=2)
    logger.finish(state)
    assert logger.backends[0].logs()["x"].tolist() == [1.0, 2.0, 3.0, 10.0, 11.0]


def test_logger_tap_of_a_custom_jvp_function_under_grad_says_what_to_do():
    logger = lox.loggers.from_config("memory")
    state = logger.init()

    @jax.custom_jvp
    def g(x):
        lox.log({"inside": x})
        return jnp.sin(x)

    g.defjvp(lambda primals, tangents: (g(primals[0]), jnp.cos(primals[0]) * tangents[0]))
    with pytest.raises(NotImplementedError, match=r"cannot route the event with keys 'inside'.*use `logger.spool`"):
        jax.grad(lambda x: logger.tap(g, state)(x))(1.0)
    logger.close()


def test_a_script_that_ends_cleanly_prints_nothing_on_stderr(tmp_path):
    # Module-level functions jitted through lox.spool and lox.tap (whose compiled-program
    # cache refers to them weakly), a logger never finished: nothing at exit looks like a crash.
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import jax, jax.numpy as jnp, lox

        def step(w, i):
            lox.log({{"loss": w * w}}, step=i)
            return w * 0.5

        spooled = jax.jit(lox.spool(step))
        tapped = jax.jit(lox.tap(step, lambda event: None))
        w, logs = spooled(1.0, 0)
        tapped(w, 1)
        logger = lox.loggers.from_config({f"parquet:{tmp_path / 'runs'}"!r})
        state = logger.init()
        logger.spool(step, state)(w, 2)
        print(float(logs["loss"][0]))
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "LOX_DEFAULT": "off"}, cwd=tmp_path, check=False)
    assert result.returncode == 0 and result.stdout == "1.0\n"
    assert result.stderr == ""
    assert len(lox.load(tmp_path / "runs")) == 1  # the unfinished run written at exit
