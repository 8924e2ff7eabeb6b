"""The runs a Logger opened: their `RunInfo`, numbers, names, and which are still open.

A run's number (its `RunInfo.index`) is what `LoggerState.run` holds on the
device; `Runs` maps it back to the run and keeps track of `finish`.

A run's id, which names its folder, is the group's (the logger's name, when,
random digits) and its number; a run named at `logger.init` has that name
in front instead of the logger's.

>>> runs = Runs("demo")
>>> first = runs.open({"lr": 0.1}, position=None)
>>> second = runs.open({"name": "sweep"}, position=1)
>>> first.name, second.name, first.group == second.group, runs[1] is second
('demo-0', 'sweep-1', True, True)
>>> first.run_id == f"{runs.group}-0", second.run_id == f"sweep-{runs.group.removeprefix('demo-')}-1"
(True, True)
>>> [run.index for run in runs.finishing([0])], runs.finishing([0])
([0], [])
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import threading
import time
from typing import Any

from lox_backends.plugin.hooks import RunInfo

MAX_NAME = 64  # characters of a name that a run id keeps (folder names are limited)


def safe_name(name: str) -> str:
    """`name` with only the characters a run id may hold: no ``..``, at most
    `MAX_NAME` characters."""
    safe = re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9_.-]+", "-", name))
    return safe[:MAX_NAME].strip("-.") or "lox"


def new_group(name: str) -> str:
    """A new group id: the logger's name, when, and random digits."""
    return f"{safe_name(name)}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


class Runs:
    """The runs of one Logger (thread-safe: runs open in JAX's callback threads)."""

    def __init__(self, name: str, group: str | None = None):
        self.name = name
        self.group = new_group(name) if group is None else group
        # What follows the logger's name in the group (when, random digits): a named run's id keeps it.
        self._stamp = self.group.removeprefix(f"{safe_name(name)}-")
        self._runs: list[RunInfo] = []
        self._open: set[int] = set()
        self._finished: set[int] = set()  # runs whose close reached the backends
        self._lock = threading.Lock()

    def open(self, metadata: dict[str, Any], position: int | None, named: RunInfo | None = None) -> RunInfo:
        """A new run. Without ``name`` in `metadata` it is named after the logger
        and its number; with one, seeds of one `init` (`position`) are numbered.
        A run the user named (``init(run_id=...)``) comes as `named`: its id,
        group and resume, and its name when `metadata` has none; this gives it
        its number."""
        with self._lock:
            number = len(self._runs)
            base = str(metadata.get("name", self.name))
            if named is not None:
                name = named.name if "name" not in metadata else base if position is None else f"{base}-{position}"
                run = dataclasses.replace(named, name=name, index=number, metadata=metadata)
            else:
                if "name" not in metadata:
                    name = f"{base}-{number}"  # unique within the logger
                    run_id = f"{self.group}-{number}"
                else:
                    name = base if position is None else f"{base}-{position}"
                    run_id = f"{safe_name(base)}-{self._stamp}-{number}"
                run = RunInfo(run_id, name, self.group, number, metadata)
            self._runs.append(run)
            self._open.add(number)
        return run

    def ids(self) -> tuple[set[str], set[str]]:
        """The ids of the runs this logger opened, and of those open now."""
        with self._lock:
            return {run.run_id for run in self._runs}, {self._runs[n].run_id for n in self._open}

    def __getitem__(self, number: int) -> RunInfo:
        with self._lock:
            return self._runs[number]

    def all(self) -> list[RunInfo]:
        with self._lock:
            return list(self._runs)

    def finishing(self, numbers: list[int], strict: bool = True) -> list[RunInfo]:
        """The runs among `numbers` that are still open, now marked as finishing;
        a number this logger never gave out is an error if `strict` (else ignored)."""
        with self._lock:
            unknown = [n for n in numbers if n >= len(self._runs) or n < 0]
            if unknown and not strict:
                numbers = [n for n in numbers if n not in unknown]
            elif unknown:
                raise ValueError(f"`logger.finish` got run number {unknown[0]}, which this logger did not open.")
            closing = [self._runs[n] for n in dict.fromkeys(numbers) if n in self._open]
            self._open.difference_update(numbers)
        return closing

    def any_open(self) -> bool:
        """Whether a run was opened and not finished (one lock-free read: a stale answer costs a tick)."""
        return bool(self._open)

    def open_numbers(self) -> list[int]:
        with self._lock:
            return sorted(self._open)

    def set_status(self, number: int, status: str) -> None:
        """How the run ended (`RunInfo.status`), as `all` shows it."""
        with self._lock:
            self._runs[number] = dataclasses.replace(self._runs[number], status=status)

    def mark_finished(self, run: RunInfo) -> None:
        """From the router, in order with the logs: what arrives later is refused."""
        self._finished.add(run.index)

    def check_open(self, run: RunInfo) -> None:
        if run.index in self._finished:
            raise ValueError(
                f"lox logger: logs for run {run.name!r} arrived after `logger.finish` closed it and were not "
                "written; log before `finish`, or open a new run with `logger.init`."
            )
