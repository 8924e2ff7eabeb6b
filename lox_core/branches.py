"""Collecting the logs of `cond`/`switch` branches that log differently.

The logs of a cond are outputs of the cond, and every branch must return
outputs of the same shapes. When the branches log different keys, or a key
a different number of times, spool collects each key as a *padded series*
(as `lox.spool(..., max_events=N)` does for while loops): every branch
returns the most events of that key any branch logs, the events it logged
first and padding after them, with a mask (`logdict.valid`) that is true on
the events of the branch that ran. Keys that every branch logs alike are
returned as they are. One key keeps one structure, shape and dtype across
branches.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lox_core import _compat, media
from lox_core.logdict import NO_STEP, event_count, event_totals, logdict, padded_logdict


class _Key(NamedTuple):
    """How one key leaves a cond whose branches log it differently."""

    events: int  # the most events of the key a branch logs
    leaves: tuple  # the tree structure and (event shape, dtype, sharding) of each leaf
    steps: dict  # step name -> (event shape, dtype, sharding)
    mask_tail: tuple  # the mask's axes after the event axis (vmap axes of a bounded loop inside)


class Layout:
    """The union of the logs of a cond's branches, from one trace of each
    (`records`: logdicts of abstract values, one per branch)."""

    def __init__(self, records: list[logdict]):
        keys = list(dict.fromkeys(k for logs in records for k in logs))
        self.keys = sorted(keys)
        self.padded: dict[str, _Key] = {}
        for key in self.keys:
            holders = [(i, logs) for i, logs in enumerate(records) if key in logs]
            _check_one_layout(key, holders)
            if len(holders) == len(records) and _alike(
                [logs.filter(lambda k, _, key=key: k == key) for _, logs in holders]  # `key` bound as a default
            ):
                continue  # logged alike by every branch: as it is
            _, first = holders[0]
            tree = jax.tree_util.tree_structure(first[key])
            # Pads keep the placement of the values (on a mesh with explicit axes).
            leaves = tuple((x.shape[1:], x.dtype, _compat.events_sharding(x, series=True))
                           for x in jax.tree_util.tree_leaves(first[key]))
            steps: dict = {}
            mask_tail: tuple = ()
            for _, logs in holders:
                for name in logs.step_names(key):
                    s = logs.steps[name][key]
                    steps.setdefault(name, (s.shape[1:], s.dtype, _compat.events_sharding(s, series=True)))
                if key in logs.valid:
                    mask_tail = logs.valid[key].shape[1:]
            events = max(event_count(logs[key]) for _, logs in holders)
            self.padded[key] = _Key(events, (tree, leaves), steps, mask_tail)

    def pad(self, logs: logdict) -> logdict:
        """One branch's logs (sorted as `interpreter.canonical` sorts them) in
        the layout every branch returns."""
        if not self.padded:
            return logs
        data, valid, totals = {}, {}, {}
        counts = event_totals(logs)  # (recorded, dropped) of the keys of bounded loops
        names = sorted(
            {n for key in self.keys for n in (self.padded[key].steps if key in self.padded else logs.step_names(key))}
        )
        steps: dict = {name: {} for name in names}
        for key in self.keys:
            spec = self.padded.get(key)
            if spec is None:
                data[key] = logs[key]
                for name in logs.step_names(key):
                    steps[name][key] = logs.steps[name][key]
                if key in logs.valid:
                    valid[key] = logs.valid[key]
                if key in counts:
                    totals[key] = counts[key]
                continue
            have = event_count(logs[key]) if key in logs else 0
            tree, leaves = spec.leaves
            values = jax.tree_util.tree_leaves(logs[key]) if key in logs else [None] * len(leaves)
            # One value per leaf of the key's layout: every branch logs it with one structure.
            data[key] = jax.tree_util.tree_unflatten(
                tree,
                [
                    _padded(x, spec.events, shape, dtype, sharding, 0)
                    for x, (shape, dtype, sharding) in zip(values, leaves, strict=True)
                ],
            )
            for name, (shape, dtype, sharding) in spec.steps.items():
                s = logs.steps[name][key] if key in logs and name in logs.steps and key in logs.steps[name] else None
                if s is None and have:
                    s = _compat.full((have, *shape), NO_STEP, dtype, sharding)
                steps[name][key] = _padded(s, spec.events, shape, dtype, sharding, NO_STEP)
            mask = logs.valid.get(key) if key in logs else None
            if mask is None:
                mask = jnp.ones((have, *spec.mask_tail), bool)
            valid[key] = _padded(mask, spec.events, spec.mask_tail, np.dtype(bool), None, False)
            if key in logs and key in counts:
                dropped = counts[key][1]
            else:
                dropped = jnp.zeros(spec.mask_tail, jnp.int32)
            totals[key] = (jnp.sum(valid[key], axis=0, dtype=jnp.int32), jnp.asarray(dropped, jnp.int32))
        return padded_logdict(data, steps, valid, totals)


def _padded(x, events: int, shape: tuple, dtype, sharding, fill):
    """`x` (events first, or None for none) followed by `fill` up to `events` events."""
    have = 0 if x is None else x.shape[0]
    pad = _compat.full((events - have, *shape), fill, dtype, sharding)
    return pad if x is None else jnp.concatenate([x, pad]) if events > have else x


def _alike(parts: list[logdict]) -> bool:
    leaves = [jax.tree_util.tree_flatten(p) for p in parts]
    first_leaves, first_tree = leaves[0]
    return all(tree == first_tree and [(x.shape, x.dtype) for x in ls] == [(x.shape, x.dtype) for x in first_leaves]
               for ls, tree in leaves[1:])


def _check_one_layout(key: str, holders: list) -> None:
    """Every branch that logs `key` logs it with one structure, and one event
    shape and dtype per leaf."""

    def kind(logs):
        value = logs[key]
        leaves = jax.tree_util.tree_leaves(value)
        return jax.tree_util.tree_structure(value), [(x.shape[1:], np.dtype(x.dtype)) for x in leaves]

    def shown(logs):
        value = logs[key]
        arrays = ", ".join(f"{np.dtype(x.dtype).name}{list(x.shape[1:])}" for x in jax.tree_util.tree_leaves(value))
        if not isinstance(value, media.Media):
            return arrays
        return f"lox.{value.kind}({arrays}{''.join(f', {k}={v!r}' for k, v in value.options.items())})"

    first_branch, first = holders[0]
    for branch, logs in holders[1:]:
        if kind(logs) != kind(first):
            raise ValueError(
                f"the branches of a `jax.lax.cond`/`switch` log key {key!r} differently: branch {first_branch} "
                f"logs {shown(first)}, branch {branch} logs {shown(logs)} (for `jax.lax.cond`, branch 0 is "
                "`false_fun` and branch 1 is `true_fun`). A key keeps one kind, structure, shape and dtype in every "
                "branch, because its events become one output of the cond; log differently shaped values under "
                "different keys."
            )
