"""Background threads that run tasks in order: `Worker`, and `BackendWorker`, a backend with one of its own.

A Logger has a router worker (it turns logs into tables and hands them on) and
one `BackendWorker` per backend, so that a slow, hanging or failing backend
never delays or loses another backend's data. Trackers send with a `Worker` too.

>>> worker = Worker("demo")
>>> done = []
>>> worker.submit(lambda: done.append(1))
>>> worker.barrier().wait(10)
True
>>> done
[1]
>>> worker.stop()
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
import warnings
from typing import Callable

import pyarrow as pa

from lox_backends.plugin.hooks import Backend, RunInfo
from lox_backends.runstore import filesystems


class Worker:
    """One daemon thread that runs the submitted tasks in order.

    Submitting never blocks and never raises, so that JAX's callback threads
    can submit. A task's exception is kept (`take_errors`) and handed to
    `on_error`; the next task runs. With `every`, `periodic` also runs every
    `every` seconds after a task ran, for as long as it returns True (it has
    work left), or after the number of seconds it returns (it has work then;
    a task that runs meanwhile brings it within `every` seconds again), so
    that an idle worker sleeps. The thread starts now: Python
    refuses new threads while the interpreter exits, when the last logs are
    written.
    """

    def __init__(
        self,
        name: str,
        *,
        every: float | None = None,
        periodic: Callable[[], bool | float] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ):
        self.name = name
        self._every = every
        self._periodic = periodic
        self._on_error = on_error
        self._tasks: collections.deque[tuple[Callable[[], None], str | None]] = collections.deque()
        self._current: str | None = None  # the label of the task running now
        self._busy = False
        self._stopping = False
        self._errors: list[BaseException] = []
        self._condition = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, task: Callable[[], None], label: str | None = None) -> None:
        """Queue `task` (ignored once the worker was stopped)."""
        with self._condition:
            if not self._stopping:
                self._tasks.append((task, label))
                self._condition.notify_all()

    def barrier(self) -> threading.Event:
        """An event set once every task submitted before it has run."""
        reached = threading.Event()
        self.submit(reached.set)
        if self._stopping:
            reached.set()  # nothing more will run
        return reached

    def wait_idle(self, timeout: float | None) -> bool:
        """Whether the queue emptied (and no task runs) within `timeout` seconds."""
        with self._condition:
            return self._condition.wait_for(lambda: not self._tasks and not self._busy, timeout)

    def backlog(self, label: str | None = None) -> int:
        """Tasks queued or running (only those with `label`, if given)."""
        with self._condition:
            queued = [task_label for _, task_label in self._tasks]
            running = [self._current] if self._busy else []
        return sum(1 for task_label in [*running, *queued] if label is None or task_label == label)

    def take_errors(self) -> list[BaseException]:
        with self._condition:
            errors, self._errors = self._errors, []
        return errors

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, wait: bool = True, timeout: float | None = None) -> None:
        """End the thread once what is queued has run (waiting for that, at most
        `timeout` seconds, if `wait`); later submissions are ignored."""
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        if wait and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        due: float | None = None  # when `periodic` runs next; None while it has nothing to do
        while True:
            with self._condition:
                timeout = None if due is None else max(due - time.monotonic(), 0.0)
                self._condition.wait_for(lambda: self._tasks or self._stopping, timeout)
                if self._tasks:
                    task, self._current = self._tasks.popleft()
                    self._busy = True
                elif self._stopping:
                    return
                else:
                    task = None
            if task is not None:
                self._call(task)
                with self._condition:
                    self._busy, self._current = False, None
                    self._condition.notify_all()
                if self._every is not None:
                    soon = time.monotonic() + self._every
                    due = soon if due is None else min(due, soon)
            if due is not None and time.monotonic() >= due:
                after = self._call_periodic()
                due = None if after is None else time.monotonic() + after

    def _call_periodic(self) -> float | None:
        """Run `periodic`; in how many seconds to run it again (None: it has no work
        left; after a failure, `every`, to try again)."""
        if self._periodic is None:
            return None
        try:
            again = self._periodic()
        except BaseException as error:  # kept for the user's thread
            self.report(error)
            again = True
        if again is True:
            return self._every or 0.0
        return float(again) if again is not False else None

    def report(self, error: BaseException) -> None:
        """Keep `error` as if a task had raised it."""
        with self._condition:
            self._errors.append(error)
        if self._on_error is not None:
            self._on_error(error)

    def _call(self, task: Callable[[], None]) -> None:
        try:
            task()
        except BaseException as error:  # kept for the user's thread; the next task runs
            self.report(error)


class BackendError(RuntimeError):
    """A backend failed in the background."""


RETRY_FIRST = 0.5  # seconds before a failed backend call is made again; doubled each time
RETRY_MAX = 30.0
HANGS_AFTER = 5.0  # seconds a backend call may run before it counts as hanging (`BackendWorker.failing`)


@dataclasses.dataclass
class _Held:
    """Tables handed to a backend that no successful `flush` has confirmed yet."""

    number: int  # the write's number (`BackendWorker._writes`)
    nbytes: int
    tables: int
    runs: frozenset[str]  # their run ids (for messages, and `holds`)


class BackendWorker:
    """A backend and the thread that calls it.

    A call that raises an `OSError` (a full disk, a bucket that does not
    answer: faults that pass) is made again with backoff, in order, until it
    succeeds; the calls after it wait. The tables written since the last
    `flush` that succeeded are counted (`unwritten`): the backend keeps them
    (a write that raised took nothing; a backend that took a table keeps it
    until it is written) and lox keeps those not taken yet, so that nothing is
    lost when the fault clears. The first failure of an outage warns, naming
    the backend. Any other exception is a refusal or a bug: it warns at once,
    is raised as a `BackendError` by `errors` (the Logger's next call, or
    `finish`), and that call is skipped.
    """

    def __init__(self, backend: Backend, name: str, logger: str, timeout: float | None = None):
        self.backend = backend
        self.timeout = timeout  # bounds each request to a store that a call makes (`filesystems.time_limit`)
        self.name = name  # in messages: the config string, or the class
        self.fault: OSError | None = None  # what the call being retried raised (None: the backend works)
        self.lost_runs: set[str] = set()  # ids of runs with tables it refused, or that lox dropped or gave up
        self._lock = threading.Lock()
        self._held: collections.deque[_Held] = collections.deque()
        self._held_bytes = 0
        self._writes = 0  # writes submitted
        self._done = 0  # calls that returned (see `progress`)
        self._began: float | None = None  # when the running call began (None: none runs)
        self._closing = threading.Event()  # the logger gave up on the backend: a last try of each call
        self._wake = threading.Event()  # cuts a retry's wait short (`retry_now`, `stop`)
        self._worker = Worker(f"lox-{logger}-{type(backend).__name__}", on_error=self._warn)

    def call(self, method: Callable[[Backend], None], label: str = "call", held: _Held | None = None) -> None:
        """Run `method(backend)` in the backend's thread (again, while it raises an OSError)."""
        self._worker.submit(lambda: self._retried(method, label, held), label)

    def write(self, tables: list[tuple[RunInfo, pa.Table]], nbytes: int) -> None:
        """`backend.write` of each (run, table) in the backend's thread, the `tables`
        (`nbytes` bytes) counted as unwritten until a flush (see `_Tables`)."""
        with self._lock:
            self._writes += 1
            held = _Held(self._writes, nbytes, len(tables), frozenset(run.run_id for run, _ in tables))
            self._held.append(held)
            self._held_bytes += nbytes
        self.call(_Tables(tables, self.lost_runs), "write", held)

    def drop(self, runs: frozenset[str]) -> None:
        """A write of `runs` that lox did not hand to the backend (``on_error="warn"``)."""
        self.lost_runs.update(runs)

    def flush(self) -> None:
        """`backend.flush()`; once it returns, the writes before it are no longer unwritten."""
        with self._lock:
            upto = self._writes

        def flush(backend: Backend) -> None:
            backend.flush()
            with self._lock:
                while self._held and self._held[0].number <= upto:
                    self._held_bytes -= self._held.popleft().nbytes

        self.call(flush, "flush")

    def unwritten(self) -> int:
        """Bytes of the tables handed to the backend since its last flush that succeeded."""
        return self._held_bytes

    def holds(self, run_id: str) -> bool:
        """Whether tables of the run are unwritten (see `unwritten`)."""
        with self._lock:
            return any(run_id in held.runs for held in self._held)

    def unwritten_summary(self) -> str:
        """What is unwritten, for messages: "3 batches (1.2 MiB) of runs 'a', 'b'"."""
        with self._lock:
            held = list(self._held)
        tables = sum(h.tables for h in held)
        names = sorted(set().union(*(h.runs for h in held)))
        shown = ", ".join(map(repr, names[:5])) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        return f"{tables} batch(es) ({_size(sum(h.nbytes for h in held))}) of run(s) {shown or '(none)'}"

    def failing(self) -> bool:
        """Whether the backend fails (a call raised an OSError and is being retried)
        or hangs (a call has run `HANGS_AFTER` seconds)."""
        began = self._began
        return self.fault is not None or (began is not None and time.monotonic() - began > HANGS_AFTER)

    def progress(self) -> int:
        """Calls that returned so far: a backend that makes none is stuck."""
        return self._done

    def barrier(self) -> threading.Event:
        return self._worker.barrier()

    def retry_now(self) -> None:
        """Make the call being retried again now, not after its backoff (up to
        `RETRY_MAX` seconds): someone waits for it (`logger.flush`), and the fault
        may have been fixed meanwhile."""
        self._wake.set()

    def errors(self) -> list[BackendError]:
        """What failed since the last call, each as a BackendError naming the backend."""
        wrapped = []
        for error in self._worker.take_errors():
            if isinstance(error, BackendError):
                wrapped.append(error)
            else:
                wrapped.append(BackendError(f"{self.name}: {error!r}"))
                wrapped[-1].__cause__ = error
        return wrapped

    def stop(self, wait: bool = True, timeout: float | None = None) -> None:
        self._closing.set()
        self._wake.set()
        self._worker.stop(wait, timeout)

    def alive(self) -> bool:
        return self._worker.alive()

    def _retried(self, method: Callable[[Backend], None], label: str, held: _Held | None) -> None:
        delay = RETRY_FIRST
        while True:
            self._began = time.monotonic()
            try:
                with filesystems.time_limit(self.timeout):
                    method(self.backend)
            except OSError as error:
                if self._closing.is_set():  # the logger gave up on this backend: one last try
                    with self._lock:  # what it holds is lost
                        self.lost_runs.update(*(h.runs for h in self._held))
                    if self.fault is not None:
                        return  # the logger said so when it gave up
                    raise
                if self.fault is None:
                    warnings.warn(
                        f"lox: backend {self.name} cannot {label}: {str(error).rstrip('.')}. lox keeps the logs it "
                        "could not write and tries again until the fault clears (nothing is lost meanwhile, up to "
                        "the logger's max_pending bytes).",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                self.fault = error
                self._began = None
                self._wake.wait(delay)
                self._wake.clear()
                delay = min(delay * 2, RETRY_MAX)
                continue
            except Exception:  # refused (a write's `_Tables` counted the runs it lost)
                self._began = None
                self._done += 1
                if not self._closing.is_set():
                    self.fault = None  # the outage is over: the backend answered, with a refusal (reported as such)
                raise
            self._began = None
            self._done += 1
            if self.fault is not None and not self._closing.is_set():
                self.fault = None
                warnings.warn(f"lox: backend {self.name} works again; what it held is written.", RuntimeWarning,
                              stacklevel=2)
            return

    def _warn(self, error: BaseException) -> None:
        warnings.warn(
            f"lox: backend {self.name} failed: {error if isinstance(error, BackendError) else repr(error)}. "
            "The other backends keep their data; this error is raised by the logger's next call or `finish`.",
            RuntimeWarning,
            stacklevel=2,
        )


class _Tables:
    """A write of several runs' tables to one backend, which `BackendWorker` may
    call again after an OSError: each table is handed over once (a write that
    raised took nothing; those that returned are not made again, which would
    write their rows twice), and a run's tables in order (after one of its
    tables raised, its later ones wait for the next call). A table the backend
    refuses (any other exception) is given up, its run counted in `lost`, and
    that refusal raised once no table waits for a retry."""

    def __init__(self, tables: list[tuple[RunInfo, pa.Table]], lost: set[str]):
        self._tables = tables
        self._lost = lost
        self._left = list(range(len(tables)))  # positions not taken nor refused yet, in order
        self._refused: Exception | None = None

    def __call__(self, backend: Backend) -> None:
        failed: OSError | None = None
        waiting: set[str] = set()  # runs a table of which raised an OSError in this call
        left = []
        for position in self._left:
            run, table = self._tables[position]
            if run.run_id in waiting:
                left.append(position)
                continue
            try:
                backend.write(run, table)
            except OSError as error:  # tried again by the next call
                failed = failed or error
                waiting.add(run.run_id)
                left.append(position)
            except Exception as error:  # noqa: BLE001 - raised below, once the other runs are written
                self._lost.add(run.run_id)
                self._refused = self._refused or error
        self._left = left
        if failed is not None:
            raise failed
        if self._refused is not None:
            raise self._refused


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"
