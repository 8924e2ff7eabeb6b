"""The ``memory`` backend: keeps everything it is given in Python objects, for tests
and notebooks.

Nothing is written anywhere. Per run, `MemoryBackend` keeps the `RunInfo`
(``runs``), every table it was given in arrival order (``writes``), its summary
(``summaries``, as ``_run.json`` holds it: `lox_backends.runstore.summary`), and
whether the run was closed (``closed``); ``logs(run_id)`` turns a run back into
one `lox.logdict`, each key with its kind: images, video, audio and histograms
as what they were logged as (``logs["samples"].pixels``), text as NumPy string
arrays (``logs.kind`` names them). Summaries count scalar keys only.
"""

from __future__ import annotations

import pyarrow as pa

from lox_backends.plugin import hooks
from lox_backends.runstore.summary import Summary, of_table
from lox_core.arrow import concat_read, from_arrow
from lox_core.logdict import logdict


class MemoryBackend(hooks.Backend):
    """Keeps the runs and tables it receives in memory.

    Attributes:
      runs: ``{run_id: RunInfo}``, in the order the runs were opened.
      writes: ``{run_id: [pyarrow.Table, ...]}``: the tables of each run (spooled
        batches and blocks of tapped events), in arrival order.
      summaries: ``{run_id: {"keys": {series: {"last", "min", "max", "count"}},
        "values": {name: value}}}``: of each series of scalars its last, least and
        greatest value (NaN ignored) and count, and the values given by
        ``logger.summary``.
      closed: ``{run_id: bool}``: whether `close_run` was called for the run.
      flushes: how many times `flush` was called.
      is_closed: whether `close` was called.

    >>> import numpy as np, lox
    >>> from lox_backends import hooks
    >>> from lox_backends.memory import MemoryBackend
    >>> backend = MemoryBackend()
    >>> run = hooks.RunInfo("run-0", name="demo", group="g")
    >>> backend.open_run(run)
    >>> for step in range(3):
    ...     event = lox.logdict({"loss": np.array([float(step)])}, steps={"step": {"loss": np.array([step])}})
    ...     backend.write(run, event.to_arrow(run=run.run_id))
    >>> backend.summarize(run, {"best": 0.0})
    >>> backend.close_run(run)
    >>> backend.logs()["loss"].tolist(), backend.closed
    ([0.0, 1.0, 2.0], {'run-0': True})
    >>> backend.summaries["run-0"]
    {'keys': {'loss': {'last': 2.0, 'min': 0.0, 'max': 2.0, 'count': 3}}, 'values': {'best': 0.0}}
    """

    EXAMPLE = "memory"  # no options; named so in messages

    def __init__(self, target: str | None = None, options: dict[str, str] | None = None):
        super().__init__(target, options)
        if target:
            raise ValueError(f"the memory backend takes no target (got 'memory:{target}'); it keeps runs in "
                             "this process. Use 'memory'.")
        self.runs: dict[str, hooks.RunInfo] = {}
        self.writes: dict[str, list[pa.Table]] = {}
        self.closed: dict[str, bool] = {}
        self._summaries: dict[str, Summary] = {}
        self.flushes = 0
        self.is_closed = False

    def open_run(self, run: hooks.RunInfo) -> None:
        self._register(run)

    def write(self, run: hooks.RunInfo, table: pa.Table) -> None:
        self._register(run).append(table)
        self._summaries[run.run_id].add(of_table(table).get(run.run_id, {}))

    def summarize(self, run: hooks.RunInfo, values: dict) -> None:
        self._register(run)
        self._summaries[run.run_id].values.update(values)

    @property
    def summaries(self) -> dict[str, dict]:
        """Run id -> its summary, as ``_run.json`` holds it (see the class)."""
        return {run_id: summary.to_json() for run_id, summary in self._summaries.items()}

    def flush(self) -> None:
        self.flushes += 1

    def close_run(self, run: hooks.RunInfo) -> None:
        self._register(run)
        self.closed[run.run_id] = True

    def close(self) -> None:
        self.is_closed = True

    def _register(self, run: hooks.RunInfo) -> list:
        self.runs.setdefault(run.run_id, run)
        self._summaries.setdefault(run.run_id, Summary())
        self.closed.setdefault(run.run_id, False)
        return self.writes.setdefault(run.run_id, [])

    # --- reading back -------------------------------------------------------------
    def tables(self, run_id: str | None = None) -> list[pa.Table]:
        """The tables of a run, in arrival order."""
        return list(self.writes[self._run_id(run_id)])

    def logs(self, run_id: str | None = None) -> logdict:
        """One run's tables, as one logdict, in arrival order.

        `run_id` may be left out when the backend holds exactly one run.
        """
        parts = [from_arrow(table) for table in self.writes[self._run_id(run_id)]]
        return concat_read(parts) if parts else logdict()

    def _run_id(self, run_id: str | None) -> str:
        if run_id is None:
            if len(self.runs) == 1:
                return next(iter(self.runs))
            if not self.runs:
                raise ValueError("the memory backend holds no runs yet: nothing was logged to it.")
            raise ValueError(
                f"the memory backend holds {len(self.runs)} runs ({', '.join(map(repr, self.runs))}): "
                "pass the one you want, e.g. backend.logs(run_id)."
            )
        if not isinstance(run_id, str):
            raise TypeError(
                f"the memory backend takes a run's id (a str, such as `logger.runs()[0].run_id`), got "
                f"{type(run_id).__name__}; its runs are {', '.join(map(repr, self.runs)) or 'none'}."
            )
        if run_id not in self.runs:
            raise ValueError(
                f"the memory backend has no run {run_id!r}; its runs are {', '.join(map(repr, self.runs)) or 'none'}."
            )
        return run_id


@hooks.hookimpl
def lox_backends():
    return [
        hooks.BackendSpec(
            "memory",
            "lox_backends.memory:MemoryBackend",
            description="keeps runs in memory, for tests and notebooks",
        )
    ]
