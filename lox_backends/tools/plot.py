"""Plotting saved runs: one curve per run (``lox plot``)."""

from __future__ import annotations

import collections
import os
from collections.abc import Sequence

import numpy as np

from lox_backends.runstore import filesystems
from lox_backends.runstore.reader import load
from lox_backends.runstore.reader import runs as saved_runs
from lox_core.arrow import flatten_keys
from lox_core.logdict import NO_STEP, event_count, logdict

DEFAULT_STEP = "step"
# Fewer points than this are drawn raw, marked: a moving average over a few points lags far behind them.
MIN_SMOOTHED = 50


def plot_runs(
    path: str | os.PathLike,
    key: str | Sequence[str] = "loss",
    output: str | os.PathLike | None = None,
    step: str = DEFAULT_STEP,
    run_ids=None,
    runs=None,
    groups=None,
    smoothing: float = 0.0,
    title: str | None = None,
) -> str:
    """Plot `key` (or several keys) against `step` for every run saved under
    `path` (or the one run at `path`) into a PNG; returns the PNG's path
    (default ``PATH/KEY.png``, or ``KEY.png`` in the current folder when `path`
    is in a bucket). Positive series get a log scale.

    `runs` (names, ``GROUP/NAME`` or run ids), `groups` (group ids) and
    `run_ids` choose the runs plotted; `smoothing` and `title`: see `plot_figure`.
    A key logged as a pytree is plotted leaf by leaf, each named ``key/path``
    (``norms/l1/kernel``)."""
    path = os.fspath(path)
    figure = plot_figure(path, key=key, step=step, run_ids=run_ids, runs=runs, groups=groups, smoothing=smoothing,
                         title=title)
    import matplotlib.pyplot as plt

    first = key if isinstance(key, str) else key[0]
    if output is None:
        name = f"{_file_safe(first)}.png"
        output = name if filesystems.is_uri(path) else os.path.join(path, name)
    output = os.fspath(output)
    try:
        figure.savefig(output, dpi=120)
    finally:
        plt.close(figure)
    return output


def plot_figure(path: str | os.PathLike, key: str | Sequence[str] = "loss", step: str = DEFAULT_STEP, run_ids=None,
                runs=None, groups=None, smoothing: float = 0.0, title: str | None = None):
    """The matplotlib Figure of `plot_runs` (not saved, not closed).

    One curve per run and key, labelled by the run's name, or ``GROUP/NAME``
    where runs of different groups share a name (the run id where that is not
    unique either), and by the key when there are several; a run keeps its
    colour across keys, a key its line style. A key holding arrays is plotted
    as the mean of each event's values, and its label says so. Events that lack
    `step` are left out; a run that logged `key` without `step` is an error
    naming the steps it has (with the default step, a key logged without any
    step is plotted against its event index). With `smoothing` (from 0, none,
    to below 1) each curve of at least `MIN_SMOOTHED` points is an exponential
    moving average of that weight (as TensorBoard's slider), with the raw
    curve faint behind it; a curve of fewer points has them marked. `title`
    titles the plot."""
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError(
            "plotting needs matplotlib, which is not installed: run `pip install 'jax-lox[plot]'`."
        ) from error
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"the smoothing must be from 0 (none) to below 1, got {smoothing!r}.")

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    path = os.fspath(path)
    keys = [key] if isinstance(key, str) else list(key)
    loaded = load(path)
    single = isinstance(loaded, logdict)  # one run's folder
    infos = {r["run_id"]: r for r in saved_runs(path)}
    by_run = {os.path.basename(os.path.normpath(path)): loaded} if single else dict(loaded)
    if single and len(infos) == 1:
        by_run = {next(iter(infos)): loaded}
    by_run = _choose(path, by_run, infos, run_ids, runs, groups)
    by_run = {run: flatten_keys(logs) for run, logs in by_run.items()}  # keys as key/path series

    curves = [(k, _runs_with(path, by_run, infos, k, step)) for k in keys]
    indexed = [k for k, (_, against_index) in curves if against_index]
    if indexed and len(indexed) < len(keys):
        stepped = [k for k in keys if k not in indexed]
        raise LookupError(
            f"{', '.join(map(repr, indexed))} was logged without any step and {', '.join(map(repr, stepped))} "
            f"with {step!r}: one x axis cannot show both. Plot them apart, or log every key with `{step}=`."
        )
    plotted = list(dict.fromkeys(run for _, (with_key, _) in curves for run in with_key))
    labels = _labels(plotted, infos)
    colours = {run: f"C{i % 10}" for i, run in enumerate(plotted)}
    figure, axes = plt.subplots(figsize=(7, 4))
    positive = True
    averaged = False
    for number, (k, (with_key, against_index)) in enumerate(curves):
        style = ("-", "--", ":", "-.")[number % 4]
        for run, logs in with_key.items():
            values = np.asarray(logs[k])
            shape = values.shape[1:]
            label = labels[run] + (f" {k}" if len(keys) > 1 else "")
            if shape and int(np.prod(shape)) != 1:
                label += f" (mean of {'×'.join(map(str, shape))} values)"
                averaged = True
            values = values.reshape(values.shape[0], -1).mean(axis=1)  # arrays: their mean per event
            if against_index:
                x = np.arange(values.shape[0])
            else:
                x = np.asarray(logs.steps[step][k])
                kept = x != NO_STEP  # events that did not carry this step
                x, values = x[kept], values[kept]
            if smoothing and values.size >= MIN_SMOOTHED:
                axes.plot(x, values, color=colours[run], linestyle=style, alpha=0.25, linewidth=0.8)
                axes.plot(x, _smoothed(values, smoothing), color=colours[run], linestyle=style, label=label)
            else:  # a sparse series (an evaluation per epoch) with its points marked
                marker = "o" if values.size < MIN_SMOOTHED else None
                axes.plot(x, values, color=colours[run], linestyle=style, marker=marker, markersize=3, label=label)
            positive &= bool(np.all(values > 0))
    if positive:
        axes.set_yscale("log")
    axes.set_xlabel("event index (no step was logged)" if indexed else step)
    axes.set_ylabel(", ".join(keys) + (" (mean per event)" if averaged else ""))
    if title:
        axes.set_title(title)
    axes.legend(fontsize="small")
    figure.tight_layout()
    return figure


def _runs_with(path: str, by_run: dict, infos: dict, key: str, step: str) -> tuple[dict, bool]:
    """The runs that logged `key` (each with `step`, else an error naming the
    steps they have), and whether they are plotted against the event index."""
    with_key = {run: logs for run, logs in by_run.items() if key in logs and event_count(logs[key])}
    if not with_key:
        available = sorted({k for logs in by_run.values() for k in logs})
        raise LookupError(
            f"no run under {path!r} logged {key!r}; the keys logged are: {', '.join(available) or 'none'}."
        )
    against_index = step == DEFAULT_STEP and not any(key in steps for logs in with_key.values()
                                                       for steps in logs.steps.values())
    if not against_index:
        lacking = [run for run, logs in with_key.items() if not _has_step(logs, key, step)]
        if lacking:
            logged = sorted({name for logs in with_key.values() for name, steps in logs.steps.items() if key in steps})
            whose = "no run" if len(lacking) == len(with_key) else "the runs " + ", ".join(
                _label_of(run, infos) for run in lacking)
            raise LookupError(
                f"{whose} under {path!r} logged {key!r} with the step {step!r}; {key!r} was logged with the "
                f"step(s): {', '.join(logged) or 'none'}. Pass one of them as --step"
                + (", or choose runs with --run/--group." if len(lacking) < len(with_key) else ".")
            )
    return with_key, against_index


def _smoothed(values: np.ndarray, weight: float) -> np.ndarray:
    """The exponential moving average of `values` with `weight`, debiased at
    the start (the first point is the first value), as TensorBoard smooths: a
    NaN or infinite value is shown as it is and left out of the average."""
    out = np.empty(values.shape, float)
    average, seen = 0.0, 0
    for i, value in enumerate(values.astype(float)):
        if not np.isfinite(value):
            out[i] = value
            continue
        seen += 1
        average = weight * average + (1.0 - weight) * value
        out[i] = average / (1.0 - weight**seen)
    return out


def _has_step(logs: logdict, key: str, step: str) -> bool:
    steps = logs.steps.get(step, {}).get(key)
    return steps is not None and bool(np.any(np.asarray(steps) != NO_STEP))


def _choose(path: str, by_run: dict, infos: dict, run_ids, runs, groups) -> dict:
    """The runs that `run_ids`, `runs` and `groups` choose (all when None)."""
    if run_ids is not None:
        by_run = {run: logs for run, logs in by_run.items() if run in set(run_ids)}
    if runs is None and groups is None:
        return by_run

    def info(run):
        return infos.get(run, {"run_id": run, "name": run, "group": ""})

    chosen = {}
    for run, logs in by_run.items():
        i = info(run)
        names = {i["run_id"], i.get("name", run), f"{i.get('group', '')}/{i.get('name', run)}"}
        if (runs is None or names & set(runs)) and (groups is None or i.get("group") in set(groups)):
            chosen[run] = logs
    if not chosen:
        asked = " and ".join(
            part for part in (runs and f"--run {', '.join(runs)}", groups and f"--group {', '.join(groups)}") if part
        )
        listed = [f"{info(run).get('group', '')}/{info(run).get('name', run)}" for run in by_run]
        raise LookupError(
            f"no run under {path!r} matches {asked}; the runs there (GROUP/NAME) are: "
            f"{', '.join(listed) or 'none'}. --run takes a name, GROUP/NAME or run id; --group a group."
        )
    return chosen


def _label_of(run: str, infos: dict) -> str:
    info = infos.get(run)
    return f"{info.get('group', '')}/{info.get('name', run)}" if info else run


def _labels(plotted: list[str], infos: dict) -> dict[str, str]:
    """Each run's name; GROUP/NAME where names repeat; the run id where that repeats too."""
    names = {run: infos.get(run, {}).get("name", run) for run in plotted}
    name_counts = collections.Counter(names.values())
    labels = {run: name if name_counts[name] == 1 else _label_of(run, infos) for run, name in names.items()}
    label_counts = collections.Counter(labels.values())
    return {run: label if label_counts[label] == 1 else run for run, label in labels.items()}


def _file_safe(key: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in key).strip(".") or "key"
