"""Multi-process jobs (`jax.distributed`): one run per logical run, written once.

Every process of a job runs the same program and creates the same Loggers in
the same order. `Job` is that job as a Logger sees it:

* **Run ids every process agrees on.** Process 0 names the group of each of
  its Loggers and publishes it through JAX's distributed runtime (its
  key-value store); the other processes wait for it. Runs are numbered in
  the order `logger.init` opens them, so ``jax.vmap(logger.init)(keys)``
  called on every process gives every process the same run ids.
* **Who writes.** By default (``processes="first"``) process 0 writes to the
  backends. Values passed to a logger outside `jax.jit` are held by every
  process: process 0 writes them, the others drop them. A jitted program's
  host calls run on its first device, so on process 0; a program on
  process-local arrays runs on every process alike, whose host calls the
  others drop in the same way. The one exception,
  logger calls inside `shard_map` or `pmap`, whose host calls run on every
  device of every process, is refused at the call (on every process alike).
  With ``processes="each"`` every process writes runs of its own (their ids
  end in ``-p<index>`` and their metadata holds ``process_index``): for
  debugging, and for logger calls inside `shard_map` / `pmap`.
* **Values sharded across processes** are gathered at the call, on every
  process at once (`host_local`), so the writer gets the whole value.
* **A process that dies.** JAX's coordination service ends the others only
  when its own heartbeat times out (SIGABRT, a minute or more later), with no
  exit flush. A `Watcher` in every process notices well before: it writes
  what this process's loggers received and prints one line naming the
  process that is gone.

>>> job = Job("first")  # outside a multi-process job: one process, which writes
>>> (job.index, job.count, job.writes, job.group(lambda: "g", timeout=1.0))
(0, 1, True, 'g')
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import socket
import sys
import threading
import time
from typing import Any, Callable

import jax
from jax.experimental import multihost_utils

from lox_backends.logger import shutdown
from lox_core import runtime

PROCESSES = ("first", "each")

# The Loggers a process created while in a multi-process job, in order: the
# name under which process 0 publishes each one's group.
_loggers = itertools.count()


class Job:
    """The processes of the job this process belongs to (see the module docstring)."""

    def __init__(self, processes: str):
        if processes not in PROCESSES:
            raise ValueError(
                f"a Logger's `processes` is 'first' (process 0 writes, the default) or 'each' (every process "
                f"writes runs of its own), got {processes!r}."
            )
        self.processes = processes
        self.index, self.count, self._client = runtime.distributed_runtime()
        if self.count > 1:
            watch(self.index, self._client)

    @property
    def writes(self) -> bool:
        """Whether this process writes to the backends."""
        return self.processes == "each" or self.index == 0

    @property
    def per_device_error(self) -> str | None:
        """Why logger calls inside `shard_map` / `pmap` are refused (None where they are not)."""
        if self.count == 1 or self.processes == "each":
            return None
        return (
            f"a lox logger is called inside shard_map or pmap in a job of {self.count} processes: its host "
            "calls would run on every device of every process, and only process 0 writes. Create the logger "
            "with `processes='each'` (each process writes runs of its own), or call it outside shard_map / "
            "pmap (e.g. return the values and log them outside)."
        )

    def group(self, make: Callable[[], str], timeout: float) -> str:
        """The group of a new Logger's runs, the same on every process: made
        by process 0 (`make`), published, and awaited by the others."""
        if self.count == 1:
            return make()
        number = next(_loggers)
        key = f"lox/logger-{number}/group"
        if self.index == 0:
            group = make()
            self._client.key_value_set(key, group)
        else:
            try:
                group = self._client.blocking_key_value_get(key, int(timeout * 1000))
            except Exception as error:  # the runtime's timeout error has no public type
                raise TimeoutError(
                    f"lox: process {self.index} waited {timeout:g} s for process 0 to create its Logger number "
                    f"{number} ({error}). Create the same Loggers on every process, in the same order."
                ) from error
        return group if self.processes == "first" else f"{group}-p{self.index}"

    def agree(self, key: str, decide: Callable[[], Any], timeout: float) -> Any:
        """What process 0 decides (`decide`, a JSON value; an exception it raises
        is raised on every process), published under `key` and awaited by the
        others: e.g. which runs `logger.init(run_id=...)` resumes."""
        if self.count == 1:
            return decide()
        key = f"lox/agreed/{key}"
        if self.index == 0:
            try:
                decided = {"value": decide()}
            except ValueError as error:
                decided = {"error": str(error)}
            self._client.key_value_set(key, json.dumps(decided))
        else:
            try:
                decided = json.loads(self._client.blocking_key_value_get(key, int(timeout * 1000)))
            except Exception as error:  # the runtime's timeout error has no public type
                raise TimeoutError(
                    f"lox: process {self.index} waited {timeout:g} s for process 0 to decide {key!r} ({error}). "
                    "Call `logger.init` alike on every process."
                ) from error
        if "error" in decided:
            raise ValueError(decided["error"])
        return decided["value"]

    def check_unchanged(self) -> None:
        """A Logger made before `jax.distributed.initialize` would write one run per process."""
        if runtime.distributed_runtime()[1] != self.count:
            raise RuntimeError(
                "this lox Logger was created before `jax.distributed.initialize()`, so each process would "
                "write runs of its own under different ids; create loggers after initializing the job."
            )


HEARTBEAT_EVERY = 2.0  # seconds between two heartbeats of a process, and between two looks at the others'
GONE_AFTER = 10.0  # a process whose heartbeat has not changed for this long is gone (JAX's own limit: 100 s)
WRITE_WITHIN = 30.0  # seconds the loggers get to write what they received, well before JAX ends the job
LEAVE_WITHIN = 5.0  # seconds interpreter exit waits at most to tell the others this process ends normally
ALIVE = "lox/alive/"  # + process index: its heartbeat, or {"done": true} once it ends normally
GONE = "lox/gone/"  # + process index: published by process 0 when that process is gone


class Watcher:
    """Notices, well before JAX does, that another process of the job is gone.

    Every process but 0 writes a heartbeat (a counter, its host and pid) into
    the job's key-value store every `HEARTBEAT_EVERY` seconds, from a daemon
    thread, and ``done`` when it ends normally (`leave`, at interpreter exit),
    so that a process that finishes first is not taken for dead. Process 0
    hosts that store and reads them all: a heartbeat unchanged for
    `GONE_AFTER` seconds is a process gone, which process 0 publishes. (When
    process 0 itself dies, JAX ends the others at once: nothing is left to
    do.) Each process that learns of it writes what its loggers received
    (`Logger.write_received`), then prints one line saying so. Nothing of this
    raises into the user's program, and the thread stops once
    `jax.distributed.shutdown()` has ended the job."""

    def __init__(self, index: int, client: Any):
        self.index, self.client = index, client
        self._lock = threading.Lock()  # a heartbeat is never written after `done`
        self._beats = itertools.count(1)
        self._who = {"host": socket.gethostname(), "pid": os.getpid()}
        self._leaving = False
        self._heard: dict[int, tuple[str, float]] = {}  # process 0: each one's last heartbeat, and when it changed
        self._reported: set[int] = set()  # the processes this one learnt are gone
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lox-job-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def leave(self) -> None:
        """This process ends normally: its peers are not to report it gone.
        Waits `LEAVE_WITHIN` seconds at most (a store that does not answer
        must not hold up exit)."""

        def tell() -> None:
            with self._lock:  # after the heartbeat being written, if one is
                self._leaving = True
                if self.index != 0 and self._current():
                    try:
                        self.client.key_value_set(f"{ALIVE}{self.index}", json.dumps({"done": True}),
                                                  allow_overwrite=True)
                    except Exception:  # noqa: BLE001 - the job's runtime is gone already: nobody is left to tell
                        pass

        teller = threading.Thread(target=tell, name="lox-job-leave", daemon=True)
        teller.start()
        teller.join(LEAVE_WITHIN)

    def stop(self) -> None:
        self._stop.set()

    def _current(self) -> bool:
        """Whether the job this watcher watches is still the one this process is in."""
        return runtime.distributed_runtime()[2] is self.client

    def _run(self) -> None:
        try:
            while self._current() and not self._stop.is_set():
                try:
                    self._look()
                except Exception:  # noqa: BLE001 - the store did not answer (the job is ending): look again later
                    pass
                self._stop.wait(HEARTBEAT_EVERY)
        except BaseException:  # noqa: BLE001 - never into the user's program, not even at interpreter exit
            pass

    def _look(self) -> None:
        """One heartbeat; and on process 0, one look at every other's."""
        if self.index != 0:
            with self._lock:
                if not self._leaving:
                    beat = {"beat": next(self._beats), **self._who}
                    self.client.key_value_set(f"{ALIVE}{self.index}", json.dumps(beat), allow_overwrite=True)
            for _, value in self.client.key_value_dir_get(GONE):
                self._gone(json.loads(value))
            return
        now = time.monotonic()
        for key, value in self.client.key_value_dir_get(ALIVE):
            process = int(key.rsplit("/", 1)[-1])
            beat = json.loads(value)
            if beat.get("done"):
                self._heard.pop(process, None)  # ended normally: no longer watched
                continue
            last = self._heard.get(process)
            if last is None or last[0] != value:
                self._heard[process] = (value, now)
            elif now - last[1] >= GONE_AFTER and process not in self._reported:
                gone = {"process": process, "host": beat.get("host"), "pid": beat.get("pid"), "silent": now - last[1]}
                self.client.key_value_set(f"{GONE}{process}", json.dumps(gone), allow_overwrite=True)
                self._gone(gone)

    def _gone(self, gone: dict[str, Any]) -> None:
        """Act once on a process that is gone, in a thread of its own (this one goes on beating)."""
        if gone["process"] in self._reported or gone["process"] == self.index:
            return
        self._reported.add(gone["process"])
        threading.Thread(target=_write_and_say, args=(gone,), name="lox-job-gone", daemon=True).start()


def _write_and_say(gone: dict[str, Any]) -> None:
    """Write what every live logger of this process received, then print one line: which process is gone, what
    happens next, and what lox wrote where."""
    try:
        deadline = time.monotonic() + WRITE_WITHIN
        wrote, failed = [], []
        for logger in shutdown.live():
            if not getattr(logger, "writes", True):
                continue  # processes="first" on a process other than 0: process 0 writes its runs
            backends = getattr(logger, "backends", [])
            targets = ", ".join(getattr(b, "config", None) or type(b).__name__ for b in backends)
            try:
                logger.write_received(max(deadline - time.monotonic(), 0.1))
                wrote.append(targets)
            except Exception as error:  # noqa: BLE001 - said on the line, and the other loggers still write
                failed.append(f"logger {logger.name!r} could not write what it received to {targets}: "
                              f"{type(error).__name__}: {error}")
        where = f"{gone['host']}, pid {gone['pid']}" if gone.get("host") else "host unknown"
        done = [f"lox wrote what this process's loggers had received to {', '.join(wrote)}"] if wrote else []
        if not wrote and not failed:
            done = ["this process has no runs to write"]
        line = (f"lox: process {gone['process']} of this job ({where}) is gone: no heartbeat from it for "
                f"{gone['silent']:.0f} s. JAX will end this process when its coordination service notices "
                f"(SIGABRT); {'; '.join(done + failed)}.")
        print(line.replace("\n", " "), file=sys.stderr, flush=True)
    except BaseException:  # noqa: BLE001 - never into the user's program
        pass


_watcher: Watcher | None = None
_watcher_lock = threading.Lock()


def watch(index: int, client: Any) -> None:
    """Start this process's `Watcher` of its job, once per job (on the first Logger created in it)."""
    global _watcher
    with _watcher_lock:
        if _watcher is not None and _watcher.client is client and _watcher.running:
            return
        if _watcher is None:
            # Registered now, after lox's and JAX's exit handlers, so that it runs before them (last registered
            # first): before the loggers' exit flush and the job's exit barriers, which a process that finished
            # first may wait in longer than GONE_AFTER.
            atexit.register(_leave_at_exit)
        else:
            _watcher.stop()
        _watcher = Watcher(index, client)
        _watcher.start()


def _leave_at_exit() -> None:
    """At interpreter exit: this process ends normally. Its watcher goes on watching the others (process 0) and
    reading who is gone while the exit flush runs, which a dead peer may block."""
    if _watcher is not None:
        _watcher.leave()


def host_local(logs: Any) -> Any:
    """`logs` with each array this process cannot read whole made readable:
    a replicated one as its local copy, one sharded across processes gathered
    from every process (a collective: every process calls this at once, as
    every process calls the logger)."""

    def local(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return x
        if x.is_fully_replicated:
            return x.addressable_data(0)
        return multihost_utils.process_allgather(x, tiled=True)

    return jax.tree_util.tree_map(local, logs)
