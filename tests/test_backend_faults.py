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
import pytest

import lox
from lox_backends import hooks
from lox_backends.logger import BackendError
from lox_backends.memory import MemoryBackend
from lox_backends.registry import registry

ROOT = pathlib.Path(__file__).resolve().parent.parent
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
    from lox_backends import store

    return store.runs(folder)


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


def _script(tmp_path, body: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})


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
        from lox_backends import hooks
        from lox_backends.registry import registry

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
        with pytest.raises(BackendError, match="No space left on device"):
            logger.flush()  # what the host call raised, raised by the next logger call
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
