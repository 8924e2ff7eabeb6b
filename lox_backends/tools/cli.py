"""The ``lox`` command.

    lox demo [--dir lox-runs] [--seeds 4] [--epochs 20]   a real training run, saved and plotted
    lox plot RUN_DIR --key loss -o loss.png                 one curve per run and key (--run, --group choose runs)
    lox backends                                            installed backends and their packages
    lox runs RUN_DIR [--where COND] [--sort COLUMN]         the table of runs: status, metadata, summaries
    lox sync RUN_DIR --to SPEC [--timeout 30]               send saved runs to a tracker (what is missing)
    lox --version

RUN_DIR may be a folder in a bucket: s3://bucket/runs, gs://bucket/runs (see lox_backends.runstore.filesystems).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import io
import json
import math
import shutil
import sys
import warnings

import pyarrow as pa
import pyarrow.csv as pa_csv

from lox_backends.plugin.config import mask_secrets
from lox_backends.plugin.registry import registry
from lox_backends.runstore import reader
from lox_backends.runstore.layout import DEFAULT_DIR
from lox_backends.runstore.table import STATUSES, column_named, run_table, select
from lox_backends.tools.demo import run_demo
from lox_backends.tools.plot import PlotNote, plot_runs
from lox_backends.trackers.sync import DEFAULT_SYNC_TIMEOUT, SyncError, SyncTimeout, sync


def version() -> str:
    """The installed version of lox (its distribution is jax-lox)."""
    try:
        return importlib.metadata.version("jax-lox")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown (not installed: pip install -e .)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lox", description="lox: accelerated logging for JAX.")
    parser.add_argument("--version", action="version", version=f"lox {version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="train a small model with several seeds, log it, plot it",
        description=(
            "Train a two-layer network on y = sin(3x) with minibatch SGD, one run per seed, all seeds "
            "at once under jax.vmap. Every step's loss and gradient norm and every epoch's validation "
            "loss are logged to 'console,parquet:DIR'; at the end the loss curves are plotted into "
            "DIR/loss.png (plotting needs matplotlib: pip install 'jax-lox[plot]')."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    demo.add_argument("--dir", default=DEFAULT_DIR, help="where the runs are saved")
    demo.add_argument("--seeds", type=int, default=4, help="how many seeds (runs) are trained side by side")
    demo.add_argument("--epochs", type=int, default=20, help="training epochs")
    demo.add_argument("--steps", type=int, default=100, help="SGD steps per epoch")

    plot = commands.add_parser(
        "plot",
        help="plot keys of saved runs, one curve per run and key",
        description=(
            "Plot keys of saved runs against a step, one curve per run and key, into a PNG (needs matplotlib: "
            "pip install 'jax-lox[plot]'). Curves are labelled by run name, or GROUP/NAME where runs of "
            "different groups share a name; a key holding arrays is plotted as the mean of each event's "
            "values, which its label says."
        ),
    )
    plot.add_argument("path", help="a folder of runs, or one run's folder (a local path, or s3://... gs://...)")
    plot.add_argument("--key", action="append", dest="keys", metavar="KEY",
                      help="a key to plot (default: loss; repeat for several, e.g. --key loss --key val_loss)")
    plot.add_argument("--smooth", type=float, default=0.0, metavar="WEIGHT",
                      help="smooth each curve with an exponential moving average of this weight, from 0 (the "
                           "default: none) to below 1, the raw curve faint behind it")
    plot.add_argument("--title", default=None, help="the plot's title (default: none)")
    plot.add_argument("-o", "--output", default=None,
                      help="PNG file (default: KEY.png in PATH; in the current folder for a bucket)")
    plot.add_argument("--step", default="step",
                      help="the step name on the x axis (default: step; a key logged without any step is "
                           "plotted against its event index)")
    plot.add_argument("--run", action="append", dest="runs", metavar="RUN",
                      help="plot only this run: its name, GROUP/NAME or run id (repeat for several)")
    plot.add_argument("--group", action="append", dest="groups", metavar="GROUP",
                      help="plot only the runs of this group (repeat for several)")
    plot.add_argument("--logy", action=argparse.BooleanOptionalAction, default=None,
                      help="a log y axis (refused where a value is <= 0), or with --no-logy a linear one "
                           "(default: log where every finite value is positive)")
    plot.add_argument("--ylim", nargs=2, type=float, metavar=("LO", "HI"), default=None,
                      help="the y axis' limits (default: those of most values; a curve far from the rest, such "
                           "as a diverged run, leaves the plot, marked on its edge and named on stderr)")
    plot.add_argument("--label", default=None, metavar="KEY",
                      help="colour and label the curves by this metadata key's value, one colour per value "
                           "(nested keys with dots, e.g. config.lr)")
    plot.add_argument("--where", default=None, metavar="CONDITION",
                      help="plot only the runs whose row in the table of runs (lox runs) meets this, e.g. "
                           "\"lr < 0.1 and status == 'finished'\"")
    plot.add_argument("--best", nargs=2, default=None, metavar=("N", "COLUMN"),
                      help="plot only the N runs of least COLUMN in the table of runs, e.g. --best 3 loss.min")

    commands.add_parser("backends", help="list installed backends and what the missing ones need")

    sync = commands.add_parser(
        "sync",
        help="send saved runs (a tracker's local log, or any parquet folder) to a tracker, skipping what it has",
    )
    sync.add_argument("path", help="a folder of runs (e.g. lox-runs, s3://bucket/runs), or one run's folder")
    sync.add_argument(
        "--to", required=True, metavar="SPEC", help="the tracker, e.g. 'mlflow:http://127.0.0.1:5000?experiment=demo'"
    )
    sync.add_argument(
        "--timeout", type=float, default=DEFAULT_SYNC_TIMEOUT, metavar="SECONDS",
        help="give up when one step (a call to the tracker, reading a run's files) takes longer than this "
             f"(default: {DEFAULT_SYNC_TIMEOUT:g}); nothing is recorded as sent that was not",
    )

    runs = commands.add_parser(
        "runs",
        help="the table of runs of a folder: name, run id, status, start, duration, metadata, summaries",
        description=(
            "Print the table of runs saved in a folder (by the parquet backend, or a tracker's local log), "
            "oldest first, one line each: name, run id, status (running, finished, failed, or killed: its process "
            "died, or ended by SIGTERM), when it started (UTC), how long it ran (seconds), then its metadata "
            "(nested keys with dots, config.lr), the last, min, max and count of each key of scalars it logged "
            "(loss.min...) and its logger.summary values: the table lox.runs(DIR) returns. Columns that do not fit "
            "the terminal are left out, and named."
        ),
    )
    runs.add_argument("path", help="a folder of runs (e.g. lox-runs, s3://bucket/runs), or one run's folder")
    runs.add_argument("--where", default=None, metavar="CONDITION",
                      help="only the runs that meet this: comparisons of a column with a number or a quoted string, "
                           "joined by 'and', e.g. \"lr < 0.1 and status == 'finished'\"")
    runs.add_argument("--sort", default=None, metavar="COLUMN",
                      help="order by this column (descending with a leading '-': --sort=-acc.max)")
    runs.add_argument("--status", default=None, choices=STATUSES, help="only the runs of this status")
    runs.add_argument("--columns", default=None, metavar="A,B,...",
                      help="print these columns (after name and run id), e.g. --columns lr,loss.min")
    runs.add_argument("--format", default="text", choices=("text", "csv", "json"),
                      help="text (the default: a table for reading), csv or json (every column, for scripts)")
    runs.add_argument("--short", action="store_true",
                      help="the listing of earlier lox: name, run id, status, created (UTC), rows")

    args = parser.parse_args(argv)
    if args.command is None:  # bare `lox`
        parser.print_help()
        return 0
    try:
        _run(args)
    except (LookupError, OSError, ValueError, ImportError) as error:
        # What the user can fix (a wrong path or key, a missing package): the message, not a traceback.
        parser.exit(2, f"lox {args.command}: error: {error.args[0] if error.args else error}\n")
    return 0


def _run(args) -> None:
    if args.command == "demo":
        run_demo(args.dir, seeds=args.seeds, epochs=args.epochs, steps=args.steps)
    elif args.command == "plot":
        with warnings.catch_warnings(record=True) as notes:
            warnings.simplefilter("always", PlotNote)
            output = plot_runs(
                args.path, key=args.keys or ["loss"], output=args.output, step=args.step, runs=args.runs,
                groups=args.groups, smoothing=args.smooth, title=args.title, logy=args.logy,
                ylim=args.ylim and tuple(args.ylim), label=args.label, where=args.where,
                best=args.best and _best(*args.best),
            )
        for note in notes:
            if issubclass(note.category, PlotNote):  # what the plot leaves out (a diverged run): a line
                print(f"lox plot: note: {note.message}", file=sys.stderr)
            else:  # any other warning, as it would have been shown
                warnings.showwarning(note.message, note.category, note.filename, note.lineno)
        print(output)
    elif args.command == "backends":
        print(backends_table())
    elif args.command == "runs":
        if args.short:
            print(runs_table(args.path))
        else:
            table = select(run_table(args.path), where=args.where, sort=args.sort, status=args.status)
            if args.columns is not None:
                chosen = [column_named(table, name.strip(), "--columns") for name in args.columns.split(",")
                          if name.strip()]
                table = table.select(list(dict.fromkeys(["name", "run_id", *chosen])))
            sys.stdout.write(run_listing(table, args.format))
    elif args.command == "sync":
        try:
            done, error = sync(args.path, args.to, timeout=args.timeout), None
        except SyncError as failure:
            done, error = failure.done, failure
        total_files = total_rows = 0
        for folder, files, rows in done:
            print(f"{folder}: sent {files} batch file(s), {rows} row(s)")
            total_files, total_rows = total_files + files, total_rows + rows
        print(f"sent {total_files} batch file(s), {total_rows} row(s) to {mask_secrets(args.to)}")
        if isinstance(error, SyncTimeout):  # its message says what to do
            print(f"lox sync: error: {error}", file=sys.stderr)
            raise SystemExit(1)
        if error is not None:
            print(f"lox sync: error: {error}\nRun `lox sync` again once the cause is fixed: it sends only what "
                  "is missing.", file=sys.stderr)
            raise SystemExit(1)


def _best(count: str, column: str) -> tuple[int, str]:
    """``--best N COLUMN``'s values, N a whole number."""
    try:
        return int(count), column
    except ValueError:
        raise ValueError(f"--best takes how many runs and a column, e.g. --best 3 loss.min; got {count!r} "
                         "runs.") from None


def run_listing(table: pa.Table, form: str = "text", width: int | None = None) -> str:
    """A table of runs (`lox_backends.runstore.table.run_table`) as ``lox runs``
    prints it: ``csv``, ``json`` (a list of objects), or ``text``: name, run id,
    status, start, duration first, values but names and run ids cut to `VALUE_WIDTH` characters,
    and as many columns as fit `width` characters (the terminal's), the others
    named below the table."""
    if form == "csv":  # a list or dict value (a PRNG key, a list of layer sizes) as JSON in its cell
        columns = [pa.array([None if v is None else json.dumps(_finite_tree(v), default=_json_value)
                             for v in column.to_pylist()], pa.string()) if _nested(column.type) else column
                   for column in table.columns]
        sink = io.BytesIO()
        pa_csv.write_csv(pa.table(columns, names=table.column_names), sink)
        return sink.getvalue().decode()
    if form == "json":
        rows = [{k: _finite(v) for k, v in row.items()} for row in table.to_pylist()]
        return json.dumps(rows, default=_json_value, allow_nan=False) + "\n"
    first = [name for name in ("name", "run_id", "status", "start", "duration") if name in table.column_names]
    last = [name for name in ("group", "end") if name in table.column_names]
    others = [n for n in table.column_names if n not in first and n not in last]
    # Lists and dicts (a PRNG key) are wide and seldom compared: after the numbers.
    nested = [n for n in others if _nested(table.schema.field(n).type)]
    names = [*first, *(n for n in others if n not in nested), *nested, *last]
    width = width or shutil.get_terminal_size((160, 24)).columns
    shown, used = [], 0
    for name in names:
        cells = [_cell(value, whole=name in ("name", "run_id")) for value in table.column(name).to_pylist()]
        header = _HEADERS.get(name) or name
        column_width = max([len(header), *map(len, cells)])
        if shown and used + column_width > width:
            break
        shown.append((header, cells, column_width))
        used += column_width + 2
    lines = ["  ".join(f"{header:<{w}}" for header, _, w in shown).rstrip()]
    for i in range(table.num_rows):
        lines.append("  ".join(f"{cells[i]:<{w}}" for _, cells, w in shown).rstrip())
    left = names[len(shown):]
    if left:
        lines.append(f"({len(left)} more column{'s' if len(left) > 1 else ''}: {', '.join(left)}; choose with "
                     "--columns, or --format csv for all)")
    return "\n".join(lines) + "\n"


VALUE_WIDTH = 24  # characters of a value in the text table
_HEADERS = {"start": "start (UTC)", "duration": "duration (s)"}  # columns whose unit the text table says


def _cell(value: object, whole: bool = False) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime.datetime):
        text = value.astimezone(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    elif isinstance(value, float):
        text = f"{value:.6g}"
    else:
        text = str(value)
    return text if whole or len(text) <= VALUE_WIDTH else text[:VALUE_WIDTH - 3] + "..."


def _nested(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_struct(kind) or pa.types.is_map(kind)


def _finite_tree(value):
    if isinstance(value, list):
        return [_finite_tree(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite_tree(v) for k, v in value.items()}
    return _finite(value)


def _finite(value):
    """A non-finite float as the string JSON readers take (as in ``_run.json``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    return value


def _json_value(value):
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    return str(value)


def runs_table(path: str) -> str:
    """The runs at `path`, oldest first, one line each under a header: name,
    run id, status (a run whose process died or got SIGTERM: killed), when it
    was created (UTC, to the second), and its rows where ``_run.json`` records them (once
    the run ended)."""
    rows = [("name", "run id", "status", "created (UTC)", "rows")]
    for info in reader.runs(path):
        rows.append((str(info.get("name", "")), str(info.get("run_id", "")), str(info.get("status", "")),
                     _utc(info.get("created")), str(info["rows"]) if "rows" in info else ""))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join("  ".join([*(f"{row[i]:<{widths[i]}}" for i in range(4)), row[4]]).rstrip() for row in rows)


def _utc(created) -> str:
    """An ISO-8601 time as ``YYYY-MM-DD HH:MM:SS`` in UTC (as it is, if it is not one)."""
    try:
        when = datetime.datetime.fromisoformat(str(created))
    except ValueError:
        return str(created or "")
    if when.tzinfo is not None:
        when = when.astimezone(datetime.timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M:%S")


def backends_table() -> str:
    """Every installed backend: name, package, whether its extra is installed."""
    rows = [("backend", "package", "installed", "description")]
    for name, offers in registry.offers().items():
        for offer in offers:
            missing = offer.spec.missing()
            if missing:
                status = f"no: {offer.spec.install_hint()}"
            else:
                status = "yes"
            if len(offers) > 1:
                status += f" (conflict: also claimed by {', '.join(o.package for o in offers if o is not offer)})"
            rows.append((name, offer.package, status, offer.spec.description))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}".rstrip() for r in rows)


if __name__ == "__main__":
    sys.exit(main())
