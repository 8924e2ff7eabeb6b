"""The ``wandb`` backend: one Weights & Biases run per lox run, sent from a local log.

Config string ``wandb?project=NAME&entity=TEAM&mode=offline`` (``pip install
'jax-lox[wandb]'``). ``project`` defaults to ``WANDB_PROJECT``, else ``lox``;
``entity`` to your W&B default; ``mode`` (``online``, ``offline`` or
``disabled``) to ``WANDB_MODE``, else ``online``. The server is W&B's usual
``WANDB_BASE_URL``, and credentials come from W&B's usual ``WANDB_API_KEY``
(or ``wandb login``); lox never prints them. Offline runs are written under
``WANDB_DIR`` (else the current directory) as W&B writes them: upload them
later with ``wandb sync``. With ``disabled`` lox keeps its local log only.

What goes where:

* Each lox run (each seed of a vmapped ``logger.init``) becomes a W&B run in
  the project: named like the lox run, in the W&B group of the Logger's runs
  (``group=``: the UI groups the seeds), with the run metadata as its config.
  Its W&B run id is the lox run id (when longer than 64 characters or holding
  characters W&B refuses, a readable prefix and a hash of it), so sending it
  again resumes the same W&B run.
* Scalar events are sent with one ``run.log(row, step=s)`` per step, rows in
  increasing step order. The W&B step is the event's ``step`` (or its batch's
  first step name); every other step name is logged in the same row (e.g.
  ``epoch``), so charts can use it as their x axis, and a key logged with
  another step name only (``lox.log({"val": v}, epoch=e)``) gets that one as
  its default x axis (``define_metric``). Events without that step are put in
  the row of the latest step. Booleans become 0 and 1; complex values become
  ``KEY/real`` and ``KEY/imag``; keys that W&B reserves (starting with ``_``)
  get a ``lox`` prefix.
* Array-valued events become ``wandb.Histogram``s (64 bins of their finite
  entries) at their step. The values themselves stay in the local log.
* The kinds (`lox_core.media`) become W&B media, in the row of their step
  beside its scalars; each image or clip is encoded in the backend's
  worker thread (`lox_backends.trackers.encoding`), and W&B copies the file
  into the run's ``files/media`` folder:

  - ``lox.image(x)``: a ``wandb.Image`` (PNG; floats in [0, 1] as uint8); a
    batch ``(N, H, W, C)`` a list of N images under the key (W&B keeps at
    most 108 of a list: the first are sent, and lox warns once per run);
  - ``lox.video(x, fps=)``: a ``wandb.Video`` of an animated GIF at ``fps``
    (encoded by lox: no moviepy needed); a batch a list of them;
  - ``lox.audio(x, rate=)``: a ``wandb.Audio`` (16-bit WAV at ``rate``;
    no soundfile needed);
  - text: a str is a string value; a list ``(n,)`` a ``wandb.Table`` of one
    column ``text``, a table ``(rows, cols)`` one of columns ``0``, ``1``...;
  - ``lox.histogram(x, bins=)``: a ``wandb.Histogram`` of the logged counts
    and edges, as they are (``np_histogram``); beyond W&B's 512 bins, runs of
    adjacent bins are merged (counts summed).
* A run finishes at W&B when ``logger.finish`` closes it, with exit code 0
  (W&B: finished), or 1 when it failed (logs were lost, or the program
  raised; W&B: failed); ``lox sync`` finishes a run whose process died with
  exit code 137, as a process killed by SIGKILL. W&B's console capture is off
  for these runs (one process's output, many runs).

The run's summary, when it ends, goes to the W&B run's summary: ``loss.last``,
``loss.min``, ``loss.max``, ``loss.count`` of each key (beside W&B's own
``loss``, its last value), and the values given by ``logger.summary``.

A run resumed by id (``logger.init(run_id=..., resume="allow")``) goes on in
the same W&B run (``resume="allow"``). With ``from_step=N`` (N > 0), online,
or where values of steps N and above reached W&B before, the W&B run is
rewound to step N - 1 (``resume_from="<id>?_step=<N-1>"``, W&B's rewind: its
history after that step is dropped, and the run goes on from step N). Offline,
the new offline folder records the rewind, which ``wandb sync`` applies. A run
whose process was killed had nothing confirmed (see below): its new offline
folder holds the whole run, each step once. W&B cannot rewind to before step
0: with ``from_step=0`` the values sent before stay, and lox warns.

W&B keeps one value per key and step, and drops a row whose step is below the
one it has reached. lox orders each batch by step and merges the batches of
one step into one row, but a value logged at an earlier step than W&B has
reached (a key that lags behind the others, in a later batch), or a second
value of a key for one step, cannot be stored: lox then warns, once per run,
and the values stay in the local log. Give every key ``step=``, logged in step
order, and nothing is lost.

W&B offline writes a run's file in 32 KiB blocks and completes it only when
the run finishes: a killed process leaves a partial file. So lox records a
run's batch files as sent only when its W&B run has finished and its file is
complete on disk (flushed); ``lox sync DIR --to 'wandb?mode=offline'`` then
sends whatever was not, into a new offline folder of the same W&B run
(marked as resumed), and finishes it. After a crash that folder holds the
whole run: upload it with ``wandb sync``, rather than the killed process's
partial one. Online, the W&B run is resumed; what it already holds (the steps
below the one it reached) is skipped.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import re
import struct
import tempfile
import time
import warnings
import zlib
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lox_backends.plugin import hooks
from lox_backends.plugin.config import Option
from lox_backends.runstore.filesystems import fsync
from lox_backends.trackers import encoding
from lox_backends.trackers.tables import Batch, MediaEvent, media
from lox_backends.trackers.template import TrackerBackend, ended_status
from lox_core import schema
from lox_core.arrow import from_arrow
from lox_core.logdict import NO_STEP
from lox_core.media import RENDERED_KINDS

DEFAULT_PROJECT = "lox"
Mode = Literal["online", "offline", "disabled"]
MODES: tuple[Mode, ...] = ("online", "offline", "disabled")
MAX_ID = 64  # characters of a W&B run id that lox derives
HISTOGRAM_BINS = 64
# How a run ended, as the exit code W&B records (non-zero: "failed"); killed as by SIGKILL (128 + 9).
EXIT_CODES = {"finished": 0, "failed": 1, "killed": 137}
FILE_TIMEOUT = 60.0  # seconds `end_run` waits for W&B to complete an offline run's file
_PROJECT_REFUSED = "/\\#?%:"
_ID = re.compile(r"[A-Za-z0-9_-]{1,%d}" % MAX_ID)


class WandbBackend(TrackerBackend):
    """Sends runs to Weights & Biases; see the module docstring."""

    tracker = "wandb"
    confirms_at_end = True
    OPTIONS = {
        "project": Option(f"the W&B project, by default WANDB_PROJECT or else {DEFAULT_PROJECT}"),
        "entity": Option("the W&B entity, a user or team, by default yours"),
        "mode": Option("how runs are sent, by default WANDB_MODE or else online", "choice", choices=MODES),
        **TrackerBackend.OPTIONS,
    }
    EXAMPLE = "wandb?project=demo&mode=offline"

    def __init__(self, target: str | None = None, options: dict[str, str] | None = None):
        super().__init__(target, options)
        if target:
            raise ValueError(
                f"the wandb backend takes no target (got 'wandb:{target}'); the server is W&B's "
                f"WANDB_BASE_URL. E.g. {self.EXAMPLE!r}."
            )
        self.mode = _mode(self.settings["mode"])
        self.project = self.settings["project"] or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
        bad = sorted(set(self.project) & set(_PROJECT_REFUSED))
        if bad:
            raise ValueError(
                f"the wandb backend's project {self.project!r} has {''.join(bad)!r}, which W&B refuses in project "
                f"names ({_PROJECT_REFUSED}). E.g. {self.EXAMPLE!r}."
            )
        self.entity = self.settings["entity"] or os.environ.get("WANDB_ENTITY") or None
        # Resolved now, as the local log's folder is: where offline runs go.
        self.wandb_dir = os.path.abspath(os.environ.get("WANDB_DIR") or os.getcwd())
        # Imported here, in the thread that creates the backend: the sending
        # thread may first need it while the interpreter exits.
        import wandb
        import wandb.proto.wandb_internal_pb2  # noqa: F401 - read when a run ends
        from wandb.errors import CommError

        self._wandb, self._CommError = wandb, CommError
        self._open_runs: dict[str, _WandbRun] = {}
        self._resume: dict[str, bool] = {}  # run_id -> whether its W&B run may exist
        self._rewind: dict[str, int] = {}  # run_id -> the step its W&B run is rewound to (resumed from_step)
        if self.mode == "online":
            self._check_credentials()

    def _check_credentials(self) -> None:
        """Online: log in now, in the caller's thread (W&B may prompt there),
        rather than in the sending thread."""
        if os.environ.get("WANDB_API_KEY"):
            return
        try:
            self._wandb.login(verify=False)
        except Exception as error:
            raise ValueError(
                f"the wandb backend (mode=online) found no W&B credentials ({error}). Set WANDB_API_KEY, "
                "run `wandb login`, or log offline with 'wandb?mode=offline' and upload with `wandb sync`."
            ) from error

    def destination(self) -> str:
        where = f"{self.entity or ''}/{self.project}"
        if self.mode == "offline":
            return f"offline {self.wandb_dir} {where}"
        if self.mode == "disabled":
            return "disabled"
        return f"{os.environ.get('WANDB_BASE_URL') or 'https://api.wandb.ai'} {where}"

    # --- the tracker contract (all in the sending thread) --------------------------------------
    def start_run(self, run: hooks.RunInfo, remote: dict | None) -> dict:
        # A run that an earlier process started (its id is on record) is resumed.
        self._resume[run.run_id] = remote is not None
        self._rewind.pop(run.run_id, None)
        if run.resumed and run.from_step is not None and (self.mode == "online" or self.superseded_sent(run)):
            if run.from_step > 0:
                self._rewind[run.run_id] = run.from_step - 1
            elif self.superseded_sent(run):
                warnings.warn(
                    f"lox: run {run.name!r} was resumed from step 0, and W&B cannot rewind a run to before its "
                    "first step: the values W&B had keep their steps, and it drops the new ones below the step it "
                    f"had reached. lox.load and the local log {self.local_root!r} hold each step once.",
                    RuntimeWarning,
                    stacklevel=2,
                )
        remote = {"id": remote["id"]} if remote and remote.get("id") else {"id": wandb_id(run.run_id)}
        if self.mode != "disabled":
            # Now, while the program runs: W&B starts threads, which Python
            # refuses while the interpreter exits (when the last batches go out).
            self._run(run, remote)
        return remote

    def transient(self, error: Exception) -> bool:
        """Retried: W&B unreachable (online). Not: what W&B refuses."""
        return isinstance(error, self._CommError) or super().transient(error)

    def send(self, run: hooks.RunInfo, remote: dict, batch: Batch) -> None:
        if self.mode == "disabled":
            return
        state = self._run(run, remote)
        # Images and clips are written here as files, which W&B copies into the run as it logs them.
        with tempfile.TemporaryDirectory(prefix="lox-wandb-") as files:
            rows = state.rows(batch, files)
            for step, row in rows:
                state.run.log(row, step=step)
        state.sent(rows)
        state.warn_about_losses(self.local_root)

    def send_summary(self, run: hooks.RunInfo, remote: dict, values: dict) -> None:
        if self.mode != "disabled":
            self._run(run, remote).run.summary.update({_name(name): value for name, value in values.items()})

    def end_run(self, run: hooks.RunInfo, remote: dict) -> None:
        if self.mode == "disabled":
            return
        self._run(run, remote)  # an empty run still shows at W&B, with its config
        self._finish(run.run_id, EXIT_CODES.get(ended_status(run), 1))

    def shutdown(self) -> None:
        """Finish the W&B runs the Logger did not (no `logger.finish`)."""
        for run_id in list(self._open_runs):
            try:
                self._finish(run_id)
            except Exception as error:  # noqa: BLE001 - the others still finish
                warnings.warn(f"lox: could not finish W&B run {run_id}: {error}", RuntimeWarning, stacklevel=2)

    # --- W&B runs --------------------------------------------------------------------------
    def _run(self, run: hooks.RunInfo, remote: dict) -> _WandbRun:
        state = self._open_runs.get(run.run_id)
        if state is None:
            wandb = self._wandb
            settings = {"console": "off", "quiet": True}
            rewind = self._rewind.get(run.run_id)
            resume = {"resume_from": f"{remote['id']}?_step={rewind}"} if rewind is not None else {
                "resume": "allow" if self._resume.get(run.run_id) else None}
            if self.syncing:  # no system metrics of the machine that runs `lox sync`
                settings.update(x_disable_stats=True, x_disable_meta=True, x_disable_machine_info=True)
            started = wandb.init(
                project=self.project,
                entity=self.entity,
                id=remote["id"],
                name=run.name,
                group=run.group or None,
                config=dict(run.metadata),
                dir=self.wandb_dir,
                mode=self.mode,
                reinit="create_new",
                settings=wandb.Settings(**settings),
                **resume,
            )
            state = self._open_runs[run.run_id] = _WandbRun(run, started, wandb,
                                                            start=0 if rewind is None else rewind + 1)
            self.flush_before_exit_handlers()  # W&B's own handler would finish the run first
        return state

    def _finish(self, run_id: str, exit_code: int = 0) -> None:
        state = self._open_runs[run_id]
        state.run.finish(exit_code=exit_code)
        if self.mode == "offline":
            _wait_for_complete_file(state.file, FILE_TIMEOUT)
        del self._open_runs[run_id]


class _WandbRun:
    """A W&B run being sent to, and the row it has open (its latest step)."""

    def __init__(self, info: hooks.RunInfo, run, wandb, start: int = 0):
        self.info = info
        self.run = run
        self.wandb = wandb
        self.file = run.settings.sync_file  # the offline transaction log, `run-<id>.wandb`
        # A resumed online run goes on after its last step (a rewound one, after the step
        # it was rewound to: `start`); below it, W&B has the rows from before.
        self.start = max(int(run.step or 0), start)
        self.step: int | None = None  # the W&B step of the open row
        self.row: dict = {}  # what the open row holds so far
        self.x_axes: set[str] = set()  # keys whose x axis is another step name
        self.late: dict[str, int] = {}  # key -> values at steps W&B had passed (not sent)
        self.twice: dict[str, int] = {}  # key -> second values for one key and step (overwritten)
        self.cut: dict[str, int] = {}  # key -> batches of images longer than W&B keeps of a list
        self.warned: set[str] = set()

    def rows(self, batch: Batch, files: str) -> list[tuple[int, dict]]:
        """The rows of a batch: (W&B step, {key: value}), in increasing step order
        (media as W&B's media objects, their files written under `files`)."""
        logs = from_arrow(_plain(batch.table), flat=True)  # metrics are named key/path
        events = media(batch.table)
        names = set(logs.steps).union(*(event.steps for event in events))
        primary = schema.primary_step(n for n in batch.table.column_names if n in names)
        by_key = logs.steps.get(primary, {}) if primary else {}
        floor = self.start if self.step is None else self.step  # W&B drops rows below it
        # Events without the primary step go in the row of the latest step.
        latest = max([floor, *(int(s.max()) for s in map(np.asarray, by_key.values()) if (s != NO_STEP).any()),
                      *(event.steps[primary] for event in events if primary in event.steps)])
        rows: dict[int, dict] = {}
        for key, values in logs.items():
            values = np.asarray(values)
            events_of_key = len(values)
            if not events_of_key:
                continue
            name = _name(key)
            steps = _first(by_key.get(key), events_of_key)
            others = {_name(n): _first(d[key], events_of_key) for n, d in logs.steps.items()
                      if n != primary and key in d}
            kept, step_list = self._place(rows, name, steps, others, floor, latest)
            for part, column in _columns(name, values[kept], self.wandb):
                self._fill(rows, part, step_list, column)
        by_media: dict[str, list[MediaEvent]] = {}
        for event in events:
            by_media.setdefault(event.key, []).append(event)
        for key_number, (key, group) in enumerate(by_media.items()):
            name = _name(key)
            steps = np.array([event.steps.get(primary, NO_STEP) if primary else NO_STEP for event in group], np.int64)
            others = {_name(n): np.array([event.steps.get(n, NO_STEP) for event in group], np.int64)
                      for n in sorted(names) if n != primary and any(n in event.steps for event in group)}
            kept, step_list = self._place(rows, name, steps, others, floor, latest)
            cut = sum(np.ndim(group[i].value.pixels) == 4 and len(group[i].value.pixels) > self.wandb.Image.MAX_ITEMS
                      for i in kept.tolist() if group[i].kind == "image")
            if cut:
                self.cut[name] = self.cut.get(name, 0) + cut
            objects = [_media_object(self.wandb, group[i], os.path.join(files, f"{key_number}-{i}"))
                       for i in kept.tolist()]  # encoded only when W&B takes them
            self._fill(rows, name, step_list, objects)
        timestamp = batch.time_ms / 1000  # the batch's time, also when sent again
        for row in rows.values():
            row["_timestamp"] = timestamp
        return sorted(rows.items())

    def _place(self, rows: dict[int, dict], name: str, steps: np.ndarray, others: dict[str, np.ndarray],
               floor: int, latest: int) -> tuple[np.ndarray, list[int]]:
        """The events of a key that W&B can still take, and their W&B steps;
        the other step names they carry are filled in their rows, the lost ones counted."""
        if others and (steps == NO_STEP).all() and name not in self.x_axes:
            self.x_axes.add(name)
            self.run.define_metric(name, step_metric=next(iter(others)))
        steps = np.where(steps == NO_STEP, latest, steps)
        kept = np.flatnonzero(steps >= floor)
        late = int(np.count_nonzero((steps < floor) & ~((steps >= 0) & (steps < self.start))))
        if late:  # below `start`: sent before, W&B has it; otherwise lost at W&B
            self.late[name] = self.late.get(name, 0) + late
        steps = steps[kept]
        for other, other_steps in others.items():
            has = other_steps[kept] != NO_STEP  # events without this step name have nothing to add
            self._fill(rows, other, steps[has].tolist(), other_steps[kept][has].tolist())
        return kept, steps.tolist()

    def _fill(self, rows: dict[int, dict], key: str, steps: list[int], values: list) -> None:
        """Put one value of `key` in the row of each step."""
        for step, value in zip(steps, values, strict=True):
            row = rows.get(step)
            if row is None:
                row = rows[step] = {}
            if key in row or (step == self.step and key in self.row):
                self._put(row, self.row if step == self.step else {}, key, value)
            else:
                row[key] = value

    def sent(self, rows: list[tuple[int, dict]]) -> None:
        """`rows` reached W&B: the last one is the open row."""
        if rows:
            last, row = rows[-1]
            self.row = {**self.row, **row} if last == self.step else row
            self.step = last

    def _put(self, row: dict, before: dict, key: str, value) -> None:
        """Set `key` in `row`, counting a value it replaces (in `row`, or
        sent before in the open row `before`)."""
        old = row[key] if key in row else before.get(key, _MISSING)
        if old is not _MISSING and not _same(old, value):
            self.twice[key] = self.twice.get(key, 0) + 1
        row[key] = value

    def warn_about_losses(self, local_root: str) -> None:
        where = os.path.join(local_root, self.info.run_id)
        in_order = ("W&B keeps one value per key and step, in increasing step order: log every key with "
                    "`step=`, in step order.")
        most = self.wandb.Image.MAX_ITEMS
        for kind, counts, what, advice in (
            ("late", self.late, "at steps below the one W&B had reached, which W&B drops", in_order),
            ("twice", self.twice, "for a key and step that already had a value, which W&B overwrites", in_order),
            ("cut", self.cut, f"(batches of images) beyond the first {most} images of each, the most W&B keeps "
                              "of a list", f"Log at most {most} images per key and step (a batch split over keys)."),
        ):
            if counts and kind not in self.warned:
                self.warned.add(kind)
                keys = sorted(counts, key=lambda k: counts[k], reverse=True)
                listed = ", ".join(f"{k!r} ({counts[k]})" for k in keys[:5]) + (" ..." if len(keys) > 5 else "")
                warnings.warn(
                    f"lox: in W&B run {self.info.name!r}, values {what}: {listed}. They are kept in the "
                    f"local log ({where!r}, read it with lox.load). {advice} (Warned once per run.)",
                    RuntimeWarning,
                    stacklevel=2,
                )


def _columns(key: str, values: np.ndarray, wandb) -> list[tuple[str, list]]:
    """What W&B gets for a series of events: (key, one value per event) pairs."""
    if np.iscomplexobj(values):
        return [*_columns(f"{key}/real", np.real(values), wandb), *_columns(f"{key}/imag", np.imag(values), wandb)]
    if values.ndim == 1:
        if values.dtype.kind in "biu":
            return [(key, values.astype(np.int64 if values.dtype.kind == "b" else values.dtype).tolist())]
        return [(key, values.astype(np.float64).tolist())]
    histograms = []
    for value in values:
        finite = value.reshape(-1).astype(np.float64)
        histograms.append(wandb.Histogram(finite[np.isfinite(finite)], num_bins=HISTOGRAM_BINS))
    return [(key, histograms)]


def _media_object(wandb, event: MediaEvent, path: str):
    """What W&B gets for an event of a rendered kind (see the module docstring);
    an image or clip is written to `path` (plus its extension) first."""
    value = event.value
    if event.kind == "text":
        if isinstance(value, str):
            return value
        text = np.asarray(value, dtype=object)
        columns = ["text"] if text.ndim == 1 else [str(j) for j in range(text.shape[1])]
        return wandb.Table(columns=columns, data=text.reshape(len(text), -1).tolist())
    if event.kind == "histogram":
        return wandb.Histogram(np_histogram=_at_most(np.asarray(value.counts), np.asarray(value.edges),
                                                     wandb.Histogram.MAX_LENGTH))
    if event.kind == "audio":
        with open(path + ".wav", "wb") as f:
            f.write(encoding.wav(value.samples, value.rate))
        return wandb.Audio(path + ".wav", sample_rate=value.rate)
    if event.kind == "video":
        videos = [wandb.Video(io.BytesIO(encoding.gif(frames, value.fps)), format="gif")
                  for frames in encoding.as_nthwc(value.frames)]
        return videos if np.ndim(value.frames) == 5 else videos[0]
    images = []
    for i, image in enumerate(encoding.as_nhwc(value.pixels)[: wandb.Image.MAX_ITEMS]):  # all W&B keeps of a list
        with open(f"{path}-{i}.png", "wb") as f:
            f.write(encoding.png(image))
        images.append(wandb.Image(f"{path}-{i}.png"))
    return images if np.ndim(value.pixels) == 4 else images[0]


def _at_most(counts: np.ndarray, edges: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """A histogram of at most `bins` bins: runs of k adjacent bins merged (their
    counts summed, their inner edges dropped) when it has more."""
    if len(counts) <= bins:
        return counts, edges
    k = math.ceil(len(counts) / bins)
    starts = np.arange(0, len(counts), k)
    return np.add.reduceat(counts, starts), edges[[*starts.tolist(), len(counts)]]


def _plain(table: pa.Table) -> pa.Table:
    """The rows of `table` that W&B gets as numbers or histograms of arrays (not a rendered kind)."""
    if "kind" not in table.column_names:
        return table  # a table of schema 1: scalars and arrays only
    # pyarrow.compute defines its functions at import time, unseen by type checkers.
    rendered = pc.is_in(table.column("kind").cast(pa.string()),  # pyright: ignore[reportAttributeAccessIssue]
                        value_set=pa.array(RENDERED_KINDS))
    return table.filter(pc.invert(rendered))  # pyright: ignore[reportAttributeAccessIssue]


_MISSING = object()


def _first(steps, events: int) -> np.ndarray:
    """One step per event (steps logged under vmap repeat along the batch axes)."""

    if steps is None:
        return np.full(events, NO_STEP, np.int64)
    return np.asarray(steps).reshape(events, -1)[:, 0]


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or (a != a and b != b)  # NaN equals NaN here
    return False


def _name(key: str) -> str:
    """A W&B key: names starting with ``_`` are W&B's (``_step``, ``_runtime``...)."""
    return "lox" + key if key.startswith("_") else key


def wandb_id(run_id: str) -> str:
    """The W&B run id of a lox run: the run id itself when W&B takes it, else
    a readable prefix and a hash (W&B ids hold letters, digits, ``_`` and ``-``).

    >>> wandb_id("demo-20250101-120000-3f9c01-0")
    'demo-20250101-120000-3f9c01-0'
    >>> wandb_id("my.model-20250101-120000-3f9c01-0")
    'my-model-20250101-120000-3f9c01-0-91f4bf90'
    """
    if _ID.fullmatch(run_id):
        return run_id
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
    prefix = re.sub(r"[^A-Za-z0-9_-]+", "-", run_id)[: MAX_ID - 9].strip("-")
    return f"{prefix}-{digest}" if prefix else digest


def _mode(option: str | None) -> Mode:
    if option is not None:
        if option not in MODES:
            raise ValueError(
                f"the wandb backend's mode is online, offline or disabled, got {option!r}. "
                "E.g. 'wandb?project=demo&mode=offline'."
            )
        return option
    env = os.environ.get("WANDB_MODE") or "online"
    mode = {"dryrun": "offline", "run": "online"}.get(env, env)
    if mode not in MODES:
        raise ValueError(
            f"WANDB_MODE is {env!r}; the wandb backend sends online, offline or disabled. "
            "Set the mode in the config string, e.g. 'wandb?project=demo&mode=offline'."
        )
    return mode


# --- W&B's offline file --------------------------------------------------------------------
# A ``run-<id>.wandb`` file: a 7-byte header, then 32 KiB blocks of chunks
# (crc32, length, type; a record is one full chunk or first, middle..., last
# chunks). W&B writes whole blocks while the run is open and the rest when it
# closes the file, shortly after `finish` returned.
_BLOCK = 32 * 1024
_CHUNK_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _wait_for_complete_file(path: str, timeout: float) -> None:
    """Wait until W&B's file holds the run's exit record, then flush it to disk."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while not _has_exit_record(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"W&B did not complete the run file {path} within {timeout} s of finishing the run")
        time.sleep(delay)
        delay = min(2 * delay, 0.05)

    for target in (path, os.path.dirname(path)):  # W&B does not fsync
        fsync(target)


def _has_exit_record(path: str) -> bool:
    """Whether one of the records that end in the last two blocks of the file
    is W&B's exit record (the last one W&B writes for a finished run)."""
    from wandb.proto import wandb_internal_pb2

    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            first_block = max(size - 1, 0) // _BLOCK - 1
            start = max(first_block, 0) * _BLOCK
            f.seek(start)
            data = f.read()
    except FileNotFoundError:
        return False
    for payload in _records(data, start):
        # Generated protobuf code, without type stubs: its message classes are unknown to type checkers.
        record = wandb_internal_pb2.Record()  # pyright: ignore[reportAttributeAccessIssue]
        try:
            record.ParseFromString(payload)
        except Exception:  # noqa: BLE001 - a record cut by the blocks read: not the exit record
            continue
        if record.WhichOneof("record_type") == "exit":
            return True
    return False


def _records(data: bytes, start: int) -> list[bytes]:
    """The records that start and end in `data` (whole blocks of a run file, from offset `start`)."""
    found, parts, at = [], None, _CHUNK_HEADER if start == 0 else 0
    while at + _CHUNK_HEADER <= len(data):
        if _BLOCK - (start + at) % _BLOCK < _CHUNK_HEADER:  # a block's padding
            at += _BLOCK - (start + at) % _BLOCK
            continue
        crc, length, kind = struct.unpack_from("<IHB", data, at)
        payload = data[at + _CHUNK_HEADER : at + _CHUNK_HEADER + length]
        if kind == 0 or len(payload) != length or zlib.crc32(bytes([kind]) + payload) != crc:
            # The zeros that end a block, or bytes not written yet: go on at the next block.
            at += _BLOCK - (start + at) % _BLOCK
            parts = None
            continue
        at += _CHUNK_HEADER + length
        if kind == _FULL:
            found.append(payload)
        elif kind == _FIRST:
            parts = [payload]
        elif kind == _MIDDLE and parts is not None:
            parts.append(payload)
        elif kind == _LAST and parts is not None:
            found.append(b"".join([*parts, payload]))
            parts = None
    return found


@hooks.hookimpl
def lox_backends():
    return [
        hooks.BackendSpec(
            "wandb",
            "lox_backends.trackers.wandb:WandbBackend",
            description="one W&B run per lox run (wandb?project=NAME&mode=offline)",
            requires=("wandb",),
            install="pip install 'jax-lox[wandb]'",
        )
    ]
