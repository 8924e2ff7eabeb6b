"""Trackers (MLflow, W&B, Neptune...): a local log first, then sending in the background.

A `TrackerBackend` never sends a batch that is not on disk. What a Logger hands
it goes into a local log, a folder of lox runs in the Parquet format of the
``parquet`` backend, so `lox.load` reads it. One per Logger: the Logger's
``parquet`` backend when it has one (``console,parquet:runs,mlflow`` sends from
``runs``), else the folder that another of its trackers was given with
``local=DIR``, else ``lox-runs``; a tracker given ``local=DIR`` writes that
folder (a second copy, unless the parquet backend writes there too). Each time
that log makes files durable (every flush, a few seconds apart, and when a run
finishes), the files are queued for a background thread that sends them to the
tracker, one request per batch API call, retrying with backoff while the
tracker is unreachable (one warning, then quiet). The training loop never
waits for the tracker; `logger.finish`, `logger.flush` and interpreter exit
wait for the sending, within the logger's timeout, and warn about what is still
unsent.

Per run and destination, the files that reached the tracker are recorded in
``DIR/<run_id>/_sent-<tracker>-<hash>.jsonl`` (with the tracker's own run id),
so ``lox sync DIR --to SPEC`` sends only what is missing: after a crash, after
the tracker was down, or to a tracker the run was never sent to. ``DIR`` may
be a folder in a bucket (``lox sync s3://bucket/runs --to SPEC``, or a
tracker's ``local=s3://...``): objects cannot be appended to, so there the
record is a folder ``DIR/<run_id>/_sent-<tracker>-<hash>/`` of small objects,
one per entry, written after the tracker took the file (see `SentRecord`). A
batch that was being sent when the process died is sent again; trackers are
given the same timestamps for it, which MLflow's database and W&B's step order
use to drop the repeated values (see each backend's page). A run's
``_sending-*.lock`` file keeps two processes from sending it to one destination
at once; it is removed when its sender lets go of it (a killed sender's, by the
next ``lox sync`` of the run).

``lox sync`` bounds every step it takes (each call to the tracker, each read
of a run's files) by its ``--timeout`` (`sync`'s `timeout`), and tells the
tracker a run's status (``finished``, ``failed``, ``killed``) when it ends it.

A backend for another tracker subclasses `TrackerBackend` and implements
`destination`, `start_run`, `send` and `end_run` (see ``plugins.md``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading
import time
import warnings
from typing import Callable, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lox_backends.logger import shutdown
from lox_backends.logger.worker import Worker
from lox_backends.parquet import LogListener, ParquetBackend, check_writable
from lox_backends.plugin import hooks
from lox_backends.plugin.config import BackendConfig, Option, mask_secrets, parse
from lox_backends.plugin.registry import registry
from lox_backends.runstore import filesystems, reader
from lox_backends.runstore.reader import (
    DEFAULT_DIR,
    TIME_METADATA,
    BatchFile,
    batch_file,
    locate,
    read_run_json,
    run_files,
)
from lox_backends.runstore.sent import SentRecord
from lox_core import schema
from lox_core.arrow import dictionary_codes
from lox_core.logdict import NO_STEP

COMMON_OPTIONS = {
    # Without it: the Logger's parquet backend's folder (or another tracker's `local`), else the default.
    "local": Option("folder of the local log that is sent from, if not the Logger's parquet backend's",
                    default=DEFAULT_DIR),
}
RETRY_FIRST = 0.5  # seconds before the first retry; doubled each time
RETRY_MAX = 30.0
# A tracker call unanswered this long is warned about while it goes on: clients
# retry internally (MLflow's for minutes), so a tracker down for good raises nothing for a long time.
SLOW_CALL = 5.0
T = TypeVar("T")


class TrackerBackend(hooks.Backend):
    """A backend that sends to a tracker from a local log (see the module docstring).

    Subclasses set `tracker` (their config name) and implement, all called from
    one background thread, in order for each run:

    * `destination()`: where runs go, as a string (it names the record of what
      was sent, and appears in messages), e.g. ``"http://host:5000 experiment=demo"``.
    * `start_run(run, remote)`: create the tracker's run for a lox run, or
      resume it: `remote` is what an earlier `start_run` returned for this run
      and destination (None the first time). Return JSON-compatible data to
      keep (the tracker's run id). While `syncing` is true (``lox sync``),
      a run without `remote` may still exist at the tracker (the process
      died right after creating it): look for it before creating another.
    * `send(run, remote, batch)`: send one `Batch` (a batch file's table:
      rows of one run, ordered by step) with the tracker's batch API.
    * `end_run(run, remote)`: the run ended; `ended_status(run)` says how:
      ``"finished"``, ``"failed"`` (logs were lost, or the program raised), or
      ``"killed"`` (``lox sync`` of a run whose process died): tell the
      tracker, if it has the notion. `shutdown()`: no more runs.

    Raise on failure: lox retries the call with backoff when `transient`
    says the error may pass, and otherwise reports it once and skips the batch
    (raise `Unsendable` to say so outright).

    A tracker whose client buffers what `send` hands it and writes it only when
    the run ends (W&B offline) sets `confirms_at_end`: a run's batch files are
    then recorded as sent only once `end_run` returned, and ``lox sync`` ends
    the runs it sends to.

    ``lox sync --timeout`` stops waiting for a call that takes longer; a client
    that retries for long on its own can be told to give up sooner
    (`calls_within`).
    """

    tracker = "tracker"
    confirms_at_end = False
    syncing = False  # True while `lox sync` sends (see `start_run`)
    OPTIONS = COMMON_OPTIONS  # a subclass adds its own: OPTIONS = {"project": Option(...), **TrackerBackend.OPTIONS}

    def __init__(self, target: str | None = None, options: dict[str, str] | None = None):
        super().__init__(target, options)
        # Resolved now, as a parquet backend's folder: a later os.chdir changes nothing.
        self._local = filesystems.resolve(self.settings["local"])
        self._local_given = "local" in self.options  # else the Logger's parquet backend is the local log
        self._log: ParquetBackend | None = None
        self._owns_log = True
        self._follower = _Follower(self)
        if self._local_given:  # checked now, so that a Logger refuses a folder it cannot write
            self._create_log()
        self._runs: dict[str, hooks.RunInfo] = {}
        self._sender = _Sender(self)
        self._gave_up_at: tuple[int, int] | None = None  # `_sender.progress()` when a wait last timed out
        self._bound: _Bound | None = None  # set while `lox sync` sends (`sync`'s timeout)

    # --- what subclasses implement ---------------------------------------------------
    def destination(self) -> str:
        raise NotImplementedError

    def start_run(self, run: hooks.RunInfo, remote: dict | None) -> dict:
        raise NotImplementedError

    def send(self, run: hooks.RunInfo, remote: dict, batch: "Batch") -> None:
        raise NotImplementedError

    def end_run(self, run: hooks.RunInfo, remote: dict) -> None:
        """The run finished (after its last `send`)."""

    def shutdown(self) -> None:
        """Called once, after the last run, in the sending thread."""

    def transient(self, error: Exception) -> bool:
        """Whether `error` (raised by one of the methods above) may pass if the
        call is made again: the tracker is unreachable, busy, restarting. Those
        are retried with backoff; any other error (a value or name the tracker
        refuses, a deleted run) is reported once and the batch skipped.
        Override it to recognise your client's network errors."""
        return isinstance(error, (OSError, TimeoutError, ConnectionError))

    def flush_before_exit_handlers(self) -> None:
        """Call after the tracker's client registered an exit handler (often
        when a run starts): lox's exit flush then runs first, and the client's
        handler finds its runs complete."""
        shutdown.flush_before_exit_handlers()

    # --- the local log ---------------------------------------------------------------
    @property
    def log(self) -> ParquetBackend:
        """The local log this tracker sends from (see `attach`); made in its
        folder on first use when no Logger attached the backend."""
        return self._log if self._log is not None else self._create_log()

    @property
    def local_root(self) -> str:
        """The local log's folder (for messages; it makes no folder)."""
        return self._log.root if self._log is not None else self._local

    def _create_log(self) -> ParquetBackend:
        if not filesystems.is_uri(self._local):
            check_writable(self._local, f"the {self.tracker} backend's local folder (option local)")
        return self._use_log(ParquetBackend(self._local), owns=True)

    def _use_log(self, log: ParquetBackend, owns: bool) -> ParquetBackend:
        if self._log is not None:
            self._log.listeners.remove(self._follower)
        self._log, self._owns_log = log, owns
        log.listeners.append(self._follower)
        return log

    def attach(self, backends: list[hooks.Backend]) -> None:
        """One local log per Logger, each table written once. Without
        ``local=``, this tracker sends from the Logger's parquet backend (the
        first), else from the local log of one of its trackers given ``local=``,
        else from an earlier tracker's, else from its own in ``lox-runs``. With
        ``local=DIR``, from a parquet backend or an earlier tracker writing DIR,
        else from its own in DIR."""
        position = next(i for i, b in enumerate(backends) if b is self)
        parquet = [b for b in backends if isinstance(b, ParquetBackend)]
        trackers = [b for b in backends if isinstance(b, TrackerBackend) and b is not self]
        earlier = [b._log for b in backends[:position]
                   if isinstance(b, TrackerBackend) and b._owns_log and b._log is not None]
        if self._local_given:
            shared = [log for log in [*parquet, *earlier] if log.root == self._local]
        else:
            given = [b._log for b in trackers if b._local_given and b._owns_log and b._log is not None]
            shared = parquet + given + earlier
        if shared:
            self._use_log(shared[0], owns=False)
        elif self._log is None:
            self._create_log()

    def spec(self) -> str:
        """This backend's config string, without `local`, secrets masked (for messages)."""
        options = {k: v for k, v in self.options.items() if k != "local"}
        return mask_secrets(str(BackendConfig(self.tracker, self.target or None, options)))

    # --- the backend contract ----------------------------------------------------------
    # The local log tells `_Follower` what to send (in its own thread when it is
    # a parquet backend of the Logger): these only write it, if this tracker owns it.
    def open_run(self, run: hooks.RunInfo) -> None:
        if self._owns_log:
            self.log.open_run(run)

    def write(self, run: hooks.RunInfo, table: pa.Table) -> None:
        if self._owns_log:
            self.log.write(run, table)

    def flush(self) -> None:
        if self._owns_log:
            self.log.flush()

    def close_run(self, run: hooks.RunInfo) -> None:
        if self._owns_log:
            self.log.close_run(run)

    def close(self) -> None:
        if self._owns_log:
            self.log.close()

    def wait(self, timeout: float | None) -> None:
        """Wait (at most `timeout` seconds) until everything queued was sent;
        warn about what was not, and how to send it later. At exit, after a
        wait that timed out with nothing sent since (the tracker is down), it
        neither waits nor warns again, unless more was queued since: `finish`
        did both already."""
        if shutdown.exiting() and self._sender.down() and self._gave_up_at == self._sender.progress():
            return
        if not self._sender.wait(timeout):
            self._gave_up_at = self._sender.progress()
            unsent = self._sender.unsent()
            error = self._sender.last_error
            warnings.warn(
                f"lox: {unsent} batch file(s) of {self.spec()} were not sent within {round(timeout or 0, 1):g} s"
                + (f" (last error: {mask_secrets(str(error))})" if error else "")
                + f". They are kept in {self.local_root!r}; send them later with "
                f"`lox sync {self.local_root} --to '{self.spec()}'`.",
                RuntimeWarning,
                stacklevel=3,
            )

    # --- sending (the sender thread, and `lox sync`) ------------------------------------
    def sent_record(self, folder: str) -> "SentRecord":
        return SentRecord(folder, self.tracker, self.destination())

    def _step(self, label: str, where: str | None = None) -> contextlib.AbstractContextManager:
        """A step of ``lox sync`` (`label`: what it does; `where`: what must
        answer, the tracker by default), bounded by its timeout; nothing
        otherwise (the Logger's sending thread waits for its tracker)."""
        if self._bound is None:
            return contextlib.nullcontext()
        return self._bound.step(label, where or self.spec())

    def calls_within(self, seconds: float) -> contextlib.AbstractContextManager:
        """While ``lox sync --timeout SECONDS`` runs: make the tracker's client
        give up on a call after about `seconds`, rather than retry for longer
        (then the error itself is reported, at once). By default nothing: lox
        stops waiting for a call that takes longer in any case."""
        return contextlib.nullcontext()

    def _open(self, run: hooks.RunInfo, folder: str) -> tuple[SentRecord, dict]:
        with self._step(f"reading what was sent of run {run.name!r}", folder):
            record = self.sent_record(folder)
        if not record.lock():
            raise Unsendable(
                f"another process is sending run {run.name!r} to this destination now (it holds {record.lock_path}); "
                "lox sync leaves live runs to it"
            )
        try:
            with self._step(f"opening run {run.name!r}"):
                remote = self.start_run(run, record.remote)
            if remote != record.remote:
                with self._step(f"recording the {self.tracker} run of run {run.name!r}", record.path):
                    record.set_remote(remote)
        except BaseException:
            record.unlock()  # a retry opens the record again
            raise
        return record, remote

    def _send_file(self, run: hooks.RunInfo, record: SentRecord, remote: dict, file: BatchFile) -> int:
        """Send the run's rows of one batch file unless they were sent before; the number of rows sent."""
        name = file.name
        if name in record.files or name in record.unconfirmed:
            return 0
        with self._step(f"reading {file.path}", file.path):
            table = file.read()
            meta = table.schema.metadata or {}
            time_ms = int(meta[TIME_METADATA]) if TIME_METADATA in meta else int(filesystems.mtime(file.path) * 1000)
        with self._step(_describe("file", run, file.path)):
            self.send(run, remote, Batch(name, time_ms, table))
        # Recorded only after the step: a sync that gave up on it records nothing more.
        with self._step(f"recording that {name} of run {run.name!r} was sent", record.path):
            if self.confirms_at_end:
                record.unconfirmed.append(name)
            else:
                record.add_file(name)
        return table.num_rows

    def _end(self, run: hooks.RunInfo, record: SentRecord, remote: dict) -> None:
        with self._step(_describe("close", run, None)):
            self.end_run(run, remote)
        with self._step(f"recording that run {run.name!r} was sent", record.path):
            for name in record.unconfirmed:
                record.add_file(name)
            record.unconfirmed.clear()
            record.close()

    def sync_run(self, folder: str) -> tuple[int, int]:
        """Send what of the run in `folder` did not reach this destination yet
        (``lox sync``); end the run at the tracker, with its status, if it
        ended (finished, failed, or killed: its process died). Returns
        (batch files sent, rows sent)."""
        self.syncing = True
        with self._step(f"reading run {filesystems.basename(folder)!r}", folder):
            info = read_run_json(folder)
            assert info is not None  # missing_ok=False raises instead
            status = reader.run_status(folder, info)  # "killed" where its writer is gone
            run = hooks.RunInfo(info["run_id"], info.get("name", info["run_id"]), info.get("group", ""),
                                info.get("index", 0), info.get("metadata") or {}, status=status)
            record = self.sent_record(folder)
            missing = [file for file in run_files(folder, info) if file.name not in record.files]
            SentRecord.remove_leftover_locks(folder)  # of senders that were killed
        # A run still being written is not ended (its process sends the rest); W&B's offline
        # file is complete only once its run finished, so W&B runs are ended all the same.
        ending = status in ENDED or self.confirms_at_end
        if not missing and (record.closed or not ending):
            return 0, 0  # nothing to do: the tracker is not even contacted
        record, remote = self._open(run, folder)  # refused while a live process sends this run
        try:
            files = rows = 0
            for file in missing:
                try:
                    rows += self._send_file(run, record, remote, file)
                    files += 1
                except Exception as error:  # noqa: BLE001 - a refused batch does not stop the others
                    if not isinstance(error, Unsendable) and self.transient(error):
                        raise
                    warnings.warn(
                        f"lox sync: {self.spec()} refused {file.name} of run {run.name!r} "
                        f"({type(error).__name__}: {mask_secrets(str(error))}); it stays unsent.",
                        RuntimeWarning,
                        stacklevel=2,
                    )
            if (ending and not record.closed) or record.unconfirmed:
                self._end(run, record, remote)
        finally:
            record.unlock()
        return files, rows


ENDED = ("finished", "failed", "killed")  # the statuses of a run that ended


def ended_status(run: hooks.RunInfo) -> str:
    """How a run that a tracker ends (`end_run`) ended: its `status`; a run
    still ``"running"`` counts as ``"finished"``, as every ended run did
    before runs had a status (a plugin's own Logger-less calls; W&B runs that
    ``lox sync`` or the exit ends while the run goes on)."""
    return "finished" if run.status == "running" else run.status


class Unsendable(Exception):
    """Raised by `TrackerBackend.send` for a batch the tracker refuses for good
    (not a network error): lox warns and goes on with the next batch instead
    of retrying; the batch stays in the local log, unrecorded, so that
    ``lox sync`` tries it again (after the cause is fixed)."""


class _Follower(LogListener):
    """Follows the local log for a tracker: the runs it opens and closes, and
    each batch file once durable, become items to send."""

    def __init__(self, backend: TrackerBackend):
        self._backend = backend

    def run_opened(self, run: hooks.RunInfo, folder: str) -> None:
        self._backend._runs[run.run_id] = run
        self._backend._sender.put(("open", run, folder))

    def file_durable(self, run_id: str, path: str) -> None:
        run = self._backend._runs.get(run_id)
        if run is not None:  # a run of a shared log that this backend did not open
            self._backend._sender.put(("file", run, path))

    def run_closed(self, run: hooks.RunInfo, folder: str) -> None:
        if run.run_id in self._backend._runs:
            self._backend._sender.put(("close", run, folder))

    def log_closed(self) -> None:
        self._backend._sender.put(("shutdown", None, None))


class _Watchdog:
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


class _Sender:
    """Sends a tracker backend's items in order, in a `Worker` of its own,
    retrying each with backoff until it succeeds (one warning per outage:
    when a call fails, or has gone unanswered for `SLOW_CALL` seconds)."""

    def __init__(self, backend: TrackerBackend):
        self._backend = backend
        self._open: dict[str, tuple[SentRecord, dict]] = {}  # run_id → record, remote
        self._runs_open: dict[str, hooks.RunInfo] = {}
        self._refused: set[str] = set()  # runs the tracker refused to open
        self.last_error: BaseException | None = None
        self._warned = False  # an outage was warned about: a call failed, or went unanswered (`SLOW_CALL`)
        self._queued = self._sent = 0  # batch files queued, items handled (see `progress`)
        self._worker = Worker(f"lox-send-{backend.tracker}")
        self._watchdog = _Watchdog(f"lox-watch-{backend.tracker}", SLOW_CALL, self._slow)

    def progress(self) -> tuple[int, int]:
        """Batch files queued and items handled so far."""
        return self._queued, self._sent

    def down(self) -> bool:
        """Whether the tracker is in an outage that was warned about."""
        return self._warned

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

    def put(self, item: tuple) -> None:
        if item[0] == "file":
            self._queued += 1
        self._worker.submit(lambda: self._with_retries(item), label=item[0])
        if item[0] == "shutdown":
            self._worker.submit(self._watchdog.stop)
            self._worker.stop(wait=False)  # the thread ends once the queue is sent

    def wait(self, timeout: float | None) -> bool:
        """Whether everything queued was sent within `timeout` seconds."""
        return self._worker.wait_idle(timeout)

    def unsent(self) -> int:
        return self._worker.backlog("file")  # the one being sent included

    def _with_retries(self, item: tuple) -> None:
        delay = RETRY_FIRST
        kind, run, where = item
        while True:
            if run is not None and run.run_id in self._refused:
                return  # the tracker refused to open this run: warned once, the rest stays local
            began = time.monotonic()
            self._watchdog.begin(_describe(kind, run, where))
            try:
                self._handle(*item)
            except Exception as error:  # noqa: BLE001 - retried when transient, else reported and skipped
                self._watchdog.end()
                backend = self._backend
                if isinstance(error, Unsendable) or not backend.transient(error):
                    if run is None:  # the shutdown item
                        what = "to shut down"
                    elif kind == "open" or run.run_id not in self._open:
                        self._refused.add(run.run_id)  # every later item of the run would fail alike
                        what = f"to open run {run.name!r}"
                    elif kind == "file":
                        what = f"{filesystems.basename(where)} of run {run.name!r}"
                    else:
                        what = f"to {kind} run {run.name!r}"
                    warnings.warn(
                        f"lox: {backend.spec()} refused {what} ({type(error).__name__}: {mask_secrets(str(error))}). "
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

    def _handle(self, kind: str, run: hooks.RunInfo | None, where: str | None) -> None:
        backend = self._backend
        if kind == "shutdown":
            for run_id, (record, remote) in list(self._open.items()):
                if backend.confirms_at_end:  # runs the Logger never finished: what they hold must be written
                    backend._end(self._runs_open[run_id], record, remote)
                record.unlock()
                del self._open[run_id]
            backend.shutdown()
            return
        if run is None or where is None:  # only the shutdown item has neither
            raise RuntimeError(f"lox internal error: a {kind!r} item to send without its run or path.")
        if run.run_id not in self._open:
            folder = where if kind != "file" else filesystems.join(backend.local_root, run.run_id)
            self._open[run.run_id] = backend._open(run, folder)
            self._runs_open[run.run_id] = run
        record, remote = self._open[run.run_id]
        if kind == "file":
            backend._send_file(run, record, remote, batch_file(where, run.run_id))
        elif kind == "close":
            if not record.closed:
                backend._end(run, record, remote)
            record.unlock()
            del self._open[run.run_id]


def _describe(kind: str, run: hooks.RunInfo | None, where: str | None) -> str:
    """What a call to the tracker does, for messages."""
    if run is None:
        return "shutting down"
    if kind == "file" and where is not None:
        return f"sending {filesystems.basename(where)} of run {run.name!r}"
    return f"{'opening' if kind == 'open' else 'closing'} run {run.name!r}"


# --- reading batch tables -------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Batch:
    """One batch file of a run's local log, to send.

    `name` is the file's name (unique within the run: name what the batch
    becomes at the tracker after it, e.g. an artifact, so that sending it
    again replaces it); `time_ms` is when it was written (Unix milliseconds:
    give its values this timestamp, so that sending it again repeats them
    exactly); `table` holds the rows (lox's Arrow schema).
    """

    name: str
    time_ms: int
    table: pa.Table


@dataclasses.dataclass
class Scalars:
    """The scalar events of a batch table, as columns (one entry per event).

    `steps` maps each step name to int64 steps, `lox.NO_STEP` where an event
    has no step of that name; `primary` is the step name trackers use as their
    step (``step`` if present, else the first), None without steps.
    """

    keys: np.ndarray  # of str (object)
    values: np.ndarray
    steps: dict[str, np.ndarray]
    primary: str | None
    codes: np.ndarray | None = None  # keys as positions in `names` (from the table's dictionary)
    names: list[str] | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def tracker_steps(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Each event's step for a tracker with one step per value: its
        `primary` step, else its first other step name's (`lox.NO_STEP`
        without any); and, per step name, which events also carry that name
        besides the one chosen (to log as a series of its own, e.g. ``epoch``)."""
        names = sorted(self.steps, key=lambda name: name != self.primary)
        chosen = np.full(len(self), NO_STEP, np.int64)
        source = np.full(len(self), -1)
        for j, name in enumerate(names):
            take = (chosen == NO_STEP) & (self.steps[name] != NO_STEP)
            chosen[take], source[take] = self.steps[name][take], j
        besides = {name: (self.steps[name] != NO_STEP) & (source != j) for j, name in enumerate(names)}
        return chosen, besides

    def by_key(self) -> dict[str, np.ndarray]:
        """Each key's event positions (in order), keys in order of first appearance."""
        if self.codes is None:  # not from a dictionary column: number the keys here
            numbers: dict[str, int] = {}
            codes = np.fromiter((numbers.setdefault(k, len(numbers)) for k in self.keys), np.int64, len(self.keys))
            names = list(numbers)
        else:
            if self.names is None:
                raise TypeError("Scalars.codes are positions in Scalars.names, which is None.")
            codes, names = self.codes, self.names
        order = np.argsort(codes, kind="stable")
        bounds = np.cumsum(np.bincount(codes, minlength=len(names)))[:-1]
        groups = dict(zip(names, np.split(order, bounds), strict=True))
        firsts = {name: group[0] for name, group in groups.items() if len(group)}
        return {name: groups[name] for name in sorted(firsts, key=lambda name: firsts[name])}


def scalars(table: pa.Table) -> Scalars:
    """The events of `table` whose value is a real number (every scalar but complex)."""
    # pyarrow.compute defines its functions at import time, unseen by type checkers.
    scalar = pc.equal(pc.list_value_length(table.column("shape")), 0)  # pyright: ignore[reportAttributeAccessIssue]
    rows = table.filter(scalar)
    values = rows.column("value").to_numpy(zero_copy_only=False).astype(np.float64)
    missing = np.flatnonzero(np.isnan(values) & ~rows.column("value").is_valid().to_numpy(zero_copy_only=False))
    keep = np.ones(len(values), bool)
    if missing.size:  # int64 / uint64 scalars are kept as bytes; complex ones are left out
        dtypes = rows.column("dtype").to_pylist()
        data = rows.column("data").to_pylist()
        for i in missing:
            dtype = np.dtype(dtypes[i])
            if dtype.kind in "iu":
                values[i] = float(np.frombuffer(data[i], dtype)[0])
            else:
                keep[i] = False
    names = schema.step_names(table)
    steps = {n: rows.column(n).fill_null(NO_STEP).to_numpy(zero_copy_only=False).astype(np.int64)[keep] for n in names}
    codes, key_names = dictionary_codes(rows.column("key"))
    codes = codes[keep]
    keys = np.asarray(key_names, object)[codes] if key_names else np.empty(0, object)
    return Scalars(keys, values[keep], steps, schema.primary_step(names), codes, key_names)


def arrays(table: pa.Table) -> pa.Table:
    """The rows of `table` that `scalars` leaves out: array-valued events, and
    complex scalars (read them with `lox.logdict.from_arrow`); trackers keep
    them as files, histograms..."""
    dtype = table.column("dtype").cast(pa.string())
    # pyarrow.compute defines its functions at import time, unseen by type checkers.
    lengths = pc.list_value_length(table.column("shape"))  # pyright: ignore[reportAttributeAccessIssue]
    complex_scalar = pc.starts_with(dtype, "complex")  # pyright: ignore[reportAttributeAccessIssue]
    return table.filter(pc.or_(pc.greater(lengths, 0), complex_scalar))  # pyright: ignore[reportAttributeAccessIssue]


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
        backend._local = filesystems.parent(folders[0])  # where messages say the runs are kept
        backend._bound = bound

        def send_all() -> None:
            try:
                for number, folder in enumerate(folders):
                    try:
                        done.append((folder, *backend.sync_run(folder)))
                    except Exception as error:  # noqa: BLE001 - one run's failure does not keep the others back
                        failed.append((folder, error))
                        if not isinstance(error, Unsendable) and backend.transient(error):
                            skipped.extend(folders[number + 1 :])  # unreachable: the others would fail alike
                            return
            finally:
                with backend._step(f"shutting down {to}"):
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
