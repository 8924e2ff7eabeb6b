"""The ``lox`` command.

    lox demo [--dir lox-runs] [--seeds 4] [--epochs 20]   a real training run, saved and plotted
    lox plot RUN_DIR --key loss -o loss.png                 one curve per run
    lox backends                                            installed backends and their packages
    lox sync RUN_DIR --to SPEC                              send saved runs to a tracker (what is missing)

RUN_DIR may be a folder in a bucket: s3://bucket/runs, gs://bucket/runs (see lox_backends.storage).
"""

from __future__ import annotations

import argparse
import sys

from lox_backends.config import mask_secrets
from lox_backends.demo import run_demo
from lox_backends.plot import plot_runs
from lox_backends.registry import registry
from lox_backends.tracker import SyncError, sync


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lox", description="lox: accelerated logging for JAX.")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="train a small model with several seeds, log it, plot it")
    demo.add_argument("--dir", default="lox-runs", help="where the runs are saved (default: lox-runs)")
    demo.add_argument("--seeds", type=int, default=4)
    demo.add_argument("--epochs", type=int, default=20)
    demo.add_argument("--steps", type=int, default=100, help="SGD steps per epoch")

    plot = commands.add_parser("plot", help="plot one key of saved runs, one curve per run")
    plot.add_argument("path", help="a folder of runs, or one run's folder (a local path, or s3://... gs://...)")
    plot.add_argument("--key", default="loss")
    plot.add_argument("-o", "--output", default=None,
                      help="PNG file (default: KEY.png in PATH; in the current folder for a bucket)")
    plot.add_argument("--step", default="step", help="the step name on the x axis")

    commands.add_parser("backends", help="list installed backends")

    sync = commands.add_parser(
        "sync",
        help="send saved runs (a tracker's local log, or any parquet folder) to a tracker, skipping what it has",
    )
    sync.add_argument("path", help="a folder of runs (e.g. lox-runs, s3://bucket/runs), or one run's folder")
    sync.add_argument(
        "--to", required=True, metavar="SPEC", help="the tracker, e.g. 'mlflow:http://127.0.0.1:5000?experiment=demo'"
    )

    args = parser.parse_args(argv)
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
        print(plot_runs(args.path, key=args.key, output=args.output, step=args.step))
    elif args.command == "backends":
        print(backends_table())
    elif args.command == "sync":
        try:
            done, error = sync(args.path, args.to), None
        except SyncError as failure:
            done, error = failure.done, failure
        total_files = total_rows = 0
        for folder, files, rows in done:
            print(f"{folder}: sent {files} batch file(s), {rows} row(s)")
            total_files, total_rows = total_files + files, total_rows + rows
        print(f"sent {total_files} batch file(s), {total_rows} row(s) to {mask_secrets(args.to)}")
        if error is not None:
            print(f"lox sync: error: {error}\nRun `lox sync` again once the cause is fixed: it sends only what "
                  "is missing.", file=sys.stderr)
            raise SystemExit(1)


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
