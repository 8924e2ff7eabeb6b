"""lox-jsonl: a lox backend that writes each run as a JSON Lines file.

``lox.loggers.from_config("jsonl:logs")`` writes run R to ``logs/R.jsonl``: a
first line with the run, then one JSON object per logged event, in the order
the tables arrive (the rows of each table are ordered by step)::

    {"run_id": "lox-20250101-120000-a1b2c3-0", "name": "lox-0", "group": "lox-20250101-120000-a1b2c3", ...}
    {"key": "loss", "steps": {"step": 0}, "value": 0.25}
    {"key": "w", "steps": {"step": 0}, "value": [0.5, -1.0, 2.0]}

Scalars come from the table's float64 ``value``; arrays, 64-bit integers and
complex numbers from its raw ``data`` (arrays as nested lists, complex numbers
as strings). ``jsonl:logs?arrays=0`` writes scalars only. Keys are only ever
written inside the files, never used in a path.
"""

from __future__ import annotations

import json
import os

import ml_dtypes  # noqa: F401 - lets NumPy find bfloat16 & co. by name
import numpy as np

from lox_backends import hooks
from lox_backends.plugin.config import Option
from lox_core import schema


class JsonlBackend(hooks.Backend):
    """Writes run R to ``TARGET/R.jsonl``; TARGET defaults to ``lox-jsonl``."""

    OPTIONS = {"arrays": Option("write array-valued events too (0: scalars only)", "flag", True)}
    EXAMPLE = "jsonl:logs?arrays=0"

    def __init__(self, target=None, options=None):
        super().__init__(target, options)  # checks the options: self.settings["arrays"] is True or False
        self.arrays = self.settings["arrays"]
        self.folder = os.path.abspath(target or "lox-jsonl")  # a later os.chdir changes nothing
        self.files = {}  # run_id -> the run's open file

    def open_run(self, run: hooks.RunInfo) -> None:
        """Create the run's file and write its first line."""
        self._file(run)

    def write(self, run: hooks.RunInfo, table) -> None:
        """One line per row of a table (a pyarrow.Table of one run's events)."""
        step_names = schema.step_names(table)
        file = self._file(run)
        for row in table.to_pylist():
            if row["shape"] and not self.arrays:
                continue
            record = {
                "key": row["key"],
                "steps": {name: row[name] for name in step_names if row[name] is not None},
                "value": row["value"] if row["data"] is None else _decode(row),
            }
            file.write(_dumps(record) + "\n")

    def flush(self) -> None:
        """Hand everything written so far to the operating system."""
        for file in self.files.values():
            file.flush()

    def close_run(self, run: hooks.RunInfo) -> None:
        """The run has finished: close its file."""
        file = self.files.pop(run.run_id, None)
        if file is not None:
            file.close()

    def close(self) -> None:
        """Close the files of runs that were never finished."""
        while self.files:
            self.files.popitem()[1].close()

    def _file(self, run: hooks.RunInfo):
        """The run's open file; opening it writes the run's line first."""
        if run.run_id not in self.files:
            name = f"{run.run_id}.jsonl"
            if os.path.basename(name) != name or name.startswith("."):
                raise ValueError(f"run id {run.run_id!r} cannot be a file name.")
            os.makedirs(self.folder, exist_ok=True)
            file = open(os.path.join(self.folder, name), "a", encoding="utf-8")
            info = {"run_id": run.run_id, "name": run.name, "group": run.group, "index": run.index}
            file.write(_dumps({**info, "metadata": run.metadata}) + "\n")
            self.files[run.run_id] = file
        return self.files[run.run_id]


def _decode(row):
    """The event of a row without a ``value``, from its raw bytes, as nested lists."""
    return np.frombuffer(row["data"], np.dtype(row["dtype"])).reshape(row["shape"]).tolist()


def _dumps(record):
    return json.dumps(record, default=str)  # complex numbers (and odd metadata) as strings


@hooks.hookimpl
def lox_backends():
    """The backends this plugin offers; lox asks once, when it first needs a backend."""
    return [hooks.BackendSpec("jsonl", JsonlBackend, description="one JSON Lines file per run (jsonl:DIR)")]
