"""The ``mlflow`` backend: one MLflow run per lox run, sent from a local log.

Config string ``mlflow:TRACKING_URI?experiment=NAME`` (``pip install
'jax-lox[mlflow]'``). The tracking URI is anything MLflow takes
(``http://127.0.0.1:5000``, ``sqlite:///mlflow.db``, ``databricks``); without
one, MLflow's own default applies (``MLFLOW_TRACKING_URI``). Credentials come
from MLflow's usual environment variables (``MLFLOW_TRACKING_TOKEN``,
``MLFLOW_TRACKING_USERNAME`` / ``PASSWORD``...) and are never printed.

What goes where:

* Each lox run (each seed of a vmapped ``logger.init``) becomes an MLflow run in
  the experiment (created if missing; default ``lox``), named like the lox run
  and tagged ``lox.run_id``, ``lox.group`` (shared by the seeds of one Logger:
  group or filter by it in the MLflow UI) and ``lox.index``. Run metadata and
  config become params (nested values as JSON text).
* Scalar events become metrics, sent with ``log_batch`` (at most 1000 metrics
  per request). Their MLflow step is the event's ``step`` (else its first
  other step name; 0 without any); every other step name it has is logged as
  a metric of its own at that step (e.g. ``epoch``), so charts can use it as
  their x axis. Keys become metric names, with characters MLflow refuses (and
  empty, ``.`` and ``..`` path parts) replaced by ``_``: two keys that differ
  only there become one metric.
* Array-valued events (and complex scalars) go to the run's artifacts as Parquet files,
  ``lox/<batch file>.parquet``, in lox's Arrow schema (``lox.load`` reads a
  folder of them; so do pandas and DuckDB).
* Images, video, audio, histograms and text (`lox.image`... and strings;
  `lox_backends.trackers.tables.media`) are encoded in the sending thread
  and become artifacts, one per event, ``K`` being the key with characters
  other than letters, digits, ``_-./`` and space made ``_``:

  - an image: ``log_image(key=K, step=...)`` (MLflow's image charts, with a
    step slider); a batch ``(N, H, W, C)`` is one grid, ``ceil(sqrt(N))``
    images wide with 1-pixel black gaps;
  - a video: a looping GIF at its fps, ``media/K/step_<step>.gif`` (a batch:
    one GIF whose every frame is the grid of the N videos' frames);
  - audio: 16-bit PCM ``media/K/step_<step>.wav``;
  - a histogram: ``media/K/step_<step>.json``, ``{"counts": [...], "edges": [...]}``
    (bin i counts ``edges[i] <= v < edges[i + 1]``);
  - text: ``log_text``, ``media/K/step_<step>.txt``; an ``(n,)`` or ``(rows,
    cols)`` array of strings: ``log_table``, ``media/K/step_<step>.json``
    (columns ``"0"``, ``"1"``...).

  A second event of a key at one step in a batch is ``step_<step>-1``...;
  events without a step are named by their batch file,
  ``<batch file>-<i>``. These names are the same each time a batch is sent,
  so a batch sent again replaces its files; its images (``log_image`` names
  them at random) are sent only when the run's ``images/`` artifacts lack
  an image of that key, step and timestamp (each image of a batch gets the
  batch's timestamp plus its position among the key's images at that step).
  A table already at its name is kept (``log_table`` would append to it).
* The run's summary, when it ends (``loss.last``, ``loss.min``, ``loss.max``,
  ``loss.count`` of each key, and the values given by ``logger.summary``)
  becomes metrics of those names at step 0 (bools as 0 and 1; MLflow's runs
  table shows them, ``search_runs`` filters by them:
  ``metrics.`loss.min` < 0.1``), and text values tags ``summary.<name>``.
* A run resumed by id (``logger.init(run_id=..., resume="allow")``) goes on
  in its MLflow run (the one its local log's sent record names), back to
  ``RUNNING``; params it has keep their values (a changed one is warned
  about, not sent: MLflow refuses to change a param). MLflow cannot delete
  metric values: with ``from_step=N``, the values of steps N and above that
  reached MLflow before the restart stay in each metric's history beside
  the new ones (lox warns when there are any); ``lox.load`` reads each step
  once.
* A run ends ``FINISHED`` when ``logger.finish`` closes it, ``FAILED`` when
  it failed (logs were lost, or the program raised); ``lox sync`` ends a run
  whose process died ``KILLED`` (a run still being written stays ``RUNNING``).

Every value gets the timestamp of the batch file it was written to, so that a
batch sent again (after a crash, with ``lox sync``) repeats exactly the values
MLflow's database already holds, which it then ignores: metrics arrive once.
(MLflow's file store, ``./mlruns``, does not ignore them; use a database or a
server.) The same value logged twice for one key and step within one batch is
stored once. Media artifacts arrive once too (see above), also when ``lox
sync`` was stopped halfway through a batch and runs again.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import posixpath
import re
import tempfile
import time
import warnings

import numpy as np
import pyarrow.parquet as pq

from lox_backends.plugin import hooks
from lox_backends.plugin.config import Option
from lox_backends.runstore import layout
from lox_backends.trackers import encoding
from lox_backends.trackers.tables import Batch, MediaEvent, arrays, file_stems, media, scalars
from lox_backends.trackers.template import TrackerBackend, ended_status
from lox_core.logdict import NO_STEP

DEFAULT_EXPERIMENT = "lox"
MAX_METRICS = 1000  # per log_batch request (MLflow's limit)
MAX_PARAMS = 100
MAX_PARAM_VALUE = 6000
STATUSES = {"finished": "FINISHED", "failed": "FAILED", "killed": "KILLED"}  # lox's → MLflow's run status
_INVALID = re.compile(r"[^\w./\- :]")  # what MLflow refuses in metric and param names
_INVALID_MEDIA = re.compile(r"[^A-Za-z0-9_\-./ ]")  # in image keys (`log_image`) and artifact paths


class MlflowBackend(TrackerBackend):
    """Sends runs to MLflow; see the module docstring."""

    tracker = "mlflow"
    keeps_superseded = "MLflow cannot delete metric values: it shows both the earlier and the new value of those steps"
    OPTIONS = {
        "experiment": Option("the MLflow experiment, created if missing",
                             default=DEFAULT_EXPERIMENT, check=lambda name: None if name else "it must not be empty"),
        **TrackerBackend.OPTIONS,
    }
    EXAMPLE = "mlflow:http://127.0.0.1:5000?experiment=demo"

    def __init__(self, target: str | None = None, options: dict[str, str] | None = None):
        super().__init__(target, options)
        self.experiment: str = self.settings["experiment"]
        # Imported here, in the thread that creates the backend: the sending
        # thread may first need it while the interpreter exits.
        from mlflow.tracking import MlflowClient

        self._client = MlflowClient(tracking_uri=_absolute(target)) if target else MlflowClient()
        self._experiment_id: str | None = None
        self._created: dict[str, str] = {}  # lox run id → MLflow run id created by this backend
        self._images: dict[str, set[str]] = {}  # MLflow run id → names of its `images/` artifacts

    def destination(self) -> str:
        return f"{self._client.tracking_uri} experiment={self.experiment}"

    def _experiment(self) -> str:
        if self._experiment_id is None:
            found = self._client.get_experiment_by_name(self.experiment)
            if found is not None:
                self._experiment_id = found.experiment_id
            else:
                try:
                    self._experiment_id = self._client.create_experiment(self.experiment)
                except Exception:  # created meanwhile by another process
                    found = self._client.get_experiment_by_name(self.experiment)
                    if found is None:
                        raise
                    self._experiment_id = found.experiment_id
        return self._experiment_id

    def start_run(self, run: hooks.RunInfo, remote: dict | None) -> dict:
        from mlflow.entities import Param

        client = self._client
        run_id = self._find_run(run, remote) or self._created.get(run.run_id)
        had: dict[str, str] = {}  # the params of the MLflow run, when it existed
        if run_id is None:
            tags = {"lox.run_id": run.run_id, "lox.group": run.group, "lox.index": str(run.index)}
            run_id = client.create_run(self._experiment(), tags=tags, run_name=run.name).info.run_id
            self._created[run.run_id] = run_id  # a retry (the params below failed) reuses it
        elif remote or self.syncing:  # a run that existed: it may have params, and may have ended
            found = client.get_run(run_id)
            had = dict(found.data.params)
            if run.resumed and found.info.status != "RUNNING":
                client.update_run(run_id, status="RUNNING")  # it goes on; `end_run` ends it again
        params = [Param(_name(k), _param_value(v)) for k, v in sorted(run.metadata.items())]
        changed = sorted(p.key for p in params if p.key in had and had[p.key] != p.value)
        if changed:
            warnings.warn(
                f"lox: run {run.name!r} was opened again with other values of {', '.join(map(repr, changed))} "
                f"than its MLflow run {run_id} has; MLflow keeps a param's first value, so the new ones are not "
                f"sent (they are in the local log's {layout.RUN_FILE}).",
                RuntimeWarning,
                stacklevel=2,
            )
        params = [p for p in params if p.key not in had]  # MLflow refuses to change a param
        for start in range(0, len(params), MAX_PARAMS):
            client.log_batch(run_id, params=params[start : start + MAX_PARAMS])
        return {"run_id": run_id}

    def _find_run(self, run: hooks.RunInfo, remote: dict | None) -> str | None:
        """The MLflow run this lox run was sent to before, if any."""
        if remote and remote.get("run_id"):
            return remote["run_id"]
        if not self.syncing:  # a run this process opened: new, unless `lox sync` resumes it
            return None
        found = self._client.search_runs(
            [self._experiment()], filter_string=f"tags.`lox.run_id` = '{run.run_id}'", max_results=1
        )
        return found[0].info.run_id if found else None

    def send(self, run: hooks.RunInfo, remote: dict, batch: Batch) -> None:
        from mlflow.entities import Metric

        events, time_ms = scalars(batch.table), batch.time_ms
        steps, besides = events.tracker_steps()
        steps[steps == NO_STEP] = 0  # MLflow needs a step
        keys = {key: _name(key) for key in set(events.keys)}
        metrics = [
            Metric(keys[key], value, time_ms, step)
            for key, value, step in zip(events.keys, events.values.tolist(), steps.tolist(), strict=True)
        ]
        for name, has in besides.items():
            # One metric per (step, value) of this step name, however many keys carried it.
            pairs = np.unique(np.stack([steps[has], events.steps[name][has]], axis=1), axis=0).tolist()
            metrics += [Metric(_name(name), float(value), time_ms, step) for step, value in pairs]
        for start in range(0, len(metrics), MAX_METRICS):
            self._client.log_batch(remote["run_id"], metrics=metrics[start : start + MAX_METRICS])
        array_rows = arrays(batch.table)
        if array_rows.num_rows:
            with tempfile.TemporaryDirectory(prefix="lox-mlflow-") as folder:
                path = os.path.join(folder, batch.name)
                pq.write_table(array_rows, path)
                self._client.log_artifact(remote["run_id"], path, artifact_path="lox")
        events = media(batch.table)
        if events:
            try:
                with tempfile.TemporaryDirectory(prefix="lox-mlflow-") as folder:
                    for event, (stem, repeat) in zip(events, file_stems(events, batch.name), strict=True):
                        self._log_media(remote["run_id"], event, stem, batch.time_ms + repeat, folder)
            except BaseException:
                self._images.pop(remote["run_id"], None)  # what reached MLflow is listed again on the retry
                raise

    def _log_media(self, run_id: str, event: MediaEvent, stem: str, time_ms: int, folder: str) -> None:
        """One event of a rendered kind, encoded here (in the sending thread), as
        the module docstring says; `stem` names its file, `time_ms` is its timestamp."""
        key = _media_key(event.key)
        base = f"media/{key}/{stem}"
        value = event.value
        if event.kind == "image":
            pixels = encoding.to_uint8(encoding.grid(encoding.as_nhwc(value.pixels)))
            self._log_image(run_id, key, event.step or 0, time_ms, pixels)
        elif event.kind == "video":
            frames = encoding.video_grid(encoding.as_nthwc(value.frames))
            self._log_file(run_id, base + ".gif", encoding.gif(frames, value.fps), folder)
        elif event.kind == "audio":
            self._log_file(run_id, base + ".wav", encoding.wav(value.samples, value.rate), folder)
        elif event.kind == "histogram":
            counts = {"counts": np.asarray(value.counts).tolist(), "edges": np.asarray(value.edges).tolist()}
            self._client.log_text(run_id, json.dumps(counts), base + ".json")
        elif event.kind == "text":
            text = np.asarray(value)
            if text.ndim == 0:
                self._client.log_text(run_id, str(text.item()), base + ".txt")
            else:
                self._log_table(run_id, text.reshape(len(text), -1), base + ".json")

    def _log_image(self, run_id: str, key: str, step: int, time_ms: int, pixels: np.ndarray) -> None:
        """`log_image` with its step, unless this image reached MLflow before
        (`log_image` names its files with a random part: a batch sent again would
        add a second image)."""
        present = self._images.get(run_id)
        if present is None:
            present = self._images[run_id] = {posixpath.basename(f.path)
                                              for f in self._client.list_artifacts(run_id, "images")}
        # MLflow's names: images/<key, "/" as "~">+step+<step>+timestamp+<ms>+<uuid>.png (before 3.x,
        # "#" and "%"); lox gives each image of a batch its own timestamp.
        prefixes = tuple(f"{key.replace('/', slash)}{sep}step{sep}{step}{sep}timestamp{sep}{time_ms}{sep}"
                         for slash in "~#" for sep in "+%")
        if any(name.startswith(prefixes) and name.endswith(".png") for name in present):
            return
        self._client.log_image(run_id, pixels, key=key, step=step, timestamp=time_ms, synchronous=True)
        present.add(prefixes[0] + ".png")  # as found when listed: this image is there

    def _log_file(self, run_id: str, path: str, content: bytes, folder: str) -> None:
        """`content` as the artifact `path` (replaced when it is there)."""
        local = os.path.join(folder, posixpath.basename(path))
        with open(local, "wb") as file:
            file.write(content)
        self._client.log_artifact(run_id, local, artifact_path=posixpath.dirname(path))

    def _log_table(self, run_id: str, rows: np.ndarray, path: str) -> None:
        """Rows of strings as `log_table`'s JSON (columns ``"0"``, ``"1"``...),
        unless `path` is there: `log_table` would append the rows to it."""
        if any(f.path == path for f in self._client.list_artifacts(run_id, posixpath.dirname(path))):
            return
        import pandas as pd  # MLflow's own dependency, which `log_table` imports

        columns = {str(c): [str(v) for v in rows[:, c]] for c in range(rows.shape[1])}
        # Of object dtype: pandas' string dtype makes log_table warn.
        self._client.log_table(run_id, pd.DataFrame(columns, dtype=object), path)

    def send_summary(self, run: hooks.RunInfo, remote: dict, values: dict) -> None:
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        metrics = [Metric(_name(name), float(value), now, 0) for name, value in values.items()
                   if isinstance(value, (int, float)) and math.isfinite(value)]
        tags = [RunTag(_name(f"summary.{name}"), value[:MAX_PARAM_VALUE]) for name, value in values.items()
                if isinstance(value, str)]
        for start in range(0, max(len(metrics), 1), MAX_METRICS):
            self._client.log_batch(remote["run_id"], metrics=metrics[start : start + MAX_METRICS],
                                   tags=tags if start == 0 else [])

    def end_run(self, run: hooks.RunInfo, remote: dict) -> None:
        self._client.set_terminated(remote["run_id"], STATUSES.get(ended_status(run), "FAILED"))

    @contextlib.contextmanager
    def calls_within(self, seconds: float):
        """While ``lox sync`` runs: MLflow's client would retry a request that
        fails 7 times over about 4 minutes, and wait 120 s for each answer
        (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``MLFLOW_HTTP_REQUEST_TIMEOUT``,
        read at every request): unless those variables are set, it tries
        once and waits `seconds` (whole seconds, at least 1) for an answer, so
        that an unreachable server is reported at once, with MLflow's own
        error naming the request (lox sync is the retry: run it again)."""
        wanted = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, int(seconds)))}
        chosen = {name: value for name, value in wanted.items() if name not in os.environ}
        os.environ.update(chosen)
        try:
            yield
        finally:
            for name, value in chosen.items():
                if os.environ.get(name) == value:
                    del os.environ[name]

    def transient(self, error: Exception) -> bool:
        """Retried: the server unreachable, overloaded or failing (HTTP 5xx, 429),
        the database busy. Not: what MLflow refuses (an invalid name or value, a
        deleted run or experiment)."""
        from mlflow.exceptions import MlflowException, RestException

        if isinstance(error, RestException):
            status = error.get_http_status_code()
            return status >= 500 or status == 429
        if isinstance(error, MlflowException):
            return error.error_code in ("INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED")
        return super().transient(error)


def _absolute(uri: str) -> str:
    """A SQLite URI with a relative path made absolute now (MLflow would
    resolve it at its first request, and reuse that database for the same URI
    after an os.chdir), like the local log's folder."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not os.path.isabs(uri[len(prefix) :]):
        return prefix + os.path.abspath(uri[len(prefix) :])
    return uri


def _name(key: str) -> str:
    """A metric or param name MLflow accepts: refused characters become ``_``,
    and so do empty, ``.`` and ``..`` path parts (``a//b`` is ``a/_/b``)."""
    parts = [part if part not in ("", ".", "..") else "_" for part in _INVALID.sub("_", key).split("/")]
    return "/".join(parts)[:250]


def _media_key(key: str) -> str:
    """A key as `log_image` takes it and as a path below ``media/``: other
    characters become ``_``, and so do empty, ``.`` and ``..`` path parts.

    >>> _media_key("samples/é:grid//x")
    'samples/__grid/_/x'
    """
    parts = [part if part not in ("", ".", "..") else "_" for part in _INVALID_MEDIA.sub("_", key).split("/")]
    return "/".join(parts)[:250]


def _param_value(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:MAX_PARAM_VALUE]


@hooks.hookimpl
def lox_backends():
    return [
        hooks.BackendSpec(
            "mlflow",
            "lox_backends.trackers.mlflow:MlflowBackend",
            description="one MLflow run per lox run (mlflow:TRACKING_URI?experiment=NAME)",
            requires=("mlflow",),
            install="pip install 'jax-lox[mlflow]'",
        )
    ]
