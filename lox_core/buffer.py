"""The device-side buffers of ``lox.tap(f, callback, buffer=K)``.

A tapped loop keeps its events on device, in arrays carried by the loop (the
outermost loop that logs creates them; loops, branches and functions inside it
pass them on), and crosses to the host once the buffers hold `K` events, and
once more when the loop ends. Events are grouped by *kind*: the keys, pytree
structures, shapes and dtypes of one `lox.log` call, and its step names. Each
kind has its own arrays, one slot per event, with the event's place in program
order (`seq`) and whether it was logged (`valid`: false in the slots a `cond`
branch reserved but did not use).

Appends between two checks (the end of a loop iteration) are counted in Python
(`pending`), so an event costs one dynamic-update-slice per array and no
counter arithmetic; a kind's capacity is `K - 1` plus the number of `lox.log`
calls of that kind in the loop, the most that can arrive between two checks.

Branches keep the counters out of the `cond`: each branch fills the slots of
the most events any branch logs (the rest marked not valid), so the counters
move by a static amount whichever branch runs. That keeps them unbatched under
`vmap`, where a cond with a batched predicate runs both branches and selects
their outputs; a counter among those outputs would become one per element and
turn the check that sends the buffers into a select that sends them every time.
"""

from __future__ import annotations

import collections
import copy
from typing import Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from lox_core import _compat
from lox_core.logdict import concat, logdict
from lox_core.primitive import log_p, site_of

# Loops lox rebuilds with a carry; a branch holding one that logs appends a number
# of events known only at run time.
_LOOPS = frozenset({"scan", "while"})


class Kind(NamedTuple):
    """What the events of one kind look like (static)."""

    keys: tuple[str, ...]
    trees: tuple  # one pytree structure per key
    leaves: tuple  # (shape, dtype, sharding of its events or None) of every leaf, key after key
    steps: tuple  # (name, shape, dtype) of every step


def kind_of(keys, values: dict, steps: dict) -> Kind:
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
    return kind_of(taken, values, steps)


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
        if scans and eqn.primitive.name == "scan":
            inner = appends(selection, subs[0], scans)
            if inner is None:
                return None
            total.update({kind: n * _compat.scan_params(eqn.params).length for kind, n in inner.items()})
            continue
        if eqn.primitive.name in _LOOPS:
            if any(kinds_in(selection, s) for s in subs):
                return None
            continue
        counts = [appends(selection, s, scans) for s in subs]
        if any(c is None for c in counts):
            return None
        if eqn.primitive.name == "cond":  # one branch runs
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
        if eqn.primitive.name == "cond":
            counts = [appends(selection, s, scans=True) for s in subs]
            if any(c != counts[0] for c in counts):
                return False
        if not all(conds_log_alike(selection, s) for s in subs):
            return False
    return True


def check_one_shape_per_key(
    kinds, what: str = "`lox.tap(..., buffer=K)`", where: str = "one loop", otherwise: str = "tap without `buffer`"
) -> None:
    """A buffer holds each key's events in one array, so each key must keep
    one structure, shape and dtype in the buffered loop (the error says what
    the user can do `otherwise`)."""
    seen: dict[str, tuple] = {}
    for kind in kinds:
        leaves = iter(kind.leaves)
        for key, tree in zip(kind.keys, kind.trees):
            mine = (tree, tuple(next(leaves) for _ in range(tree.num_leaves)))
            other = seen.setdefault(key, mine)
            if other != mine:
                describe = lambda d: ", ".join(f"{np.dtype(t).name}{list(s)}" for s, t, _ in d[1])  # noqa: E731
                raise ValueError(
                    f"{what}: key {key!r} is logged as {describe(other)} and as {describe(mine)} "
                    f"in {where}. A buffer holds each key's events in one array, so a key must keep one "
                    f"shape and dtype there: log the other values under another key, or {otherwise}."
                )


class Buffers:
    """The buffers of one tapped loop, as the interpreter goes through it.

    Holds the current arrays (tracers of whichever trace is being built) and
    the appends since the last check; `carry`/`resume` pass the arrays in and
    out of loops, branches and functions.
    """

    def __init__(self, kinds: collections.Counter, size: int):
        check_one_shape_per_key(kinds)
        self.size = size
        self.kinds = list(kinds)
        self.index = {kind: i for i, kind in enumerate(self.kinds)}
        self.capacity = [size - 1 + kinds[kind] for kind in self.kinds]
        self.counts = [jnp.zeros((), jnp.int32) for _ in self.kinds]
        self.n = jnp.zeros((), jnp.int32)  # events held, all kinds
        self.arrays = [_empty(kind, cap) for kind, cap in zip(self.kinds, self.capacity)]
        self.pending = [0] * len(self.kinds)  # appended since the counters last moved
        self.pending_total = 0

    # --- appending -----------------------------------------------------------------
    def append(self, kind: Kind, leaves: list, steps: list, active) -> None:
        i = self.index[kind]
        at = self.counts[i] + self.pending[i]
        old_leaves, old_steps, valid, seq = self.arrays[i]
        put = lambda buf, x: jax.lax.dynamic_update_index_in_dim(buf, jnp.asarray(x, buf.dtype), at, 0)  # noqa: E731
        self.arrays[i] = (
            tuple(put(b, x) for b, x in zip(old_leaves, leaves)),
            tuple(put(b, s) for b, s in zip(old_steps, steps)),
            put(valid, True if active is None else active),
            put(seq, self.n + self.pending_total),
        )
        self.pending[i] += 1
        self.pending_total += 1

    def commit(self) -> None:
        for i, p in enumerate(self.pending):
            if p:
                self.counts[i] = self.counts[i] + p
        if self.pending_total:
            self.n = self.n + self.pending_total
        self.pending = [0] * len(self.kinds)
        self.pending_total = 0

    def carry(self):
        self.commit()
        return tuple(self.counts), self.n, tuple(self.arrays)

    def structure(self) -> "Buffers":
        """A copy without the arrays, for a function JAX traces later, which
        resumes from the state it is passed: holding no tracer, it can outlive
        the trace it was made in."""
        empty = copy.copy(self)
        empty.counts = empty.n = empty.arrays = None
        empty.pending, empty.pending_total = [0] * len(self.kinds), 0
        return empty

    def resume(self, carried) -> None:
        counts, self.n, arrays = carried
        self.counts, self.arrays = list(counts), list(arrays)
        self.pending = [0] * len(self.kinds)
        self.pending_total = 0

    # --- branches ------------------------------------------------------------------
    def plan_cond(self, selection, branches):
        """The slots each kind reserves in a cond, or None when a branch holds a
        loop that logs (then the whole state goes through the cond)."""
        counts = [appends(selection, getattr(b, "jaxpr", b)) for b in branches]
        self.commit()
        if any(c is None for c in counts):
            return None
        most = [max(c[kind] for c in counts) for kind in self.kinds]
        return most, (list(self.counts), self.n)

    def leave_branch(self, plan):
        """Mark the reserved slots this branch left empty; the arrays it returns."""
        most, _ = plan
        for i, (used, reserved) in enumerate(zip(self.pending, most)):
            if reserved > used:
                leaves, steps, valid, seq = self.arrays[i]
                empty = jnp.zeros((reserved - used,), bool)
                valid = jax.lax.dynamic_update_slice_in_dim(valid, empty, self.counts[i] + used, 0)
                self.arrays[i] = (leaves, steps, valid, seq)
        return tuple(self.arrays)

    def exit_cond(self, plan, arrays) -> None:
        most, (counts, n) = plan
        self.counts, self.n, self.arrays = counts, n, list(arrays)
        self.pending = list(most)
        self.pending_total = sum(most)

    # --- sending ---------------------------------------------------------------------
    def send_when(self, when, token, send):
        """If `when` (always if None), call ``send(token, when, counts, arrays)``
        (a chained host call returning the next token) and empty the buffers;
        returns the token."""
        self.commit()
        if when is None:
            token = send(token, jnp.ones((), bool), tuple(self.counts), tuple(self.arrays))
            self.counts = [jnp.zeros_like(c) for c in self.counts]
            self.n = jnp.zeros_like(self.n)
            return token

        def sent(token, counts, n):
            token = send(token, when, counts, tuple(self.arrays))
            return token, tuple(jnp.zeros_like(c) for c in counts), jnp.zeros_like(n)

        def kept(token, counts, n):
            return token, counts, n

        token, counts, self.n = jax.lax.cond(when, sent, kept, token, tuple(self.counts), self.n)
        self.counts = list(counts)
        return token


def _empty(kind: Kind, capacity: int):
    # Inside a shard_map, typed per device: the events written into it may differ per device.
    zeros = lambda shape, dtype, sharding=None: _compat.varying_in_manual_axes(_compat.full(shape, 0, dtype, sharding))  # noqa: E731
    leaves = tuple(zeros((capacity, *shape), dtype, sharding) for shape, dtype, sharding in kind.leaves)
    steps = tuple(zeros((capacity, *shape), dtype) for _, shape, dtype in kind.steps)
    return leaves, steps, zeros((capacity,), bool), zeros((capacity,), jnp.int32)


# --- on the host ---------------------------------------------------------------------
def elements(batch_ndim: int, shape: tuple, tree) -> list:
    """`tree`'s arrays for each element of the leading `batch_ndim` axes (of
    size `shape[:batch_ndim]`), in the order `blocks` numbers elements."""
    batch_shape = tuple(shape[:batch_ndim])
    return [jax.tree_util.tree_map(lambda x: np.array(np.broadcast_to(x, batch_shape + np.shape(x)[batch_ndim:])[index]), tree)
            for index in np.ndindex(batch_shape)]


def blocks(kinds: list[Kind], prefix: str, batch_ndim: int, when, counts, arrays) -> Iterator[tuple[int, logdict]]:
    """The events a sent buffer holds, one logdict per `vmap` element (one in
    all outside vmap) with the element's flat index, each key's events in
    program order."""
    when = np.asarray(when)
    batch_shape = when.shape[:batch_ndim]
    elements = int(np.prod(batch_shape))
    flat = lambda x: np.reshape(np.broadcast_to(x, batch_shape + np.shape(x)[batch_ndim:]), (elements, *np.shape(x)[batch_ndim:]))  # noqa: E731
    when = flat(when)
    counts = [flat(c) for c in counts]
    arrays = [jax.tree_util.tree_map(flat, a) for a in arrays]
    for e in range(elements):
        if not when[e]:
            continue
        parts, seqs = [], []
        for kind, count, (leaves, steps, valid, seq) in zip(kinds, counts, arrays):
            rows = np.flatnonzero(valid[e, : count[e]])
            if rows.size == 0:
                continue
            flat_leaves = iter([x[e, rows] for x in leaves])  # fancy indexing copies: the callee may keep them
            data = {
                prefix + k: jax.tree_util.tree_unflatten(tree, [next(flat_leaves) for _ in range(tree.num_leaves)])
                for k, tree in zip(kind.keys, kind.trees)
            }
            per_name = {name: dict.fromkeys(data, s[e, rows]) for (name, _, _), s in zip(kind.steps, steps)}
            parts.append(logdict._trusted(data, per_name))
            seqs.append(seq[e, rows])
        if not parts:
            continue
        yield e, parts[0] if len(parts) == 1 else _in_program_order(parts, seqs)


def _in_program_order(parts: list[logdict], seqs: list[np.ndarray]) -> logdict:
    """Concatenate kinds; a key logged by several kinds gets its events sorted."""
    merged = concat(parts)
    owners = collections.Counter(k for p in parts for k in p)
    for key, n in owners.items():
        if n == 1:
            continue
        order = np.argsort(np.concatenate([s for p, s in zip(parts, seqs) if key in p]), kind="stable")
        merged[key] = jax.tree_util.tree_map(lambda x: x[order], merged[key])
        for per_key in merged.steps.values():
            if key in per_key:
                per_key[key] = per_key[key][order]
    return merged
