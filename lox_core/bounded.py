"""Spooling loops of unknown length: the buffers of `lox.spool(f, max_events=N)`.

A `while_loop` (or a `fori_loop` with traced bounds) runs a number of times
known only at run time, so its events cannot be stacked into outputs of a
fixed shape as a scan's are. With `max_events=N`, the outermost such loop that
logs carries a buffer of `N` events per key instead (loops, branches and
functions inside it pass the buffer on) and returns it when it ends: a padded
series per key, whose mask (`logdict.valid`) marks the recorded events, and a
count of the events that came after the buffer was full (`logdict.dropped`).
The first `N` events of a key are kept.

Each buffer has one slot more than it returns: once the buffer is full, events
are written there and forgotten, so that an append is one
dynamic-update-slice whatever the count, with no test.

The mask is the count (``arange(N) < count``) unless the key is logged in a
loop whose predicate is batched by `jax.vmap` (a vmap inside the spool): that
loop runs while any element does, every element's events take the same slots,
and a stored mask (events × vmap axes) says which elements were running. (A
slot is then taken whenever any element logs, so an element may keep fewer
than `N` events when the others log more.)
"""

from __future__ import annotations

import collections
import copy
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lox_core import _compat
from lox_core.buffer import check_one_shape_per_key, kinds_in
from lox_core.logdict import NO_STEP, logdict


class _Group(NamedTuple):
    """Keys logged by the same `lox.log` calls (static): their events come
    together, so they share a count, step arrays and mask."""

    keys: tuple[str, ...]
    trees: tuple  # each key's pytree structure
    leaves: tuple  # each key's leaves' (shape, dtype, sharding of their events or None)
    steps: dict  # step name -> (shape, dtype)


def batched_loops(selection, eqn) -> tuple[tuple[int, ...], frozenset[str]]:
    """The vmap axes of the batched predicates in a loop nest (() if none),
    and the keys logged inside those loops."""
    shapes, keys = set(), set()

    def visit(eqn):
        if eqn.primitive.name == "while":
            p = _compat.while_params(eqn.params)
            shape = tuple(p.cond_jaxpr.out_avals[0].shape)
            shapes.add(shape)
            if shape:
                keys.update(k for kind in kinds_in(selection, p.body_jaxpr.jaxpr) for k in kind.keys)
        for sub in _compat.subjaxprs_of(eqn):
            for inner in getattr(sub, "jaxpr", sub).eqns:
                visit(inner)

    visit(eqn)
    shapes.discard(())
    if len(shapes) > 1:
        raise NotImplementedError(
            "`lox.spool(..., max_events=N)` cannot spool nested `jax.lax.while_loop`s whose predicates are "
            f"batched by different `jax.vmap`s (predicate shapes {sorted(shapes)}). Apply `jax.vmap` outside "
            "`lox.spool`."
        )
    return (shapes.pop() if shapes else ()), frozenset(keys)


class Bounded:
    """The buffers of one bounded loop, as the interpreter goes through it:
    per group of keys (`_Group`), the count of events seen, each key's values,
    the steps, and (with batched predicates) the mask and the dropped count.
    `carry`/`resume` pass them in and out of loops, branches and functions."""

    def __init__(self, kinds: collections.Counter, capacity: int, mask_shape: tuple[int, ...], masked_keys=frozenset()):
        check_one_shape_per_key(kinds, "`lox.spool(..., max_events=N)`", "a bounded loop", "spool the loop as a `scan`")
        self.capacity = capacity
        self.groups = _groups(list(kinds))
        self.group_of = {key: i for i, group in enumerate(self.groups) for key in group.keys}
        # A stored mask for the groups logged in a loop with a batched predicate.
        self.mask_shapes = [mask_shape if masked_keys.intersection(g.keys) else () for g in self.groups]
        self.state = [self._empty(group, shape) for group, shape in zip(self.groups, self.mask_shapes)]

    def _empty(self, group: _Group, mask_shape: tuple[int, ...]) -> dict:
        slots = self.capacity + 1  # the last one takes what does not fit
        state = {
            "count": jnp.zeros((), jnp.int32),
            "leaves": tuple(tuple(_compat.full((slots, *shape), 0, dtype, sharding) for shape, dtype, sharding in leaves)
                            for leaves in group.leaves),
            "steps": {name: jnp.full((slots, *shape), NO_STEP, dtype) for name, (shape, dtype) in group.steps.items()},
        }
        if mask_shape:
            state["mask"] = jnp.zeros((slots, *mask_shape), bool)
            state["dropped"] = jnp.zeros(mask_shape, jnp.int32)
        return state

    def carry(self):
        return tuple(self.state)

    def structure(self) -> "Bounded":
        """A copy without the arrays (as `Buffers.structure`)."""
        empty = copy.copy(self)
        empty.state = None
        return empty

    def resume(self, carried) -> None:
        self.state = list(carried)

    def append(self, values: dict, steps: dict, active) -> None:
        """One event: write it in each group's next slot (the spare one when full)."""
        for i in dict.fromkeys(self.group_of[key] for key in values):
            group, state = self.groups[i], self.state[i]
            count = state["count"]
            at = jnp.minimum(count, self.capacity)

            def put(buf, x):
                return jax.lax.dynamic_update_index_in_dim(buf, jnp.asarray(x, buf.dtype), at, 0)

            # Step names this event lacks keep NO_STEP in its slot (written once).
            new = {
                "count": count + 1,
                "leaves": tuple(
                    tuple(put(b, x) for b, x in zip(buffers, jax.tree_util.tree_leaves(values[key])))
                    for key, buffers in zip(group.keys, state["leaves"])
                ),
                "steps": {name: put(b, steps[name]) if name in steps else b for name, b in state["steps"].items()},
            }
            mask_shape = self.mask_shapes[i]
            if mask_shape:
                running = jnp.broadcast_to(jnp.asarray(True if active is None else active), mask_shape)
                new["mask"] = put(state["mask"], running)
                new["dropped"] = state["dropped"] + (running & (count >= self.capacity)).astype(jnp.int32)
            self.state[i] = new

    def logs(self) -> logdict:
        """The loop's events: `capacity` slots per key, padded."""
        n = self.capacity
        data, steps, valid, totals = {}, {}, {}, {}
        for group, state in zip(self.groups, self.state):
            if "mask" in state:
                mask = state["mask"][:n]
                total = (jnp.sum(mask, axis=0, dtype=jnp.int32), state["dropped"])
                # What finished elements computed in the slots they did not log: padding, as for the others.
                cut = lambda b, fill: jnp.where(jnp.reshape(mask, mask.shape + (1,) * (b.ndim - mask.ndim)), b[:n], fill)  # noqa: E731
            else:
                mask = jnp.arange(n) < state["count"]
                total = (jnp.minimum(state["count"], n), jnp.maximum(state["count"] - n, 0))
                cut = lambda b, fill: b[:n]  # noqa: E731
            for key, tree, buffers in zip(group.keys, group.trees, state["leaves"]):
                data[key] = jax.tree_util.tree_unflatten(tree, [cut(b, jnp.zeros((), b.dtype)) for b in buffers])
                valid[key], totals[key] = mask, total
            for name, s in state["steps"].items():
                steps.setdefault(name, {}).update(dict.fromkeys(group.keys, cut(s, jnp.asarray(NO_STEP, s.dtype))))
        return logdict(data, steps)._like(data, steps, valid, totals)


def _groups(kinds: list) -> list[_Group]:
    """The keys of `kinds` grouped by the kinds that log them (each key in one
    group), with their layouts and the steps any of those kinds carries."""
    by_kinds: dict[frozenset, list[str]] = {}
    layout: dict[str, tuple] = {}
    for index, kind in enumerate(kinds):
        leaves = iter(kind.leaves)
        for key, tree in zip(kind.keys, kind.trees):
            layout[key] = (tree, tuple(next(leaves) for _ in range(tree.num_leaves)))
    for key in layout:
        owners = frozenset(i for i, kind in enumerate(kinds) if key in kind.keys)
        by_kinds.setdefault(owners, []).append(key)
    groups = []
    for owners, keys in by_kinds.items():
        steps: dict = {}
        for i in sorted(owners):
            for name, shape, dtype in kinds[i].steps:
                known = steps.get(name)
                if known is not None and known[0] != shape:
                    raise ValueError(
                        f"`lox.spool(..., max_events=N)`: the steps {name!r} of key {keys[0]!r} have shape "
                        f"{list(known[0])} in one `lox.log` and {list(shape)} in another, in one bounded loop. "
                        "Give them one shape (e.g. log the step outside `jax.vmap`), or use another step name."
                    )
                steps[name] = (shape, dtype if known is None else np.promote_types(known[1], dtype))
        groups.append(_Group(tuple(keys), tuple(layout[k][0] for k in keys), tuple(layout[k][1] for k in keys), steps))
    return groups
