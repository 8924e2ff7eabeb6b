"""Plotting saved runs: one curve per run (``lox plot``)."""

from __future__ import annotations

import collections
import os
import warnings
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from lox_backends.runstore import filesystems
from lox_backends.runstore.reader import load
from lox_backends.runstore.reader import runs as saved_runs
from lox_backends.runstore.table import flatten, run_table, select
from lox_core.arrow import flatten_keys
from lox_core.logdict import NO_STEP, event_count, logdict
from lox_core.media import RENDERED_KINDS

DEFAULT_STEP = "step"
# Fewer points than this are drawn raw, marked: a moving average over a few points lags far behind them.
MIN_SMOOTHED = 50
NOT_SET = "not set"  # the legend entry, with --label, of runs without that metadata key


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
    logy: bool | None = None,
    ylim: tuple[float, float] | None = None,
    label: str | None = None,
    where: str | None = None,
    best: tuple[int, str] | None = None,
) -> str:
    """Plot `key` (or several keys) against `step` for every run saved under
    `path` (or the one run at `path`) into a PNG; returns the PNG's path
    (default ``PATH/KEY.png``, or ``KEY.png`` in the current folder when `path`
    is in a bucket). Positive series get a log scale unless `logy` is False.

    `runs` (names, ``GROUP/NAME`` or run ids), `groups` (group ids) and
    `run_ids` choose the runs plotted, and so do `where` and `best` from the
    table of runs; `smoothing`, `title`, `logy`, `ylim`, `label`, `where` and
    `best`: see `plot_figure`. A key logged as a pytree is plotted leaf by
    leaf, each named ``key/path`` (``norms/l1/kernel``). Keys of images,
    video, audio, histograms and text are not curves: they are left out, with
    a `PlotNote` naming them, and asking for one is an error."""
    path = os.fspath(path)
    figure = plot_figure(path, key=key, step=step, run_ids=run_ids, runs=runs, groups=groups, smoothing=smoothing,
                         title=title, logy=logy, ylim=ylim, label=label, where=where, best=best)
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
                runs=None, groups=None, smoothing: float = 0.0, title: str | None = None, logy: bool | None = None,
                ylim: tuple[float, float] | None = None, label: str | None = None, where: str | None = None,
                best: tuple[int, str] | None = None):
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
    titles the plot.

    `logy`: True, a log y axis (an error where a plotted value is <= 0);
    False, a linear one; None (the default), log where every finite value
    plotted is positive. `ylim`: the y axis' limits ``(LO, HI)``; without them
    the limits leave out values far from the rest (`default_ylim`: a diverged
    run does not flatten the others). A curve that leaves the plot (values
    beyond the limits, or infinite) is marked where it first does, by a
    triangle on that edge in its colour, and, under the default limits, named
    in a `PlotNote` warning. NaN values are gaps. `label`: a metadata key
    (dotted for nested metadata, ``config.lr``, or its last part, ``lr``, where
    no other key ends so) whose value colours and labels the curves, one colour
    and legend entry per value (in the values' order; runs without the key:
    "not set", in grey).

    `where` (``"lr < 0.1"``) and `best` (``(3, "loss.min")``: the 3 runs of
    least ``loss.min``, drawn best first) choose runs by the table of runs
    (`lox_backends.runstore.table.run_table`, whose `select` reads them), as
    well as `runs`, `groups` and `run_ids`.

    >>> import lox, numpy as np, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> logger = lox.loggers.SaveLogger(folder)
    >>> for lr in (0.1, 0.01):
    ...     state = logger.init(name=f"lr-{lr}", config={"lr": lr})
    ...     logger.log(state, lox.logdict({"loss": np.array([1.0, 0.5 + lr])}, {"step": {"loss": np.arange(2)}}))
    ...     logger.finish(state)
    >>> logger.close()
    >>> figure = plot_figure(folder, label="config.lr", logy=False, ylim=(0, 1.2))
    >>> [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    ['0.01', '0.1']
    >>> figure.axes[0].get_yscale(), [float(limit) for limit in figure.axes[0].get_ylim()]
    ('linear', [0.0, 1.2])
    >>> import matplotlib.pyplot as plt; plt.close(figure)
    """
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError(
            "plotting needs matplotlib, which is not installed: run `pip install 'jax-lox[plot]'`."
        ) from error
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"the smoothing must be from 0 (none) to below 1, got {smoothing!r}.")
    if ylim is not None:
        ylim = _checked_ylim(ylim, logy)

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
    if where is not None or best is not None:
        by_run = _choose_by_table(path, by_run, where, best)
    by_run = _without_rendered(by_run, keys)
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
    if label is None:
        colours = {run: f"C{i % 10}" for i, run in enumerate(plotted)}
        legend_of, rank = dict(labels), {}
    else:
        colours, legend_of, rank, label = _by_metadata(path, plotted, infos, label)  # label: as resolved

    drawn: list[_Curve] = []
    averaged = False
    for number, (k, (with_key, against_index)) in enumerate(curves):
        style = ("-", "--", ":", "-.")[number % 4]
        # With --label, in the values' order (so is the legend), runs without the key last.
        for run, logs in sorted(with_key.items(), key=lambda item: rank.get(legend_of[item[0]], len(rank))):
            values = np.asarray(logs[k])
            shape = values.shape[1:]
            suffix = f" {k}" if len(keys) > 1 else ""
            if shape and int(np.prod(shape)) != 1:
                suffix += f" (mean of {'×'.join(map(str, shape))} values)"
                averaged = True
            values = values.reshape(values.shape[0], -1).mean(axis=1)  # arrays: their mean per event
            if against_index:
                x = np.arange(values.shape[0])
            else:
                x = np.asarray(logs.steps[step][k])
                kept = x != NO_STEP  # events that did not carry this step
                x, values = x[kept], values[kept]
            drawn.append(_Curve(labels[run] + (f" {k}" if len(keys) > 1 else ""), x, values, colours[run], style,
                                legend_of[run] + suffix))

    x_name = "event" if indexed else step
    log = _log_scale(drawn, logy, ylim, x_name)
    figure, axes = plt.subplots(figsize=(7, 4))
    in_legend = set()
    for curve in drawn:
        # With --label, one legend entry per value (and key): the other curves are named but left out of it.
        line_label = curve.legend if curve.legend not in in_legend else f"_{curve.name}"
        in_legend.add(curve.legend)
        values, colour, style = curve.values, curve.colour, curve.style
        if smoothing and values.size >= MIN_SMOOTHED:
            axes.plot(curve.x, values, color=colour, linestyle=style, alpha=0.25, linewidth=0.8)
            axes.plot(curve.x, _smoothed(values, smoothing), color=colour, linestyle=style, label=line_label)
        else:  # a sparse series (an evaluation per epoch) with its points marked
            marker = "o" if values.size < MIN_SMOOTHED else None
            axes.plot(curve.x, values, color=colour, linestyle=style, marker=marker, markersize=3, label=line_label)
    if log:
        axes.set_yscale("log")
    chosen = ylim is not None
    if ylim is None:
        ylim = default_ylim([curve.values for curve in drawn], log=log)
    if ylim is not None:
        axes.set_ylim(*ylim)
    _mark_leaving(axes, drawn, x_name, note=not chosen)
    axes.set_xlabel("event index (no step was logged)" if indexed else step)
    axes.set_ylabel(", ".join(keys) + (" (mean per event)" if averaged else ""))
    if title:
        axes.set_title(title)
    axes.legend(fontsize="small", title=label, title_fontsize="small")
    figure.tight_layout()
    return figure


class PlotNote(UserWarning):
    """What `plot_figure` says about a plot that the plot does not show: the
    curves that leave the y axis' default limits, the keys of images, text...
    left out (``lox plot`` prints it on stderr)."""


class _Curve(NamedTuple):
    name: str  # the run's label, and the key's where there are several
    x: np.ndarray
    values: np.ndarray  # raw, as logged (a curve drawn smoothed has them faint behind it)
    colour: str
    style: str
    legend: str  # its legend entry (shared by the runs of one value with --label)


# How far beyond the middle half of the values the default y limits reach: in spreads of it, and on a log axis
# at least this many decades (a loss falling fast from 10 to 0.001 is shown whole).
FENCE = 3.0
MIN_DECADES = 4.0


def default_ylim(series: Sequence[np.ndarray], log: bool = False) -> tuple[float, float] | None:
    """The y limits that `plot_figure` gives the curves `series` where none are
    chosen, leaving out values far from the rest; None where no value is far
    (matplotlib's own limits, which show every finite value, are kept).

    Reckoned on the axis' scale (log10 of the values on a log axis) over the
    finite values of every curve, each curve weighing the same however many
    points it has: the middle half of them spans Q1 to Q3; the limits reach
    beyond it at most `FENCE` times ``Q3 - Q1``, and at least `MIN_DECADES`
    decades on a log axis, ``FENCE * max(|Q1|, |Q3|)`` on a linear one; they
    are the least and greatest values within that reach, padded by 5 %. A run
    that diverges (a loss of 2e36) then leaves the plot instead of flattening
    the others, while a loss falling by up to 4 decades is shown whole,
    however fast; values far out are left out as long as they weigh less than
    a quarter of all.

    >>> low, high = default_ylim([np.array([3.0, 1.0, 0.5]), np.array([3.0, 1.0, 2e36])], log=True)
    >>> round(low, 2), round(high, 2)  # 0.5 to 3, padded: 2e36 leaves the plot
    (0.46, 3.28)
    >>> default_ylim([np.array([3.0, 1.0, 0.5, np.nan, np.inf])]) is None  # nothing far: matplotlib's limits
    True
    """
    kept, weights = [], []
    for values in series:
        values = np.asarray(values, dtype=float)
        values = values[np.isfinite(values) & (values > 0)] if log else values[np.isfinite(values)]
        if values.size:
            kept.append(np.log10(values) if log else values)
            weights.append(np.full(values.size, 1.0 / values.size))
    if not kept:
        return None
    values, weights = np.concatenate(kept), np.concatenate(weights)
    order = np.argsort(values, kind="stable")
    values, cumulative = values[order], np.cumsum(weights[order]) / len(kept)
    q1, q3 = (values[min(np.searchsorted(cumulative, q - 1e-12), values.size - 1)] for q in (0.25, 0.75))
    reach = max(FENCE * (q3 - q1), MIN_DECADES) if log else FENCE * max(q3 - q1, abs(q1), abs(q3))
    within = values[(values >= q1 - reach) & (values <= q3 + reach)]
    low, high = float(within[0]), float(within[-1])
    if within.size == values.size or low == high:
        return None
    pad = 0.05 * (high - low)
    low, high = low - pad, high + pad
    return (float(10**low), float(10**high)) if log else (low, high)


def _checked_ylim(ylim, logy: bool | None) -> tuple[float, float]:
    try:
        low, high = (float(limit) for limit in ylim)
    except (TypeError, ValueError):
        raise ValueError(f"the y limits (--ylim LO HI) are two numbers, got {ylim!r}.") from None
    if not (np.isfinite(low) and np.isfinite(high) and low < high):
        raise ValueError(f"the y limits (--ylim LO HI) must be finite with LO below HI, got {low:g} {high:g}.")
    if logy and low <= 0:
        raise ValueError(f"a log y axis (--logy) cannot start at {low:g}: give --ylim a LO above 0, or plot on a "
                         "linear axis (--no-logy).")
    return low, high


def _log_scale(drawn: list[_Curve], logy: bool | None, ylim: tuple[float, float] | None, x_name: str) -> bool:
    """Whether the y axis is a log one: `logy`, or (None) where every finite value is positive."""
    if logy is False:
        return False
    if logy is None:
        finite = [curve.values[np.isfinite(curve.values)] for curve in drawn]
        return (ylim is None or ylim[0] > 0) and any(v.size for v in finite) and all(bool(np.all(v > 0))
                                                                                     for v in finite)
    nonpositive = [curve for curve in drawn if np.any(curve.values <= 0)]  # NaN compares False: a gap
    if nonpositive:
        curve = nonpositive[0]
        first = int(np.argmax(curve.values <= 0))
        more = f" (and {len(nonpositive) - 1} more curve(s))" if len(nonpositive) > 1 else ""
        raise ValueError(
            f"a log y axis (--logy) cannot show values <= 0, and {curve.name} has {curve.values[first]:g} at "
            f"{x_name} {curve.x[first]}{more}; plot on a linear axis (--no-logy), or leave the run out "
            "(--run, --where)."
        )
    return True


def _mark_leaving(axes, drawn: list[_Curve], x_name: str, note: bool) -> None:
    """Mark where each curve leaves the y axis' limits (a triangle on the edge
    it crosses, in its colour) and, with `note`, name those curves in a `PlotNote`."""
    low, high = map(float, axes.get_ylim())  # matplotlib's own where none were set
    axes.set_ylim(low, high)  # kept: the marks on the edges must not widen them
    leaving = []
    for curve in drawn:
        values = curve.values
        for beyond, edge, marker, word, extreme in ((values > high, high, "^", "up", np.nanmax),
                                                    (values < low, low, "v", "down", np.nanmin)):
            if np.any(beyond):
                first = int(np.argmax(beyond))
                axes.plot([curve.x[first]], [edge], marker=marker, color=curve.colour, markersize=7,
                          linestyle="none", clip_on=False, label="_leaves")
                leaving.append(f"{curve.name} ({word} to {extreme(values):.3g}, from {x_name} {curve.x[first]})")
    if note and leaving:
        warnings.warn(
            f"the y axis shows {low:.3g} to {high:.3g}, where most values are; these curves leave it: "
            f"{', '.join(leaving)}. Choose the limits with --ylim LO HI.",
            PlotNote, stacklevel=3,
        )


def _by_metadata(path: str, plotted: list[str], infos: dict, key: str) -> tuple[dict, dict, dict, str]:
    """Each run's colour and legend entry by its value of the metadata `key`
    (dotted for nested metadata), each entry's place in the legend, and the
    key (``config.lr`` where `key` is ``lr`` and no other ends so)."""
    metadata = {run: dict(flatten(infos.get(run, {}).get("metadata") or {})) for run in plotted}
    known = sorted({name for values in metadata.values() for name in values})
    ending = [name for name in known if name.endswith(f".{key}")]
    if not any(key in values for values in metadata.values()) and len(ending) == 1:
        key = ending[0]  # `lr` for `config.lr`, as `lox runs --where` reads it
    if not any(key in values for values in metadata.values()):
        raise LookupError(
            f"no run plotted from {path!r} has the metadata key {key!r} (--label); their metadata keys are: "
            f"{', '.join(known) or 'none'} (nested keys joined with dots, e.g. config.lr)."
        )
    values = {run: metadata[run][key] for run in plotted if key in metadata[run]}
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values.values())
    shown = {run: str(value) for run, value in values.items()}
    order = sorted(set(shown.values()), key=float) if numeric else sorted(set(shown.values()))
    if len(order) <= 10:
        palette = {text: f"C{i}" for i, text in enumerate(order)}
    else:  # more values than distinct colours: spread along a colour map, in order
        from matplotlib import colormaps, colors

        colour_map = colormaps["viridis"]
        palette = {text: colors.to_hex(colour_map(i / (len(order) - 1))) for i, text in enumerate(order)}
    legend = {run: shown.get(run, NOT_SET) for run in plotted}
    colours = {run: palette.get(legend[run], "grey") for run in plotted}
    return colours, legend, {text: i for i, text in enumerate(order)}, key


_ARTICLES = {"image": "an ", "audio": ""}


def _without_rendered(by_run: dict[str, logdict], keys: list[str]) -> dict[str, logdict]:
    """The runs' logs without the keys of kinds that are not curves (images,
    text...), named in a `PlotNote`; a LookupError where `keys` ask for one."""
    found: dict[str, str] = {}  # key -> its kind
    for logs in by_run.values():
        found.update((key, kind) for key, kind in logs.kind.items() if kind in RENDERED_KINDS)
    if not found:
        return by_run
    for key in keys:
        owner = next((k for k in found if key == k or key.startswith(k + "/")), None)
        if owner is not None:
            curves = sorted({k for logs in by_run.values() for k in logs if k not in found})
            kind = found[owner]
            what = "text" if kind == "text" else f"{_ARTICLES.get(kind, 'a ')}{kind} (logged as lox.{kind}(...))"
            raise LookupError(
                f"{key!r} holds {what}, which lox plot does not draw as a curve; see it in a tracker "
                "(TensorBoard, W&B...) or read it with lox.load. The keys lox plot draws: "
                f"{', '.join(curves) or 'none'}."
            )
    warnings.warn(
        "left out, not curves: " + ", ".join(f"{key} ({kind})" for key, kind in found.items()),
        PlotNote, stacklevel=3,
    )
    return {run: logs.filter(lambda k, _: k not in found) for run, logs in by_run.items()}


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


def _choose_by_table(path: str, by_run: dict, where: str | None, best: tuple[int, str] | None) -> dict:
    """The runs of `by_run` that `where` and `best` choose from the table of runs,
    in its order (best first): the best of those runs, not of every run."""
    table = run_table(path)
    table = table.filter(pa.array([run in by_run for run in table["run_id"].to_pylist()], pa.bool_()))
    chosen = select(table, where=where, best=best)["run_id"].to_pylist()
    ordered = {run: by_run[run] for run in chosen if run in by_run}
    if not ordered:
        asked = " and ".join(part for part in (where is not None and f"--where {where!r}",
                                               best is not None and f"--best {best[0]} {best[1]}") if part)
        raise LookupError(f"no run under {path!r} matches {asked}; `lox runs {path}` shows the runs' columns "
                          "and values.")
    return ordered


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
