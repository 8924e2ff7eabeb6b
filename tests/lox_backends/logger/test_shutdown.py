"""Interpreter exit (lox_backends/logger/shutdown.py): a script that ends without `finish`
has what it logged written and its runs closed, by every live logger; lox's exit flush runs
before a tracker client's own exit handler once the tracker asks for it
(`flush_before_exit_handlers`); a logger that cannot flush at exit is warned about and the
others are closed all the same."""

import gc
import json
import subprocess
import sys
import textwrap
import warnings
import weakref

import pytest

import lox
from lox_backends.logger import shutdown
from lox_backends.runstore import reader


def script(tmp_path, body: str) -> subprocess.CompletedProcess:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def last_json(done: subprocess.CompletedProcess) -> dict:
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_script_that_ends_without_finish_has_its_logs_written_and_its_runs_closed(tmp_path):
    runs = tmp_path / "runs"
    done = script(tmp_path, f"""
        import atexit, json

        def report():  # registered before lox: runs after lox's exit flush
            memory = logger.backends[1]
            print(json.dumps({{
                "closed": memory.is_closed,
                "runs": {{run.name: [memory.closed[run.run_id], memory.logs(run.run_id)["x"].tolist()]
                         for run in memory.runs.values()}},
            }}))

        atexit.register(report)

        import jax, numpy as np, lox
        logger = lox.loggers.from_config("parquet:{runs},memory")
        single = logger.init(name="left-open")
        seeds = jax.vmap(lambda key: logger.init(key, name="seed"))(jax.random.split(jax.random.key(0), 2))
        for i in range(3):
            logger.log(single, lox.logdict({{"x": np.array([float(i)])}}, {{"step": {{"x": np.array([i])}}}}))
            steps = {{"step": {{"x": np.array([[i], [i]])}}}}
            logger.log(seeds, lox.logdict({{"x": np.array([[i], [10.0 + i]])}}, steps))
        # no finish, no close: the script ends
    """)
    expected = {"left-open": [0.0, 1.0, 2.0], "seed-0": [0.0, 1.0, 2.0], "seed-1": [10.0, 11.0, 12.0]}
    assert last_json(done) == {"closed": True, "runs": {name: [True, x] for name, x in expected.items()}}
    saved = {info["name"]: info for info in reader.runs(runs)}
    assert {name: info["status"] for name, info in saved.items()} == dict.fromkeys(expected, "finished")
    logs = lox.load(runs)
    for name, x in expected.items():
        run = logs[saved[name]["run_id"]]
        assert run["x"].tolist() == x and run.step["x"].tolist() == [0, 1, 2]
    assert done.stderr == ""


def test_every_live_logger_is_closed_at_exit_one_that_fails_is_warned_about(tmp_path):
    done = script(tmp_path, f"""
        import numpy as np, lox
        from lox_backends.plugin import hooks

        class Broken(hooks.Backend):
            def close_run(self, run):
                raise ValueError("the store refused to close " + run.name)

        broken = lox.loggers.Logger([Broken()], name="broken")
        broken.init(name="b")
        first = lox.loggers.from_config("parquet:{tmp_path / 'first'}", name="first")
        second = lox.loggers.from_config("parquet:{tmp_path / 'second'}", name="second")
        done = lox.loggers.from_config("parquet:{tmp_path / 'done'}", name="done")
        for logger in (first, second, done):
            state = logger.init(name=logger.name)
            logger.log(state, lox.logdict({{"x": np.array([1.0, 2.0])}}))
        done.close()  # closed by the script: not again at exit
    """)
    for name in ("first", "second", "done"):
        (info,) = reader.runs(tmp_path / name)
        assert (info["name"], info["status"]) == (name, "finished")
        (logs,) = lox.load(tmp_path / name).values()
        assert logs["x"].tolist() == [1.0, 2.0]
    assert "lox: logger 'broken' could not flush at exit: " in done.stderr
    assert "ValueError('the store refused to close b')" in done.stderr
    assert done.stderr.count("lox: logger '") == 1


TRACKER = """
    import atexit, json

    atexit.register(lambda: print(json.dumps({"in the end": tracker.received})))  # before lox's: runs last

    import numpy as np, lox
    from lox_backends.logger import shutdown
    from lox_backends.plugin import hooks

    class Tracker(hooks.Backend):
        '''Sends runs to a client that ends its session in an exit handler of its own.'''

        def __init__(self):
            super().__init__()
            self.session = "open"
            self.received = []
            atexit.register(self.end_session)  # as a tracker's client does when it starts (after lox's)
            if FLUSH_FIRST:
                shutdown.flush_before_exit_handlers()

        def write(self, run, table):
            self.received.append(["write", self.session])

        def close_run(self, run):
            self.received.append(["close_run", self.session])

        def end_session(self):
            self.session = "ended"
            print(json.dumps({"when the session ended": self.received}), flush=True)

    logger = lox.loggers.Logger([Tracker()], name="tracked")
    tracker = logger.backends[0]
    state = logger.init(name="t")
    logger.log(state, lox.logdict({"x": np.array([1.0])}))
    logger.flush()
    # no finish: the run ends at exit
"""


@pytest.mark.parametrize("flush_first", [True, False])
def test_flush_before_exit_handlers_puts_loxs_exit_flush_before_a_clients_own_handler(tmp_path, flush_first):
    done = script(tmp_path, f"FLUSH_FIRST = {flush_first}\n" + textwrap.dedent(TRACKER))
    lines = [json.loads(line) for line in done.stdout.strip().splitlines()]
    if flush_first:  # lox closes the run while the client's session is open
        everything = [["write", "open"], ["close_run", "open"]]
        assert lines == [{"when the session ended": everything}, {"in the end": everything}]
    else:  # the session ends first: the run's end reaches a client that is gone
        assert lines == [{"when the session ended": [["write", "open"]]},
                         {"in the end": [["write", "open"], ["close_run", "ended"]]}]


class Closable:
    """What `shutdown` keeps: a logger's name and `close`."""

    def __init__(self, name: str, fails: bool = False):
        self.name, self.fails = name, fails
        self.closed_while_exiting: bool | None = None

    def close(self, timeout=None):
        self.closed_while_exiting = shutdown.exiting()
        if self.fails:
            raise RuntimeError(f"{self.name} cannot reach its store")

    def write_received(self, timeout=None):
        pass


@pytest.fixture
def own_registry(monkeypatch):
    """`shutdown`'s registry and exit flag of the test's own (the real ones hold the suite's loggers)."""
    monkeypatch.setattr(shutdown, "_live", weakref.WeakSet())
    monkeypatch.setattr(shutdown, "_exiting", False)


def test_loggers_are_live_from_register_until_discard_and_held_weakly(own_registry):
    a, b = Closable("a"), Closable("b")
    shutdown.register(a)
    shutdown.register(b)
    shutdown.register(a)
    assert sorted(x.name for x in shutdown.live()) == ["a", "b"]
    shutdown.discard(a)
    shutdown.discard(a)  # twice: nothing to do
    assert shutdown.live() == [b]
    del b
    gc.collect()
    assert shutdown.live() == []


def test_close_at_exit_closes_every_live_logger_while_exiting_and_warns_of_those_that_fail(own_registry):
    loggers = [Closable("a"), Closable("bad", fails=True), Closable("c")]
    for logger in loggers:
        shutdown.register(logger)
    assert not shutdown.exiting()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shutdown.close_at_exit()
    assert [logger.closed_while_exiting for logger in loggers] == [True, True, True]
    assert [str(w.message) for w in caught] == ["lox: logger 'bad' could not flush at exit: bad cannot reach its store"]
    assert [w.category for w in caught] == [RuntimeWarning]
    assert shutdown.exiting()


def test_a_logger_is_live_until_it_is_closed():
    logger = lox.loggers.from_config("memory", name="live")
    assert logger in shutdown.live()
    logger.close()
    assert logger not in shutdown.live()


@pytest.mark.parametrize("first", ["lox", "lox_backends.runstore.filesystems"])
def test_a_callback_error_nothing_raised_again_ends_the_process_after_the_flush_with_its_runs_failed(tmp_path, first):
    """A tap callback raised and nothing raised it again: lox prints it at exit and ends the
    process with 1, after the Logger's exit flush wrote what it held and ended its runs as
    'failed' (the program failed) — whichever of lox's modules the script imported first."""
    runs = tmp_path / "runs"
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(f"""
        import {first}
        import jax, jax.numpy as jnp, lox

        logger = lox.loggers.from_config("parquet:{runs}")
        state = logger.init(name="r")
        logger.log(state, lox.spool(lambda x: lox.log({{"x": x}}, step=0))(jnp.float32(3.0))[1])

        def callback(logs):
            raise ValueError("callback broke")

        jax.block_until_ready(jax.jit(lox.tap(lambda x: lox.log({{"y": x}}) or x, callback))(jnp.float32(1.0)))
        # no finish, and nothing raises the callback's error again (block_until_ready does not)
    """))
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "ValueError: callback broke" in done.stderr
    (info,) = reader.runs(runs)
    assert info["status"] == "failed"
    assert lox.load(runs)[info["run_id"]]["x"].tolist() == [3.0]
