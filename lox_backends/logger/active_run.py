"""A Logger's runs as the destination of ``with logger.active(state):``.

Inside the block every `lox.log` that no transform captures reaches
`ActiveRun.deliver` (`lox_core.active` finds it), on the host: eagerly in the
caller's thread, else in a host call's thread. It is routed the way
`logger.tap` routes its events: element i of a vmap over the runs to run i,
in one call for all of them (`lox_core.active.runs_for`), checked as
`logger.log` checks logs, and handed to the Logger's router.
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from lox_core.active import new_key, runs_for
from lox_core.logdict import logdict


class ActiveRun:
    """The runs `runs` (a state's run numbers) of one Logger, as a destination.

    `receive_event(batch_ndim, event, runs, took)` and `receive_block(batch_ndim,
    logs, runs)` are the Logger's, as for `logger.tap`; `check(logs, runs_shape)`
    refuses what the runs cannot hold (`LogChecks.check`); `per_device_error`
    refuses logs inside `shard_map` where only process 0 writes."""

    def __init__(self, runs: np.ndarray, receive_event: Callable, receive_block: Callable,
                 check: Callable[[logdict, tuple[int, ...]], None], per_device_error: str | None = None):
        self.key = new_key()
        self.runs = runs
        self.per_device_error = per_device_error
        self._receive_event = receive_event
        self._receive_block = receive_block
        self._check = check
        self._checked: set = set()  # signatures (keys, shapes, dtypes) already checked: once each

    def deliver(self, batch_ndim: int, event: logdict, took: np.ndarray | None) -> None:
        event, runs, batch_ndim = self._routed(batch_ndim, event)
        took = np.ones(runs.shape, bool) if took is None else np.broadcast_to(took, runs.shape)  # copied by the Logger
        self._receive_event(batch_ndim, event, runs, took)

    def deliver_block(self, batch_ndim: int, logs: logdict) -> None:
        logs, runs, batch_ndim = self._routed(batch_ndim, logs)
        self._receive_block(batch_ndim, logs, runs)

    def _routed(self, batch_ndim: int, logs: logdict) -> tuple[logdict, np.ndarray, int]:
        """`logs` with the run of each element: given to every run when they are
        not vmapped and the state holds several. Checked once per structure."""
        first = next(iter(logs.values()))
        batch_shape = np.shape(first if isinstance(first, np.ndarray) else jax.tree_util.tree_leaves(first)[0])
        runs, to_every_run = runs_for(self.runs, batch_shape[:batch_ndim], logs)
        if to_every_run:
            logs = jax.tree_util.tree_map(lambda x: np.broadcast_to(x, runs.shape + np.shape(x)), logs)
            batch_ndim = runs.ndim
        signature = (runs.shape, batch_ndim, tuple(logs.steps),
                     tuple((key, _layout(value)) for key, value in logs.items()))
        if signature not in self._checked:
            self._check(logs, runs.shape)
            self._checked.add(signature)
        return logs, runs, batch_ndim


def _layout(value) -> tuple:
    """A key's value as its checks see it: its structure, and each array's shape and dtype."""
    if isinstance(value, np.ndarray):  # the common case, without a walk of the pytree
        return value.shape, value.dtype
    leaves, tree = jax.tree_util.tree_flatten(value)
    return tree, tuple((np.shape(x), np.asarray(x).dtype) for x in leaves)
