"""Runs named by the user, and resumed after a preemption: ``logger.init(run_id=..., resume=..., from_step=...)``.

A job killed at step 151 that saved a checkpoint at step 100 restarts with
``logger.init(key, run_id="job", resume="allow", from_step=100)``: the run
``job`` goes on (its folder, its group's batch files, its trackers' runs), and
what it logged from step 100 on before the kill is superseded by what it logs
now (`lox_backends.runstore.layout`, "Resumed runs").

`Resume` checks the arguments where `init` is called; `Resume.ids` names the
runs of one call (``job``; ``job-0``, ``job-1``... for vmapped seeds, the same
at every restart); `Resume.decide` looks for them where the Logger's backends
keep runs and says which are resumed, or why the call is refused.

>>> request = Resume.of("job", "allow", 100)
>>> request.ids(()), request.ids((2,))
(['job'], ['job-0', 'job-1'])
>>> request.decide(["job"], folders=[], opened={"job"}, open_now=set())
{'job'}
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from lox_backends.runstore import filesystems
from lox_backends.runstore.reader import existing_runs

RESUME = ("never", "allow", "must")
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")  # a folder name on every filesystem and store


@dataclasses.dataclass(frozen=True)
class Resume:
    """What ``init`` was asked: the run id, whether an existing run goes on
    (`resume`), and the step from which its earlier events are superseded."""

    run_id: str
    resume: str = "never"
    from_step: int | None = None
    process: int | None = None  # with processes="each": this process's index, in its run ids

    @classmethod
    def of(cls, run_id: Any, resume: Any, from_step: Any, process: int | None = None) -> Resume | None:
        """The request, checked (None without a `run_id`): a clear error names
        the argument that is wrong and what it takes."""
        if isinstance(resume, bool) or resume not in RESUME:
            hint = " (W&B spells it resume=True; lox's is resume='allow')" if resume is True else ""
            raise ValueError(f"`logger.init` got resume={resume!r}{hint}: resume is 'never' (the default: a run "
                             "id that exists is an error), 'allow' (go on with the run of that id if it exists) or "
                             "'must' (it must exist).")
        if run_id is None:
            if resume != "never" or from_step is not None:
                given = "resume=" + repr(resume) if resume != "never" else f"from_step={from_step!r}"
                raise ValueError(f"`logger.init` got {given} without a run_id: a run is resumed by its id. Pass "
                                 "run_id='...' (the same at every restart of the job).")
            return None
        if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
            raise ValueError(
                f"`logger.init` got run_id={run_id!r}: a run id is 1 to 64 letters, digits, '_', '.' or '-', "
                "starting with a letter or digit (it names the run's folder), e.g. run_id='sweep-lr3'."
            )
        if from_step is not None:
            if resume == "never":
                raise ValueError(f"`logger.init` got from_step={from_step!r} with resume='never': from_step says "
                                 "where a resumed run goes on. Pass resume='allow' (or 'must') with it.")
            from_step = _step(from_step)
        return cls(run_id, resume, from_step, process)

    def ids(self, batch_shape: tuple[int, ...]) -> list[str]:
        """The run ids of one call, in the order of its seeds (row-major over
        `batch_shape`): the id itself for one run, ``<id>-<position>`` for
        seeds (``-p<process>`` after the id with ``processes="each"``)."""
        base = self.run_id if self.process is None else f"{self.run_id}-p{self.process}"
        count = int(np.prod(batch_shape, dtype=np.int64))
        return [base] if not batch_shape else [f"{base}-{i}" for i in range(count)]

    @property
    def group(self) -> str:
        """The group of the runs (their batches folder): the same at every restart."""
        return self.run_id if self.process is None else f"{self.run_id}-p{self.process}"

    def decide(self, ids: Sequence[str], folders: Sequence[str], opened: Collection[str],
               open_now: Collection[str]) -> set[str]:
        """The ids among `ids` that are resumed: those with a run in one of
        `folders` (where the Logger's backends keep runs) or among `opened`
        (runs this Logger opened before). Refused (ValueError): an id whose
        run is open now, one that exists with ``resume="never"``, one that does
        not with ``resume="must"``."""
        busy = [run_id for run_id in ids if run_id in open_now]
        if busy:
            raise ValueError(f"`logger.init` got run_id={self.run_id!r}, but run {busy[0]!r} is open in this "
                             "logger: `logger.finish` it before opening it again.")
        found: dict[str, str] = {}  # id -> where
        for folder in folders:
            for run_id in existing_runs(folder, ids):
                found.setdefault(run_id, folder)
        found.update({run_id: "this logger" for run_id in ids if run_id in opened and run_id not in found})
        if self.resume == "never" and found:
            run_id, where = next(iter(found.items()))
            place = where if where == "this logger" else repr(filesystems.join(where, run_id))
            raise ValueError(
                f"`logger.init` got run_id={self.run_id!r}, and run {run_id!r} exists ({place}). To go on with "
                "it (a job restarted after a preemption), pass resume='allow' (and from_step=<the step of the "
                "checkpoint you restart from>); to start another, pick another run_id."
            )
        if self.resume == "must":
            missing = [run_id for run_id in ids if run_id not in found]
            if missing:
                where = " or ".join(map(repr, folders)) if folders else "no backend of this logger keeps runs"
                raise ValueError(
                    f"`logger.init` got run_id={self.run_id!r} with resume='must', but there is no run "
                    f"{missing[0]!r} ({where}). Check the run id (`lox runs DIR` lists the runs), or pass "
                    "resume='allow' to start it when it does not exist."
                )
        return set(found)


def _step(value: Any) -> int:
    """`from_step` as a Python int: an int, a NumPy integer, or a concrete
    integer scalar array (a step restored from a checkpoint)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        if hasattr(value, "shape") and hasattr(value, "dtype"):  # NumPy / JAX scalar arrays
            if np.shape(value) != () or not np.issubdtype(value.dtype, np.integer):
                raise TypeError
            value = np.asarray(value).item()  # a tracer fails here: its value is not known yet
        step = operator.index(value)
    except Exception:  # noqa: BLE001 - every way of not being a known integer step
        raise TypeError(
            f"`logger.init` got from_step={_shown(value)}: from_step is a step number known when `init` runs "
            "(a Python int, or an integer scalar array outside jax.jit), e.g. from_step=int(checkpoint_step)."
        ) from None
    if step < 0:
        raise ValueError(f"`logger.init` got from_step={step}: steps are 0 or more.")
    return step


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
