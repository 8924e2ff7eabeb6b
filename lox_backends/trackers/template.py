"""The tracker template: `TrackerBackend`, the base class of lox's MLflow, W&B, Neptune and
TensorBoard backends, and of a plugin's tracker (see ``plugins.md``).

A `TrackerBackend` never sends a batch that is not on disk. What a Logger hands
it goes into a local log, a folder of lox runs in the Parquet format of the
``parquet`` backend, so `lox.load` reads it. One per Logger: the Logger's
``parquet`` backend when it has one (``console,parquet:runs,mlflow`` sends from
``runs``), else the folder that another of its trackers was given with
``local=DIR``, else ``lox-runs``; a tracker given ``local=DIR`` writes that
folder (a second copy, unless the parquet backend writes there too). Each time
that log makes files durable (every flush, a few seconds apart, and when a run
finishes), the files are queued for a background thread that sends them to the
tracker (`lox_backends.trackers.sending`). The training loop never waits for the
tracker; `logger.finish`, `logger.flush` and interpreter exit wait for the
sending, within the logger's timeout, and warn about what is still unsent.

Per run and destination, the files that reached the tracker are recorded in
the run's folder (`lox_backends.runstore.sent.SentRecord`, with the tracker's
own run id), so ``lox sync DIR --to SPEC`` (`lox_backends.trackers.sync`) sends
only what is missing: after a crash, after the tracker was down, or to a tracker
the run was never sent to. A batch that was being sent when the process died is
sent again; trackers are given the same timestamps for it, which MLflow's
database and W&B's step order use to drop the repeated values (see each
backend's page). A run's sending lock keeps two processes from sending it to
one destination at once.

This module holds what a subclass implements (`destination`, `start_run`,
`send`, `end_run`, and optionally `shutdown`, `transient`, `calls_within`), the
backend methods a Logger calls (which write the local log), and the steps of
sending one run that the sending thread and ``lox sync`` both take
(`open_sending`, `send_file`, `end_sending`), which keep the sent record. What a
tracker sends is read with `lox_backends.trackers.tables`.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lox_backends.logger import shutdown
from lox_backends.parquet import ParquetBackend
from lox_backends.plugin import hooks
from lox_backends.plugin.config import BackendConfig, Option, mask_secrets
from lox_backends.runstore import filesystems
from lox_backends.runstore.filesystems import check_writable
from lox_backends.runstore.layout import DEFAULT_DIR, TIME_METADATA
from lox_backends.runstore.reader import BatchFile, read_run_json, run_files
from lox_backends.runstore.sent import SentRecord
from lox_backends.trackers.sending import Follower, Sender
from lox_backends.trackers.tables import Batch

COMMON_OPTIONS = {
    # Without it: the Logger's parquet backend's folder (or another tracker's `local`), else the default.
    "local": Option("folder of the local log that is sent from, if not the Logger's parquet backend's",
                    default=DEFAULT_DIR),
}

Step = Callable[[str, str | None], contextlib.AbstractContextManager]
"""A step of sending a run, given (what it does, what must answer: the tracker when None): a context
around it that bounds it by ``lox sync``'s timeout (`lox_backends.trackers.sync`), or does nothing."""


def unbounded(label: str, where: str | None = None) -> contextlib.AbstractContextManager:
    """The `Step` of the Logger's sending thread, which waits for its tracker as long as it takes."""
    return contextlib.nullcontext()


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
    * `send_summary(run, remote, values)` (optional): the run's summary, when
      it ends, before `end_run`: names to values (`summary_values`).
    * `end_run(run, remote)`: the run ended; `ended_status(run)` says how:
      ``"finished"``, ``"failed"`` (logs were lost, or the program raised), or
      ``"killed"`` (``lox sync`` of a run whose process died): tell the
      tracker, if it has the notion. `shutdown()`: no more runs.

    A run opened again by id (`hooks.RunInfo.resumed`, after a preemption)
    reaches `start_run` with the `remote` its earlier process recorded:
    continue that run. Its batch files written before it was resumed that did
    not reach the tracker are sent first, without the rows `from_step`
    supersedes. Where rows of those steps reached the tracker before
    (`superseded_sent`), a tracker drops them if it can (TensorBoard's purge,
    W&B's rewind); one that cannot says what it shows in `keeps_superseded`,
    which lox warns with.

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
    # What the tracker shows of steps >= from_step that reached it before a resume, if it keeps them: warned.
    keeps_superseded: str | None = None
    OPTIONS = COMMON_OPTIONS  # a subclass adds its own: OPTIONS = {"project": Option(...), **TrackerBackend.OPTIONS}

    def __init__(self, target: str | None = None, options: dict[str, str] | None = None):
        super().__init__(target, options)
        # Resolved now, as a parquet backend's folder: a later os.chdir changes nothing.
        self._local = filesystems.resolve(self.settings["local"])
        self._local_given = "local" in self.options  # else the Logger's parquet backend is the local log
        self._log: ParquetBackend | None = None
        self._owns_log = True
        self._follower = Follower(self)
        if self._local_given:  # checked now, so that a Logger refuses a folder it cannot write
            self._create_log()
        self.sender = Sender(self)  # the sending thread, fed by `_follower`
        self._gave_up_at: tuple[int, int] | None = None  # `sender.progress()` when a wait last timed out
        self._superseded: dict[str, bool] = {}  # run id -> `superseded_sent`

    # --- what subclasses implement ---------------------------------------------------
    def destination(self) -> str:
        raise NotImplementedError

    def start_run(self, run: hooks.RunInfo, remote: dict | None) -> dict:
        raise NotImplementedError

    def send(self, run: hooks.RunInfo, remote: dict, batch: Batch) -> None:
        raise NotImplementedError

    def send_summary(self, run: hooks.RunInfo, remote: dict, values: dict[str, Any]) -> None:
        """The run's summary (`summary_values`), as it ended; `end_run` follows."""

    def end_run(self, run: hooks.RunInfo, remote: dict) -> None:
        """The run finished (after its last `send`)."""

    def superseded_sent(self, run: hooks.RunInfo) -> bool:
        """In `start_run` of a resumed run with a `from_step`: whether rows at
        steps from it on reached this tracker before it was resumed."""
        return self._superseded.get(run.run_id, False)

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

    def calls_within(self, seconds: float) -> contextlib.AbstractContextManager:
        """While ``lox sync --timeout SECONDS`` runs: make the tracker's client
        give up on a call after about `seconds`, rather than retry for longer
        (then the error itself is reported, at once). By default nothing: lox
        stops waiting for a call that takes longer in any case."""
        return contextlib.nullcontext()

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

    def begin_sync(self, folder: str) -> None:
        """``lox sync`` is about to send the runs kept in `folder`: messages
        name it where the runs are kept (`local_root`, unless this backend
        has a local log of its own), and `syncing` is true from now on."""
        self._local = folder
        self.syncing = True

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
    # The local log tells `sending.Follower` what to send (in its own thread when it is
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

    def summarize(self, run: hooks.RunInfo, values: dict[str, Any]) -> None:
        if self._owns_log:
            self.log.summarize(run, values)

    def runs_folder(self) -> str | None:
        return self.log.root

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
        if shutdown.exiting() and self.sender.down() and self._gave_up_at == self.sender.progress():
            return
        if not self.sender.wait(timeout):
            self._gave_up_at = self.sender.progress()
            unsent = self.sender.unsent()
            error = self.sender.last_error
            warnings.warn(
                f"lox: {unsent} batch file(s) of {self.spec()} were not sent within {round(timeout or 0, 1):g} s"
                + (f" (last error: {mask_secrets(str(error))})" if error else "")
                + f". They are kept in {self.local_root!r}; send them later with "
                f"`lox sync {self.local_root} --to '{self.spec()}'`.",
                RuntimeWarning,
                stacklevel=3,
            )

    # --- sending one run: the sending thread's steps, and `lox sync`'s ---------------------
    def sent_record(self, folder: str) -> SentRecord:
        """The record of what of the run in `folder` reached this destination."""
        return SentRecord(folder, self.tracker, self.destination())

    def worth_retrying(self, error: Exception) -> bool:
        """Whether a call that raised `error` is made again (with backoff):
        the error may pass (`transient`), and is not `Unsendable`."""
        return not isinstance(error, Unsendable) and self.transient(error)

    def open_sending(self, run: hooks.RunInfo, folder: str, step: Step = unbounded) -> tuple[SentRecord, dict]:
        """Begin sending `run`, kept in `folder`: hold its sending lock, and
        open the tracker's run (`start_run`, resuming the one its sent record
        names), recording its id. Returns the record, which holds the lock
        until `unlock`, and the tracker's run (`remote`). Raises `Unsendable`
        while another process sends the run to this destination."""
        with step(f"reading what was sent of run {run.name!r}", folder):
            record = self.sent_record(folder)
        if not record.lock():
            raise Unsendable(
                f"another process is sending run {run.name!r} to this destination now (it holds {record.lock_path}); "
                "lox sync leaves live runs to it"
            )
        try:
            if run.resumed:
                with step(f"reading what was sent of run {run.name!r}", folder):
                    record.reopen()  # ended at the tracker again, when it ends now
                    self._superseded[run.run_id] = run.from_step is not None and _sent_from(
                        folder, record, run.run_id, run.from_step)
                if self._superseded[run.run_id] and self.keeps_superseded:
                    warnings.warn(
                        f"lox: run {run.name!r} was resumed from step {run.from_step}, and {self.spec()} had "
                        f"values of steps from {run.from_step} on from before: {self.keeps_superseded}. lox.load "
                        f"and the local log {self.local_root!r} hold each step once.",
                        RuntimeWarning,
                        stacklevel=2,
                    )
            with step(f"opening run {run.name!r}", None):
                remote = self.start_run(run, record.remote)
            if remote != record.remote:
                with step(f"recording the {self.tracker} run of run {run.name!r}", record.path):
                    record.set_remote(remote)
        except BaseException:
            record.unlock()  # a retry opens the record again
            raise
        return record, remote

    def send_file(self, run: hooks.RunInfo, record: SentRecord, remote: dict, file: BatchFile,
                  step: Step = unbounded, superseded_from: int | None = None) -> int:
        """Send the run's rows of one batch file (`send`) unless they were
        sent before, and record it as sent (once the run ends, if
        `confirms_at_end`); the number of rows sent. Rows whose ``step`` is
        `superseded_from` or more are left out (a file written before the
        run was resumed from that step)."""
        name = file.name
        if name in record.files or name in record.unconfirmed:
            return 0
        with step(f"reading {file.path}", file.path):
            table = file.read()
            if superseded_from is not None and "step" in table.column_names:
                # pyarrow.compute defines its functions at import time, unseen by type checkers.
                later = pc.greater_equal(table.column("step"), superseded_from)  # pyright: ignore[reportAttributeAccessIssue]
                table = table.filter(pc.invert(pc.fill_null(later, False)))  # pyright: ignore[reportAttributeAccessIssue]
            meta = table.schema.metadata or {}
            time_ms = int(meta[TIME_METADATA]) if TIME_METADATA in meta else int(filesystems.mtime(file.path) * 1000)
        with step(f"sending {filesystems.basename(file.path)} of run {run.name!r}", None):
            self.send(run, remote, Batch(name, time_ms, table))
        # Recorded only after the step: a sync that gave up on it records nothing more.
        with step(f"recording that {name} of run {run.name!r} was sent", record.path):
            if self.confirms_at_end:
                record.unconfirmed.append(name)
            else:
                record.add_file(name)
        return table.num_rows

    def send_earlier(self, run: hooks.RunInfo, record: SentRecord, remote: dict, folder: str,
                     names: frozenset[str], step: Step = unbounded) -> None:
        """A resumed run: send its batch files written before it was resumed
        (`names`, of its group's batches folder then) that did not reach the
        tracker, without the rows its `from_step` supersedes; one the tracker
        refuses is warned about (it stays in the local log, for ``lox sync``)."""
        with step(f"listing the batch files of run {run.name!r}", folder):
            files = [file for file in run_files(folder) if file.name in names]
        for file in files:
            try:
                self.send_file(run, record, remote, file, step, superseded_from=run.from_step)
            except Exception as error:  # noqa: BLE001 - retried when transient, else the next file
                if self.worth_retrying(error):
                    raise
                warnings.warn(
                    f"lox: {self.spec()} refused {file.name} of run {run.name!r} ({type(error).__name__}: "
                    f"{mask_secrets(str(error))}); it stays in {self.local_root!r} (send it later with "
                    f"`lox sync {self.local_root} --to '{self.spec()}'`).",
                    RuntimeWarning,
                    stacklevel=2,
                )

    def end_sending(self, run: hooks.RunInfo, record: SentRecord, remote: dict, step: Step = unbounded,
                    folder: str | None = None) -> None:
        """End the tracker's run (`end_run`), after sending its summary
        (`send_summary`, from the ``_run.json`` in `folder` if given, when it
        holds one), and record the run as sent, with the files that wait for
        its end (`confirms_at_end`)."""
        values: dict[str, Any] = {}
        if folder is not None:
            with step(f"reading the summary of run {run.name!r}", folder):
                values = summary_values((read_run_json(folder, missing_ok=True) or {}).get("summary"))
        with step(f"closing run {run.name!r}", None):
            if values:
                self.send_summary(run, remote, values)
            self.end_run(run, remote)
        with step(f"recording that run {run.name!r} was sent", record.path):
            for name in record.unconfirmed:
                record.add_file(name)
            record.unconfirmed.clear()
            record.close()


ENDED = ("finished", "failed", "killed")  # the statuses of a run that ended
SUMMARY_STATS = ("last", "min", "max", "count")  # of each series, in a run's summary
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}  # as _run.json writes them


def summary_values(summary: Any) -> dict[str, Any]:
    """A run's summary as ``_run.json`` holds it (``{"keys": {series: {"last",
    "min", "max", "count"}}, "values": {...}}``, `lox_backends.runstore.layout`)
    as the names trackers get, those of the table of runs: ``<key>.last``,
    ``<key>.min``, ``<key>.max``, ``<key>.count`` of each series (but nulls), then
    the values given by ``logger.summary``.

    >>> summary_values({"keys": {"loss": {"last": 0.5, "min": 0.25, "max": "Infinity", "count": 3}},
    ...                 "values": {"best_acc": 0.9}})
    {'loss.last': 0.5, 'loss.min': 0.25, 'loss.max': inf, 'loss.count': 3, 'best_acc': 0.9}
    """
    if not isinstance(summary, dict):
        return {}
    values: dict[str, Any] = {}
    for key, stats in (summary.get("keys") or {}).items():
        for stat in SUMMARY_STATS:
            value = stats.get(stat) if isinstance(stats, dict) else None
            if isinstance(value, str):
                value = _NON_FINITE.get(value)
            if value is not None:
                values[f"{key}.{stat}"] = value
    values.update(summary.get("values") or {})
    return values


def _sent_from(folder: str, record: SentRecord, run_id: str, from_step: int) -> bool:
    """Whether the batch files of the run in `folder` that `record` lists as
    sent hold rows of it at steps `from_step` or more (as written: rows a
    resume superseded count). Read from the last sent file back, only the
    ``step`` column, until a file below `from_step`."""
    sent = [file for file in run_files(folder) if file.name in record.files]
    for file in reversed(sent):
        source = pa.BufferReader(filesystems.read_buffer(file.path)) if filesystems.is_uri(file.path) else file.path
        parquet = pq.ParquetFile(source)
        if "step" not in parquet.schema_arrow.names:
            continue
        steps = parquet.read(columns=["step"]).column("step")
        if file.rows is not None:
            steps = steps.slice(*file.rows)
        found = steps.drop_null().to_numpy()
        if found.size and (found >= from_step).any():
            return True
        if found.size:
            return False  # steps grow from file to file: the earlier files are below it too
    return False


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
