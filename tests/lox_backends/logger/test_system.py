"""System metrics (issue 31, part 2): a Logger made with ``system=N`` writes
host, device and steps-per-second figures to its open runs every N seconds
(`lox_backends.logger.system`), at each run's latest step; off by default;
the sampler's thread lives while runs are open and never waits for the router."""

import math
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import psutil
import pytest

import lox
from lox_backends.logger import system
from lox_backends.logger.worker import Worker
from lox_backends.memory import MemoryBackend

INTERVAL = 0.2  # seconds between samples in these tests
SECONDS = 1.5  # how long each training loop runs
STEPS_PER_CALL = 50
HOST_KEYS = {"system/cpu_percent", "system/memory_used_bytes", "system/memory_percent", "system/process_rss_bytes"}


def epoch(w, start, stride):
    """A scan of `STEPS_PER_CALL` steps, each logging its loss at step (start + i) * stride."""
    def step(w, i):
        w = jnp.tanh(w * 1.01 + 0.1)
        lox.log({"loss": w}, step=(start + i) * stride)
        return w, None

    return jax.lax.scan(step, w, jnp.arange(STEPS_PER_CALL))[0]


def train_for(call, w, seconds):
    """Call ``call(w, start)`` (it logs `STEPS_PER_CALL` steps from `start`) for
    `seconds`, after a first call that compiles; the steps logged while timed, and the time."""
    w = call(w, 0)
    jax.block_until_ready(w)
    start, began = STEPS_PER_CALL, time.monotonic()
    while time.monotonic() - began < seconds:
        w = call(w, start)
        start += STEPS_PER_CALL
    jax.block_until_ready(w)
    return start - STEPS_PER_CALL, time.monotonic() - began


def sampler_threads(name):
    return [t for t in threading.enumerate() if t.name == f"lox-system-{name}"]


def expected_device_keys():
    """What this machine's local devices give (none on CPU devices: `memory_stats()` is None)."""
    return {key for i, device in enumerate(jax.local_devices())
            for key in system.device_values(i, device.memory_stats())}


def test_a_training_loop_gets_system_metrics_at_the_interval_with_plausible_values(tmp_path):
    rss_before = psutil.Process().memory_info().rss
    total = psutil.virtual_memory().total
    began = time.monotonic()
    logger = lox.loggers.from_config(f"parquet:{tmp_path}", name="sampled", system=INTERVAL)
    assert logger.system == INTERVAL
    state = logger.init(name="run")
    call = jax.jit(logger.spool(lambda w, start: epoch(w, start, 1), state))
    steps, trained = train_for(call, jnp.float32(0.5), SECONDS)
    (thread,) = sampler_threads("sampled")
    logger.finish(state)
    ended = time.monotonic()
    rss_after = psutil.Process().memory_info().rss
    thread.join(10)  # `finish` closed the only run: the sampler ends
    assert not thread.is_alive() and not sampler_threads("sampled")

    (logs,) = lox.load(str(tmp_path)).values()
    keys = {key for key in logs if key.startswith("system/")}
    assert keys == HOST_KEYS | {"system/steps_per_second"} | expected_device_keys()
    if all(device.memory_stats() is None for device in jax.local_devices()):  # CPU devices: no device keys
        assert not any(key.startswith("system/device") for key in keys)

    # One sample per interval while the run was open: never more, and most of them (a few may be skipped).
    samples = len(logs["system/cpu_percent"])
    assert trained / INTERVAL / 3 <= samples <= (ended - began) / INTERVAL + 1
    assert all(len(logs[key]) == samples for key in HOST_KEYS)

    # At the run's latest step: steps the run logged (or 0 before its first), never going back.
    at = logs.step["system/cpu_percent"]
    assert set(at.tolist()) <= set(logs.step["loss"].tolist()) | {0}
    assert np.all(np.diff(at) >= 0) and at[-1] <= logs.step["loss"].max()
    for key in HOST_KEYS:
        assert logs.step[key].tolist() == at.tolist()

    cpu = logs["system/cpu_percent"]
    assert np.all((cpu >= 0) & (cpu <= 100))
    used = logs["system/memory_used_bytes"]
    assert np.all((used > 0) & (used <= total))
    percent = logs["system/memory_percent"]
    assert np.all((percent > 0) & (percent <= 100))
    assert np.all(np.abs(percent - psutil.virtual_memory().percent) <= 25)  # as the host's now, give or take
    rss = logs["system/process_rss_bytes"]
    assert np.all((rss >= rss_before / 2) & (rss <= 2 * rss_after) & (rss <= total))

    # Steps per second from the second sample on, as fast as the loop ran, within a wide factor.
    rates = logs["system/steps_per_second"]
    assert 1 <= len(rates) <= samples - 1
    assert np.all(rates >= 0)
    measured = steps / trained
    assert measured / 3 <= np.mean(rates) <= 3 * measured
    logger.close()


def test_each_vmapped_run_gets_its_own_steps_per_second():
    logger = lox.loggers.from_config("memory", name="seeds", system=INTERVAL)
    states = jax.vmap(lambda key: logger.init(key, name="seed"))(jax.random.split(jax.random.key(0), 2))
    strides = jnp.array([1, 3])  # seed 1 logs steps 0, 3, 6...: three times the steps per second of seed 0
    vmapped = jax.vmap(lambda s, w, start, stride: logger.spool(epoch, s)(w, start, stride), in_axes=(0, 0, None, 0))
    call = jax.jit(lambda w, start: vmapped(states, w, start, strides))
    train_for(call, jnp.full(2, 0.5), SECONDS)
    logger.finish(states)
    first, second = (logger.backends[0].logs(run.run_id) for run in logger.runs())
    assert {key for key in first if key.startswith("system/")} >= HOST_KEYS | {"system/steps_per_second"}
    # One host call delivers both seeds' steps: every sample sees both runs at once.
    assert second.step["system/cpu_percent"].tolist() == (3 * first.step["system/cpu_percent"]).tolist()
    assert np.allclose(second["system/steps_per_second"], 3 * first["system/steps_per_second"])
    assert np.all(first["system/steps_per_second"] >= 0) and np.any(first["system/steps_per_second"] > 0)
    assert first["system/cpu_percent"].tolist() == second["system/cpu_percent"].tolist()  # one sample, every run
    logger.close()


def test_system_metrics_are_off_by_default():
    logger = lox.loggers.from_config("memory", name="quiet")
    assert logger.system is None
    state = logger.init(name="run")
    call = jax.jit(logger.spool(lambda w, start: epoch(w, start, 1), state))
    train_for(call, jnp.float32(0.5), 3 * INTERVAL)
    assert not sampler_threads("quiet")
    logger.finish(state)
    logs = logger.backends[0].logs()
    assert list(logs) == ["loss"]
    logger.close()


def test_the_sampler_starts_with_the_first_run_and_stops_at_close():
    logger = lox.loggers.from_config("memory", name="lazy", system=INTERVAL)
    time.sleep(2 * INTERVAL)
    assert not sampler_threads("lazy")  # no run yet: no thread
    state = logger.init(name="run")
    logger.log(state, {"x": 1.0}, step=4)
    logger.flush()  # the router has announced the run: the sampler runs
    (thread,) = sampler_threads("lazy")
    deadline = time.monotonic() + 30
    while "system/cpu_percent" not in logger.backends[0].logs() and time.monotonic() < deadline:
        time.sleep(INTERVAL)
        logger.flush()
    logs = logger.backends[0].logs()
    assert logs.step["system/cpu_percent"][-1] == 4  # the run's latest step
    logger.close()  # the run is still open: closing ends the sampler too
    thread.join(10)
    assert not thread.is_alive()


def test_a_run_opened_after_finish_starts_the_sampler_again():
    logger = lox.loggers.from_config("memory", name="again", system=INTERVAL)
    first = logger.init(name="first")
    logger.flush()
    (thread,) = sampler_threads("again")
    logger.finish(first)
    thread.join(10)
    assert not thread.is_alive()
    second = logger.init(name="second")
    logger.flush()
    assert len(sampler_threads("again")) == 1
    deadline = time.monotonic() + 30
    while "system/cpu_percent" not in logger.backends[0].logs(logger.runs()[1].run_id) \
            and time.monotonic() < deadline:
        time.sleep(INTERVAL)
        logger.flush()
    # A run that logged no step yet gets step 0.
    assert logger.backends[0].logs(logger.runs()[1].run_id).step["system/cpu_percent"][0] == 0
    logger.finish(second)
    logger.close()


def test_a_sample_is_skipped_while_the_router_is_behind():
    router = Worker("busy-router")
    delivered = []
    sampler = system.Sampler(INTERVAL, "test", router, delivered.append, lambda: True, max_backlog=3)
    process, devices = psutil.Process(), jax.local_devices()
    release = threading.Event()
    router.submit(lambda: release.wait(30))  # the router is busy
    assert sampler.tick(process, devices)  # handed over: it waits behind that task
    assert not sampler.tick(process, devices)  # one sample waits already: skipped, not queued
    release.set()
    assert router.barrier().wait(30)
    assert len(delivered) == 1 and set(delivered[0]) >= HOST_KEYS and sampler.skipped == 1
    release.clear()
    router.submit(lambda: release.wait(30))
    for _ in range(3):
        router.submit(lambda: None)
    assert not sampler.tick(process, devices)  # the router is behind: skipped
    release.set()
    assert router.barrier().wait(30)
    assert len(delivered) == 1 and sampler.skipped == 2
    router.stop()


def test_device_keys_come_from_memory_stats():
    stats = {"num_allocs": 7, "bytes_in_use": 3 * 2**20, "peak_bytes_in_use": 5 * 2**20, "bytes_limit": 2**34}
    assert system.device_values(2, stats) == {"system/device2/memory_used_bytes": 3.0 * 2**20,
                                              "system/device2/memory_peak_bytes": 5.0 * 2**20}
    assert system.device_values(0, None) == {}  # a CPU device
    assert system.device_values(0, {}) == {}
    assert system.device_values(1, {"bytes_in_use": 10}) == {"system/device1/memory_used_bytes": 10.0}


def test_a_multi_logger_samples_at_the_least_interval_of_its_loggers():
    assert lox.loggers.MultiLogger(lox.loggers.backend_logger("memory", system=2),
                                   lox.loggers.backend_logger("memory", system=0.5),
                                   lox.loggers.backend_logger("memory")).system == 0.5
    assert lox.loggers.MultiLogger(lox.loggers.backend_logger("memory"),
                                   lox.loggers.backend_logger("memory")).system is None


REFUSED = [
    ("10", TypeError, r"`system` is a number of seconds \(how often system metrics are sampled; None: never\), "
                      r"got '10' \(a str\); pass a number, e\.g\. system=10\.0"),
    (True, TypeError, r"`system` .* got True \(a bool\)"),
    (0, ValueError, r"`system` is a finite number of seconds > 0 .* got 0; pass e\.g\. system=10\.0"),
    (-1, ValueError, r"`system` .* got -1;"),
    (math.nan, ValueError, r"`system` .* got nan;"),
    (math.inf, ValueError, r"`system` .* got inf; pass system=None \(the default\) for no system metrics"),
]


@pytest.mark.parametrize(("value", "error", "message"), REFUSED)
def test_a_bad_system_interval_is_refused_when_the_logger_is_made(tmp_path, value, error, message):
    for make in (lambda: lox.loggers.from_config("memory", system=value),
                 lambda: lox.loggers.Logger([MemoryBackend()], system=value),
                 lambda: lox.loggers.backend_logger("memory", system=value),
                 lambda: lox.loggers.SaveLogger(tmp_path / "runs", system=value),
                 lambda: lox.loggers.ConsoleLogger(system=value)):
        with pytest.raises(error, match=message):
            make()
    assert not (tmp_path / "runs").exists()  # refused before anything was written


def test_a_numpy_interval_is_taken_as_seconds():
    assert lox.loggers.from_config("memory", system=np.float32(2.5)).system == 2.5
