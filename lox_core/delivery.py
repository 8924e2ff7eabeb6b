"""On the host: what a tap's host calls carry, delivered as its callback expects.

A tapped program crosses to the host in three forms, each a host call with
NumPy arrays (`batch_ndim` leading axes under `vmap`): one event (`event`),
the logs of a chunk of scan iterations (`chunk`), and the buffers of a loop
(`buffers`, see `lox_core.buffer`). A `Delivery` turns each into calls of the
user's callback: one `Event` per event and one logdict per block, per vmap
element, or for ``batched=True`` one call per event with the batch, or, for
the Logger's routed tap (`tap_with_context`), calls that carry each
element's context.
Devices call back from threads of their own (shard_map): one callback runs at
a time.
"""

from __future__ import annotations

import functools
import threading
from typing import Callable, Iterator

import jax
import numpy as np

from lox_core import printing
from lox_core.logdict import NO_STEP, Event, concat, event_count, in_key_order, logdict, trusted, trusted_event


def print_event(event: Event | logdict) -> None:
    """The default tap callback: one readable line per event (a buffered tap
    delivers several events of a key at once: one line each, key by key)."""
    if isinstance(event, Event):
        print(printing.format_event(event, event.steps), flush=True)
        return
    if all(event_count(v) == 1 for v in event.values()):
        values = {k: jax.tree_util.tree_map(lambda x: x[0], v) for k, v in event.items()}
        steps = {name: next(iter(per_key.values()))[0] for name, per_key in event.steps.items()}
        print(printing.format_event(values, steps), flush=True)
        return
    for key, value in event.items():
        for i in range(event_count(value)):
            values = {key: jax.tree_util.tree_map(lambda x, i=i: x[i], value)}
            steps = {name: per_key[key][i] for name, per_key in event.steps.items() if key in per_key}
            print(printing.format_event(values, steps), flush=True)


def _as_logged(x):
    """A host call's operand as the event holds it: a NumPy scalar for a scalar."""
    return x[()] if x.ndim == 0 else x


def _as_block(callback: Callable, event: Event) -> None:
    callback(event.to_logdict())


def _step(s):
    """An event's step: an int, or the steps of a `vmap` inside the tap (an array)."""
    return int(s) if np.ndim(s) == 0 else s


class Delivery:
    """Where one tap's events go: ``callback(event)`` (``callback(event,
    took)`` when `batched`), or with a context (`with_context`)
    ``callback(batch_ndim, event, context, took)`` for events and
    ``block_callback(batch_ndim, logs, context)`` for blocks. Each method
    returns the function its host call runs."""

    def __init__(self, callback: Callable, prefix: str = "", batched: bool = False, with_context: bool = False,
                 block_callback: Callable | None = None, blocks: bool = False):
        self.callback, self.prefix, self.batched = callback, prefix, batched
        self.with_context, self.block_callback = with_context, block_callback
        # A callback that gets blocks (`buffer=K`) gets an event outside a loop as a one-event block too.
        self.blocks = blocks
        self.lock = threading.Lock()

    def event(self, keys: list[str], names: list[str]) -> Callable:
        """``deliver(batch_ndim, taken, values, steps, context)`` for one
        `lox.log` event: the values of `keys` and the steps of `names`, and
        `taken` (None: always) the mask of elements that logged it. The host
        call passes one value per key (`vals`) and one step per name (`stps`)."""
        callback, prefix, lock = self.callback, self.prefix, self.lock
        with_context, batched = self.with_context, self.batched
        # Per event, an `Event`; to a callback that gets blocks (`buffer=K`), a one-event block.
        per_event = functools.partial(_as_block, callback) if self.blocks else callback

        def deliver_unlocked(batch_ndim, taken, vals, stps, context):
            if batch_ndim == 0 and not (with_context or batched):
                # One event, the common case: nothing to route, nothing to split. (A
                # batched event of `tap(vmap(f))` in a while loop whose predicate is
                # batched goes out while any element runs.)
                if taken is None or np.any(taken):
                    data = {
                        prefix + k: _as_logged(v) if isinstance(v, np.ndarray)
                        else jax.tree_util.tree_map(_as_logged, v)
                        for k, v in zip(keys, vals, strict=True)
                    }
                    per_event(trusted_event(data, {n: _step(s) for n, s in zip(names, stps, strict=True)}))
                return
            batch_shape = np.shape(jax.tree_util.tree_leaves((taken, vals, stps))[0])[:batch_ndim]
            # Elements that took their cond branch (all of them outside a cond).
            if taken is None:
                took = np.ones(batch_shape, bool)
            else:  # a mask over inner vmap axes too (tap of a vmapped while loop): any element of them
                taken = np.asarray(taken)
                if taken.size == np.prod(batch_shape):
                    took = taken.reshape(batch_shape)
                else:
                    took = taken.reshape(*batch_shape, -1).any(-1)
            if with_context or batched:
                # The batched event (batch axes, then the event axis) in one call.
                # Copies (np.array): the callee may keep them, and XLA may reuse its buffers.
                data = {
                    prefix + k: jax.tree_util.tree_map(lambda x: np.expand_dims(np.array(x), batch_ndim), v)
                    for k, v in zip(keys, vals, strict=True)
                }
                per_name = {
                    n: dict.fromkeys(data, np.expand_dims(np.array(s), batch_ndim))
                    for n, s in zip(names, stps, strict=True)
                }
                if batched:
                    callback(trusted(data, per_name), took)
                else:
                    callback(batch_ndim, logdict(data, per_name), jax.tree_util.tree_map(np.array, context), took)
                return
            # Under vmap one host call carries the whole batch, delivered as one
            # event per element: views (NumPy scalars for scalars) sliced per element.
            flat = [jax.tree_util.tree_flatten(v) for v in vals]
            leaves = [leaves for leaves, _ in flat]
            steps_e = [np.asarray(s) for s in stps]
            names_p = [prefix + k for k in keys]
            single = [tree.num_leaves == 1 and tree.num_nodes == 1 for _, tree in flat]
            indices = range(batch_shape[0]) if batch_ndim == 1 else list(np.ndindex(batch_shape))
            took_flat = took.reshape(-1).tolist()  # Python bools: cheap to test per element
            for index, taken_here in zip(indices, took_flat, strict=True):  # both: one per element
                if taken_here:
                    data = {
                        name: ls[0][index] if one else jax.tree_util.tree_unflatten(tree, [x[index] for x in ls])
                        for name, ls, one, (_, tree) in zip(names_p, leaves, single, flat, strict=True)
                    }
                    per_event(trusted_event(data, {n: _step(s[index]) for n, s in zip(names, steps_e, strict=True)}))

        def deliver(*args):
            with lock:
                deliver_unlocked(*args)

        return deliver

    def chunk(self, tree, where: list[int]) -> Callable:
        """``deliver(batch_ndim, unique, when, context)`` for a chunk's logs:
        the logdict of pytree `tree` whose leaves are ``unique[i] for i in
        where`` (an event's keys share their steps: sent once), one logdict
        per vmap element of the elements where `when` (all if None)."""
        callback, block_callback, lock = self.callback, self.block_callback, self.lock

        def block_of(arrays):  # the chunk's logs, from the unique arrays
            return jax.tree_util.tree_unflatten(tree, [arrays[i] for i in where])

        def deliver(batch_ndim, unique, when, context):
            # The user's callback gets copies (np.array): the host call's arrays may be buffers that XLA reuses.
            if batch_ndim == 0 and block_callback is None:  # the common case, kept cheap: one block, no routing
                if when is None or when:
                    block = block_of([np.array(x) for x in unique])
                    with lock:
                        callback(block)
                return
            batch_shape = np.shape(unique[0])[:batch_ndim]
            sending = np.broadcast_to(True if when is None else when, batch_shape)
            if block_callback is not None and sending.all():  # all elements at once, routed by the context
                block = block_of(unique)
                with lock:
                    block_callback(batch_ndim, block, context)
                return
            contexts = [] if block_callback is None else elements(batch_ndim, batch_shape, context)
            for e, index in enumerate(np.ndindex(batch_shape)):
                if not sending[index]:
                    continue
                block = block_of([np.array(x[index]) for x in unique])
                with lock:
                    if block_callback is None:
                        callback(block)
                    else:
                        block_callback(0, block, contexts[e])

        return deliver

    def buffers(self, groups: list, key_order: list[str]) -> Callable:
        """``deliver(batch_ndim, when, counts, arrays, context)`` for the
        buffers of `groups` (`lox_core.buffer.KeyGroup`), sent where `when`,
        with the keys in `key_order`."""
        callback, block_callback, prefix, lock = self.callback, self.block_callback, self.prefix, self.lock

        def deliver(batch_ndim, when, counts, arrays, context):
            contexts = [] if block_callback is None else elements(batch_ndim, np.shape(when), context)
            with lock:
                for e, block in blocks(groups, key_order, prefix, batch_ndim, when, counts, arrays):
                    if block_callback is None:
                        callback(block)
                    else:  # one element's events, routed with its context
                        block_callback(0, block, contexts[e])

        return deliver


def elements(batch_ndim: int, shape: tuple, tree) -> list:
    """`tree`'s arrays for each element of the leading `batch_ndim` axes (of
    size `shape[:batch_ndim]`), in the order `blocks` numbers elements."""
    batch_shape = tuple(shape[:batch_ndim])
    return [
        jax.tree_util.tree_map(
            lambda x, index=index: np.array(np.broadcast_to(x, batch_shape + np.shape(x)[batch_ndim:])[index]), tree
        )
        for index in np.ndindex(batch_shape)
    ]


def blocks(groups: list, key_order: list[str], prefix: str, batch_ndim: int, when, counts, arrays
           ) -> Iterator[tuple[int, logdict]]:
    """The events a sent buffer holds (`lox_core.buffer.TapBuffer`: per
    group, its count and arrays), one logdict per `vmap` element (one in all
    outside vmap) with the element's flat index, each key's events in program
    order and the keys in `key_order`."""
    rank = {prefix + key: i for i, key in enumerate(key_order)}
    when = np.asarray(when)
    batch_shape = when.shape[:batch_ndim]
    elements = int(np.prod(batch_shape))
    flat = lambda x: np.reshape(  # noqa: E731
        np.broadcast_to(x, batch_shape + np.shape(x)[batch_ndim:]), (elements, *np.shape(x)[batch_ndim:])
    )
    when = flat(when)
    counts = [flat(c) for c in counts]
    arrays = [jax.tree_util.tree_map(flat, a) for a in arrays]
    for e in range(elements):
        if not when[e]:
            continue
        parts = []
        for group, count, held in zip(groups, counts, arrays, strict=True):  # one count and arrays per group
            rows = np.flatnonzero(held["valid"][e, : count[e]])
            if rows.size == 0:
                continue
            # Fancy indexing copies: the callee may keep them.
            flat_leaves = iter([x[e, rows] for leaves in held["leaves"] for x in leaves])
            data = {
                prefix + k: jax.tree_util.tree_unflatten(tree, [next(flat_leaves) for _ in range(tree.num_leaves)])
                for k, tree in zip(group.keys, group.trees, strict=True)
            }
            per_name = {}
            for name, s in held["steps"].items():
                s = s[e, rows]
                if not (s == NO_STEP).all():  # a step name none of these events carries is left out
                    per_name[name] = dict.fromkeys(data, s)
            parts.append(trusted(data, per_name))
        if len(parts) == 1:
            yield e, parts[0]
        elif parts:  # keys of one group are in order already; across groups, as `key_order` says
            merged = concat(parts)
            ordered = sorted(merged, key=rank.__getitem__)
            yield e, in_key_order(merged, ordered)
