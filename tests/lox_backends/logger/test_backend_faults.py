"""When a backend fails: logs kept and written once the fault clears, training
stopped (or warned) once `max_pending` bytes are held, bounded waits, honest
run statuses. On a real full filesystem: a small tmpfs each test mounts (the
suite and CI run as root)."""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow.parquet as pq
import pytest

import lox
from lox_backends.logger.logger import BackendError
from lox_backends.logger.worker import Worker
from lox_backends.memory import MemoryBackend
from lox_backends.plugin import hooks
from lox_backends.plugin.registry import registry

ROOT = pathlib.Path(__file__).resolve().parents[3]
WIDTH = 256  # float32s per logged vector: 1 KiB a step


class SmallDisk:
    """A tmpfs of `size` bytes, filled by a file of its own to make it full."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        self.filler = path / "filler"

    def fill(self) -> None:
        """Take every free byte: the next write fails with ENOSPC."""
        with open(self.filler, "ab", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError:
                pass

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        yield SmallDisk(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def step(w, i):
    lox.log({"w": w}, step=i)
    return w + 1.0


def by_hand(steps) -> np.ndarray:
    """What `step` logs at each of `steps`, from a start of zeros."""
    return np.stack([np.full(WIDTH, float(i), np.float32) for i in steps])


def saved(folder) -> tuple[list[int], np.ndarray]:
    (logs,) = lox.load(folder).values()
    return logs.step["w"].tolist(), np.asarray(logs["w"])


def lox_runs(folder) -> list[dict]:
    from lox_backends.runstore import reader

    return reader.runs(folder)


def run_json(folder) -> dict:
    (info,) = [json.loads(p.read_text()) for p in pathlib.Path(folder).glob("*/_run.json")]
    return info


def test_a_full_disk_keeps_every_batch_and_writes_it_once_space_is_freed(small_disk):
    runs = small_disk.path / "runs"
    logger = lox.loggers.from_config(f"parquet:{runs}", flush_every=0.05, timeout=30)
    state = logger.init(name="full-disk")
    train = jax.jit(logger.spool(step, state))
    w = jnp.zeros(WIDTH)
    for i in range(20):
        w = train(w, i)
    logger.flush()
    small_disk.fill()
    with pytest.warns(RuntimeWarning, match=rf"backend parquet:{runs} cannot flush: .*No space left on device.*"
                                            rf"{small_disk.path}"):
        for i in range(20, 60):
            w = train(w, i)
            time.sleep(0.005)  # flushes fail meanwhile
        jax.effects_barrier()
        time.sleep(0.5)
    small_disk.free()
    logger.finish(state)  # waits for what was held, then closes the run
    steps, values = saved(runs)
    assert steps == list(range(60))
    np.testing.assert_array_equal(values, by_hand(range(60)))
    assert run_json(runs)["status"] == "finished" and run_json(runs)["rows"] == 60
    assert [run.status for run in logger.runs()] == ["finished"]


def test_finish_on_a_full_disk_says_what_it_holds_and_a_later_flush_writes_it(small_disk):
    runs = small_disk.path / "runs"
    logger = lox.loggers.from_config(f"parquet:{runs}", flush_every=0.05)
    state = logger.init(name="held")
    train = jax.jit(logger.spool(step, state))
    w = jnp.zeros(WIDTH)
    small_disk.fill()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for i in range(10):
            w = train(w, i)
        with pytest.raises(BackendError, match=rf"parquet:{runs} could not write \d+ batch\(es\) \(.*KiB\) of run\(s\) "
                                               r"'held-.*' within 1 s: .*No space left on device.*lox keeps them in "
                                               r"memory and writes them as soon as the fault clears"):
            logger.finish(state, timeout=1)
        assert [run.status for run in logger.runs()] == ["running"]  # its end waits on the disk
        small_disk.free()
        logger.flush(timeout=30)
    steps, values = saved(runs)
    assert steps == list(range(10))
    np.testing.assert_array_equal(values, by_hand(range(10)))
    assert run_json(runs)["status"] == "finished"
    assert [run.status for run in logger.runs()] == ["finished"]


def test_close_that_gives_up_on_a_full_disk_leaves_its_runs_failed(small_disk):
    runs = small_disk.path / "runs"
    logger = lox.loggers.from_config(f"parquet:{runs}", flush_every=0.05)
    state = logger.init(name="given-up")
    logger.flush()
    small_disk.fill()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        logger.log(state, lox.logdict({"x": np.arange(3.0)}))
        with pytest.raises(BackendError, match=rf"parquet:{runs} could not write 1 batch\(es\) .* of run\(s\) "
                                               r"'given-up-.*' within 1 s: .*No space left on device"):
            logger.close(timeout=1)
    assert [run.status for run in logger.runs()] == ["failed"]  # what it held is lost


def test_a_full_disk_stops_a_jitted_training_loop_once_max_pending_is_spent(small_disk):
    runs = small_disk.path / "runs"
    logger = lox.loggers.from_config(f"parquet:{runs}", flush_every=0.05, max_pending=32 * 1024, timeout=30)
    state = logger.init(name="stopped")
    train = jax.jit(lambda w, i: logger.spool(step, state)(w, i))  # the loop's step jitted, spool inside
    w = jnp.zeros(WIDTH)
    small_disk.fill()
    stopped_at = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for i in range(2000):
            try:
                w = train(w, i)
                w.block_until_ready()
            except Exception as error:  # noqa: BLE001 - XLA's error, holding lox's message
                stopped_at = i
                assert "No space left on device" in str(error) and str(runs) in str(error)
                assert "Training stops here" in str(error)
                break
            time.sleep(0.002)
        assert stopped_at is not None, "training went on with logs dropped"
        with pytest.raises(BackendError, match=rf"backend parquet:{runs} holds \d+ batch\(es\) .* that it could not "
                                               r"write: .*No space left on device.*more than the logger's "
                                               r"max_pending \(32768 bytes\).*on_error='warn'"):
            logger.log(state, lox.logdict({"w": np.zeros((1, WIDTH), np.float32)}))
        small_disk.free()
        logger.finish(state)
    steps, values = saved(runs)
    assert steps == list(range(len(steps))) and 30 <= len(steps) <= stopped_at  # nothing held was lost
    np.testing.assert_array_equal(values, by_hand(steps))


def test_on_error_warn_keeps_training_drops_what_exceeds_max_pending_and_the_run_fails(small_disk):
    runs = small_disk.path / "runs"
    logger = lox.loggers.from_config(f"parquet:{runs}", flush_every=0.05, max_pending=16 * 1024, on_error="warn")
    state = logger.init(name="warned")
    train = jax.jit(logger.spool(step, state))
    w = jnp.zeros(WIDTH)
    small_disk.fill()
    with pytest.warns(RuntimeWarning, match=r"With on_error='warn', lox drops the logs parquet:.* cannot take"):
        for i in range(300):
            w = train(w, i)
            time.sleep(0.002)
        jax.effects_barrier()
        time.sleep(0.3)
    np.testing.assert_array_equal(np.asarray(w), np.full(WIDTH, 300.0))  # every step ran
    small_disk.free()
    logger.finish(state)
    steps, values = saved(runs)
    assert 0 < len(steps) < 300 and steps == sorted(steps)
    np.testing.assert_array_equal(values, by_hand(steps))  # what was written is right
    assert run_json(runs)["status"] == "failed"
    assert [run.status for run in logger.runs()] == ["failed"]


def test_a_failing_plugin_is_named_by_its_config_name_and_its_runs_fail():
    class _Plugin:
        class Refusing(hooks.Backend):
            def write(self, run, table):
                raise ValueError("this plugin refuses every table")

        @hooks.hookimpl
        def lox_backends(self):
            return [hooks.BackendSpec("badplugin", self.Refusing, description="refuses tables (a test plugin)")]

    registry.register(_Plugin(), name="lox-tests:badplugin")
    logger = lox.loggers.from_config("badplugin,memory")
    state = logger.init(name="refused")
    with pytest.warns(RuntimeWarning, match=r"backend badplugin failed: ValueError\('this plugin refuses"):
        logger.log(state, lox.logdict({"x": np.zeros(2)}))
        with pytest.raises(BackendError, match=r"badplugin: ValueError\('this plugin refuses every table'\)"):
            logger.finish(state)
    memory = logger.backends[1]
    assert isinstance(memory, MemoryBackend) and memory.logs()["x"].tolist() == [0.0, 0.0]
    assert [run.status for run in logger.runs()] == ["failed"]


def test_a_state_of_another_logger_is_refused_naming_both():
    a = lox.loggers.from_config("memory", name="a")
    b = lox.loggers.from_config("memory", name="b")
    state_b = b.init()
    logs = lox.logdict({"x": np.zeros(1)})
    message = r"lox logger 'a' \(group 'a-.*'\) got a state that lox logger 'b' opened \(group 'b-.*'\)"
    with pytest.raises(ValueError, match=rf"`logger.log` of {message}"):
        a.log(state_b, logs)
    with pytest.raises(ValueError, match=rf"`logger.spool` of {message}"):
        a.spool(lambda x: x, state_b)(1.0)
    with pytest.raises(ValueError, match=rf"`logger.tap` of {message}"):
        a.tap(lambda x: x, state_b)(1.0)
    with pytest.raises(ValueError, match=rf"`logger.finish` of {message}"):
        a.finish(state_b)
    with pytest.raises(ValueError, match=rf"`logger.log` of {message}"):
        jax.jit(lambda s: a.log(s, logs))(state_b)
    seeds = jax.vmap(b.init)(jax.random.split(jax.random.key(0), 3))
    with pytest.raises(ValueError, match=rf"`logger.log` of {message}"):
        a.log(seeds, lox.logdict({"x": np.zeros((3, 1))}))
    b.finish(state_b)
    b.finish(seeds)


def _script(tmp_path, body: str, stdout_closed: bool = False) -> subprocess.CompletedProcess:
    """Run `body` in a fresh interpreter in `tmp_path`; with `stdout_closed`, its stdout is a pipe
    whose reader is gone (a `| head` that ended): printing there fails with EPIPE."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    command = [sys.executable, str(script)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "support")}
    if not stdout_closed:
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(command, cwd=tmp_path, stdout=write, stderr=subprocess.PIPE, text=True, timeout=300,
                              env=env)
    finally:
        os.close(write)


def test_runs_left_open_end_finished_at_exit_or_failed_by_an_uncaught_exception(tmp_path):
    for ending, status in [("", "finished"), ("raise RuntimeError('diverged')", "failed")]:
        runs = tmp_path / f"runs-{status}"
        done = _script(tmp_path, f"""
            import numpy as np, lox
            logger = lox.loggers.from_config("parquet:{runs}")
            state = logger.init(name="left-open")
            logger.log(state, lox.logdict({{"x": np.arange(3.0)}}))
            {ending}
        """)
        info = run_json(runs)
        assert (info["status"], info["rows"]) == (status, 3), done.stderr
        assert ("RuntimeError: diverged" in done.stderr) == bool(ending)


def test_exit_does_not_wait_again_for_a_backend_finish_gave_up_on(tmp_path):
    began = time.monotonic()
    done = _script(tmp_path, """
        import threading, numpy as np, lox
        from lox_backends.plugin import hooks
        from lox_backends.plugin.registry import registry

        class Plugin:
            class Hang(hooks.Backend):
                def flush(self):
                    threading.Event().wait(600)

            @hooks.hookimpl
            def lox_backends(self):
                return [hooks.BackendSpec("hangs", self.Hang)]

        registry.register(Plugin(), name="hangs")
        logger = lox.loggers.from_config("hangs,parquet:runs")  # the logger's timeout: 60 s
        state = logger.init()
        logger.log(state, lox.logdict({"x": np.arange(3.0)}))
        try:
            logger.finish(state, timeout=3)
        except TimeoutError as error:
            print("finish:", error)
    """)
    took = time.monotonic() - began
    assert "finish: lox: hangs of logger 'lox' did not finish within 3 s" in done.stdout, done.stderr
    assert done.returncode == 0, done.stderr
    assert took < 45, f"exit waited for the hanging backend again ({took:.0f} s)"  # it would take 60 s more
    (saved,) = lox.load(tmp_path / "runs").values()
    assert saved["x"].tolist() == [0.0, 1.0, 2.0]


def test_temporary_files_of_a_killed_writer_are_removed_when_the_folder_is_next_opened(tmp_path):
    runs = tmp_path / "runs"
    first = lox.loggers.from_config(f"parquet:{runs}")
    state = first.init(name="first")
    first.log(state, lox.logdict({"x": np.arange(3.0)}))
    first.finish(state)
    (group,) = runs.glob("*.batches")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)  # a process of this host that has ended
    host = os.uname().nodename
    killed = group / f".batch-000001-0123abcd.parquet.{dead_pid}@{host}.tmp"
    live = group / f".batch-000002-4567cdef.parquet.{os.getpid()}@{host}.tmp"  # a live writer's, being written
    old_unknown = group / ".batch-000003-89abcdef.parquet.tmp"  # lox before 0.3 named no writer
    new_unknown = group / ".batch-000004-89abcdef.parquet.tmp"
    for path in (killed, live, old_unknown, new_unknown):
        path.write_bytes(b"PAR1 half a file")
    os.utime(old_unknown, (time.time() - 3600, time.time() - 3600))
    second = lox.loggers.from_config(f"parquet:{runs}")
    second.finish(second.init(name="second"))
    assert not killed.exists() and not old_unknown.exists()
    assert live.exists() and new_unknown.exists()
    first_logs, second_logs = lox.load(runs).values()
    assert first_logs["x"].tolist() == [0.0, 1.0, 2.0] and list(second_logs) == []


def test_a_trackers_local_log_on_a_full_disk_stops_training_and_the_tracker_gets_everything_after(small_disk, tmp_path):
    from tensorboard.backend.event_processing import event_accumulator

    local, board = small_disk.path / "runs", tmp_path / "tb"
    logger = lox.loggers.from_config(f"tensorboard:{board}?local={local}", flush_every=0.05, max_pending=16 * 1024)
    state = logger.init(name="tracked")
    train = jax.jit(lambda w, i: logger.spool(step, state)(w, i))
    w = jnp.zeros(WIDTH)
    small_disk.fill()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(Exception, match=rf"backend tensorboard:{board}\?local={local} holds .*No space left on "
                                            rf"device.*{local}"):
            for i in range(2000):
                w = train(w, i)
                w.block_until_ready()
                time.sleep(0.002)
        with pytest.raises(BackendError, match=r"could not write .* within 1 s: .*No space left on device"):
            logger.flush(timeout=1)
        small_disk.free()
        logger.finish(state)
    steps, values = saved(local)
    assert steps == list(range(len(steps))) and len(steps) >= 10
    (run,) = logger.runs()
    assert run.status == "finished"
    accumulator = event_accumulator.EventAccumulator(
        str(board / run.group / run.name), size_guidance={event_accumulator.HISTOGRAMS: 0}
    )
    accumulator.Reload()
    assert [h.step for h in accumulator.Histograms("w")] == steps  # the tracker got every step the local log kept
    assert [h.histogram_value.max for h in accumulator.Histograms("w")] == [float(s) for s in steps]


@pytest.fixture
def own_s3(tmp_path, monkeypatch):
    """A moto S3 server of this test's own (it is stopped, killed and restarted) and a bucket on it."""
    from s3_server import S3Server

    server = S3Server(tmp_path).start()
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    server.create_bucket("faults")
    try:
        yield server
    finally:
        server.stop()


def test_a_frozen_bucket_is_waited_for_within_the_timeout_warned_about_and_nothing_is_lost(own_s3):
    runs = "s3://faults/runs"
    logger = lox.loggers.from_config(f"parquet:{runs}", flush_every=0.2, timeout=4)
    state = logger.init(name="frozen")
    train = jax.jit(logger.spool(step, state))
    w = jnp.zeros(WIDTH)
    for i in range(5):
        w = train(w, i)
    logger.flush()
    own_s3.pause()  # SIGSTOP: connections open, no answer
    try:
        with pytest.warns(RuntimeWarning) as warned:
            for i in range(5, 15):
                w = train(w, i)
            jax.effects_barrier()
            time.sleep(9)  # a write waits 4 s (the logger's timeout), then is tried again
    finally:
        own_s3.resume()
    (message,) = [str(w.message) for w in warned]
    assert re.fullmatch(rf"lox: backend parquet:{runs} cannot flush: lox: writing '{runs}/.*batch-\d+-\w+\.parquet' "
                        r"did not finish within 4 s; lox stopped waiting for it\. Check that the store answers .*",
                        message), message
    logger.finish(state, timeout=60)
    steps, values = saved(runs)
    assert steps == list(range(15))
    np.testing.assert_array_equal(values, by_hand(range(15)))
    assert lox_runs(runs)[0]["status"] == "finished"


def test_a_killed_and_restarted_bucket_server_gets_what_was_logged_meanwhile(own_s3):
    runs = "s3://faults/runs"
    logger = lox.loggers.from_config(f"parquet:{runs}", flush_every=0.2, timeout=5)
    state = logger.init(name="restarted")
    logger.flush()
    own_s3.kill()
    train = jax.jit(logger.spool(step, state))
    w = jnp.zeros(WIDTH)
    with pytest.warns(RuntimeWarning, match=rf"backend parquet:{runs} cannot flush: .*{runs}"):
        for i in range(10):
            w = train(w, i)
        jax.effects_barrier()
        time.sleep(2)
        with pytest.raises(BackendError, match=rf"parquet:{runs} could not write \d+ batch\(es\) .* of run\(s\) "
                                               r"'restarted-.*' within 1 s"):
            logger.flush(timeout=1)
    own_s3.start()  # on the same port; moto forgets its buckets: made again, as an operator would
    own_s3.create_bucket("faults")
    logger.finish(state, timeout=60)
    steps, values = saved(runs)
    assert steps == list(range(10))
    np.testing.assert_array_equal(values, by_hand(range(10)))
    assert lox_runs(runs)[0]["status"] == "finished"


def test_a_call_with_a_bad_timeout_is_refused_naming_it():
    logger = lox.loggers.from_config("memory")
    state = logger.init()
    for call in (lambda: logger.finish(state, timeout=-3), lambda: logger.flush(timeout=float("nan")),
                 lambda: logger.write_received(timeout=0)):
        with pytest.raises(ValueError, match=r"`timeout` is a finite number of seconds > 0 \(how long this call "
                                             r"waits\), got .*; pass e\.g\. timeout=60"):
            call()
    with pytest.raises(TypeError, match=r"`timeout` is a number of seconds \(how long this call waits\), got '5'"):
        logger.finish(state, timeout="5")
    logger.finish(state)


def test_vmapped_seeds_on_a_full_disk_count_the_bytes_they_hold_once(small_disk):
    """A vmapped call's rows are one table for all seeds, handed to each seed's
    run as a slice; the bytes held are the table's, counted once (each slice
    also names every seed's run id: counted per slice, 256 seeds' 12 calls
    looked like 25 MiB, and a full disk stopped training at once)."""
    runs, seeds = small_disk.path / "runs", 256
    logger = lox.loggers.from_config(f"parquet:{runs}", flush_every=0.05, max_pending=2**20, timeout=30)
    states = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), seeds))
    train = jax.jit(jax.vmap(lambda s, w, i: logger.spool(step, s)(w, i), in_axes=(0, 0, None)))
    w = jnp.zeros(seeds)
    small_disk.fill()
    with pytest.warns(RuntimeWarning, match=rf"backend parquet:{runs} cannot .*No space left on device"):
        for i in range(12):  # about 20 KiB a call, for all seeds
            w = train(states, w, i)
            w.block_until_ready()
            time.sleep(0.1)  # flushes fail meanwhile
    small_disk.free()
    logger.finish(states)
    saved_runs = lox.load(runs)
    assert len(saved_runs) == seeds
    for logs in saved_runs.values():
        assert logs.step["w"].tolist() == list(range(12))
        assert logs["w"].tolist() == [float(i) for i in range(12)]
    assert {run.status for run in logger.runs()} == {"finished"}


def test_logs_sent_after_finish_are_refused_and_fail_no_other_run(tmp_path):
    runs = tmp_path / "runs"
    logger = lox.loggers.from_config(f"parquet:{runs}")
    a, b = logger.init(name="a"), logger.init(name="b")
    logger.log(a, lox.logdict({"x": np.arange(3.0)}))
    logger.log(b, lox.logdict({"x": np.arange(3.0)}))
    logger.finish(a)
    logger.log(a, lox.logdict({"x": np.arange(3.0)}))  # too late: refused in the background
    with pytest.raises(BackendError, match=r"logs for run 'a' arrived after `logger.finish` closed it and were not "
                                           r"written"):
        logger.flush()
    logger.log(b, lox.logdict({"x": np.arange(3.0, 6.0)}))
    logger.finish(b)
    c = logger.init(name="c")  # opened after the refusal
    logger.log(c, lox.logdict({"x": np.arange(2.0)}))
    logger.finish(c)
    assert [(run.name, run.status) for run in logger.runs()] == [("a", "finished"), ("b", "finished"),
                                                                   ("c", "finished")]
    records = {info["name"]: info for info in lox_runs(runs)}
    assert {name: (info["status"], info["rows"]) for name, info in records.items()} == {
        "a": ("finished", 3), "b": ("finished", 6), "c": ("finished", 2)}
    loaded = {records_name: lox.load(runs)[info["run_id"]]["x"].tolist() for records_name, info in records.items()}
    assert loaded == {"a": [0.0, 1.0, 2.0], "b": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], "c": [0.0, 1.0]}


def _raise_in_a_host_callback(message: str) -> None:
    """A user's tap callback that raises inside jax.jit: lox keeps the exception for the next call."""

    def logged(x):
        lox.log({"x": x})
        return x

    def callback(event):
        raise RuntimeError(message)

    jax.jit(lox.tap(logged, callback))(1.0).block_until_ready()


def test_flush_writes_and_finish_closes_the_runs_before_raising_what_a_host_callback_raised(tmp_path):
    runs = tmp_path / "runs"
    logger = lox.loggers.from_config(f"parquet:{runs}", flush_every=600)  # written by `flush` alone
    state = logger.init(name="after-a-bug")
    train = jax.jit(logger.spool(step, state))
    w = train(jnp.zeros(WIDTH), 0)
    _raise_in_a_host_callback("a bug in the user's callback")
    with pytest.raises(RuntimeError, match="a bug in the user's callback"):
        logger.flush()
    assert saved(runs)[0] == [0]  # written all the same
    w = train(w, 1)
    _raise_in_a_host_callback("another bug")
    with pytest.raises(RuntimeError, match="another bug"):
        logger.finish(state)
    info = run_json(runs)
    assert (info["status"], info["rows"]) == ("finished", 2)  # closed all the same
    steps, values = saved(runs)
    assert steps == [0, 1]
    np.testing.assert_array_equal(values, by_hand([0, 1]))


def test_training_stopped_by_max_pending_runs_again_once_space_is_freed_and_finish_raises_nothing(small_disk):
    """The error that stopped the program says how things stand: once space is freed and
    what was held is written, the same jitted step runs and logs again, without a logger
    call in between (a kept copy of the error failed every later step, then `finish`)."""
    runs = small_disk.path / "runs"
    logger = lox.loggers.from_config(f"parquet:{runs}", flush_every=0.05, max_pending=32 * 1024, timeout=30)
    state = logger.init(name="resumed")
    train = jax.jit(lambda w, i: logger.spool(step, state)(w, i))
    w, i = jnp.zeros(WIDTH), 0
    small_disk.fill()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(jax.errors.JaxRuntimeError, match="Training stops here"):
            while i < 2000:
                w_next = train(w, i)
                w_next.block_until_ready()
                w, i = w_next, i + 1
                time.sleep(0.002)
        small_disk.free()
        deadline = time.monotonic() + 20
        while True:  # the step that failed, until the logger took back what it held (its next retry)
            try:
                w_next = train(w, i)
                w_next.block_until_ready()
                break
            except jax.errors.JaxRuntimeError as error:
                assert "Training stops here" in str(error)
                assert time.monotonic() < deadline, "the step still fails, 20 s after space was freed"
                time.sleep(0.1)
        w, i = w_next, i + 1
        for j in range(i, i + 5):
            w = train(w, j)
        logger.finish(state)  # nothing to raise
    steps, values = saved(runs)
    assert steps == list(range(i + 5)) and i >= 30
    np.testing.assert_array_equal(values, by_hand(steps))
    assert run_json(runs)["status"] == "finished" and [run.status for run in logger.runs()] == ["finished"]


def test_flush_tries_again_at_once_rather_than_after_the_backoff(small_disk):
    """After a long outage a failed write is tried again only every 16-30 s; `flush` (space was
    just freed) tries at once."""
    runs = small_disk.path / "runs"
    logger = lox.loggers.from_config(f"parquet:{runs}", flush_every=0.05)
    state = logger.init(name="long-outage")
    logger.flush()
    small_disk.fill()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        logger.log(state, lox.logdict({"x": np.arange(3.0)}))
        time.sleep(17)  # tried at about 0.5, 1.5, 3.5, 7.5 and 15.5 s; the next at 31.5 s
        small_disk.free()
        began = time.monotonic()
        logger.flush(timeout=10)
    assert time.monotonic() - began < 5
    assert lox.load(runs)[run_json(runs)["run_id"]]["x"].tolist() == [0.0, 1.0, 2.0]
    logger.finish(state)


class _PerRunPlugin:
    """A plugin that writes each run's tables to a folder of its own (`TARGET/<run name>`), a
    Parquet file per table, whole or not at all; it refuses the tables of runs opened with ``refuse=True``."""

    class PerRun(hooks.Backend):
        def __init__(self, target=None, options=None):
            super().__init__(target, options)
            self.files = 0

        def write(self, run, table):
            if run.metadata.get("refuse"):
                raise ValueError(f"run {run.name} is refused")
            folder = pathlib.Path(self.target or ".") / run.name
            folder.mkdir(exist_ok=True)
            self.files += 1
            temp = folder / f".{self.files}.tmp"
            try:
                pq.write_table(table, temp)
                temp.rename(folder / f"{self.files:06d}.parquet")
            except OSError:
                temp.unlink(missing_ok=True)
                raise

    @hooks.hookimpl
    def lox_backends(self):
        return [hooks.BackendSpec("perrun", self.PerRun, description="a folder per run (a test plugin)")]


def test_a_write_retried_after_one_run_failed_writes_the_other_runs_once(small_disk, tmp_path):
    """A vmapped write holds every seed's table; where one seed's folder is on a full disk,
    the retry writes only what failed, each run's tables in order."""
    registry.register(_PerRunPlugin(), name="lox-tests:perrun")
    base = tmp_path / "perrun"
    base.mkdir()
    (small_disk.path / "s-0").mkdir()
    (base / "s-0").symlink_to(small_disk.path / "s-0")  # seed 0 on the small disk, seed 1 beside it
    logger = lox.loggers.from_config(f"perrun:{base}", flush_every=0.05)
    states = jax.vmap(lambda key: logger.init(key, name="s"))(jax.random.split(jax.random.key(0), 2))
    small_disk.fill()
    with pytest.warns(RuntimeWarning, match=rf"backend perrun:{base} cannot write: .*No space left on device"):
        for i in range(3):
            logger.log(states, lox.logdict({"x": np.full((2, 1), float(i))}, {"step": {"x": np.full((2, 1), i)}}))
            time.sleep(0.3)  # one write per call, retried meanwhile
        time.sleep(1)
    small_disk.free()
    logger.finish(states)
    for seed in ("s-0", "s-1"):
        tables = [pq.read_table(path) for path in sorted((base / seed).glob("*.parquet"))]
        assert [s for t in tables for s in t.column("step").to_pylist()] == [0, 1, 2], seed
    assert [run.status for run in logger.runs()] == ["finished", "finished"]

    (tmp_path / "refusing").mkdir()
    refusing = lox.loggers.from_config(f"perrun:{tmp_path / 'refusing'}")
    pair = jax.vmap(lambda key, refuse: refusing.init(key, name="r", refuse=refuse))(
        jax.random.split(jax.random.key(1), 2), jnp.array([False, True]))
    with pytest.warns(RuntimeWarning, match="run r-1 is refused"):
        refusing.log(pair, lox.logdict({"x": np.zeros((2, 1))}))
        with pytest.raises(BackendError, match=r"perrun:.*ValueError\('run r-1 is refused'\)"):
            refusing.finish(pair)
    assert [(run.name, run.status) for run in refusing.runs()] == [("r-0", "finished"), ("r-1", "failed")]


def test_a_worker_with_nothing_to_do_sleeps_until_the_time_its_periodic_call_asks_for():
    """The router of a Logger with runs open and nothing logged wakes at the next flush
    (a heartbeat), not every 0.25 s; a task brings its tick back within `every`."""
    calls = []
    worker = Worker("sleeps", every=0.01, periodic=lambda: calls.append(time.monotonic()) or 2.0)
    worker.submit(lambda: None)
    time.sleep(0.5)
    assert len(calls) == 1  # 0.01 s after the task, then not for 2 s
    worker.submit(lambda: None)
    time.sleep(0.3)
    assert len(calls) == 2
    worker.stop()


def test_at_exit_a_full_disk_says_what_is_lost(small_disk, tmp_path):
    runs = small_disk.path / "runs"
    done = _script(tmp_path, f"""
        import numpy as np, lox
        logger = lox.loggers.from_config("parquet:{runs}", timeout=2)
        state = logger.init(name="at-exit")
        logger.log(state, lox.logdict({{"x": np.arange(3.0)}}))
        logger.flush()
        with open({str(small_disk.filler)!r}, "ab", buffering=0) as f:
            try:
                while True:
                    f.write(bytes(4096))
            except OSError:
                pass
        logger.log(state, lox.logdict({{"x": np.arange(3.0, 6.0)}}))
    """)
    assert done.returncode == 0, done.stderr
    assert re.search(rf"could not flush at exit: lox: parquet:{runs} could not write 1 batch\(es\) .* of run\(s\) "
                     r"'at-exit-.*' at exit: .*No space left on device.*\. The process exits: they are lost\.",
                     done.stderr), done.stderr
    assert "logger.flush()" not in done.stderr


def test_many_seeds_opened_at_once_write_their_groups_heartbeat_once(tmp_path):
    """The heartbeat beside the batch files is written when the first run of a group
    opens and at each flush, not once per run (1,024 seeds on a bucket: 1,024 uploads,
    one after the other, before the first batch)."""
    done = _script(tmp_path, f"""
        import sys, jax, numpy as np, lox
        heartbeats = []
        sys.addaudithook(lambda event, args: event == "open" and "_alive-" in str(args[0])
                         and heartbeats.append(args[0]))
        logger = lox.loggers.from_config("parquet:{tmp_path / 'runs'}", flush_every=600)  # flushed by hand
        states = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), 64))
        logger.log(states, lox.logdict({{"x": np.zeros((64, 3))}}))
        logger.flush()
        print("heartbeats written:", len(heartbeats))
        logger.finish(states)
    """)
    assert "heartbeats written: 2" in done.stdout, done.stdout + done.stderr  # at the first open_run, at the flush
    assert {info["status"] for info in lox_runs(tmp_path / "runs")} == {"finished"}


def test_a_console_that_cannot_print_warns_once_and_never_stops_training(tmp_path):
    done = _script(tmp_path, """
        import jax, jax.numpy as jnp, lox
        logger = lox.loggers.from_config("console?interval=0,parquet:runs", max_pending=4096)
        state = logger.init(name="piped")
        step = jax.jit(lambda w, i: logger.spool(lambda w: (lox.log({"w": w}, step=i), w + 1.0)[1], state)(w))
        w = jnp.zeros(64)
        for i in range(200):
            w = step(w, i)
        logger.finish(state)
        import sys
        print("trained", float(w[0]), file=sys.stderr)
    """, stdout_closed=True)
    assert "trained 200.0" in done.stderr, done.stderr
    assert done.stderr.count("the console backend cannot print") == 1, done.stderr
    (saved_logs,) = lox.load(tmp_path / "runs").values()
    assert saved_logs.step["w"].tolist() == list(range(200))


def test_a_script_that_fails_on_a_full_disk_exits_at_once_saying_what_is_lost(small_disk, tmp_path):
    runs = small_disk.path / "runs"
    began = time.monotonic()
    done = _script(tmp_path, f"""
        import numpy as np, lox, time
        logger = lox.loggers.from_config("parquet:{runs}", flush_every=0.05)  # the logger's timeout: 60 s
        state = logger.init(name="lost")
        with open("{small_disk.filler}", "ab", buffering=0) as f:
            try:
                while True:
                    f.write(bytes(4096))
            except OSError:
                pass
        logger.log(state, lox.logdict({{"x": np.arange(1000.0)}}))
        time.sleep(0.5)
        raise RuntimeError("diverged")
    """)
    took = time.monotonic() - began
    assert "RuntimeError: diverged" in done.stderr
    assert re.search(r"could not flush at exit: lox: parquet:.* could not write 1 batch\(es\) .* of run\(s\) "
                     r"'lost-.*' at exit: .*No space left on device.*The process exits: they are lost",
                     done.stderr), done.stderr
    assert took < 40, f"exit waited {took:.0f} s for a disk that stays full"  # the logger's timeout is 60 s
