"""Plotting saved runs: one curve per run (``lox plot``)."""

from __future__ import annotations

import collections
import os

import numpy as np

from lox_backends import storage
from lox_backends.store import load
from lox_backends.store import runs as saved_runs
from lox_core.logdict import NO_STEP, event_count, logdict

DEFAULT_STEP = "step"


def plot_runs(
    path: str | os.PathLike,
    key: str = "loss",
    output: str | os.PathLike | None = None,
    step: str = DEFAULT_STEP,
    run_ids=None,
    runs=None,
    groups=None,
) -> str:
    """Plot `key` against `step` for every run saved under `path` (or the one
    run at `path`) into a PNG; returns the PNG's path (default ``PATH/KEY.png``,
    or ``KEY.png`` in the current folder when `path` is in a bucket). Positive
    series get a log scale.

    `runs` (names, ``GROUP/NAME`` or run ids), `groups` (group ids) and
    `run_ids` choose the runs plotted; see `plot_figure`."""
    path = os.fspath(path)
    figure = plot_figure(path, key=key, step=step, run_ids=run_ids, runs=runs, groups=groups)
    import matplotlib.pyplot as plt

    if output is None:
        output = f"{_file_safe(key)}.png" if storage.is_uri(path) else os.path.join(path, f"{_file_safe(key)}.png")
    output = os.fspath(output)
    try:
        figure.savefig(output, dpi=120)
    finally:
        plt.close(figure)
    return output


def plot_figure(path: str | os.PathLike, key: str = "loss", step: str = DEFAULT_STEP, run_ids=None, runs=None,
                groups=None):
    """The matplotlib Figure of `plot_runs` (not saved, not closed).

    One curve per run, labelled by the run's name, or ``GROUP/NAME`` where runs
    of different groups share a name (the run id where that is not unique
    either). A key holding arrays is plotted as the mean of each event's
    values, and its label says so. Events that lack `step` are left out; a run
    that logged `key` without `step` is an error naming the steps it has (with
    the default step, a key logged without any step is plotted against its
    event index)."""
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError(
            "plotting needs matplotlib, which is not installed: run `pip install 'jax-lox[plot]'`."
        ) from error

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    path = os.fspath(path)
    loaded = load(path)
    single = isinstance(loaded, logdict)  # one run's folder
    infos = {r["run_id"]: r for r in saved_runs(path)}
    by_run = {os.path.basename(os.path.normpath(path)): loaded} if single else dict(loaded)
    if single and len(infos) == 1:
        by_run = {next(iter(infos)): loaded}
    by_run = _choose(path, by_run, infos, run_ids, runs, groups)

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

    labels = _labels(list(with_key), infos)
    figure, axes = plt.subplots(figsize=(7, 4))
    positive = True
    averaged = False
    for run, logs in with_key.items():
        values = np.asarray(logs[key])
        shape = values.shape[1:]
        label = labels[run]
        if shape and int(np.prod(shape)) != 1:
            label += f" (mean of {'×'.join(map(str, shape))} values)"
            averaged = True
        values = values.reshape(values.shape[0], -1).mean(axis=1)  # arrays: their mean per event
        if against_index:
            x = np.arange(values.shape[0])
        else:
            x = np.asarray(logs.steps[step][key])
            kept = x != NO_STEP  # events that did not carry this step
            x, values = x[kept], values[kept]
        axes.plot(x, values, label=label)
        positive &= bool(np.all(values > 0))
    if positive:
        axes.set_yscale("log")
    axes.set_xlabel("event index (no step was logged)" if against_index else step)
    axes.set_ylabel(f"{key} (mean per event)" if averaged else key)
    axes.legend(fontsize="small")
    figure.tight_layout()
    return figure


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
