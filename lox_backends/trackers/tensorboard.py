"""The ``tensorboard`` backend: TensorBoard event files, one folder per lox run, written from a local log.

Config string ``tensorboard:DIR`` (``pip install 'jax-lox[tensorboard]'``, the
small ``tensorboardX`` writer; the ``tensorboard`` package itself is needed only
to view the runs: ``tensorboard --logdir DIR``). DIR defaults to ``tb-runs``.

What goes where:

* Each lox run (each seed of a vmapped ``logger.init``) is a folder
  ``DIR/<group>/<name>`` with one event file per writing process
  (``events.out.tfevents.<time>.<host>.<run_id>.<n>``). The seeds of one
  Logger share the ``<group>`` folder, so TensorBoard's run names start with
  it: filter the run selector by it, or colour runs by the regex ``^([^/]+)/``.
  A second run of the Logger with the same name (two ``logger.init(name="a")``)
  goes to ``<name>-<index>``.
* Scalar events become scalar summaries (``simple_value``, float32 like every
  TensorBoard scalar) at their ``step`` (else their first other step name; 0
  without any); every other step name is written as a scalar of its own at
  that step (e.g. ``epoch``). The tags are the keys as they are (``/`` groups
  charts, as in TensorBoard). The values of one step in one batch share one
  event.
* Array-valued events become histograms (of their finite entries, with
  TensorFlow's default buckets, as tensorboardX's ``add_histogram`` makes them)
  at their step; arrays without a finite entry are left out. Complex values
  become ``KEY/real`` and ``KEY/imag``.
* The kinds (`lox_core.media`) become the summaries TensorBoard shows them
  with, tagged with the key, at their step; they are encoded in the
  backend's worker thread (`lox_backends.trackers.encoding`: floats in
  [0, 1] become uint8 pixels, floats in [-1, 1] 16-bit samples):

  - ``lox.image(x)``: PNG images (IMAGES dashboard); a batch ``(N, H, W, C)``
    is N images of one tag at one step (the dashboard's sample slider), one
    tensor ``[width, height, png, ...]`` as ``tf.summary.image`` writes it;
  - ``lox.video(x, fps=)``: animated GIF images, looping at ``fps``, in the
    IMAGES dashboard (a batch: one per video);
  - ``lox.audio(x, rate=)``: an audio summary (AUDIO dashboard), 16-bit WAV at
    ``rate``;
  - text: a text summary (TEXT dashboard): a str as Markdown, a list ``(n,)``
    or table ``(rows, cols)`` of strings as a table (a string tensor of
    that shape);
  - ``lox.histogram(x, bins=)``: a histogram summary of the logged counts and
    edges, not recomputed: ``bucket_limit`` holds every edge and ``bucket``
    an empty bucket before the counts; ``min`` and ``max`` are the outer
    edges of the first and last buckets holding values (where the
    dashboards draw from and to); ``sum`` and ``sum_squares`` are
    estimated from the bins' centres (no dashboard reads them).
* The run's metadata (``logger.init(key, lr=0.1)``) becomes the hparams of a
  session (``_hparams_/session_start_info``, read by the HPARAMS dashboard,
  which lists the run's scalars as its metrics), written by the run's own
  writer into its own event file; and a text summary ``_lox/run`` (a table:
  name, run id, group, index and the metadata) in the TEXT dashboard;
  ``logger.finish`` ends the session (status: success; failure for a run
  that failed, or that ``lox sync`` finds killed).
* The run's summary, when it ends (``loss.last``, ``loss.min``, ``loss.max``,
  ``loss.count`` of each key, and the values given by ``logger.summary``;
  numbers and bools), becomes scalars ``summary/<name>`` at the run's last
  step: the HPARAMS dashboard lists them as metrics, so its table shows each
  run's final and best values beside its hparams.
* A run resumed by id (``logger.init(run_id=..., resume="allow")``) goes on in
  its folder, in a new event file. With ``from_step=N`` that file starts with
  a restart marker at step N (``SessionLog.START``, what tensorboardX's
  ``purge_step`` writes): TensorBoard drops the events of steps N and above
  written before it, so each step shows once. tensorboardX's
  ``add_hparams`` is not used: it writes a second event file, and TensorBoard's
  Python reader then stops reading the first one, which holds the scalars.

Every batch is written to the local log first (the Logger's ``parquet``
backend, if it has one; else ``lox-runs``, or ``local=DIR``), then converted
in a background thread and flushed to the event file (fsynced):
``logger.flush()`` returns once TensorBoard can read everything logged before
it. ``lox sync DIR --to tensorboard:OUT`` converts saved runs,
each batch file once (see ``lox_backends.trackers.sync``). A batch that was being
written when the process died is written again by ``lox sync``, into a new
event file of the same folder: every event carries its batch file's time, and
the events already in the run's files (read back first) are not written twice.
"""

from __future__ import annotations

import collections
import json
import math
import os
import re
import socket
import struct
import time

import numpy as np

from lox_backends.plugin import hooks
from lox_backends.runstore.filesystems import check_writable
from lox_backends.trackers import encoding
from lox_backends.trackers.tables import Batch, MediaEvent, arrays, media, scalars
from lox_backends.trackers.template import TrackerBackend, ended_status
from lox_core import schema
from lox_core.arrow import from_arrow
from lox_core.logdict import NO_STEP

DEFAULT_LOGDIR = "tb-runs"
FILE_VERSION = "brain.Event:2"
RUN_TAG = "_lox/run"  # the text summary of the run and its metadata
HPARAMS_TAG = "_hparams_/session_start_info"  # what TensorBoard's HPARAMS dashboard reads
HPARAMS_END_TAG = "_hparams_/session_end_info"
SUMMARY_PREFIX = "summary/"  # the tags of a run's summary values
STATUS_SUCCESS, STATUS_FAILURE = 1, 2  # tensorboard.hparams.Status
FALLBACK_BINS = 64  # for arrays beyond TensorFlow's buckets (|x| > 1e20)
_UNSAFE = re.compile(r'[\\/:*?"<>|\x00-\x1f]+')  # not in a folder name


class TensorboardBackend(TrackerBackend):
    """Writes runs as TensorBoard event files; see the module docstring.

    >>> import os, tempfile, numpy as np, lox
    >>> folder = tempfile.mkdtemp()
    >>> logger = lox.loggers.from_config(f"tensorboard:{folder}/tb?local={folder}/lox-runs", name="demo")
    >>> state = logger.init(lr=0.1)
    >>> logger.log(state, lox.logdict({"loss": np.array([0.5, 0.25])}, steps={"step": {"loss": np.array([0, 1])}}))
    >>> logger.finish(state)
    >>> (group,) = os.listdir(f"{folder}/tb")
    >>> group == logger.group, os.listdir(f"{folder}/tb/{group}")
    (True, ['demo-0'])
    """

    tracker = "tensorboard"
    EXAMPLE = "tensorboard:tb-runs"

    def __init__(self, target: str | None = None, options: dict[str, str] | None = None):
        super().__init__(target, options)
        if target and "://" in target:
            raise ValueError(
                f"the tensorboard backend writes to a local folder, got {target!r}; write to a folder "
                f"(e.g. {self.EXAMPLE!r}) and copy it where it should go."
            )
        # Resolved now: a later os.chdir changes nothing (as for the local log).
        self.logdir = os.path.abspath(os.path.expanduser(target or DEFAULT_LOGDIR))
        if os.path.exists(self.logdir) and not os.path.isdir(self.logdir):
            raise ValueError(
                f"the tensorboard backend's folder {self.logdir!r} is a file; give it a folder, e.g. {self.EXAMPLE!r}."
            )
        check_writable(self.logdir, "the tensorboard backend's folder")
        # Imported here, in the thread that creates the backend: the sending
        # thread may first need it while the interpreter exits.
        import tensorboardX.record_writer
        from tensorboardX.proto import (
            event_pb2,
            plugin_hparams_pb2,
            plugin_text_pb2,
            summary_pb2,
            tensor_pb2,
            tensor_shape_pb2,
        )
        from tensorboardX.summary import make_histogram

        self._tbx = _Tbx(event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, plugin_hparams_pb2, plugin_text_pb2,
                         tensorboardX.record_writer.RecordWriter, make_histogram)
        self._writers: dict[str, _RunWriter] = {}

    def destination(self) -> str:
        return self.logdir

    def start_run(self, run: hooks.RunInfo, remote: dict | None) -> dict:
        writer = self._writers.get(run.run_id)
        if writer is None:
            folder = remote["folder"] if remote and remote.get("folder") else self._choose_folder(run)
            writer = _RunWriter(self._tbx, self.logdir, folder, run.run_id)
            if run.resumed and run.from_step is not None:
                writer.purge(run.from_step)
            if not writer.has_metadata:
                writer.write_metadata(run)
            self._writers[run.run_id] = writer
        return {"folder": writer.folder}

    def send(self, run: hooks.RunInfo, remote: dict, batch: Batch) -> None:
        self._writers[run.run_id].write_batch(batch)

    def send_summary(self, run: hooks.RunInfo, remote: dict, values: dict) -> None:
        numbers = {name: float(value) for name, value in values.items()
                   if isinstance(value, (int, float)) and not isinstance(value, str)}
        self._writers[run.run_id].write_summary(numbers)

    def end_run(self, run: hooks.RunInfo, remote: dict) -> None:
        writer = self._writers.pop(run.run_id, None)
        if writer is not None:
            if run.metadata:
                writer.write_end(STATUS_SUCCESS if ended_status(run) == "finished" else STATUS_FAILURE)
            writer.close()

    def shutdown(self) -> None:
        """Close the event files of the runs the Logger did not finish."""
        while self._writers:
            self._writers.popitem()[1].close()

    def transient(self, error: Exception) -> bool:
        """Retried: OS errors that may pass (a full disk, a network file system).
        Not: a folder that cannot be written or is a file."""
        if isinstance(error, (PermissionError, NotADirectoryError, IsADirectoryError, FileExistsError)):
            return False
        return super().transient(error)

    def _choose_folder(self, run: hooks.RunInfo) -> str:
        """``<group>/<name>``, unless another run's event files are there (the
        first free one or this run's own, of ``<name>-<index>`` and ``<run_id>``)."""
        name = _component(run.name) or run.run_id
        group = _component(run.group)
        prefix = f"{group}/" if group else ""
        candidates = [f"{prefix}{name}", f"{prefix}{name}-{run.index}", f"{prefix}{run.run_id}"]
        for folder in candidates:
            path = os.path.join(self.logdir, *folder.split("/"))
            if all(_own_file(file, run.run_id) is not None for file in _event_files(path)):
                return folder
        return candidates[-1]


class _Tbx:
    """The parts of tensorboardX the backend uses (imported when it is created)."""

    def __init__(self, event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, hparams_pb2, text_pb2, record_writer,
                 make_histogram):
        self.Event = event_pb2.Event
        self.Summary = summary_pb2.Summary
        self.Value = summary_pb2.Summary.Value
        self.Audio = summary_pb2.Summary.Audio
        self.HistogramProto = summary_pb2.HistogramProto
        self.SummaryMetadata = summary_pb2.SummaryMetadata
        self.TensorProto = tensor_pb2.TensorProto
        self.TensorShapeProto = tensor_shape_pb2.TensorShapeProto
        self.HParamsPluginData = hparams_pb2.HParamsPluginData
        self.SessionStartInfo = hparams_pb2.SessionStartInfo
        self.SessionEndInfo = hparams_pb2.SessionEndInfo
        self.SessionLog = event_pb2.SessionLog
        self.TextPluginData = text_pb2.TextPluginData
        self.RecordWriter = record_writer
        self.make_histogram = make_histogram
        # TensorFlow's default histogram buckets, as tensorboardX's add_histogram uses them.
        limits, v = [], 1e-12
        while v < 1e20:
            limits.append(v)
            v *= 1.1
        self.bins = np.array([-x for x in reversed(limits)] + [0.0] + limits)


class _RunWriter:
    """The event file a run is written to by this process, in ``DIR/<folder>``.

    When the folder already holds event files of the run (`lox sync` after a
    crash), their events are read first: an event written before (same batch
    time, step and tag) is not written again."""

    def __init__(self, tbx: _Tbx, logdir: str, folder: str, run_id: str):
        self.tbx = tbx
        self.folder = folder
        path = os.path.join(logdir, *folder.split("/"))
        os.makedirs(path, exist_ok=True)
        self.seen: collections.Counter = collections.Counter()  # (wall time, step, tag) written before
        self.has_metadata = False
        self.last_step = 0  # the greatest step of the run's events (where its summary goes)
        sessions = []
        for name in _event_files(path):
            session = _own_file(name, run_id)
            if session is not None:
                sessions.append(session)
                self._read(os.path.join(path, name))
        number = max(sessions, default=-1) + 1
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{run_id}.{number}"
        self._file = tbx.RecordWriter(os.path.join(path, name))
        self._file.write(tbx.Event(wall_time=time.time(), file_version=FILE_VERSION).SerializeToString())
        self._file.flush()

    def _read(self, path: str) -> None:
        for event in _events(path, self.tbx.Event):
            for value in event.summary.value:
                if value.tag == RUN_TAG:
                    self.has_metadata = True
                self.seen[(event.wall_time, event.step, value.tag)] += 1
            if event.HasField("session_log") and event.session_log.status == self.tbx.SessionLog.START:
                self.last_step = min(self.last_step, event.step)  # what TensorBoard keeps of the run
            elif event.summary.value:
                self.last_step = max(self.last_step, event.step)

    def purge(self, step: int) -> None:
        """TensorBoard drops the events of `step` and above written before
        this (a restart marker, as tensorboardX's ``purge_step`` writes it)."""
        tbx = self.tbx
        marker = tbx.Event(wall_time=time.time(), step=step, session_log=tbx.SessionLog(status=tbx.SessionLog.START))
        self._file.write(marker.SerializeToString())
        self._file.flush()
        self.last_step = min(self.last_step, step)

    def write_summary(self, values: dict[str, float]) -> None:
        """The run's summary values, as scalars ``summary/<name>`` at its last step."""
        if values:
            tbx = self.tbx
            summary = tbx.Summary(value=[tbx.Value(tag=f"{SUMMARY_PREFIX}{name}", simple_value=value)
                                         for name, value in values.items()])
            self._file.write(tbx.Event(wall_time=time.time(), step=self.last_step, summary=summary).SerializeToString())
            self._file.flush()

    def write_metadata(self, run: hooks.RunInfo) -> None:
        tbx, now = self.tbx, time.time()
        values = []
        if run.metadata:
            start = tbx.SessionStartInfo(start_time_secs=now)
            for key, value in sorted(run.metadata.items()):
                _set_hparam(start.hparams[key], value)
            content = tbx.HParamsPluginData(version=0, session_start_info=start).SerializeToString()
            plugin = tbx.SummaryMetadata.PluginData(plugin_name="hparams", content=content)
            values.append(tbx.Value(tag=HPARAMS_TAG, metadata=tbx.SummaryMetadata(plugin_data=plugin)))
        plugin = tbx.SummaryMetadata.PluginData(
            plugin_name="text", content=tbx.TextPluginData(version=0).SerializeToString()
        )
        text = tbx.TensorProto(dtype="DT_STRING", string_val=[_run_table(run).encode()])
        values.append(tbx.Value(tag=RUN_TAG, metadata=tbx.SummaryMetadata(plugin_data=plugin), tensor=text))
        self._file.write(tbx.Event(wall_time=now, step=0, summary=tbx.Summary(value=values)).SerializeToString())
        self._file.flush()
        self.has_metadata = True

    def write_end(self, status: int = STATUS_SUCCESS) -> None:
        """The session ended (the HPARAMS dashboard's status: success or failure)."""
        tbx, now = self.tbx, time.time()
        end = tbx.HParamsPluginData(version=0, session_end_info=tbx.SessionEndInfo(
            status=status, end_time_secs=now)).SerializeToString()
        plugin = tbx.SummaryMetadata.PluginData(plugin_name="hparams", content=end)
        value = tbx.Value(tag=HPARAMS_END_TAG, metadata=tbx.SummaryMetadata(plugin_data=plugin))
        self._file.write(tbx.Event(wall_time=now, step=0, summary=tbx.Summary(value=[value])).SerializeToString())

    def write_batch(self, batch: Batch) -> None:
        """Write a batch's events, then flush them to disk."""
        tbx, wall = self.tbx, batch.time_ms / 1000
        steps, tags, values = [], [], []
        events = scalars(batch.table)
        if len(events):
            chosen, besides = events.tracker_steps()
            steps.append(chosen)
            tags.append(events.keys)
            values.append(events.values)
            for name, has in besides.items():
                # One value per (step, value) of this step name, however many keys carried it.
                pairs = np.unique(np.stack([chosen[has], events.steps[name][has]], axis=1), axis=0)
                steps.append(pairs[:, 0])
                tags.append(np.full(len(pairs), name, object))
                values.append(pairs[:, 1].astype(np.float64))
        histograms = []
        rows = arrays(batch.table)
        if rows.num_rows:
            logs = from_arrow(rows, flat=True)  # tags are named key/path
            primary = schema.primary_step(schema.step_names(rows))
            names = sorted(schema.step_names(rows), key=lambda name: name != primary)  # stable: primary first
            for key, series in logs.items():
                series = np.asarray(series)
                if not len(series):
                    continue
                at = _steps(logs, names, key, len(series))
                for tag, part in _real_parts(key, series):
                    if part.ndim == 1:  # complex scalars
                        steps.append(at)
                        tags.append(np.full(len(part), tag, object))
                        values.append(part.astype(np.float64))
                    else:
                        histograms += [(s, tag, p) for s, p in zip(at.tolist(), part, strict=True)]
        records = []
        if steps:
            records += self._scalar_events(wall, np.concatenate(steps), np.concatenate(tags), np.concatenate(values))
        for step, tag, part in histograms:
            histogram = self._histogram(part)
            if histogram is not None and self._new(wall, step, tag):
                value = tbx.Value(tag=tag, histo=histogram)
                records.append(tbx.Event(wall_time=wall, step=step, summary=tbx.Summary(value=[value])))
        for event in media(batch.table):  # encoded here, in the backend's worker thread
            step = 0 if event.step is None else event.step
            if self._new(wall, step, event.key):
                value = _media_value(tbx, event)
                records.append(tbx.Event(wall_time=wall, step=step, summary=tbx.Summary(value=[value])))
        for record in records:
            self._file.write(record.SerializeToString())
            self.last_step = max(self.last_step, record.step)
        self._file.flush()

    def _scalar_events(self, wall: float, steps: np.ndarray, tags: np.ndarray, values: np.ndarray) -> list:
        """One event per step, holding the step's values in order."""
        tbx = self.tbx
        if not len(steps):
            return []
        steps = np.where(steps == NO_STEP, 0, steps)
        order = np.argsort(steps, kind="stable")
        steps, tags, values = steps[order], tags[order].tolist(), values[order].tolist()
        starts = [0, *(np.flatnonzero(np.diff(steps)) + 1).tolist()]
        ends = [*starts[1:], len(tags)]
        Value, records = tbx.Value, []
        for start, end, step in zip(starts, ends, steps[starts].tolist(), strict=True):
            pairs = zip(tags[start:end], values[start:end], strict=True)
            if self.seen:
                pairs = [(tag, value) for tag, value in pairs if self._new(wall, step, tag)]
            summary = tbx.Summary(value=[Value(tag=tag, simple_value=value) for tag, value in pairs])
            if summary.value:
                records.append(tbx.Event(wall_time=wall, step=step, summary=summary))
        return records

    def _new(self, wall: float, step: int, tag: str) -> bool:
        """Whether a value was not written before (counting it off if it was)."""
        if not self.seen:
            return True
        key = (wall, step, tag)
        if self.seen[key] > 0:
            self.seen[key] -= 1
            return False
        return True

    def _histogram(self, values: np.ndarray):
        finite = values.reshape(-1).astype(np.float64)
        finite = finite[np.isfinite(finite)]
        if not finite.size:
            return None
        inside = self.tbx.bins[0] <= finite.min() and finite.max() <= self.tbx.bins[-1]
        return self.tbx.make_histogram(finite, self.tbx.bins if inside else FALLBACK_BINS)

    def close(self) -> None:
        self._file.flush()
        self._file.close()


def _steps(logs, names: list[str], key: str, events: int) -> np.ndarray:
    """Each event's step for a key of `logs`: its first step name (primary
    first) that it carries, 0 without any (as `Scalars.tracker_steps`)."""
    chosen = np.full(events, NO_STEP, np.int64)
    for name in names:
        steps = logs.steps.get(name, {}).get(key)
        if steps is not None:
            steps = np.asarray(steps).reshape(events, -1)[:, 0]  # steps under vmap repeat along its axes
            chosen = np.where(chosen == NO_STEP, steps, chosen)
    return np.where(chosen == NO_STEP, 0, chosen)


def _media_value(tbx: _Tbx, event: MediaEvent):
    """The summary value of an image, video, audio clip, histogram or text."""
    value = event.value
    if event.kind == "text":
        text = np.asarray(value, dtype=object)  # str, or a NumPy array of strings
        shape = tbx.TensorShapeProto(dim=[tbx.TensorShapeProto.Dim(size=n) for n in text.shape])
        tensor = tbx.TensorProto(dtype="DT_STRING", tensor_shape=shape,
                                 string_val=[str(t).encode() for t in text.reshape(-1)])
        return tbx.Value(tag=event.key, metadata=_plugin(tbx, "text", tbx.TextPluginData(version=0)), tensor=tensor)
    if event.kind == "audio":
        samples = np.asarray(value.samples)
        audio = tbx.Audio(sample_rate=float(value.rate), num_channels=1 if samples.ndim == 1 else samples.shape[1],
                          length_frames=samples.shape[0], encoded_audio_string=encoding.wav(samples, value.rate),
                          content_type="audio/wav")
        return tbx.Value(tag=event.key, audio=audio)
    if event.kind == "histogram":
        return tbx.Value(tag=event.key, histo=_logged_histogram(tbx, np.asarray(value.counts), np.asarray(value.edges)))
    # Images and videos: one tensor of N encoded images (width, height, then the images),
    # as tf.summary.image writes a batch: the IMAGES dashboard shows them with a sample slider.
    if event.kind == "image":
        images = encoding.as_nhwc(value.pixels)
        height, width = images.shape[1:3]
        files = [encoding.png(image) for image in images]
    else:  # animated GIFs: TensorBoard shows them as images
        videos = encoding.as_nthwc(value.frames)
        height, width = videos.shape[2:4]
        files = [encoding.gif(frames, value.fps) for frames in videos]
    shape = tbx.TensorShapeProto(dim=[tbx.TensorShapeProto.Dim(size=len(files) + 2)])
    tensor = tbx.TensorProto(dtype="DT_STRING", tensor_shape=shape,
                             string_val=[str(width).encode(), str(height).encode(), *files])
    return tbx.Value(tag=event.key, metadata=_plugin(tbx, "images"), tensor=tensor)


def _plugin(tbx: _Tbx, name: str, content=None):
    data = tbx.SummaryMetadata.PluginData(plugin_name=name, content=b"" if content is None else
                                          content.SerializeToString())
    return tbx.SummaryMetadata(plugin_data=data)


def _logged_histogram(tbx: _Tbx, counts: np.ndarray, edges: np.ndarray):
    """A histogram summary of logged counts and edges, as they are.

    ``bucket_limit`` holds every edge and ``bucket`` an empty bucket before the
    counts (a bucket is counted up to its limit: the first edge needs one below it).
    TensorBoard draws the buckets between the first and last non-empty ones,
    from ``min`` to ``max``: they are those buckets' outer edges. ``sum`` and
    ``sum_squares`` are estimated from the bin centres (no dashboard reads them)."""
    counts = counts.astype(np.float64)
    edges = edges.astype(np.float64)
    filled = np.flatnonzero(counts)
    low, high = (edges[filled[0]], edges[filled[-1] + 1]) if filled.size else (edges[0], edges[-1])
    centres = (edges[:-1] + edges[1:]) / 2
    return tbx.HistogramProto(min=low, max=high, num=float(counts.sum()), sum=float(counts @ centres),
                              sum_squares=float(counts @ centres**2), bucket_limit=edges.tolist(),
                              bucket=[0.0, *counts.tolist()])


def _real_parts(key: str, values: np.ndarray) -> list[tuple[str, np.ndarray]]:
    if np.iscomplexobj(values):
        return [(f"{key}/real", np.real(values)), (f"{key}/imag", np.imag(values))]
    return [(key, values)]


def _set_hparam(slot, value) -> None:
    """An hparam's value: a number, a bool, or text (anything else as JSON)."""
    if isinstance(value, bool):
        slot.bool_value = value
    elif isinstance(value, (int, float)) and math.isfinite(value) and abs(value) < 2**53:
        slot.number_value = float(value)
    elif isinstance(value, str):
        slot.string_value = value
    else:
        slot.string_value = json.dumps(value, default=str)


def _run_table(run: hooks.RunInfo) -> str:
    """The text summary of a run: a Markdown table of what identifies it and its metadata."""
    rows = [("name", run.name), ("run id", run.run_id), ("group", run.group), ("index", run.index)]
    rows += sorted(run.metadata.items())
    cell = lambda v: (v if isinstance(v, str) else json.dumps(v, default=str)).replace("|", "\\|")  # noqa: E731
    return "| | |\n|---|---|\n" + "".join(f"| {cell(k)} | {cell(v)} |\n" for k, v in rows)


def _component(name: str) -> str:
    """`name` as one folder name: separators and characters that file systems
    refuse become ``-``; no leading or trailing dots or spaces."""
    return _UNSAFE.sub("-", name).strip(" .")


def _event_files(path: str) -> list[str]:
    try:
        return sorted(name for name in os.listdir(path) if "tfevents" in name)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _own_file(name: str, run_id: str) -> int | None:
    """The session number of an event file this backend wrote for `run_id`, else None."""
    match = re.fullmatch(r"events\.out\.tfevents\.\d+\..*\." + re.escape(run_id) + r"\.(\d+)", name)
    return int(match.group(1)) if match else None


def _events(path: str, event_type) -> list:
    """The events of an event file, up to a record torn by a crash."""
    with open(path, "rb") as f:
        data = f.read()
    events, at = [], 0
    while at + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        end = at + 12 + length + 4
        if end > len(data):
            break
        try:
            events.append(event_type.FromString(data[at + 12 : at + 12 + length]))
        except Exception:  # noqa: BLE001 - a damaged record ends what can be read
            break
        at = end
    return events


@hooks.hookimpl
def lox_backends():
    return [
        hooks.BackendSpec(
            "tensorboard",
            "lox_backends.trackers.tensorboard:TensorboardBackend",
            description="TensorBoard event files, a folder per lox run (tensorboard:DIR)",
            requires=("tensorboardX",),
            install="pip install 'jax-lox[tensorboard]'",
        )
    ]
