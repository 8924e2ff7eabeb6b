"""Logs waiting for the router's next tick, gathered into one part per run.

Spooled batches and tapped events reach a Logger many times per second, for
many runs at once (vmapped seeds). They wait a moment in `Waiting` and leave
together as `Part`s: consecutive vmapped batches of one structure stacked along
their event axis, still holding every run (the router converts them to one
table for all runs at once); other batches as one logdict per run; consecutive
tapped events of one structure as one block per run. A loop that logs every
step, or 1,024 seeds that stream, then costs the backends one table per run
per tick, and the router a few array operations.

>>> import numpy as np, lox
>>> waiting = Waiting()
>>> for step in range(3):  # two runs (a vmapped batch of 2), three calls
...     logs = lox.logdict({"x": np.full((2, 1), step)}, {"step": {"x": np.full((2, 1), step)}})
...     _ = waiting.add_batch(1, np.array([0, 1]), logs)
>>> [(part.runs.tolist(), part.logs["x"].tolist()) for group in waiting.take() for part in group.parts()[0]]
[([0, 1], [[0, 1, 2], [0, 1, 2]])]
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator

import jax
import numpy as np

from lox_backends.logger.transfer import to_host
from lox_core.logdict import concat, logdict

MAX_WAITING = 256  # items that wait before the router sends without waiting for its tick


@dataclasses.dataclass(frozen=True)
class Part:
    """Logs ready to become tables: of one run (`runs` is that run's number, a
    0-d array, and `batch_ndim` is 0), or of the runs of a vmapped batch
    (`runs` holds their numbers; the leading `batch_ndim` axes of every array
    are theirs, without padding, so every run has the same events)."""

    runs: np.ndarray
    batch_ndim: int
    logs: logdict


@dataclasses.dataclass
class _Item:
    kind: str  # "batch" (spooled, or a buffered tap's block) or "events" (tapped, one at a time)
    batch_ndim: int  # vmap axes in front of the event axis
    runs: np.ndarray  # run number per vmap element
    logs: logdict
    took: np.ndarray | None = None  # events: which elements' event is real (the others are padding of a cond)

    @functools.cached_property  # asked of each item several times while grouping
    def stackable(self) -> bool:
        """A vmapped batch whose runs all hold the same events (no padding to trim),
        each element its own run (a state that is not vmapped repeats one run)."""
        return (
            self.kind == "batch"
            and self.batch_ndim > 0
            and not self.logs.valid
            and not any(np.any(n) for n in self.logs.dropped.values())
            and np.unique(self.runs).size == self.runs.size
        )


class Waiting:
    """Items waiting to be sent, in arrival order."""

    def __init__(self) -> None:
        self._items: list[_Item] = []

    def add_batch(self, batch_ndim: int, runs, logs: logdict) -> bool:
        """Add a spooled batch; whether enough waits to send now."""
        self._items.append(_Item("batch", batch_ndim, np.asarray(runs), logs))
        return len(self._items) >= MAX_WAITING

    def add_events(self, batch_ndim: int, runs, event: logdict, took) -> bool:
        """Add one tapped event per vmap element; whether enough waits to send now."""
        self._items.append(_Item("events", batch_ndim, np.asarray(runs), event, np.asarray(took)))
        return len(self._items) >= MAX_WAITING

    def take(self) -> list[Departure]:
        """What waits, in order, as departures: groups of items that leave together.
        The batches' device arrays are on the host by then, copied together
        (`lox_backends.logger.transfer`)."""
        items, self._items = self._items, []
        batches = [item for item in items if item.kind == "batch"]
        for item, logs in zip(batches, to_host([item.logs for item in batches]), strict=True):
            item.logs = logs
        return [Departure(group) for group in _departures(items)]


class Departure:
    """Consecutive waiting items that become parts together."""

    def __init__(self, items: list[_Item]):
        self._items = items

    def parts(self) -> tuple[list[Part], Exception | None]:
        """Vmapped batches of one structure stacked (one part for all their runs);
        other batches and events as one part per run (several only where a key
        changed shape between calls, as those cannot be joined). And the first
        error of an item that could not be split: only that item is left out."""
        group = self._items
        if all(g.stackable for g in group):
            first = group[0]
            return [Part(first.runs, first.batch_ndim, _stack([g.logs for g in group], first.batch_ndim))], None
        pieces: list[tuple[int, logdict]] = []
        failed: Exception | None = None
        split = _batch_pieces if group[0].kind == "batch" else _event_pieces
        try:
            pieces = list(split(group))
        except Exception:  # noqa: BLE001 - item by item, to leave out only what fails
            for item in group:
                try:
                    pieces += list(split([item]))
                except Exception as error:  # noqa: BLE001 - reported by the router
                    failed = failed or error
        gathered: dict[int, list[logdict]] = {}
        for run, piece in pieces:
            gathered.setdefault(run, []).append(piece)
        return [Part(np.asarray(run), 0, joined) for run, logs in gathered.items() for joined in _joined(logs)], failed


def _departures(items: list[_Item]) -> Iterator[list[_Item]]:
    group: list[_Item] = []
    for item in items:
        if group and not _same_group(group[-1], item):
            yield group
            group = []
        group.append(item)
    if group:
        yield group


def _same_group(a: _Item, b: _Item) -> bool:
    """Whether two waiting items can be sent together: batches always (run by
    run), vmapped batches and events of one structure (stacked)."""
    if a.kind != b.kind:
        return False
    if a.kind == "batch" and not (a.stackable and b.stackable):
        return True
    # Same batch axes, same runs, same keys, shapes (but for the event axis) and steps.
    shapes = lambda item: [_without_events(x, item) for x in jax.tree_util.tree_leaves(item.logs)]  # noqa: E731
    return (
        a.batch_ndim == b.batch_ndim
        and np.array_equal(a.runs, b.runs)
        and jax.tree_util.tree_structure(a.logs) == jax.tree_util.tree_structure(b.logs)
        and shapes(a) == shapes(b)
    )


def _without_events(x, item: _Item) -> tuple[int, ...]:
    shape = np.shape(x)
    return shape if item.kind == "events" else shape[: item.batch_ndim] + shape[item.batch_ndim + 1 :]


def _stack(logs: list[logdict], batch_ndim: int) -> logdict:
    if len(logs) == 1:
        return jax.tree_util.tree_map(np.asarray, logs[0])
    return jax.tree_util.tree_map(lambda *xs: np.concatenate([np.asarray(x) for x in xs], axis=batch_ndim), *logs)


def _batch_pieces(group: list[_Item]) -> Iterator[tuple[int, logdict]]:
    for item in group:
        logs = jax.tree_util.tree_map(np.asarray, item.logs)  # device arrays come over here, in the router
        for index, part in _elements(item.batch_ndim, item.runs, logs):
            yield int(item.runs[index]), part


def _event_pieces(group: list[_Item]) -> Iterator[tuple[int, logdict]]:
    first = group[0]
    # Events of one structure, stacked along their event axis (after the batch axes).
    events = jax.tree_util.tree_map(lambda *xs: np.concatenate(xs, axis=first.batch_ndim), *[g.logs for g in group])
    took = np.stack([g.took for g in group if g.took is not None], axis=-1)  # (*batch, events)
    for index, part in _elements(first.batch_ndim, first.runs, events):
        if took[index].any():
            kept = took[index]
            yield int(first.runs[index]), jax.tree_util.tree_map(lambda x, kept=kept: x[kept], part)


def _elements(batch_ndim: int, runs: np.ndarray, logs: logdict) -> Iterator[tuple[tuple[int, ...], logdict]]:
    """(index, that element's logs) for each element of the leading batch axes."""
    for index in np.ndindex(runs.shape[:batch_ndim]):
        yield index, (jax.tree_util.tree_map(lambda x, index=index: x[index], logs) if batch_ndim else logs)


def _joined(parts: list[logdict]) -> list[logdict]:
    try:
        return [concat(parts)]
    except ValueError:  # a key changed shape between calls: one part per call
        return parts
