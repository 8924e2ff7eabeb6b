"""Sending to a tracker in the background, while a Logger logs: the threads a `TrackerBackend` runs.

The tracker's local log (a `ParquetBackend`) tells its `Follower` what it wrote:
a run opened, a batch file made durable, a run closed, the log closed. The
follower turns each into a work item, `OpenRun`, `SendFile`, `CloseRun` or
`Shutdown`, for the tracker's `Sender`: one thread that handles them in order,
through the backend's public steps of sending a run (`TrackerBackend.open_sending`,
`send_file`, `end_sending`, then `shutdown`). A call that fails while the error
may pass (`TrackerBackend.worth_retrying`) is made again, after `RETRY_FIRST`
seconds, doubled each time up to `RETRY_MAX`: one warning per outage, when a
call fails or has gone unanswered for `SLOW_CALL` seconds (told by a `Watchdog`
thread, as clients retry internally for minutes). Any other error is reported
once and the item skipped; the rest of a run the tracker refused to open stays
in the local log, for ``lox sync`` (`lox_backends.trackers.sync`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from typing import TYPE_CHECKING, Callable

from lox_backends.logger.worker import Worker
from lox_backends.plugin import hooks
from lox_backends.plugin.config import mask_secrets
from lox_backends.runstore import filesystems, layout
from lox_backends.runstore.reader import batch_file
from lox_backends.runstore.sent import SentRecord
from lox_backends.runstore.writer import LogListener

if TYPE_CHECKING:  # the backend creates its sender: only its type is needed here
    from lox_backends.trackers.template import TrackerBackend

RETRY_FIRST = 0.5  # seconds before the first retry; doubled each time
RETRY_MAX = 30.0
# A tracker call unanswered this long is warned about while it goes on: clients
# retry internally (MLflow's for minutes), so a tracker down for good raises nothing for a long time.
SLOW_CALL = 5.0


# --- the work items ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class OpenRun:
    """The local log opened `run`, in `folder`: open it at the tracker. A
    resumed run (`hooks.RunInfo.resumed`) has `earlier`: the batch files of
    its group's folder when it was resumed, which may hold its rows from
    before, not all sent (`TrackerBackend.send_earlier`)."""

    run: hooks.RunInfo
    folder: str
    earlier: frozenset[str] | None = None


@dataclasses.dataclass(frozen=True)
class SendFile:
    """A batch file of `run`, at `path`, is durable: send its rows."""

    run: hooks.RunInfo
    path: str


@dataclasses.dataclass(frozen=True)
class CloseRun:
    """The local log closed `run` (in `folder`), every file of it durable: end it at the tracker."""

    run: hooks.RunInfo
    folder: str


@dataclasses.dataclass(frozen=True)
class Shutdown:
    """The local log was closed: no more runs. The sending thread ends after it."""


Item = OpenRun | SendFile | CloseRun | Shutdown


def describe(item: Item) -> str:
    """What the call to the tracker for `item` does, for messages."""
    match item:
        case OpenRun(run=run):
            return f"opening run {run.name!r}"
        case SendFile(run=run, path=path):
            return f"sending {filesystems.basename(path)} of run {run.name!r}"
        case CloseRun(run=run):
            return f"closing run {run.name!r}"
        case Shutdown():
            return "shutting down"


# --- the threads ------------------------------------------------------------------------------
class Follower(LogListener):
    """Follows the local log for a tracker: the runs it opens and closes, and
    each batch file once durable, become items for the backend's `Sender`."""

    def __init__(self, backend: TrackerBackend):
        self._backend = backend
        self._runs: dict[str, hooks.RunInfo] = {}  # the runs this backend opened (a log may be shared)

    def run_opened(self, run: hooks.RunInfo, folder: str) -> None:
        self._runs[run.run_id] = run
        earlier = None
        if run.resumed:  # listed now, before the log writes a file of the run again: one listing
            batches = filesystems.join(filesystems.parent(folder), layout.batches_folder(run.group or run.run_id))
            earlier = frozenset(name for name, _, _ in filesystems.scan(batches, missing_ok=True)
                                if layout.BATCH_FILE.fullmatch(name))
        self._backend.sender.put(OpenRun(run, folder, earlier))

    def file_durable(self, run_id: str, path: str) -> None:
        run = self._runs.get(run_id)
        if run is not None:  # a run of a shared log that this backend did not open
            self._backend.sender.put(SendFile(run, path))

    def run_closed(self, run: hooks.RunInfo, folder: str) -> None:
        if run.run_id in self._runs:
            self._backend.sender.put(CloseRun(run, folder))

    def log_closed(self) -> None:
        self._backend.sender.put(Shutdown())


class Watchdog:
    """Calls `on_slow(label, seconds)` once for a call (`begin` ... `end`)
    still running `after` seconds after it began, from a daemon thread of its
    own that sleeps while no call runs."""

    def __init__(self, name: str, after: float, on_slow: Callable[[str, float], None]):
        self._after, self._on_slow = after, on_slow
        self._condition = threading.Condition()
        self._call: tuple[int, str, float] | None = None  # (number, label, when it began)
        self._calls = 0
        self._stopped = False
        # Started now: Python refuses new threads while the interpreter exits.
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def begin(self, label: str) -> None:
        with self._condition:
            self._calls += 1
            self._call = (self._calls, label, time.monotonic())
            self._condition.notify_all()

    def end(self) -> None:
        with self._condition:
            self._call = None
            self._condition.notify_all()

    def stop(self) -> None:
        """End the thread (the tracker's last call was made)."""
        with self._condition:
            self._stopped = True
            self._condition.notify_all()

    def _run(self) -> None:
        while True:
            with self._condition:
                while self._call is None and not self._stopped:
                    self._condition.wait()
                if self._stopped or self._call is None:
                    return
                number, label, began = self._call
                # Until this call ends, or has run `after` seconds.
                while self._running(number) and time.monotonic() < began + self._after:
                    self._condition.wait(began + self._after - time.monotonic())
                slow = self._running(number)
            if slow:
                self._on_slow(label, self._after)
                with self._condition:  # once per call
                    while self._running(number):
                        self._condition.wait()

    def _running(self, number: int) -> bool:
        return not self._stopped and self._call is not None and self._call[0] == number


class Sender:
    """Sends a tracker backend's items in order, in a `Worker` of its own,
    retrying each with backoff until it succeeds (one warning per outage:
    when a call fails, or has gone unanswered for `SLOW_CALL` seconds)."""

    def __init__(self, backend: TrackerBackend):
        self._backend = backend
        self._open: dict[str, tuple[hooks.RunInfo, SentRecord, dict]] = {}  # run_id → run, record, remote
        self._refused: set[str] = set()  # runs the tracker refused to open
        self.last_error: BaseException | None = None
        self._warned = False  # an outage was warned about: a call failed, or went unanswered (`SLOW_CALL`)
        self._queued = self._sent = 0  # batch files queued, items handled (see `progress`)
        self._worker = Worker(f"lox-send-{backend.tracker}")
        self._watchdog = Watchdog(f"lox-watch-{backend.tracker}", SLOW_CALL, self._slow)

    def progress(self) -> tuple[int, int]:
        """Batch files queued and items handled so far."""
        return self._queued, self._sent

    def down(self) -> bool:
        """Whether the tracker is in an outage that was warned about."""
        return self._warned

    def put(self, item: Item) -> None:
        """Queue `item`, handled after those queued before it; after a
        `Shutdown`, the thread ends once the queue is sent."""
        if isinstance(item, SendFile):
            self._queued += 1
        self._worker.submit(lambda: self._with_retries(item), label=type(item).__name__)
        if isinstance(item, Shutdown):
            self._worker.submit(self._watchdog.stop)
            self._worker.stop(wait=False)  # the thread ends once the queue is sent

    def wait(self, timeout: float | None) -> bool:
        """Whether everything queued was sent within `timeout` seconds."""
        return self._worker.wait_idle(timeout)

    def unsent(self) -> int:
        """Batch files queued and not sent yet (the one being sent included)."""
        return self._worker.backlog(SendFile.__name__)

    def _slow(self, label: str, seconds: float) -> None:
        if self._warned:
            return
        self._warned = True
        backend = self._backend
        last = f"; last error: {mask_secrets(str(self.last_error))}" if self.last_error is not None else ""
        warnings.warn(
            f"lox: {backend.spec()} has not answered for {seconds:g} s ({label}{last}). lox keeps trying in the "
            f"background and training goes on; your logs are safe in {backend.local_root!r}.",
            RuntimeWarning,
            stacklevel=2,
        )

    def _with_retries(self, item: Item) -> None:
        delay = RETRY_FIRST
        run = None if isinstance(item, Shutdown) else item.run
        while True:
            if run is not None and run.run_id in self._refused:
                return  # the tracker refused to open this run: warned once, the rest stays local
            began = time.monotonic()
            self._watchdog.begin(describe(item))
            try:
                self._handle(item)
            except Exception as error:  # noqa: BLE001 - retried when transient, else reported and skipped
                self._watchdog.end()
                backend = self._backend
                if not backend.worth_retrying(error):
                    warnings.warn(
                        f"lox: {backend.spec()} refused {self._refused_part(item)} "
                        f"({type(error).__name__}: {mask_secrets(str(error))}). "
                        f"What it refused stays in {backend.local_root!r}; lox goes on without retrying it "
                        f"(after fixing the cause: `lox sync {backend.local_root} --to '{backend.spec()}'`).",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                    return
                self.last_error = error
                if not self._warned:
                    self._warned = True
                    failure = f"{type(error).__name__}: {mask_secrets(str(error))}"
                    warnings.warn(
                        f"lox: sending to {backend.spec()} failed ({failure}). "
                        f"lox keeps retrying in the background; your logs are safe in {backend.local_root!r}.",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
            else:
                self._watchdog.end()
                self._sent += 1
                if self._warned and time.monotonic() - began < SLOW_CALL:
                    self._warned = False  # answering again: warn again at the next outage
                return

    def _refused_part(self, item: Item) -> str:
        """What the tracker refused, for the warning; a run it refused to open
        is refused from now on (every later item of the run would fail alike)."""
        if isinstance(item, Shutdown):
            return "to shut down"
        if isinstance(item, OpenRun) or item.run.run_id not in self._open:
            self._refused.add(item.run.run_id)
            return f"to open run {item.run.name!r}"
        if isinstance(item, SendFile):
            return f"{filesystems.basename(item.path)} of run {item.run.name!r}"
        return f"to close run {item.run.name!r}"

    def _handle(self, item: Item) -> None:
        backend = self._backend
        match item:
            case OpenRun(run=run, folder=folder, earlier=earlier):
                record, remote = self._opened(run, folder)
                if earlier:  # again on a retry: files sent before are skipped
                    backend.send_earlier(run, record, remote, folder, earlier)
            case SendFile(run=run, path=path):
                record, remote = self._opened(run, filesystems.join(backend.local_root, run.run_id))
                backend.send_file(run, record, remote, batch_file(path, run.run_id))
            case CloseRun(run=run, folder=folder):
                record, remote = self._opened(run, folder)
                if not record.closed:
                    backend.end_sending(run, record, remote, folder=folder)
                record.unlock()
                del self._open[run.run_id]
            case Shutdown():
                for run_id, (opened, record, remote) in list(self._open.items()):
                    if backend.confirms_at_end:  # runs the Logger never finished: what they hold must be written
                        backend.end_sending(opened, record, remote)
                    record.unlock()
                    del self._open[run_id]
                backend.shutdown()

    def _opened(self, run: hooks.RunInfo, folder: str) -> tuple[SentRecord, dict]:
        """The run's sent record and tracker run, opened now (from `folder`) unless open already."""
        if run.run_id not in self._open:
            self._open[run.run_id] = (run, *self._backend.open_sending(run, folder))
        _, record, remote = self._open[run.run_id]
        return record, remote
