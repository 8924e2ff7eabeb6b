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
import threading
import time
import warnings
from typing import Callable

from lox_backends.hooks import Backend

MAX_BACKLOG = 4096  # tasks a backend may fall behind before its writes are dropped (and reported)


class Worker:
    """One daemon thread that runs the submitted tasks in order.

    Submitting never blocks and never raises, so that JAX's callback threads
    can submit. A task's exception is kept (`take_errors`) and handed to
    `on_error`; the next task runs. With `every`, `periodic` also runs every
    `every` seconds after a task ran, for as long as it returns True (it has
    work left), so that an idle worker sleeps. The thread starts now: Python
    refuses new threads while the interpreter exits, when the last logs are
    written.
    """

    def __init__(
        self,
        name: str,
        *,
        every: float | None = None,
        periodic: Callable[[], bool] | None = None,
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
                if due is None and self._every is not None:
                    due = time.monotonic() + self._every
            if due is not None and time.monotonic() >= due:
                due = time.monotonic() + (self._every or 0.0) if self._call_periodic() else None

    def _call_periodic(self) -> bool:
        """Run `periodic`; whether it has work left (after a failure: yes, to try again)."""
        if self._periodic is None:
            return False
        try:
            return bool(self._periodic())
        except BaseException as error:  # kept for the user's thread
            self.report(error)
            return True

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


class BackendWorker:
    """A backend and the thread that calls it.

    A failure warns at once, naming the backend, and is raised as a
    `BackendError` by `errors` (the Logger's next call, or `finish`). A backend
    that falls `MAX_BACKLOG` tasks behind (it hangs) has its further writes
    dropped, reported the same way, so that its queue does not grow without
    bound; the other backends are not affected.
    """

    def __init__(self, backend: Backend, name: str, logger: str):
        self.backend = backend
        self.name = name  # in messages: the class, and its target where two backends share a class
        self._dropped = 0
        self._worker = Worker(f"lox-{logger}-{type(backend).__name__}", on_error=self._warn)

    def call(self, method: Callable[[Backend], None], label: str = "call") -> None:
        """Run `method(backend)` in the backend's thread."""
        if label == "write" and self._worker.backlog() >= MAX_BACKLOG:
            self._dropped += 1
            if self._dropped == 1:  # once per episode: reported again if it falls behind again later
                self._worker.report(BackendError(
                    f"{self.name} fell {MAX_BACKLOG} writes behind (it is stuck or too slow); lox drops what "
                    "it has not taken yet, for this backend only"
                ))
            return
        if label == "write":
            self._dropped = 0  # caught up: a later episode is reported again
        self._worker.submit(lambda: method(self.backend), label)

    def barrier(self) -> threading.Event:
        return self._worker.barrier()

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
        self._worker.stop(wait, timeout)

    def alive(self) -> bool:
        return self._worker.alive()

    def _warn(self, error: BaseException) -> None:
        warnings.warn(
            f"lox: backend {self.name} failed: {error if isinstance(error, BackendError) else repr(error)}. "
            "The other backends keep their data; this error is raised by the logger's next call or `finish`.",
            RuntimeWarning,
            stacklevel=2,
        )
