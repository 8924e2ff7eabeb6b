"""Events kept on device by a loop: the buffers of ``lox.tap(f, callback,
buffer=K)`` and of ``lox.spool(f, max_events=N)``.

A loop whose events cannot leave it as stacked outputs (a while loop, or a
tapped loop that sends blocks) keeps them in arrays carried by the loop: the
outermost loop that logs creates them, and loops, branches and functions
inside it pass them on (`carry`/`resume`). The arrays are kept per *group* of
keys, the keys that the same `lox.log` calls log (so they arrive together):
one slot per event, with each key's leaves, each step name's steps
(:data:`lox.NO_STEP` where an event lacks that name), a count of the slots
used and, where needed, a mask of the slots that hold events (`valid`). A
key lives in one group, so its events are in program order there.

Appends between two commits (the end of a loop iteration, a carry) are
counted in Python (`pending`), so an event costs one dynamic-update-slice per
array and no counter arithmetic.

Two policies share this layout:

- `TapBuffer` (``buffer=K``) sends its events to the host once it holds `K`
  and empties; a group has room for `K - 1` plus the events its `lox.log`
  calls can add before the next check. Branches keep its counters out of the
  `cond`: each branch fills the slots of the most events any branch logs (the
  rest marked not valid), so the counters move by a static amount whichever
  branch runs. That keeps them unbatched under `vmap`, where a cond with a
  batched predicate runs both branches and selects their outputs; a counter
  among those outputs would become one per element and turn the check that
  sends the buffers into a select that sends them every time.
- `SpoolBuffer` (``max_events=N``) keeps the first `N` events of each group
  and returns them when the loop ends, as padded series (`logdict.valid`)
  with the count of events that did not fit (`logdict.dropped`). It has one
  slot more than it returns: once full, events are written there and
  forgotten, so an append needs no test. Its counts go through a cond with
  the branch that ran, so a branch that logs nothing takes no slot; its mask
  is the count (``arange(N) < count``) unless the key is logged in a loop
  whose predicate is batched by a `jax.vmap` inside the spool: that loop runs
  while any element does, every element's events take the same slots, and a
  stored mask (events × vmap axes) says which elements were running.
"""

from __future__ import annotations

import collections
import copy
from typing import NamedTuple, Self

import jax
import jax.numpy as jnp
import numpy as np

from lox_core import _compat
from lox_core.interpreter import continuing
from lox_core.logdict import NO_STEP, logdict, padded_logdict
from lox_core.primitive import log_p, site_of


class Kind(NamedTuple):
    """What the events of one kind look like (static)."""

    keys: tuple[str, ...]
    trees: tuple  # one pytree structure per key
    leaves: tuple  # (shape, dtype, sharding of its events or None) of every leaf, key after key
    steps: tuple  # (name, shape, dtype) of every step


def _kind_of(keys, values: dict, steps: dict) -> Kind:
    """The kind of an event; `values` and `steps` hold arrays, tracers or avals."""
    return Kind(
        tuple(keys),
        tuple(jax.tree_util.tree_structure(values[k]) for k in keys),
        tuple((tuple(x.shape), np.dtype(x.dtype), _compat.events_sharding(x)) for k in keys
              for x in jax.tree_util.tree_leaves(values[k])),
        tuple((name, tuple(s.shape), np.dtype(s.dtype)) for name, s in steps.items()),
    )


def _eqn_kind(selection, eqn) -> Kind | None:
    site = site_of(eqn.params)
    taken = selection.keys(site)
    if not taken:
        return None
    values, steps = site.split([v.aval for v in eqn.invars])
    return _kind_of(taken, values, steps)


def kinds_in(selection, jaxpr) -> collections.Counter:
    """How many `lox.log` calls of each kind `jaxpr` holds, nested jaxprs included."""
    found: collections.Counter = collections.Counter()
    for eqn in jaxpr.eqns:
        if eqn.primitive is log_p:
            kind = _eqn_kind(selection, eqn)
            if kind is not None:
                found[kind] += 1
        for sub in _compat.subjaxprs_of(eqn):
            found.update(kinds_in(selection, getattr(sub, "jaxpr", sub)))
    return found


def appends(selection, jaxpr, scans: bool = False) -> collections.Counter | None:
    """The most events of each kind one run of `jaxpr` logs, or None when a
    loop inside it logs (a number known only at run time; with `scans`, only
    while loops count as such, and a scan logs its length times its body)."""
    total: collections.Counter = collections.Counter()
    for eqn in jaxpr.eqns:
        if eqn.primitive is log_p:
            kind = _eqn_kind(selection, eqn)
            if kind is not None:
                total[kind] += 1
            continue
        subs = [getattr(s, "jaxpr", s) for s in _compat.subjaxprs_of(eqn)]
        if not subs:
            continue
        if scans and eqn.primitive is _compat.scan_p:
            inner = appends(selection, subs[0], scans)
            if inner is None:
                return None
            total.update({kind: n * _compat.scan_params(eqn.params).length for kind, n in inner.items()})
            continue
        if eqn.primitive in _compat.LOOP_PRIMITIVES:  # a number of events known only at run time
            if any(kinds_in(selection, s) for s in subs):
                return None
            continue
        counts = [c for c in [appends(selection, s, scans) for s in subs] if c is not None]
        if len(counts) < len(subs):  # a loop inside logs
            return None
        if eqn.primitive is _compat.cond_p:  # one branch runs
            total.update(collections.Counter({k: max(c[k] for c in counts) for c in counts for k in c}))
        else:
            for c in counts:
                total.update(c)
    return total


def conds_log_alike(selection, jaxpr) -> bool:
    """Whether each cond in `jaxpr` logs the same events whichever branch
    runs, so that its logs can leave it as outputs."""
    for eqn in jaxpr.eqns:
        subs = [getattr(s, "jaxpr", s) for s in _compat.subjaxprs_of(eqn)]
        if eqn.primitive is _compat.cond_p:
            counts = [appends(selection, s, scans=True) for s in subs]
            if any(c != counts[0] for c in counts):
                return False
        if not all(conds_log_alike(selection, s) for s in subs):
            return False
    return True


def check_one_shape_per_key(
    kinds, what: str = "`lox.tap(..., buffer=K)`", where: str = "one loop", otherwise: str = "tap without `buffer`"
) -> dict[str, tuple]:
    """A buffer holds each key's events in one array, so each key must keep
    one structure, shape and dtype in the buffered loop (the error says what
    the user can do `otherwise`). Returns each key's pytree structure and
    leaves' (shape, dtype, sharding), in the order keys first appear."""
    seen: dict[str, tuple] = {}
    for kind in kinds:
        leaves = iter(kind.leaves)
        for key, tree in zip(kind.keys, kind.trees, strict=True):
            mine = (tree, tuple(next(leaves) for _ in range(tree.num_leaves)))
            other = seen.setdefault(key, mine)
            if other != mine:
                describe = lambda d: ", ".join(f"{np.dtype(t).name}{list(s)}" for s, t, _ in d[1])  # noqa: E731
                raise ValueError(
                    f"{what}: key {key!r} is logged as {describe(other)} and as {describe(mine)} "
                    f"in {where}. A buffer holds each key's events in one array, so a key must keep one "
                    f"shape and dtype there: log the other values under another key, or {otherwise}."
                )
    return seen


class KeyGroup(NamedTuple):
    """Keys logged by the same `lox.log` calls (static): their events come
    together, so they share a count, step arrays and mask."""

    keys: tuple[str, ...]
    trees: tuple  # each key's pytree structure
    leaves: tuple  # each key's leaves' (shape, dtype, sharding of their events or None)
    steps: dict  # step name -> (shape, dtype)


def groups_of(kinds: list[Kind], what: str, where: str, otherwise: str) -> list[KeyGroup]:
    """The keys of `kinds` grouped by the kinds that log them (each key in one
    group), with their layouts (one per key: `check_one_shape_per_key`, whose
    error takes `what`, `where` and `otherwise`) and the steps any of those
    kinds carries."""
    by_kinds: dict[frozenset, list[str]] = {}
    layout = check_one_shape_per_key(kinds, what, where, otherwise)
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
                        f"{what}: the steps {name!r} of key {keys[0]!r} have shape {list(known[0])} in one "
                        f"`lox.log` and {list(shape)} in another, in one buffered loop. Give them one shape "
                        "(e.g. log the step outside `jax.vmap`), or use another step name."
                    )
                steps[name] = (shape, dtype if known is None else np.promote_types(known[1], dtype))
        trees, leaves = tuple(layout[k][0] for k in keys), tuple(layout[k][1] for k in keys)
        groups.append(KeyGroup(tuple(keys), trees, leaves, steps))
    return groups


class DeviceBuffer:
    """The buffers of one loop, as the interpreter goes through it: per group
    (`KeyGroup`) a dict of arrays (tracers of whichever trace is being built):
    "count" (slots used), "leaves" (per key, per leaf), "steps" (per step
    name), and "valid" (the mask) where the group stores one. Subclasses
    choose the room (`slots`), the mask and where an event goes
    (`_position`), and what happens when it is full."""

    def __init__(self, groups: list[KeyGroup], slots: list[int], stores_valid: list[bool], mask_shapes: list[tuple]):
        self.groups = groups
        self.group_of = {key: i for i, group in enumerate(self.groups) for key in group.keys}
        self.slots, self.stores_valid, self.mask_shapes = slots, stores_valid, mask_shapes
        self.arrays = [self._empty(i) for i in range(len(self.groups))]
        self.pending = [0] * len(self.groups)  # appended since the counters last moved
        self.pending_total = 0  # events (`lox.log` calls) appended since then

    def _empty(self, i: int) -> dict:
        group, slots = self.groups[i], self.slots[i]
        # Inside a shard_map, typed per device: the events written into it may differ per device.
        zeros = lambda shape, fill, dtype, sharding=None: _compat.varying_in_manual_axes(  # noqa: E731
            _compat.full(shape, fill, dtype, sharding))
        arrays = {
            "count": jnp.zeros((), jnp.int32),
            "leaves": tuple(tuple(zeros((slots, *shape), 0, dtype, sharding) for shape, dtype, sharding in leaves)
                            for leaves in group.leaves),
            "steps": {name: zeros((slots, *shape), NO_STEP, dtype) for name, (shape, dtype) in group.steps.items()},
        }
        if self.stores_valid[i]:
            arrays["valid"] = zeros((slots, *self.mask_shapes[i]), False, bool)
        return arrays

    # --- appending -----------------------------------------------------------------
    def append(self, values: dict, steps: dict, active) -> None:
        """One event (`values` by key, `steps` by name): into each of its
        groups' next slot. `active` (None: always) marks it as logged."""
        for i in dict.fromkeys(self.group_of[key] for key in values):
            group, arrays = self.groups[i], self.arrays[i]
            at = self._position(i)

            def put(buf, x, at=at):  # `at` of this iteration (called within it)
                return jax.lax.dynamic_update_index_in_dim(buf, jnp.asarray(x, buf.dtype), at, 0)

            new = dict(arrays)
            # A key's buffers: one per leaf of its events (`KeyGroup.leaves`).
            new["leaves"] = tuple(
                tuple(put(b, x) for b, x in zip(buffers, jax.tree_util.tree_leaves(values[key]), strict=True))
                for key, buffers in zip(group.keys, arrays["leaves"], strict=True)
            )
            # A slot may be used again (a tap's buffer, once sent): a step name this event lacks is written too.
            new["steps"] = {
                name: put(b, steps[name] if name in steps else NO_STEP) for name, b in arrays["steps"].items()
            }
            if "valid" in arrays:
                logged = jnp.broadcast_to(jnp.asarray(True if active is None else active), self.mask_shapes[i])
                new["valid"] = put(arrays["valid"], logged)
                self._appended(i, new, at, logged)
            self.arrays[i] = new
            self.pending[i] += 1
        self.pending_total += 1

    def _position(self, i: int):
        """The slot group `i`'s next event goes to."""
        return self.arrays[i]["count"] + self.pending[i]

    def _appended(self, i: int, arrays: dict, at, logged) -> None:
        """After an event was written at `at` into a group that stores a mask."""

    def commit(self) -> None:
        """Move the counters by what was appended since they last moved."""
        for i, p in enumerate(self.pending):
            if p:
                self.arrays[i] = dict(self.arrays[i], count=self.arrays[i]["count"] + p)
        self.pending = [0] * len(self.groups)
        self.pending_total = 0

    def carry(self) -> tuple:
        self.commit()
        return tuple(self.arrays)

    def resume(self, carried) -> None:
        self.arrays = list(carried)
        self.pending = [0] * len(self.groups)
        self.pending_total = 0

    def structure(self) -> Self:
        """A copy without the arrays, for a body JAX traces later, which
        resumes from the state it is passed: holding no tracer, it can outlive
        the trace it was made in."""
        empty = copy.copy(self)
        empty.arrays = None
        empty.pending, empty.pending_total = [0] * len(self.groups), 0
        return empty


class TapBuffer(DeviceBuffer):
    """``lox.tap(..., buffer=K)``: sends every `K` events (`send_when`); `n`
    counts the events it holds (all groups)."""

    what = "`lox.tap(..., buffer=K)`"

    def __init__(self, kinds: collections.Counter, size: int):
        self.size = size
        groups = groups_of(list(kinds), self.what, "one loop", "tap without `buffer`")
        # The order keys first appear in, `lox.log` call after call: the order of a sent block's keys.
        self.key_order = list(dict.fromkeys(key for kind in kinds for key in kind.keys))
        room = [size - 1 + sum(n for kind, n in kinds.items() if group.keys[0] in kind.keys) for group in groups]
        super().__init__(groups, room, [True] * len(groups), [()] * len(groups))
        self.n = jnp.zeros((), jnp.int32)

    def commit(self) -> None:
        if self.pending_total:
            self.n = self.n + self.pending_total
        super().commit()

    def carry(self) -> tuple:
        arrays = super().carry()
        return arrays, self.n

    def resume(self, carried) -> None:
        arrays, self.n = carried
        super().resume(arrays)

    def structure(self) -> Self:
        empty = super().structure()
        empty.n = None
        return empty

    # --- branches ------------------------------------------------------------------
    def _slots_of(self, per_kind: collections.Counter) -> list[int]:
        """Events per kind → slots per group."""
        slots = [0] * len(self.groups)
        for kind, n in per_kind.items():
            for i in {self.group_of[key] for key in kind.keys}:
                slots[i] += n
        return slots

    def plan_cond(self, selection, branches):
        """The slots each group reserves in a cond, or None when a branch
        holds a loop that logs (then the buffers go through the cond, with
        their counters)."""
        found = [appends(selection, getattr(b, "jaxpr", b)) for b in branches]
        self.commit()
        counts = [c for c in found if c is not None]
        if len(counts) < len(found):
            return None
        kinds = list(dict.fromkeys(k for c in counts for k in c))
        most_of_kind = collections.Counter({kind: max(c[kind] for c in counts) for kind in kinds})
        # What each branch fills is known statically (conds inside it reserve their most).
        used = [self._slots_of(c) for c in counts]
        return self._slots_of(most_of_kind), used, sum(most_of_kind.values()), [a["count"] for a in self.arrays], self.n

    def leave_branch(self, plan, branch: int):
        """Mark the reserved slots branch number `branch` left empty; the
        arrays it returns (the counters stay out of the cond)."""
        most, used, _, counts, _ = plan
        for i, (filled, reserved) in enumerate(zip(used[branch], most, strict=True)):
            if reserved > filled:
                arrays = self.arrays[i]
                empty = jnp.zeros((reserved - filled,), bool)
                valid = jax.lax.dynamic_update_slice_in_dim(arrays["valid"], empty, counts[i] + filled, 0)
                self.arrays[i] = dict(arrays, valid=valid)
        return tuple({k: v for k, v in a.items() if k != "count"} for a in self.arrays)

    def exit_cond(self, plan, carried) -> None:
        most, _, events, counts, self.n = plan
        self.arrays = [dict(a, count=c) for a, c in zip(carried, counts, strict=True)]
        self.pending = list(most)
        self.pending_total = events

    # --- sending ---------------------------------------------------------------------
    def send_when(self, when, token, send):
        """If `when` (always if None), call ``send(token, when, counts,
        arrays)`` (a chained host call returning the next token) and empty the
        buffers; returns the token."""
        self.commit()
        counts = tuple(a["count"] for a in self.arrays)
        contents = tuple({k: v for k, v in a.items() if k != "count"} for a in self.arrays)

        def emptied(counts, n):
            self.arrays = [dict(a, count=c) for a, c in zip(self.arrays, counts, strict=True)]
            self.n = n

        if when is None:
            token = send(token, jnp.ones((), bool), counts, contents)
            emptied([jnp.zeros_like(c) for c in counts], jnp.zeros_like(self.n))
            return token

        def sent(token, counts, n):
            token = send(token, when, counts, contents)
            return token, tuple(jnp.zeros_like(c) for c in counts), jnp.zeros_like(n)

        def kept(token, counts, n):
            return token, counts, n

        token, counts, n = jax.lax.cond(when, sent, kept, token, counts, self.n)
        emptied(counts, n)
        return token


class SpoolBuffer(DeviceBuffer):
    """``lox.spool(..., max_events=N)``: keeps the first `N` events of each
    group; `logs` returns them, padded, when the loop ends."""

    what = "`lox.spool(..., max_events=N)`"

    def __init__(
        self, kinds: collections.Counter, capacity: int, mask_shape: tuple[int, ...], masked_keys=frozenset()
    ):
        self.capacity = capacity
        groups = groups_of(list(kinds), self.what, "a bounded loop", "spool the loop as a `scan`")
        # A stored mask for the groups logged in a loop with a batched predicate.
        masked = [bool(mask_shape) and bool(masked_keys.intersection(g.keys)) for g in groups]
        # Its counters go through conds with the branch that ran (the default): a branch that logs nothing
        # takes no slot.
        super().__init__(groups, [capacity + 1] * len(groups), masked, [mask_shape if m else () for m in masked])
        for i, m in enumerate(masked):
            if m:
                self.arrays[i]["dropped"] = jnp.zeros(mask_shape, jnp.int32)

    def _position(self, i: int):
        return jnp.minimum(super()._position(i), self.capacity)  # the spare slot once full

    def _appended(self, i: int, arrays: dict, at, logged) -> None:
        arrays["dropped"] = arrays["dropped"] + (logged & (at >= self.capacity)).astype(jnp.int32)

    def logs(self) -> logdict:
        """The loop's events: `capacity` slots per key, padded."""
        self.commit()
        n = self.capacity
        data, steps, valid, totals = {}, {}, {}, {}
        for group, arrays in zip(self.groups, self.arrays, strict=True):
            count = arrays["count"]
            if "valid" in arrays:
                mask = arrays["valid"][:n]
                total = (jnp.sum(mask, axis=0, dtype=jnp.int32), arrays["dropped"])
                # What finished elements computed in the slots they did not log: padding, as for the others
                # (`mask` bound: this iteration's).
                cut = lambda b, fill, mask=mask: jnp.where(  # noqa: E731
                    jnp.reshape(mask, mask.shape + (1,) * (b.ndim - mask.ndim)), b[:n], fill
                )
            else:
                mask = jnp.arange(n) < count
                total = (jnp.minimum(count, n), jnp.maximum(count - n, 0))
                cut = lambda b, fill: b[:n]  # noqa: E731
            for key, tree, buffers in zip(group.keys, group.trees, arrays["leaves"], strict=True):
                data[key] = jax.tree_util.tree_unflatten(tree, [cut(b, jnp.zeros((), b.dtype)) for b in buffers])
                valid[key], totals[key] = mask, total
            for name, s in arrays["steps"].items():
                steps.setdefault(name, {}).update(dict.fromkeys(group.keys, cut(s, jnp.asarray(NO_STEP, s.dtype))))
        return padded_logdict(data, steps, valid, totals)


def batched_loops(selection, eqn) -> tuple[tuple[int, ...], frozenset[str]]:
    """The vmap axes of the batched predicates in a loop nest (() if none),
    and the keys logged inside those loops."""
    shapes, keys = set(), set()

    def visit(eqn):
        if eqn.primitive is _compat.while_p:
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


# --- scans in chunks ---------------------------------------------------------------
def in_chunks(handler, scan, init: list, xs: list, chunk: int, end_chunk) -> tuple[list, list]:
    """Run `scan` (the interpreter's `Scan`) as a scan over chunks of `chunk`
    iterations (and one shorter chunk for the rest), calling
    ``end_chunk(logs)`` after each with the chunk's logs: a handler that sends
    what a chunk logged then does so without a test in every iteration.
    Returns the scan's carry and ys."""
    if scan.length == 0:  # no chunk to run
        carry, ys, _ = scan(init, xs, 0)
        return carry, ys
    like = handler.snapshot()

    def run_chunk(carry, xs_chunk, length):
        values, state = carry
        with continuing(handler, like, state):
            values, ys, logs = scan(values, xs_chunk, length, per_iteration=False)
            end_chunk(logs)
            return (values, handler.carry()), ys

    full, rest = divmod(scan.length, chunk)
    # The iterations of the full chunks, then the rest, in execution order
    # (a reverse scan runs from the end: its rest is at the front).
    if scan.reverse:
        main_at, rest_at = slice(rest, None), slice(0, rest)
    else:
        main_at, rest_at = slice(0, full * chunk), slice(full * chunk, None)
    carry = (list(init), handler.carry())
    parts = {}
    if full:
        chunked_xs = [jnp.reshape(x[main_at], (full, chunk, *x.shape[1:])) for x in xs]
        carry, ys = jax.lax.scan(
            lambda c, x: run_chunk(c, x, chunk), carry, chunked_xs, length=full, reverse=scan.reverse
        )
        parts["main"] = [jnp.reshape(y, (full * chunk, *y.shape[2:])) for y in ys]
    if rest:
        carry, parts["rest"] = run_chunk(carry, [x[rest_at] for x in xs], rest)
    order = ["rest", "main"] if scan.reverse else ["main", "rest"]
    present = [parts[k] for k in order if k in parts]
    ys = present[0] if len(present) == 1 else [jnp.concatenate(pair) for pair in zip(*present, strict=True)]
    handler.resume(carry[1])
    return carry[0], ys
