"""The ``console`` backend: the latest value of every key, per run.

On a terminal it is a live `rich` table, redrawn at most a few times per
second however fast logs arrive, with each run's step rate and, given the
run's number of steps (``?total=N``), its progress and time left. Elsewhere
(a file, CI) it prints plain lines, at most one per run every `interval`
seconds (option ``?interval=SECONDS``, default 1) plus one when the run
finishes, so a fast loop cannot flood the output; with ``?every=N`` also one
at every N-th step, however fast the run, so a short run shows its course too.

An array shows as ``[array]``; a key of a kind that trackers render shows its
latest event in a few words (`lox_core.printing.media_summary`): ``img=image
uint8[4, 28, 28, 1]``, ``clip=audio float32[16000] at 16000 Hz``, ``w=histogram
of 1000 in [-3.2, 3.1]``, text as its first 60 characters on one line
(``note='step 3: the loss...'``), or its shape for a table of strings
(``text[2, 3]``).
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np
import pyarrow.compute as pc

from lox_backends.plugin import hooks
from lox_backends.plugin.config import Option
from lox_core import printing, schema
from lox_core.arrow import dictionary_codes, from_arrow
from lox_core.media import RENDERED_KINDS, Media, is_text
from lox_core.series import NO_STEP

OPTIONS = {
    "interval": Option("seconds between plain lines per run", "float", 1.0, minimum=0),
    "every": Option("a plain line also at every step that is a multiple of this", "int", None, minimum=1),
    "total": Option("the number of steps of a run, for its progress and time left on a terminal", "int", None,
                    minimum=1),
    "plain": Option("plain lines even on a terminal (1), or a live table there (0)", "flag", False),
}
EXAMPLE = "console?interval=5"


class ConsoleBackend(hooks.Backend):
    OPTIONS = OPTIONS
    EXAMPLE = EXAMPLE

    def __init__(self, target=None, options=None):
        super().__init__(target, options)
        if target:
            raise ValueError(f"the console backend takes no target (got 'console:{target}'). E.g. {EXAMPLE!r}.")
        settings = self.settings
        self.interval: float = settings["interval"]
        self.every: int | None = settings["every"]
        self.total: int | None = settings["total"]
        self.stream = sys.stdout
        self.live_table = self.stream.isatty() and not settings["plain"]
        self._latest: dict[str, dict] = {}  # run_id → {key: (value, {step name: step})}
        self._names: dict[str, str] = {}
        self._printed_at: dict[str, float] = {}
        self._unshown: dict[str, bool] = {}  # updated since last shown
        self._progress: dict[str, tuple[float, int, float, int]] = {}  # run_id → first and latest (time, step)
        self._live = None
        self._cannot_print = False  # printing failed (warned once until it works again)

    # --- receiving -----------------------------------------------------------------
    def open_run(self, run):
        self._names[run.run_id] = run.name
        self._latest[run.run_id] = {}

    def write(self, run, table):
        latest = self._latest.setdefault(run.run_id, {})
        if table.num_rows == 0:
            return
        primary = schema.primary_step(schema.step_names(table))
        column = None if primary is None else table.column(primary)
        if column is not None and column.null_count < len(column):
            steps = pc.fill_null(column, -1).to_numpy()  # -1: a row without the step (never a multiple)
            self._advance(run.run_id, int(steps.max()))
            if self.every and not self.live_table:  # a line at each N-th step the table holds, in order
                start = 0
                for end in _ends_of_multiples(steps, self.every):
                    _update(latest, table.slice(start, end - start))
                    self._show(run, force=True)
                    start = end
                table = table.slice(start)
                if table.num_rows == 0:
                    return
        _update(latest, table)
        self._show(run)

    def _advance(self, run_id: str, step: int) -> None:
        now = time.monotonic()
        first = self._progress.get(run_id)
        self._progress[run_id] = (now, step, now, step) if first is None else (first[0], first[1], now, step)

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
        try:
            if self.live_table:
                self._refresh_live()
            else:
                line = plain_line(self._latest.get(run.run_id, {}))
                print(f"[{self._names.get(run.run_id, run.name)}] {line}", file=self.stream, flush=True)
        except OSError as error:
            # A view, not a record: a closed pipe or a full disk under stdout must not stop training
            # (lox retries a backend's OSError and stops once it holds max_pending) nor print lines twice.
            if not self._cannot_print:
                self._cannot_print = True
                warnings.warn(f"lox: the console backend cannot print ({error}); it shows nothing more until it "
                              "can. The other backends keep every log.", RuntimeWarning, stacklevel=2)
            return
        self._cannot_print = False

    def _refresh_live(self):
        from rich.live import Live
        from rich.table import Table
        from rich.text import Text

        table = Table(title="lox")
        keys = list(dict.fromkeys(k for latest in self._latest.values() for k in latest))
        step_names = list(
            dict.fromkeys(n for latest in self._latest.values() for _, steps in latest.values() for n in steps)
        )
        progress = ["steps/s"] + (["progress"] if self.total else [])
        for column in ["run", *step_names, *progress, *keys]:
            table.add_column(column)
        for run_id, latest in self._latest.items():
            newest = {n: max((steps[n] for _, steps in latest.values() if n in steps), default="") for n in step_names}
            rate, left = _rate_and_left(self._progress[run_id], self.total) if run_id in self._progress else ("", "")
            cells = [self._names.get(run_id, run_id), *[str(newest[n]) for n in step_names], rate,
                     *([left] if self.total else []), *[_short(latest[k][0]) if k in latest else "" for k in keys]]
            table.add_row(*[Text(c) for c in cells])  # Text: "[array]" is not rich markup
        if self._live is None:
            from rich.console import Console

            # Redrawn by rich at most 4 times per second, whatever the log rate.
            self._live = Live(table, console=Console(file=self.stream), refresh_per_second=4, auto_refresh=True)
            self._live.start()
        else:
            self._live.update(table)


def _update(latest: dict, table) -> None:
    """`latest` (key → (value, steps)) with the last row of each key of `table`."""
    keys = table.column("key").to_numpy(zero_copy_only=False)
    values = table.column("value").to_numpy(zero_copy_only=False)
    is_scalar = table.column("value").is_valid().to_numpy(zero_copy_only=False)
    rendered = _rendered_rows(table)
    step_columns = schema.step_names(table)
    # The last row of each key (rows arrive ordered by step).
    _, last_reversed = np.unique(keys[::-1], return_index=True)
    last_rows = sorted(len(keys) - 1 - last_reversed)
    for i in last_rows:
        if rendered is not None and rendered[i]:
            continue
        steps = {n: table.column(n)[i].as_py() for n in step_columns}
        shown = values[i] if is_scalar[i] else ARRAY
        latest[str(keys[i])] = (shown, {n: v for n, v in steps.items() if v is not None})
    if rendered is not None:
        # The latest event of each image, histogram, text... key: its last rows only are decoded.
        logs = from_arrow(table.take([i for i in last_rows if rendered[i]]))
        for key, value in logs.items():
            steps = {n: int(per_key[key][-1]) for n, per_key in logs.steps.items() if key in per_key}
            event = value[-1] if isinstance(value, Media) else np.asarray(value[-1], value.dtype)  # text: not a str
            latest[key] = (event, {n: v for n, v in steps.items() if v != NO_STEP})


class _Array:
    """What an array shows as: ``[array]`` (not a str, which would show as text)."""

    def __str__(self) -> str:
        return "[array]"

    __repr__ = __str__


ARRAY = _Array()


def _rendered_rows(table) -> np.ndarray | None:
    """Which rows hold a kind that trackers render (text, images...); None where none does."""
    if schema.KIND not in table.column_names:
        return None  # schema version 1: scalars and arrays only
    codes, names = dictionary_codes(table.column(schema.KIND))
    wanted = [i for i, name in enumerate(names) if name in RENDERED_KINDS]
    if not wanted:
        return None  # the common case, decided from the dictionary alone
    found = np.isin(codes, wanted)
    return found if found.any() else None


def _ends_of_multiples(steps: np.ndarray, every: int) -> list[int]:
    """The row just after the last row of each step that is a multiple of
    `every`, for `steps` in increasing order (-1 where a row has none)."""
    at = np.flatnonzero((steps % every == 0) & (steps >= 0))
    if at.size == 0:
        return []
    last = at[np.append(steps[at][1:] != steps[at][:-1], True)]  # the last row of each such step
    return (last + 1).tolist()


def _rate_and_left(progress: tuple[float, int, float, int], total: int | None) -> tuple[str, str]:
    """A run's steps per second and, when its `total` is known, its progress and time left."""
    t0, s0, t, s = progress
    rate = (s - s0) / (t - t0) if t > t0 and s > s0 else None
    shown = "" if rate is None else f"{rate:,.0f}/s" if rate >= 10 else f"{rate:.2g}/s"
    if total is None:
        return shown, ""
    done = min(s + 1, total) / total
    left = "" if rate is None else f" {_duration(max(total - 1 - s, 0) / rate)} left"
    return shown, f"{done:.0%}{left}"


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


def plain_line(latest: dict) -> str:
    """``[step=99] loss=0.1 acc=0.9 [step=100] val_loss=0.2``: the latest value
    of every key, keys that were logged at the same steps side by side."""
    groups: dict[tuple, dict] = {}
    for key, (value, steps) in latest.items():
        groups.setdefault(tuple(steps.items()), {})[key] = value
    return " ".join(printing.format_event(values, dict(steps)) for steps, values in groups.items())


def _short(value) -> str:
    if isinstance(value, (float, np.floating)):
        return f"{value:.6g}"
    if isinstance(value, Media) or is_text(value):
        return printing.show(value)
    return str(value)


@hooks.hookimpl
def lox_backends():
    return [hooks.BackendSpec("console", ConsoleBackend, description="latest values per run, live on a terminal")]
