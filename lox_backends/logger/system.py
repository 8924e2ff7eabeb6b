"""System metrics: the sampler a Logger runs with ``system=N`` (seconds between samples).

Every N seconds a daemon thread of the Logger samples the host and the local
devices, and the router writes the sample to every open run as scalar keys
(float64), at the run's latest step:

=================================  =====================================================================
key                                what, unit
=================================  =====================================================================
``system/cpu_percent``             the host's CPU use since the last sample, all CPUs, 0 to 100 (%)
``system/memory_used_bytes``       the host's memory in use (``psutil.virtual_memory().used``), bytes
``system/memory_percent``          the same as a percentage of the host's memory (%)
``system/process_rss_bytes``       this process's resident memory (RSS), bytes
``system/device{i}/memory_used_bytes``  memory in use on local device i (``jax.local_devices()[i]``), bytes
``system/device{i}/memory_peak_bytes``  the most memory in use on device i so far, bytes
``system/steps_per_second``        the run's largest step received, its increase since the previous sample
                                   per second between the two samples
=================================  =====================================================================

A device's keys come from its ``memory_stats()`` (GPUs, TPUs); a device
without them (CPU devices: ``memory_stats()`` is None) has no keys, never
zeros. ``steps_per_second`` needs two samples of a run that has logged a
step: a run's first sample has none. The step of a sample is the largest of
the run's primary step (``step``, see `lox_core.schema.primary_step`) that
reached the Logger before it, so that system metrics line up with the run's
metrics in plots; a run that has logged no step yet gets step 0 (its
``from_step`` when it is resumed with one).

The sampler never holds back training: it samples in its own thread, hands
the sample to the router without waiting, and skips a sample while the
previous one still waits in the router or the router is far behind. It
starts with the first run opened (`Sampler.start`, from the router), ends
once no run is open (`poke` after `finish`) or the Logger closes (`stop`).
In a multi-process job only a process that writes samples (process 0 by
default: the host figures are its host's).

>>> device_values(0, {"bytes_in_use": 1024, "peak_bytes_in_use": 4096, "bytes_limit": 8192})
{'system/device0/memory_used_bytes': 1024.0, 'system/device0/memory_peak_bytes': 4096.0}
>>> device_values(1, None)  # a CPU device
{}
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import psutil
import pyarrow as pa
import pyarrow.compute as pc

from lox_backends.logger.worker import Worker
from lox_backends.plugin.hooks import RunInfo
from lox_core import schema
from lox_core.logdict import logdict

PREFIX = "system/"
STEPS_PER_SECOND = f"{PREFIX}steps_per_second"
LABEL = "system"  # the router task of a sample (`Worker.backlog` counts them)
_DEVICE_STATS = (("bytes_in_use", "memory_used_bytes"), ("peak_bytes_in_use", "memory_peak_bytes"))


def host_values(process: psutil.Process) -> dict[str, float]:
    """The host's figures now (CPU use since the last call from this thread)."""
    memory = psutil.virtual_memory()
    return {
        f"{PREFIX}cpu_percent": float(psutil.cpu_percent(interval=None)),
        f"{PREFIX}memory_used_bytes": float(memory.used),
        f"{PREFIX}memory_percent": float(memory.percent),
        f"{PREFIX}process_rss_bytes": float(process.memory_info().rss),
    }


def device_values(index: int, stats: Mapping[str, Any] | None) -> dict[str, float]:
    """The keys of local device `index` from its ``memory_stats()``: none
    where it has none (a CPU device's is None) or lacks a figure."""
    if not stats:
        return {}
    return {f"{PREFIX}device{index}/{name}": float(stats[stat]) for stat, name in _DEVICE_STATS if stat in stats}


def sample(process: psutil.Process, devices: Sequence[Any]) -> dict[str, float]:
    """One sample of the host and of `devices` (``jax.local_devices()``)."""
    values = host_values(process)
    for index, device in enumerate(devices):
        values.update(device_values(index, device.memory_stats()))
    return values


class Sampler:
    """The system metrics of one Logger: a thread that samples every `every`
    seconds while runs are open and hands each sample to `deliver` in the
    `router` (skipped while the router is behind: a sample of its waits there,
    or `max_backlog` tasks do); and each run's latest step, noted by the
    router from the tables it sends (`saw`), from which `rows` makes the
    sample's logs per run."""

    def __init__(self, every: float, name: str, router: Worker, deliver: Callable[[dict[str, float]], None],
                 has_open: Callable[[], bool], max_backlog: int):
        self.every = every
        self.name = name
        self.skipped = 0  # samples skipped while the router was behind
        self._router = router
        self._deliver = deliver
        self._has_open = has_open
        self._max_backlog = max_backlog
        self._condition = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._failed = False  # sampling raised once (warned)
        # In the router thread only:
        self._latest: dict[int, tuple[str, int]] = {}  # run number -> (step name, largest step received)
        self._sampled: dict[int, tuple[str, int] | None] = {}  # run number -> its latest step at the last sample
        self._sampled_at: float | None = None  # when the last sample was written (time.monotonic)

    # --- the thread ---------------------------------------------------------------------
    def start(self) -> None:
        """Sample from now on, if not yet (from the router, as a run opens)."""
        with self._condition:
            if self._thread is not None or self._stopped:
                return
            thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            try:
                thread.start()
            except RuntimeError:  # the interpreter exits: no new threads
                return
            self._thread = thread

    def poke(self) -> None:
        """Look again whether runs are open (after `finish`): the thread ends if none is."""
        with self._condition:
            self._condition.notify_all()

    def stop(self, timeout: float = 1.0) -> None:
        """End sampling for good (the Logger closes)."""
        with self._condition:
            self._stopped = True
            thread, self._thread = self._thread, None
            self._condition.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def running(self) -> bool:
        """Whether the sampling thread runs."""
        with self._condition:
            return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        process = psutil.Process()
        devices = jax.local_devices()
        psutil.cpu_percent(interval=None)  # this thread's reference for the first sample's CPU use
        due = time.monotonic() + self.every
        while True:
            with self._condition:
                self._condition.wait(max(due - time.monotonic(), 0.0))
                if self._stopped or not self._has_open():
                    if self._thread is threading.current_thread():
                        self._thread = None  # a run opened later starts another
                    return
                if time.monotonic() < due:
                    continue  # poked, runs still open
            due = max(due + self.every, time.monotonic())
            self.tick(process, devices)

    def tick(self, process: psutil.Process, devices: Sequence[Any]) -> bool:
        """Sample now and hand the sample to the router, unless the router is
        behind (then the sample is skipped and counted); whether it was handed over."""
        if self._router.backlog(LABEL) or self._router.backlog() >= self._max_backlog:
            self.skipped += 1
            return False
        try:
            values = sample(process, devices)
        except Exception as error:  # noqa: BLE001 - training goes on without system metrics
            if not self._failed:
                self._failed = True
                warnings.warn(f"lox: sampling system metrics failed ({error!r}); samples that fail are skipped.",
                              RuntimeWarning, stacklevel=1)
            return False
        self._router.submit(lambda: self._deliver(values), LABEL)
        return True

    # --- in the router thread -----------------------------------------------------------
    def saw(self, tables: Sequence[tuple[RunInfo, pa.Table]]) -> None:
        """Note each run's largest primary step among the tables sent to it."""
        for run, table in tables:
            name = schema.primary_step(schema.step_names(table))
            if name is None:
                continue
            top = pc.call_function("max", [table.column(name)]).as_py()  # nulls (events without it) left out
            if top is None:
                continue
            held = self._latest.get(run.index)
            if held is None or (held[0] != name and name == schema.PRIMARY_STEP):
                self._latest[run.index] = (name, top)
            elif held[0] == name and top > held[1]:
                self._latest[run.index] = (name, top)

    def rows(self, values: dict[str, float], runs: Sequence[RunInfo]) -> list[tuple[np.ndarray, logdict]]:
        """A sample's logs for `runs` (those open now), at each run's latest
        step: (run numbers, their logs, with one leading axis for the runs),
        one pair per step name and set of keys."""
        now = time.monotonic()
        since = None if self._sampled_at is None else now - self._sampled_at
        groups: dict[tuple[str, bool], list[tuple[int, int, float]]] = {}
        sampled: dict[int, tuple[str, int] | None] = {}
        for run in runs:
            latest = self._latest.get(run.index)
            before = self._sampled.get(run.index)
            rate = None
            if latest is not None and before is not None and before[0] == latest[0] and since:
                rate = (latest[1] - before[1]) / since
            name, step = latest if latest is not None else (schema.PRIMARY_STEP, run.from_step or 0)
            groups.setdefault((name, rate is not None), []).append((run.index, step, rate or 0.0))
            sampled[run.index] = latest
        self._sampled, self._sampled_at = sampled, now  # runs no longer open are forgotten
        self._latest = {number: self._latest[number] for number in self._latest if number in sampled}
        made = []
        for (name, has_rate), members in groups.items():
            count = len(members)
            data = {key: np.full((count, 1), value) for key, value in values.items()}
            if has_rate:
                data[STEPS_PER_SECOND] = np.array([[rate] for _, _, rate in members])
            steps = np.array([[step] for _, step, _ in members], np.int64)
            made.append((np.array([number for number, _, _ in members], np.int32),
                         logdict(data, {name: dict.fromkeys(data, steps)})))
        return made
