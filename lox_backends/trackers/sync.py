"""``lox sync PATH --to SPEC``: send saved runs to a tracker, skipping what reached it before.

`sync` reads the runs at PATH (a run folder or a folder of runs, local or in a
bucket, as the parquet backend and the trackers' local logs write them) and,
per run, `sync_run` sends the batch files that its sent record
(`lox_backends.runstore.sent.SentRecord`) does not list, with the tracker
backend's steps of sending a run (`TrackerBackend.open_sending`, `send_file`,
`end_sending`): after a crash, after the tracker was down, or to a tracker the
run was never sent to. A run that ended is ended at the tracker with its status
(``finished``, ``failed``, ``killed``: its process died); a run a live process is
sending is left to it (its sending lock).

``lox sync`` bounds every step it takes (each call to the tracker, each read
of a run's files) by its ``--timeout`` (`sync`'s `timeout`, `DEFAULT_SYNC_TIMEOUT`
by default): the work runs in a thread of its own, and a step that takes longer
stops the sync with `SyncTimeout`, after which nothing more is recorded as sent.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import warnings
from typing import Callable, TypeVar

from lox_backends.plugin import hooks
from lox_backends.plugin.config import mask_secrets, parse
from lox_backends.plugin.registry import registry
from lox_backends.runstore import filesystems, reader
from lox_backends.runstore.reader import locate, read_run_json, run_files
from lox_backends.runstore.sent import SentRecord
from lox_backends.trackers.template import ENDED, Step, TrackerBackend, unbounded

T = TypeVar("T")


def local_runs(path: str) -> list[str]:
    """The run folders at `path`: a run folder, or a folder of them (oldest first)."""
    return [folder for folder, _ in locate(path)[1]]


DEFAULT_SYNC_TIMEOUT = 30.0  # seconds: `lox sync --timeout`
# How long past the timeout `lox sync` waits for a step's own error (a client's or a bucket's, told the
# same timeout), which says more than that the step took too long, before giving up on the step.
SYNC_GRACE = 1.0


def sync(path: str, spec: str, timeout: float | None = DEFAULT_SYNC_TIMEOUT) -> list[tuple[str, int, int]]:
    """Send the runs at `path` (a run folder or a folder of runs, as the parquet
    backend and the trackers' local logs write them) to the tracker `spec`,
    skipping what reached it before. Returns (run folder, batch files sent,
    rows sent) per run. This is ``lox sync PATH --to SPEC --timeout SECONDS``.

    Every step the sync takes (a call to the tracker, reading a run's files,
    from a bucket too: `filesystems.time_limit`) is bounded by `timeout` seconds
    (None: unbounded): a step that takes longer stops the sync with
    `SyncTimeout`, which names it and what did not answer, and nothing more is
    recorded as sent (the next sync sends the rest). MLflow's
    client is told to give up by then too (`TrackerBackend.calls_within`: its
    request timeout, and none of its own retries, for this process while the
    sync runs); a client that cannot be told so is left waiting in a daemon
    thread. Runs that ended (finished, failed, or killed: their process died)
    are ended at the tracker with that status."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout < math.inf):
        raise ValueError(
            f"lox sync's timeout is a positive number of seconds (or None: no bound), got {timeout!r}; "
            f"e.g. --timeout 60."
        )
    configs = parse(spec)
    if len(configs) != 1:
        raise ValueError(f"`lox sync --to` takes one tracker, got {len(configs)}: {mask_secrets(spec)!r}.")
    bound = _Bound(timeout) if timeout is not None else None
    to = mask_secrets(spec)
    done: list[tuple[str, int, int]] = []
    failed: list[tuple[str, Exception]] = []
    skipped: list[str] = []
    try:
        folders = _bounded(bound, lambda: local_runs(path), (f"listing the runs in {path}", path))
        backend = registry.create(configs[0])  # a wrong path is reported before anything is created
        if not isinstance(backend, TrackerBackend):
            raise ValueError(
                f"`lox sync --to {configs[0].name}`: {configs[0].name!r} is not a tracker; lox sync sends runs to "
                "trackers such as mlflow, wandb, neptune and tensorboard (a parquet folder can be copied as it is)."
            )
        to = backend.spec()
        backend.begin_sync(filesystems.parent(folders[0]))  # where messages say the runs are kept
        step = bound.steps(to) if bound is not None else unbounded

        def send_all() -> None:
            try:
                for number, folder in enumerate(folders):
                    try:
                        done.append((folder, *sync_run(backend, folder, step)))
                    except Exception as error:  # noqa: BLE001 - one run's failure does not keep the others back
                        failed.append((folder, error))
                        if backend.worth_retrying(error):
                            skipped.extend(folders[number + 1 :])  # unreachable: the others would fail alike
                            return
            finally:
                with step(f"shutting down {to}", None):
                    backend.shutdown()

        with backend.calls_within(timeout) if timeout is not None else contextlib.nullcontext():
            _bounded(bound, send_all)
    except SyncTimeout as timed_out:
        timed_out.done, timed_out.failed = list(done), list(failed)  # as they were when it gave up
        timed_out.say_how_to_resume(path, to)
        raise
    if failed:
        raise SyncError(done, failed, to, skipped)
    return done


def sync_run(backend: TrackerBackend, folder: str, step: Step = unbounded) -> tuple[int, int]:
    """Send what of the run in `folder` did not reach `backend`'s destination
    yet; end the run at the tracker, with its status, if it ended (finished,
    failed, or killed: its process died). Each step is bounded by `step`.
    Returns (batch files sent, rows sent). `sync` calls it for each run, after
    `TrackerBackend.begin_sync`."""
    with step(f"reading run {filesystems.basename(folder)!r}", folder):
        info = read_run_json(folder)
        assert info is not None  # missing_ok=False raises instead
        status = reader.run_status(folder, info)  # "killed" where its writer is gone
        run = hooks.RunInfo(info["run_id"], info.get("name", info["run_id"]), info.get("group", ""),
                            info.get("index", 0), info.get("metadata") or {}, status=status)
        record = backend.sent_record(folder)
        missing = [file for file in run_files(folder, info) if file.name not in record.files]
        SentRecord.remove_leftover_locks(folder)  # of senders that were killed
    # A run still being written is not ended (its process sends the rest); W&B's offline
    # file is complete only once its run finished, so W&B runs are ended all the same.
    ending = status in ENDED or backend.confirms_at_end
    if not missing and (record.closed or not ending):
        return 0, 0  # nothing to do: the tracker is not even contacted
    record, remote = backend.open_sending(run, folder, step)  # refused while a live process sends this run
    try:
        files = rows = 0
        for file in missing:
            try:
                rows += backend.send_file(run, record, remote, file, step)
                files += 1
            except Exception as error:  # noqa: BLE001 - a refused batch does not stop the others
                if backend.worth_retrying(error):
                    raise
                warnings.warn(
                    f"lox sync: {backend.spec()} refused {file.name} of run {run.name!r} "
                    f"({type(error).__name__}: {mask_secrets(str(error))}); it stays unsent.",
                    RuntimeWarning,
                    stacklevel=2,
                )
        if (ending and not record.closed) or record.unconfirmed:
            backend.end_sending(run, record, remote, step, folder=folder)
    finally:
        record.unlock()
    return files, rows


def _bounded(bound: _Bound | None, work: Callable[[], T], step: tuple[str, str] | None = None) -> T:
    """`work()`, within `bound` (as one `step`, (what, who must answer), if given)."""
    if bound is None:
        return work()
    if step is None:
        return bound.run(work)

    def stepped() -> T:
        with bound.step(*step):
            return work()

    return bound.run(stepped)


class SyncError(RuntimeError):
    """Some runs could not be synced: `done` holds what the others sent,
    `failed` (run folder, error) pairs, `skipped` the run folders not tried
    after the tracker could not be reached. Running ``lox sync`` again later
    sends only what is still missing."""

    def __init__(self, done: list[tuple[str, int, int]], failed: list[tuple[str, Exception]], to: str = "",
                 skipped: list[str] | None = None):
        self.done, self.failed, self.skipped = done, failed, list(skipped or [])
        lines = [f"{folder}: {type(e).__name__}: {mask_secrets(str(e))}" for folder, e in failed]
        if self.skipped:
            lines.append(f"and {len(self.skipped)} more run(s), not tried: the tracker could not be reached")
        where = f" to {to}" if to else ""
        super().__init__(f"{len(failed) + len(self.skipped)} run(s) could not be synced{where}:\n  "
                         + "\n  ".join(lines))


class SyncTimeout(SyncError):
    """A step of ``lox sync`` took longer than its timeout: the sync stopped
    there. `done` holds what the runs before it sent; nothing more was recorded
    as sent, so running ``lox sync`` again sends only what is still missing."""

    def __init__(self, step: str, where: str, seconds: float):
        self.step, self.where, self.seconds = step, mask_secrets(where), seconds
        super().__init__([], [])
        self.say_how_to_resume()

    def say_how_to_resume(self, path: str | None = None, to: str | None = None) -> None:
        """Name, in the message, the command that sends the rest."""
        command = f"`lox sync {path} --to '{to}'`" if path is not None and to is not None else "lox sync"
        self.args = (
            f"lox sync gave up on {self.step}, which took longer than {self.seconds:g} s: {self.where} did not "
            f"answer in time, and nothing more was recorded as sent. Check that {self.where} is up and reachable "
            f"from here, then run {command} again (it sends only what is missing), with a larger --timeout if it "
            "is only slow.",
        )


class _GaveUp(BaseException):
    """Raised in the thread of a sync that was given up on, at its next step:
    it records nothing more (a BaseException: no `except Exception` stops it)."""


class _Bound:
    """Bounds each step of ``lox sync`` (`step`) by `seconds`: the work runs in
    a daemon thread (`run`), its bucket operations limited to `seconds` each,
    and the thread that waits for it gives up on a step still running
    `SYNC_GRACE` after that, raising `SyncTimeout`. The work stops at its next
    step; the step itself may go on in the client until it returns or the
    process ends."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._condition = threading.Condition()
        self._step: tuple[str, str, float] | None = None  # (what, who must answer, when it began)
        self._abandoned = False

    @contextlib.contextmanager
    def step(self, label: str, where: str):
        with self._condition:
            if self._abandoned:
                raise _GaveUp
            self._step = (label, where, time.monotonic())
            self._condition.notify_all()
        try:
            yield
        finally:
            with self._condition:
                self._step = None
                self._condition.notify_all()
        if self._abandoned:  # it returned after the sync gave up on it: record nothing
            raise _GaveUp

    def steps(self, tracker: str) -> Step:
        """The `Step` of the sending methods of a tracker backend whose spec
        is `tracker`: `step`, with the tracker as what must answer unless a
        step names another."""
        return lambda label, where: self.step(label, where or tracker)

    def run(self, work: Callable[[], T]) -> T:
        """`work()` in a daemon thread, its result or exception; `SyncTimeout`
        when one of its steps takes longer than `seconds`."""
        values: list[T] = []
        errors: list[BaseException] = []
        done = threading.Event()

        def target() -> None:
            try:
                with filesystems.time_limit(self.seconds):  # what it reads from a bucket too (a limit per thread)
                    values.append(work())
            except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
                errors.append(error)
            finally:
                with self._condition:
                    done.set()
                    self._condition.notify_all()

        threading.Thread(target=target, name="lox-sync", daemon=True).start()
        with self._condition:
            while not done.is_set():
                if self._step is None:
                    self._condition.wait()
                    continue
                label, where, began = self._step
                left = began + self.seconds + SYNC_GRACE - time.monotonic()
                if left <= 0:
                    self._abandoned = True
                    raise SyncTimeout(label, where, self.seconds)
                self._condition.wait(left)
        if errors:
            raise errors[0]
        return values[0]
