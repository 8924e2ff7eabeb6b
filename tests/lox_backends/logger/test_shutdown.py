"""Interpreter exit (lox_backends/logger/shutdown.py): a script that ends without `finish`
has what it logged written and its runs closed, by every live logger; lox's exit flush runs
before a tracker client's own exit handler once the tracker asks for it
(`flush_before_exit_handlers`); a logger that cannot flush at exit is warned about and the
others are closed all the same. On a real SIGTERM (a preemption), what was logged is written,
the runs end "killed" and the process ends by SIGTERM, within a bound whatever a backend or a
program on the device does; a SIGTERM handler of the user's, or JAX's below Python, is left alone."""

import gc
import json
import signal
import subprocess
import sys
import textwrap
import warnings
import weakref

import pytest
from logs_testing import free_port

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


# --- SIGTERM ---------------------------------------------------------------------------------
def terminated(tmp_path, body: str, wait_for: str = "ready") -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run `body` as a script; once it prints `wait_for`, send it a real SIGTERM; what it did and printed."""
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    process = subprocess.Popen([sys.executable, str(path)], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    printed = []
    assert process.stdout is not None
    for line in process.stdout:
        printed.append(line.strip())
        if line.strip() == wait_for:
            break
    else:
        process.wait(timeout=60)
        pytest.fail(f"the script ended before printing {wait_for!r}: {process.stderr.read() if process.stderr else ''}")
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    printed += out.splitlines()
    return subprocess.CompletedProcess(process.args, process.returncode, "\n".join(printed), err), printed


def test_on_sigterm_what_was_logged_is_written_the_runs_end_killed_and_the_process_ends_by_sigterm(tmp_path):
    """SLURM, Kubernetes and the clouds' preemptions send SIGTERM: lox writes what it holds (the logger
    flushes once an hour here: none of it would be on disk otherwise) and the process still ends as
    SIGTERM ends it."""
    runs = tmp_path / "runs"
    done, printed = terminated(tmp_path, f"""
        import signal, time
        import jax, numpy as np, lox

        logger = lox.loggers.from_config("parquet:{runs}", flush_every=3600)
        print(signal.getsignal(signal.SIGTERM).__qualname__, flush=True)
        single = logger.init(name="single")
        seeds = jax.vmap(lambda key: logger.init(key, name="seed"))(jax.random.split(jax.random.key(0), 2))
        for i in range(5):
            logger.log(single, lox.logdict({{"x": np.array([float(i)])}}, {{"step": {{"x": np.array([i])}}}}))
            steps = {{"step": {{"x": np.array([[i], [i]])}}}}
            logger.log(seeds, lox.logdict({{"x": np.array([[i], [10.0 + i]])}}, steps))
        logger.write_received()  # (only so that what the script logged reached the logger before the signal)
        print("ready", flush=True)
        time.sleep(120)  # training goes on: SIGTERM comes
        print("not reached", flush=True)
    """)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert printed == ["on_sigterm", "ready"]
    assert done.stderr == ""
    expected = {"single": [0.0, 1.0, 2.0, 3.0, 4.0], "seed-0": [0.0, 1.0, 2.0, 3.0, 4.0],
                "seed-1": [10.0, 11.0, 12.0, 13.0, 14.0]}
    saved = {info["name"]: info for info in reader.runs(runs)}
    assert {name: (info["status"], info["rows"]) for name, info in saved.items()} == {
        name: ("killed", 5) for name in expected}
    assert all("ended" in info for info in saved.values())
    logs = lox.load(runs)
    for name, x in expected.items():
        run = logs[saved[name]["run_id"]]
        assert run["x"].tolist() == x and run.step["x"].tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("installed", ["before", "after"])
def test_a_sigterm_handler_of_the_users_is_left_alone_and_logger_flush_from_it_writes_the_logs(tmp_path, installed):
    """A handler installed before the first Logger stays SIGTERM's handler (lox installs none); the
    user's handler runs, and `logger.flush()` from it writes what was logged (the documented call)."""
    runs = tmp_path / "runs"
    done, printed = terminated(tmp_path, f"""
        import signal, sys, time
        import numpy as np, lox

        def mine(signum, frame):
            logger.flush()
            print("the user's handler flushed", flush=True)
            sys.exit(3)

        if {installed == "before"}:
            signal.signal(signal.SIGTERM, mine)
        logger = lox.loggers.from_config("parquet:{runs}", flush_every=3600)
        if {installed == "after"}:  # over lox's: theirs runs, not lox's
            signal.signal(signal.SIGTERM, mine)
        print(signal.getsignal(signal.SIGTERM).__qualname__, flush=True)
        state = logger.init(name="mine")
        for i in range(3):
            logger.log(state, lox.logdict({{"x": np.array([float(i)])}}, {{"step": {{"x": np.array([i])}}}}))
        print("ready", flush=True)
        for _ in range(1200):  # training: Python runs the handler between two steps (a signal that a thread
            time.sleep(0.1)    # of JAX's receives does not wake a main thread sleeping in C)
    """)
    assert done.returncode == 3, done.stderr
    assert printed == ["mine", "ready", "the user's handler flushed"]
    (info,) = reader.runs(runs)
    assert info["status"] == "finished"  # the user's handler ended the process by sys.exit: the exit flush closed it
    assert lox.load(runs)[info["run_id"]]["x"].tolist() == [0.0, 1.0, 2.0]


def test_the_first_logger_made_in_the_main_thread_installs_the_handler_not_one_made_in_another_thread(tmp_path):
    done = script(tmp_path, """
        import json, signal, threading
        import lox

        seen = []
        in_a_thread = threading.Thread(target=lambda: seen.append(
            [lox.loggers.from_config("memory"), signal.getsignal(signal.SIGTERM) is signal.SIG_DFL][1]))
        in_a_thread.start()
        in_a_thread.join()
        logger = lox.loggers.from_config("memory")
        seen.append(signal.getsignal(signal.SIGTERM).__qualname__)
        print(json.dumps(seen))
    """)
    assert last_json(done) == [True, "on_sigterm"]


def test_jaxs_preemption_notifier_below_python_is_not_replaced(tmp_path):
    """``jax.distributed.initialize`` installs a SIGTERM handler in C (its preemption notifier, for
    `multihost_utils.reached_preemption_sync_point`), which Python still reports as SIG_DFL: lox
    leaves it in place."""
    done = script(tmp_path, f"""
        import json, signal
        import jax, lox

        jax.distributed.initialize("127.0.0.1:{free_port()}", num_processes=1, process_id=0)
        logger = lox.loggers.from_config("memory")
        print(json.dumps(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL))
        jax.distributed.shutdown()
    """)
    assert last_json(done) is True


HANGS = """
    import signal, threading, time
    import jax, jax.numpy as jnp, numpy as np, lox
    from lox_backends.logger import shutdown
    from lox_backends.plugin import hooks

    shutdown.SIGTERM_WAIT = 3.0  # (lox's own 20 s is for the grace period of schedulers, 30 s)

    class Hangs(hooks.Backend):
        def write(self, run, table):
            threading.Event().wait()  # a store that never answers
"""


def test_on_sigterm_a_backend_that_hangs_keeps_neither_the_process_nor_the_other_backends_from_ending(tmp_path):
    runs = tmp_path / "runs"
    done, printed = terminated(tmp_path, HANGS + f"""
    logger = lox.loggers.Logger([lox.loggers.from_config("parquet:{runs}").backends[0], Hangs()], flush_every=3600)
    state = logger.init(name="r")
    for i in range(3):
        logger.log(state, lox.logdict({{"x": np.array([float(i)])}}, {{"step": {{"x": np.array([i])}}}}))
    print("ready", flush=True)
    time.sleep(120)
    """)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert "lox: logger 'lox' could not write what it holds on SIGTERM: " in done.stderr
    assert "Hangs" in done.stderr
    (info,) = reader.runs(runs)
    assert info["status"] == "killed"
    assert lox.load(runs)[info["run_id"]]["x"].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("waiting", ["in a thread", "in the main thread"])
def test_on_sigterm_what_a_program_still_running_on_the_device_streamed_is_written(tmp_path, waiting):
    """A long program (a whole training loop under jit, tapped: 100,000 steps of at least 20 ms) is
    not waited for past the bound: what it streamed to the logger before the signal is written. Also
    when the main thread itself waits for it, where Python would run no handler until it returns."""
    runs = tmp_path / "runs"
    run = "jax.block_until_ready(jax.jit(logger.tap(train, state))(0.0))"
    wait = (f"threading.Thread(target=lambda: {run}, daemon=True).start()\n    time.sleep(600)"
            if waiting == "in a thread" else run)
    done, printed = terminated(tmp_path, HANGS + f"""
    logger = lox.loggers.from_config("parquet:{runs}", flush_every=3600)
    state = logger.init(name="long")

    def slowly(i):
        time.sleep(0.02)
        if i == 20:
            print("ready", flush=True)

    def train(x):
        def body(i, x):
            jax.debug.callback(slowly, i, ordered=True)
            lox.log({{"x": x}}, step=i)
            return x + 1.0
        return jax.lax.fori_loop(0, 100_000, body, x)

    {wait}
    print("the program ended", flush=True)
    """)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert "the program ended" not in printed  # (it would take more than 2,000 s)
    (info,) = reader.runs(runs)
    assert info["status"] == "killed"
    logs = lox.load(runs)[info["run_id"]]
    steps = logs.step["x"].tolist()
    # (step 20's event may still be on its way when the signal comes: its host call is not ordered)
    assert len(steps) >= 10 and steps == list(range(len(steps)))
    assert logs["x"].tolist() == [float(step) for step in steps]


def test_a_forked_child_terminated_by_sigterm_ends_at_once_leaving_its_parents_loggers_alone(tmp_path):
    """A process forked after the first Logger (a data loader's worker, multiprocessing's "fork")
    inherits the handler and copies of the parent's loggers, whose threads it does not have: on
    SIGTERM (`Process.terminate`) it ends as SIGTERM's default action ends it, without waiting on
    them or touching the parent's runs, which go on."""
    runs = tmp_path / "runs"
    done = script(tmp_path, f"""
        import json, multiprocessing, time, warnings
        import numpy as np, lox

        warnings.simplefilter("ignore", RuntimeWarning)  # JAX's about os.fork: the worker runs no JAX
        logger = lox.loggers.from_config("parquet:{runs}", flush_every=3600)
        state = logger.init(run_id="job")
        logger.log(state, lox.logdict({{"x": np.array([1.0])}}, {{"step": {{"x": np.array([0])}}}}))
        logger.write_received()
        worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(120,))
        worker.start()
        worker.terminate()
        worker.join()
        logger.log(state, lox.logdict({{"x": np.array([2.0])}}, {{"step": {{"x": np.array([1])}}}}))
        logger.finish(state)
        print(json.dumps(worker.exitcode))
    """)
    assert last_json(done) == -signal.SIGTERM
    assert "lox:" not in done.stderr  # no warning of the worker's: it wrote nothing, waited on nothing
    (info,) = reader.runs(runs)
    assert (info["status"], info["rows"]) == ("finished", 2)
    assert lox.load(runs / "job")["x"].tolist() == [1.0, 2.0]
