"""The ``neptune`` backend: one Neptune run per lox run, sent from a local log.

Config string ``neptune:WORKSPACE/PROJECT?mode=offline`` (``pip install
'jax-lox[neptune]'``, the ``neptune`` 1.x client). ``mode`` is Neptune's:
``offline`` (operations are written under ``NEPTUNE_DATA_DIRECTORY``, default
``.neptune``, for ``neptune sync`` to upload later), ``async`` (the default,
or ``NEPTUNE_MODE``) or ``sync``. Without a project, ``NEPTUNE_PROJECT`` is
used; online modes take the API token from ``NEPTUNE_API_TOKEN``, which is
never printed. (neptune.ai's hosted service shut down in March 2026: online
modes need a server that speaks the Neptune 1.x API; offline mode needs none.)

What goes where, in each Neptune run:

* Each lox run (each seed of a vmapped ``logger.init``) is one Neptune run,
  named like the lox run, with ``custom_run_id`` derived from the lox run id
  (`custom_run_id`), the Logger's group in ``sys/group_tags`` and in
  ``lox/group`` (group the seeds by either), ``lox/run_id`` and ``lox/index``.
  Run metadata and config go under ``config/`` (nested dicts as namespaces;
  lists, None, non-finite floats and integers beyond 32 bits as text).
* Scalar events become float series ``metrics/<key>``, sent with one
  ``extend`` per key per batch file (Neptune splits it into operations of 100
  values). The series step is the event's ``step`` (or its first step name);
  every other step name becomes a series ``steps/<name>`` at that step (e.g.
  ``steps/epoch``). Every value carries its batch file's timestamp.
* Events without any step are appended: Neptune numbers them after the
  series' last step.
* Array-valued (and complex) events are uploaded as Parquet files in lox's
  Arrow schema, one File field per batch file: ``lox/arrays/<batch file>``
  (read one with ``lox.logdict.from_arrow(pyarrow.parquet.read_table(f))``).
* Images, video, audio, histograms and text (`lox.image`... and strings;
  `lox_backends.trackers.tables.media`) are encoded in the sending thread,
  under ``media/<key>``:

  - an image: a PNG appended to the file series ``media/<key>`` at its step
    (Neptune's image series); a batch ``(N, H, W, C)`` is one grid,
    ``ceil(sqrt(N))`` images wide with 1-pixel black gaps;
  - a video: a looping GIF at its fps in the same kind of file series (a
    batch: one GIF whose every frame is the grid of the N videos' frames);
  - text (a str): the string series ``media/<key>`` (Neptune keeps 1000
    characters of each value);
  - audio (16-bit PCM WAV), a histogram (JSON, ``{"counts": [...], "edges":
    [...]}``: Neptune has no histogram type, and a file keeps them exact) and
    a table of text (``(n,)`` or ``(rows, cols)`` strings, as CSV rows
    without a header): a File field per event, ``media/<key>/step_<step>``
    (Neptune's file series take images only). A second event of a key at one
    step in a batch is ``step_<step>-1``...; events without a step are
    named by their batch file, ``<batch file>-<i>``.

  Series of images, video and text follow the float series' rules below
  (one value per step, increasing); a batch sent again replaces its files.
* Neptune series cannot hold NaN or infinity, and keep one value per step in
  strictly increasing step order: such values are not sent (one warning per
  series; every value stays in the local log).
* The run's summary, when it ends, goes to fields ``summary/<name>``:
  ``loss.last``, ``loss.min``, ``loss.max``, ``loss.count`` of each key, and the
  values given by ``logger.summary`` (stored as ``config/`` values are).
* A run resumed by id (``logger.init(run_id=..., resume="allow")``) goes on in
  the Neptune run of its ``custom_run_id`` (online; offline, see below).
  Neptune cannot delete the points of a series: with ``from_step=N``, the
  values of steps N and above that reached Neptune before the restart stay,
  and the server refuses the new values of those steps (not above the
  series' last step); lox warns when there are any. ``lox.load`` reads each
  step once.
* ``logger.finish`` stops the Neptune run (``run.stop()``), setting
  ``lox/status`` to how it ended: ``finished``, or ``failed`` (logs were lost,
  or the program raised) with ``sys/failed`` true, Neptune's mark of a failed
  run; ``lox sync`` stops a run whose process died as ``killed`` (and
  ``sys/failed``).

Sending again: a batch file is recorded as sent once Neptune has it (offline:
written to its folder and flushed to the operating system; async and sync:
acknowledged by the server). A batch that was being sent when the process died
is sent again by ``lox sync``: online, ``custom_run_id`` resumes the same
Neptune run and the server drops the values whose step is not above the
series' last one, so they arrive once (stepless events, and File fields,
which are replaced, aside): images, video and text too. Offline runs cannot be resumed: ``lox sync`` writes
what was missing into a new offline run with the same name, ``lox/run_id`` and
group, which ``neptune sync`` uploads as a run of its own.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import logging
import math
import os
import re
import threading
import warnings
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.parquet as pq

from lox_backends.plugin import hooks
from lox_backends.plugin.config import Option
from lox_backends.trackers import encoding
from lox_backends.trackers.tables import Batch, arrays, file_stems, media, scalars
from lox_backends.trackers.template import TrackerBackend, ended_status
from lox_core.logdict import NO_STEP

if TYPE_CHECKING:  # an optional dependency, imported when a backend is created
    from neptune import Run

MODES = ("offline", "async", "sync")
MAX_CUSTOM_RUN_ID = 36  # longer ids are ignored by the Neptune client
INT32 = (-(2**31), 2**31 - 1)  # Neptune integers; others are kept as text
_PROJECT = re.compile(r"[^/\s]+/[^/\s]+")


class NeptuneBackend(TrackerBackend):
    """Sends runs to Neptune; see the module docstring."""

    tracker = "neptune"
    keeps_superseded = ("Neptune cannot delete the points of a series, so it keeps those values and refuses the new "
                        "ones of those steps (offline, the resumed run is a new offline run)")
    OPTIONS = {
        "mode": Option("how runs are sent, by default NEPTUNE_MODE or else async", "choice", choices=MODES),
        **TrackerBackend.OPTIONS,
    }
    EXAMPLE = "neptune:my-workspace/my-project?mode=offline"

    def __init__(self, target: str | None = None, options: dict[str, str] | None = None):
        super().__init__(target, options)
        mode = self.settings["mode"] or os.environ.get("NEPTUNE_MODE") or "async"
        if mode not in MODES:
            raise ValueError(
                f"the neptune backend's NEPTUNE_MODE is {mode!r}; use offline, async or sync. E.g. {self.EXAMPLE!r}."
            )
        project = target or os.environ.get("NEPTUNE_PROJECT") or None
        if project is not None and not _PROJECT.fullmatch(project):
            where = "project" if target else "NEPTUNE_PROJECT"
            raise ValueError(
                f"the neptune backend's {where} is {project!r}; a Neptune project is WORKSPACE/PROJECT, "
                f"e.g. {self.EXAMPLE!r}."
            )
        if mode != "offline":
            if project is None:
                raise ValueError(
                    f"the neptune backend needs a project in mode={mode}: neptune:WORKSPACE/PROJECT, "
                    "or set NEPTUNE_PROJECT (or use mode=offline)."
                )
            if not os.environ.get("NEPTUNE_API_TOKEN"):
                raise ValueError(
                    f"the neptune backend needs NEPTUNE_API_TOKEN in mode={mode} (set the environment "
                    "variable; lox never prints it), or use mode=offline."
                )
        self.mode, self.project = mode, project
        self.data_dir = os.path.abspath(os.environ.get("NEPTUNE_DATA_DIRECTORY") or ".neptune")
        # Imported here, in the thread that creates the backend: the sending
        # thread may first need it while the interpreter exits.
        import neptune
        from neptune.exceptions import MetadataInconsistency
        from neptune.types import File

        self._neptune, self._File, self._Inconsistency = neptune, File, MetadataInconsistency
        _install_quiet_filter()
        self._open_runs: dict[str, Run] = {}  # lox run id → neptune.Run
        self._last_steps: dict[str, dict[str, int]] = {}  # lox run id → series path → last step sent
        self._warned: set[tuple[str, str]] = set()

    def transient(self, error: Exception) -> bool:
        """Retried: the connection to Neptune lost (online). Not: what Neptune refuses."""
        from neptune.exceptions import NeptuneConnectionLostException

        return isinstance(error, NeptuneConnectionLostException) or super().transient(error)

    def destination(self) -> str:
        project = self.project or "(no project)"
        return f"{project} offline {self.data_dir}" if self.mode == "offline" else project

    # --- runs --------------------------------------------------------------------------
    def start_run(self, run: hooks.RunInfo, remote: dict | None) -> dict:
        if remote is None:
            self._run(run)  # a new run shows up in Neptune at once, with its config
        # else when there is something to send: `lox sync` with nothing missing
        # must not create an empty offline run.
        return {"custom_run_id": custom_run_id(run.run_id)}

    def _run(self, run: hooks.RunInfo) -> Run:
        """The Neptune run of `run`, created (or resumed, online) if needed."""
        neptune_run = self._open_runs.get(run.run_id)
        if neptune_run is not None and neptune_run.get_state() != "stopped":
            return neptune_run
        with _quiet():
            neptune_run = self._neptune.init_run(
                project=self.project,
                mode=self.mode,
                custom_run_id=custom_run_id(run.run_id),  # online, the same id resumes the same run
                name=run.name,
                # What lox sends, nothing of the sending process (which may be `lox sync`).
                source_files=[],
                git_ref=False,
                capture_stdout=False,
                capture_stderr=False,
                capture_hardware_metrics=False,
                capture_traceback=False,
            )
            # Neptune's exit handler would stop the run before lox's sends the last batches.
            self.flush_before_exit_handlers()
            if run.group:
                neptune_run["sys/group_tags"].add([run.group])
            neptune_run["lox"] = {"run_id": run.run_id, "group": run.group, "index": run.index}
            config = _config(run.metadata)
            if config:
                neptune_run["config"] = config
        self._open_runs[run.run_id] = neptune_run
        self._last_steps[run.run_id] = {}  # a new Neptune run object knows of no steps
        return neptune_run

    def send_summary(self, run: hooks.RunInfo, remote: dict, values: dict) -> None:
        summary = _config(values)
        if summary:
            neptune_run = self._run(run)
            with _quiet():
                for name, value in summary.items():  # one field each: names may hold dots, not nest
                    neptune_run[f"summary/{_path(name)}"] = value

    def end_run(self, run: hooks.RunInfo, remote: dict) -> None:
        status = ended_status(run)
        if status != "finished" and run.run_id not in self._open_runs:
            self._run(run)  # `lox sync` of a killed run with nothing left to send: to say how it ended
        neptune_run = self._open_runs.pop(run.run_id, None)
        self._last_steps.pop(run.run_id, None)
        if neptune_run is not None:
            with _quiet():
                neptune_run["lox/status"] = status
                if status != "finished":
                    neptune_run["sys/failed"] = True  # what Neptune shows as the run's failure
                neptune_run.stop()  # waits until everything is on disk (offline) or at the server

    def shutdown(self) -> None:
        for run_id in list(self._open_runs):
            neptune_run = self._open_runs.pop(run_id)
            with _quiet():
                neptune_run.stop()
        self._last_steps.clear()

    # --- batches ------------------------------------------------------------------------
    def send(self, run: hooks.RunInfo, remote: dict, batch: Batch) -> None:
        neptune_run = self._run(run)
        last = self._last_steps[run.run_id]
        sent: dict[str, int] = {}  # last steps, kept once the whole batch is sent (else it is retried)
        events = scalars(batch.table)
        timestamp = batch.time_ms / 1000
        x, besides = events.tracker_steps()  # each event's Neptune step; the step names besides it
        with _quiet():
            for key, rows in events.by_key().items():
                self._extend(neptune_run, run, "metrics/" + _path(key), x[rows], events.values[rows],
                             timestamp, last, sent)
            for name, has in besides.items():
                rows = np.flatnonzero(has)
                if rows.size:
                    values = events.steps[name][rows].astype(np.float64)
                    self._extend(neptune_run, run, "steps/" + _path(name), x[rows], values, timestamp, last, sent)
            others = arrays(batch.table)
            if others.num_rows:
                buffer = io.BytesIO()
                pq.write_table(others, buffer)
                # Copied into Neptune's own folder (offline it uploads later); a
                # batch sent again replaces its field.
                field = "lox/arrays/" + batch.name.removesuffix(".parquet")
                neptune_run[field].upload(self._File.from_content(buffer.getvalue(), extension="parquet"))
            self._send_media(neptune_run, run, batch, timestamp, last, sent)
            neptune_run.wait()  # offline: flushed to the OS; online: acknowledged by the server
        last.update(sent)

    def _extend(self, neptune_run, run, path, steps, values, timestamp, last, sent) -> None:
        """Append one float series' points of a batch (steps NO_STEP: appended without a step)."""
        finite = np.isfinite(values)
        if not finite.all():
            self._warn(run, path, "nan", f"{np.count_nonzero(~finite)} NaN or infinite value(s)")
            steps, values = steps[finite], values[finite]
        self._append(neptune_run, run, path, steps, values.tolist(), timestamp, last, sent)

    def _append(self, neptune_run, run, path, steps, values: list, timestamp, last, sent) -> None:
        """Append one series' points of a batch, `values` of any type the series
        takes (steps NO_STEP: appended without a step)."""
        stepless = np.flatnonzero(steps == NO_STEP)
        stepped = np.flatnonzero(steps != NO_STEP)
        stepped = stepped[np.argsort(steps[stepped], kind="stable")]  # equal steps keep their order
        if stepped.size:
            # Neptune keeps strictly increasing steps only: the first value of
            # each step, above what this run's series already holds.
            at = steps[stepped]
            floor = last.get(path, at[0] - 1)
            keep = (at > floor) & (at > np.concatenate([[floor], at[:-1]]))
            if not keep.all():
                if not path.startswith("steps/"):  # step series repeat across keys: no warning
                    dropped = np.count_nonzero(~keep)
                    self._warn(run, path, "step", f"{dropped} value(s) at a step not above the previous one")
                stepped = stepped[keep]
        try:
            if stepped.size:
                neptune_run[path].extend([values[i] for i in stepped], steps=steps[stepped].tolist(),
                                         timestamps=[timestamp] * stepped.size)
                sent[path] = int(steps[stepped[-1]])
            if stepless.size:
                neptune_run[path].extend([values[i] for i in stepless], timestamps=[timestamp] * stepless.size)
        except self._Inconsistency as error:  # refused for good (retrying would not help)
            self._warn(run, path, "refused", f"values refused by Neptune ({error})")

    def _send_media(self, neptune_run, run, batch: Batch, timestamp: float, last, sent) -> None:
        """The batch's events of rendered kinds, encoded here (in the sending
        thread), as the module docstring says."""
        events = media(batch.table)
        series: dict[str, tuple[list[int], list]] = {}  # path → steps and values of its events
        for event, (stem, _) in zip(events, file_stems(events, batch.name), strict=True):
            path = "media/" + _path(event.key)
            value = event.value
            if event.kind in ("image", "video") or (event.kind == "text" and np.ndim(value) == 0):
                if event.kind == "image":
                    item = self._File.from_content(encoding.png(encoding.grid(encoding.as_nhwc(value.pixels))),
                                                   extension="png")
                elif event.kind == "video":
                    frames = encoding.video_grid(encoding.as_nthwc(value.frames))
                    item = self._File.from_content(encoding.gif(frames, value.fps), extension="gif")
                else:
                    item = str(np.asarray(value).item())
                steps, items = series.setdefault(path, ([], []))
                steps.append(NO_STEP if event.step is None else event.step)
                items.append(item)
                continue
            if event.kind == "audio":
                content, extension = encoding.wav(value.samples, value.rate), "wav"
            elif event.kind == "histogram":
                counts = {"counts": np.asarray(value.counts).tolist(), "edges": np.asarray(value.edges).tolist()}
                content, extension = json.dumps(counts).encode(), "json"
            else:  # text of shape (n,) or (rows, cols): a table
                content, extension = _csv(np.asarray(value)), "csv"
            field = f"{path}/{stem}"
            try:
                # A batch sent again replaces its files.
                neptune_run[field].upload(self._File.from_content(content, extension=extension))
            except self._Inconsistency as error:
                self._warn(run, field, "refused", f"a {event.kind} refused by Neptune ({error})")
        for path, (steps, items) in series.items():
            self._append(neptune_run, run, path, np.asarray(steps, np.int64), items, timestamp, last, sent)

    def _warn(self, run: hooks.RunInfo, path: str, reason: str, what: str) -> None:
        """Once per series path and reason, for all runs of this backend."""
        if (path, reason) in self._warned:
            return
        self._warned.add((path, reason))
        why = {
            "nan": "Neptune series hold finite numbers only",
            "step": "Neptune keeps one value per step, in increasing step order",
            "refused": "a key cannot also be the namespace of others, as 'a' beside 'a/b'",
        }[reason]
        warnings.warn(
            f"lox: {what} of {path!r} in run {run.name!r} were not sent to Neptune ({why}); "
            f"they are kept in the local log {self.local_root!r}. Not repeated for this series.",
            RuntimeWarning,
            stacklevel=2,
        )


def custom_run_id(run_id: str) -> str:
    """The Neptune ``custom_run_id`` of a lox run: its run id, or, beyond
    Neptune's 36 characters, its start and a hash of the whole.

    >>> custom_run_id("lox-20260301-120000-a1b2c3-0")
    'lox-20260301-120000-a1b2c3-0'
    >>> cid = custom_run_id("my-long-experiment-20260301-120000-a1b2c3-12")
    >>> len(cid), cid[:24]
    (36, 'my-long-experiment-2026-')
    """
    if len(run_id) <= MAX_CUSTOM_RUN_ID:
        return run_id
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:12]
    return f"{run_id[: MAX_CUSTOM_RUN_ID - 13]}-{digest}"


def _path(key: str) -> str:
    """A lox key as a Neptune path below a namespace: ``/`` nests, empty parts go."""
    return "/".join(part for part in key.split("/") if part) or "_"


def _csv(text: np.ndarray) -> bytes:
    """Strings ``(n,)`` (one column) or ``(rows, cols)`` as CSV rows, without a header.

    >>> _csv(np.array([["a", "b,c"], ["d", "e"]]))
    b'a,"b,c"\\r\\nd,e\\r\\n'
    """
    out = io.StringIO()
    csv.writer(out).writerows([[str(v) for v in row] for row in text.reshape(len(text), -1)])
    return out.getvalue().encode()


def _config(metadata: dict) -> dict:
    """Run metadata as values Neptune stores (see the module docstring).

    >>> _config({"lr": 0.1, "seed": 2**40, "key": [0, 7], "opt": {"name": "adam", "eps": None}, "": 1})
    {'lr': 0.1, 'seed': '1099511627776', 'key': '[0, 7]', 'opt': {'name': 'adam', 'eps': 'null'}, '_': 1}
    """
    out = {}
    for key, value in metadata.items():
        key = str(key) or "_"  # Neptune drops empty keys
        if isinstance(value, dict):
            value = _config(value)
            if not value:
                continue
        elif isinstance(value, bool) or isinstance(value, str):
            pass
        elif isinstance(value, int):
            value = value if INT32[0] <= value <= INT32[1] else str(value)
        elif isinstance(value, float):
            value = value if math.isfinite(value) else str(value)
        else:
            value = json.dumps(value, default=str)
        out[key] = value
    return out


# --- Neptune's console lines ------------------------------------------------------------
_calling = threading.local()


@contextlib.contextmanager
def _quiet():
    """While lox calls the client: Neptune's info lines ("Neptune initialized...",
    "Shutting down background jobs...", twice per seed) are not shown; its
    warnings and errors are."""
    before, _calling.on = getattr(_calling, "on", False), True
    try:
        yield
    finally:
        _calling.on = before


class _QuietFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not getattr(_calling, "on", False)


def _install_quiet_filter() -> None:
    neptune_logger = logging.getLogger("neptune")
    if not any(isinstance(f, _QuietFilter) for f in neptune_logger.filters):
        neptune_logger.addFilter(_QuietFilter())


@hooks.hookimpl
def lox_backends():
    return [
        hooks.BackendSpec(
            "neptune",
            "lox_backends.trackers.neptune:NeptuneBackend",
            description="one Neptune run per lox run (neptune:WORKSPACE/PROJECT?mode=offline)",
            requires=("neptune",),
            install="pip install 'jax-lox[neptune]'",
        )
    ]
