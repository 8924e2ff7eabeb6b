"""The ``console`` backend: the latest value of every key, per run.

On a terminal it is a live `rich` table, redrawn at most a few times per
second however fast logs arrive. Elsewhere (a file, CI) it prints plain lines,
at most one per run every `interval` seconds (option ``?interval=SECONDS``,
default 1) plus one when the run finishes, so a fast loop cannot flood the output.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from lox_backends import hooks
from lox_backends.config import Option, check_options
from lox_core import console, schema

OPTIONS = {
    "interval": Option("seconds between plain lines per run", "float", 1.0, minimum=0),
    "plain": Option("plain lines even on a terminal (1), or a live table there (0)", "flag", False),
}
EXAMPLE = "console?interval=5"


class ConsoleBackend(hooks.Backend):
    def __init__(self, target=None, options=None):
        super().__init__(target, options)
        if target:
            raise ValueError(f"the console backend takes no target (got 'console:{target}'). E.g. {EXAMPLE!r}.")
        settings = check_options("console", self.options, OPTIONS, EXAMPLE)
        self.interval: float = settings["interval"]
        self.stream = sys.stdout
        self.live_table = self.stream.isatty() and not settings["plain"]
        self._latest: dict[str, dict] = {}  # run_id → {key: (value, {step name: step})}
        self._names: dict[str, str] = {}
        self._printed_at: dict[str, float] = {}
        self._unshown: dict[str, bool] = {}  # updated since last shown
        self._live = None

    # --- receiving -----------------------------------------------------------------
    def open_run(self, run):
        self._names[run.run_id] = run.name
        self._latest[run.run_id] = {}

    def write(self, run, table):
        latest = self._latest.setdefault(run.run_id, {})
        if table.num_rows == 0:
            return
        keys = table.column("key").to_numpy(zero_copy_only=False)
        values = table.column("value").to_numpy(zero_copy_only=False)
        is_scalar = table.column("value").is_valid().to_numpy(zero_copy_only=False)
        step_columns = schema.step_names(table)
        # The last row of each key (rows arrive ordered by step).
        _, last_reversed = np.unique(keys[::-1], return_index=True)
        for i in sorted(len(keys) - 1 - last_reversed):
            steps = {n: table.column(n)[i].as_py() for n in step_columns}
            shown = values[i] if is_scalar[i] else "[array]"
            latest[str(keys[i])] = (shown, {n: v for n, v in steps.items() if v is not None})
        self._show(run)

    write_batch = write  # its name before lox 0.2: subclasses written then call super().write_batch

    def close_run(self, run):
        if self._unshown.get(run.run_id):
            self._show(run, force=True)  # the final values, if the last update was throttled

    def close(self):
        for run_id, unshown in self._unshown.items():
            if unshown:  # throttled values of runs that were never finished
                self._show(hooks.RunInfo(run_id, self._names.get(run_id, run_id), ""), force=True)
        if self._live is not None:
            self._live.stop()
            self._live = None

    # --- showing -------------------------------------------------------------------
    def _show(self, run, force: bool = False):
        now = time.monotonic()
        if not force and now - self._printed_at.get(run.run_id, -np.inf) < self.interval:
            self._unshown[run.run_id] = True
            return
        self._printed_at[run.run_id] = now
        self._unshown[run.run_id] = False
        if self.live_table:
            self._refresh_live()
        else:
            line = plain_line(self._latest.get(run.run_id, {}))
            print(f"[{self._names.get(run.run_id, run.name)}] {line}", file=self.stream, flush=True)

    def _refresh_live(self):
        from rich.live import Live
        from rich.table import Table
        from rich.text import Text

        table = Table(title="lox")
        keys = list(dict.fromkeys(k for latest in self._latest.values() for k in latest))
        step_names = list(
            dict.fromkeys(n for latest in self._latest.values() for _, steps in latest.values() for n in steps)
        )
        for column in ["run", *step_names, *keys]:
            table.add_column(column)
        for run_id, latest in self._latest.items():
            newest = {n: max((steps[n] for _, steps in latest.values() if n in steps), default="") for n in step_names}
            cells = [self._names.get(run_id, run_id), *[str(newest[n]) for n in step_names],
                     *[_short(latest[k][0]) if k in latest else "" for k in keys]]
            table.add_row(*[Text(c) for c in cells])  # Text: "[array]" is not rich markup
        if self._live is None:
            from rich.console import Console

            # Redrawn by rich at most 4 times per second, whatever the log rate.
            self._live = Live(table, console=Console(file=self.stream), refresh_per_second=4, auto_refresh=True)
            self._live.start()
        else:
            self._live.update(table)


def plain_line(latest: dict) -> str:
    """``[step=99] loss=0.1 acc=0.9 [step=100] val_loss=0.2``: the latest value
    of every key, keys that were logged at the same steps side by side."""
    groups: dict[tuple, dict] = {}
    for key, (value, steps) in latest.items():
        groups.setdefault(tuple(steps.items()), {})[key] = value
    return " ".join(console.format_event(values, dict(steps)) for steps, values in groups.items())


def _short(value) -> str:
    if isinstance(value, (float, np.floating)):
        return f"{value:.6g}"
    return str(value)


@hooks.hookimpl
def lox_backends():
    return [hooks.BackendSpec("console", ConsoleBackend, description="latest values per run, live on a terminal")]
