"""Plotting saved runs: one curve per run (``lox plot``)."""

from __future__ import annotations

import os

import numpy as np

from lox_backends import storage
from lox_backends.store import load, runs
from lox_core.logdict import event_count, logdict


def plot_runs(
    path: str | os.PathLike,
    key: str = "loss",
    output: str | os.PathLike | None = None,
    step: str = "step",
    run_ids=None,
) -> str:
    """Plot `key` against `step` for every run saved under `path` (or the one
    run at `path`; or the runs `run_ids` among them) into a PNG; returns the
    PNG's path (default ``PATH/KEY.png``, or ``KEY.png`` in the current folder
    when `path` is in a bucket). Positive series get a log scale."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    path = os.fspath(path)
    loaded = load(path)
    single = isinstance(loaded, logdict)  # one run's folder
    by_run = {os.path.basename(os.path.normpath(path)): loaded} if single else loaded
    names = {r["run_id"]: r.get("name", r["run_id"]) for r in ([] if single else runs(path))}
    if run_ids is not None:
        by_run = {run: logs for run, logs in by_run.items() if run in set(run_ids)}
    with_key = {run: logs for run, logs in by_run.items() if key in logs and event_count(logs[key])}
    if not with_key:
        available = sorted({k for logs in by_run.values() for k in logs})
        raise LookupError(
            f"no run under {path!r} logged {key!r}; the keys logged are: {', '.join(available) or 'none'}."
        )
    figure, axes = plt.subplots(figsize=(7, 4))
    positive = True
    for run, logs in with_key.items():
        values = np.asarray(logs[key])
        values = values.reshape(values.shape[0], -1).mean(axis=1)  # arrays: their mean per event
        x = np.asarray(logs.steps[step][key]) if key in logs.steps.get(step, {}) else np.arange(values.shape[0])
        axes.plot(x, values, label=names.get(run, run))
        positive &= bool(np.all(values > 0))
    if positive:
        axes.set_yscale("log")
    axes.set_xlabel(step)
    axes.set_ylabel(key)
    axes.legend(fontsize="small")
    figure.tight_layout()
    if output is None:
        output = f"{_file_safe(key)}.png" if storage.is_uri(path) else os.path.join(path, f"{_file_safe(key)}.png")
    output = os.fspath(output)
    figure.savefig(output, dpi=120)
    plt.close(figure)
    return output


def _file_safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in key).strip(".") or "key"
