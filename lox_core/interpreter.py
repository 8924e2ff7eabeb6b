"""The jaxpr interpreter behind `spool`, `tap` and `nolog`.

A transform is a `Handler`: it selects log events and says what each becomes
(an output, a host callback, nothing). The interpreter walks a jaxpr that
`jax.make_jaxpr` built for the handler; equations with nothing selected inside
are copied as they are, `lox_log` equations go to the handler, and higher-order
primitives that contain selected logs are rebuilt through JAX's public calls
(`lax.scan`, `lax.switch`, `lax.while_loop`, `jax.checkpoint`, `jax.custom_jvp`,
`jax.custom_vjp`) with bodies that are themselves interpreted. lox never edits
an equation or binds a control-flow primitive with internal parameters.

Order: handler → interpreter → per-primitive rules.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import weakref
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lox_core import _compat
from lox_core.branches import Layout
from lox_core.logdict import concat, logdict
from lox_core.primitive import Site, event_outputs, log_p, site_of


# --- handler -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Selection:
    """Which events a transform takes: by key (`argnames`) and by tag."""

    argnames: frozenset[str] | None = None
    tags: frozenset[str] | None = None

    def keys(self, site: Site) -> tuple[str, ...]:
        # An explicit event is only taken by a transform that names something.
        if site.explicit and self.argnames is None and self.tags is None:
            return ()
        if self.tags is not None and not self.tags.intersection(site.tags):
            return ()
        if self.argnames is None:
            return site.keys
        return tuple(k for k in site.keys if k in self.argnames)


class Handler:
    """What a transform does with the log events it selects."""

    selection: Selection = Selection()
    collects = False  # whether events become outputs (spool) or not (tap, nolog)
    guards_branches = False  # whether events need to know that their cond branch was taken
    keep_logs = False  # whether selected events stay visible to outer transforms
    defers_logs = False  # whether on_log emits nothing, so it may run after later equations
    name = "lox"
    # Whether the handler threads state of its own through the program: a
    # pytree of arrays that the rules below pass into and out of every loop,
    # branch and function that holds selected logs (tap: the token that orders
    # its host calls, and the buffers of `buffer=K`).
    carries = False

    def on_log(self, site: Site, values: dict, steps: dict, active) -> logdict | None:
        """Handle one event (`values` holds the selected keys only); return the
        logs it contributes to the enclosing program's outputs, if any."""
        raise NotImplementedError

    # --- state, for handlers that carry it ---------------------------------------
    def session(self, like=None):
        """A context for one interpretation: fresh state, or a copy of the
        static parts of `like` (a `snapshot`), for functions JAX may trace
        after the interpretation ended (custom derivative rules)."""
        return contextlib.nullcontext()

    def snapshot(self):
        return None

    def carry(self):
        """The current state, to pass into a loop, branch or function."""
        raise NotImplementedError

    def resume(self, carried) -> None:
        """Go on with the state a loop, branch or function returned."""
        raise NotImplementedError

    def can_enter_shard_map(self) -> bool:
        """Whether the state can pass into a shard_map (replicated) as it is."""
        return True

    bounds_loops = False  # whether logs in loops of unknown length can be collected (`max_events`)

    def enter_loop(self, eqn, body):
        """Before a loop equation (scan or while) whose body is `body`; returns
        what `exit_loop` needs."""
        return None

    def end_iteration(self, active) -> None:
        """At the end of each loop iteration. `active` (None: always) says
        whether the iteration really ran: under `vmap` a loop or branch runs
        for elements that finished it or did not take it, and what they
        compute is then thrown away, so a handler must not act on it."""

    def chunk_length(self, body, length: int) -> int | None:
        """For a scan the handler just entered: run it in chunks of this many
        iterations, calling `end_chunk` after each instead of `end_iteration`
        after every iteration (None: one loop, as it is)."""
        return None

    def end_chunk(self, logs: logdict, active) -> None:
        """After each chunk of a scan run in chunks, with the chunk's logs
        (`active` as in `end_iteration`)."""

    def exit_loop(self, entered, active) -> logdict | None:
        """After the loop, with its final state resumed; the logs the loop
        returns, if the handler kept them in its state (`active` as in
        `end_iteration`)."""
        return None

    def enter_cond(self, branches):
        """Before a cond; returns a plan for `leave_branch` and `exit_cond`."""
        return None

    def leave_branch(self, plan):
        """At the end of a branch: the state the branch returns."""
        return self.carry()

    def exit_cond(self, plan, carried) -> None:
        """After the cond, with the state its taken branch returned."""
        self.resume(carried)


class StatefulHandler(Handler):
    """A handler that carries state: one state object per interpretation,
    held in a context variable (`state`), made by `fresh_state`."""

    carries = True

    def __init__(self):
        self._state: contextvars.ContextVar = contextvars.ContextVar(f"lox_{type(self).__name__}_state")

    def fresh_state(self, like=None):
        """A new state, taking the static parts of `like` (a state) if given."""
        raise NotImplementedError

    @property
    def state(self):
        return self._state.get()

    @contextlib.contextmanager
    def session(self, like=None):
        token = self._state.set(self.fresh_state(like))
        try:
            yield
        finally:
            self._state.reset(token)

    def snapshot(self):
        # A copy: what a loop adds to the live state is dropped when the loop ends.
        return self.fresh_state(self.state)


def signature(logs: logdict):
    leaves, tree = jax.tree_util.tree_flatten(logs)
    return tree, tuple((x.shape, x.dtype) for x in leaves)


def canonical(logs: logdict) -> logdict:
    """The same logs with keys and step names sorted, so that branches that log
    the same things in another order produce the same pytree."""
    keys = sorted(logs)
    steps = {n: {k: logs.steps[n][k] for k in keys if k in logs.steps[n]} for n in sorted(logs.steps)}
    # With the padding masks and counts of bounded loops (`max_events`), also sorted.
    valid = {k: logs._valid[k] for k in keys if k in logs._valid}
    totals = {k: logs._totals[k] for k in keys if k in logs._totals}
    return logs._like({k: logs[k] for k in keys}, steps, valid, totals)


# --- single events ---------------------------------------------------------------------
# A collected event gets a leading event axis of 1. A scan body that logs once per
# iteration returns the value *without* that axis, as hand-written code would; to
# return the very array that was logged (so that JAX can forward a scanned input
# instead of storing it), the scan rule remembers what each expansion came from.
# Only expansions made on the body's own trace count: those of a function traced
# inside it (a custom rule, a vmap) cannot be the body's outputs, and keeping
# them would keep that function's trace alive.
_expansions: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("lox_expansions", default=None)


def single_event(x):
    """`x` with a leading event axis of 1, remembered by an enclosing scan rule."""
    expanded = jax.lax.expand_dims(x, (0,))
    seen = _expansions.get()
    if seen is not None and seen[0] is _compat.current_trace():
        seen[1][id(expanded)] = (expanded, x)
    return expanded


# --- which equations need the handler --------------------------------------------------
_sites_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def sites_in(jaxpr) -> tuple[Site, ...]:
    """Every `lox.log` site in a jaxpr and the jaxprs nested in it (cached)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    try:
        return _sites_cache[jaxpr]
    except KeyError:
        pass
    found: list[Site] = []
    for eqn in jaxpr.eqns:
        if eqn.primitive is log_p:
            found.append(site_of(eqn.params))
        for sub in _compat.subjaxprs_of(eqn):
            found.extend(sites_in(sub))
    _sites_cache[jaxpr] = result = tuple(found)
    return result


def _selected_sites(handler: Handler, eqn) -> list[Site]:
    # Not only equations with the log effect: some higher-order primitives
    # (e.g. custom_linear_solve) do not pass their bodies' effects on.
    if eqn.primitive is log_p:
        sites = [site_of(eqn.params)]
    else:
        subs = _compat.subjaxprs_of(eqn)
        if not subs:  # most equations: nothing inside
            return subs
        sites = [s for sub in subs for s in sites_in(sub)]
    return [s for s in sites if handler.selection.keys(s)]


# --- interpreter --------------------------------------------------------------------------
def interpret(handler: Handler, jaxpr, consts: Sequence, args: Sequence, active=None) -> tuple[list, logdict]:
    """Evaluate `jaxpr` on the current trace, handing selected logs to `handler`.

    Returns the jaxpr's outputs and the logs the handler collected, each key's
    events in program order. `active` is a boolean scalar that is false where
    the enclosing `cond` branch was not taken (only under vmap, see
    `cond_rule`), or None.
    """
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, _compat.Literal) else env[v]

    def write(v, x):
        if not isinstance(v, _compat.DropVar):
            env[v] = x

    for v, x in zip(jaxpr.constvars, consts):
        write(v, x)
    for v, x in zip(jaxpr.invars, args):
        write(v, x)
    # How often each variable is read (by equations and as an output): a run of
    # equations passes on only what is read after it, and the events `lox.log`
    # returns, which most programs ignore, are emitted only when read.
    uses: collections.Counter | None = None

    def use_counts() -> collections.Counter:
        nonlocal uses
        if uses is None:
            uses = collections.Counter(v for e in jaxpr.eqns for v in e.invars if not isinstance(v, _compat.Literal))
            uses.update(v for v in jaxpr.outvars if not isinstance(v, _compat.Literal))
        return uses

    def is_used(outvars) -> bool:
        counts = use_counts()
        return any(counts[v] for v in outvars)

    collected: list[logdict] = []
    pending: list = []  # equations with nothing to handle, inlined as one run
    deferred: list = []  # logs wholly consumed by the handler, after that run

    def flush():
        if pending:
            counts = use_counts()
            inside = collections.Counter(v for e in pending for v in e.invars if not isinstance(v, _compat.Literal))
            _compat.inline_equations(pending, read, write, lambda v: counts[v] > inside[v])
            pending.clear()
        for eqn in deferred:
            collected.append(log_rule(handler, site_of(eqn.params), [read(v) for v in eqn.invars], active))
        deferred.clear()

    for eqn in jaxpr.eqns:
        selected = _selected_sites(handler, eqn)
        if not selected:
            pending.append(eqn)
            continue
        returned_event_used = eqn.primitive is log_p and is_used(eqn.outvars)
        if eqn.primitive is log_p and handler.defers_logs and not handler.keep_logs and not returned_event_used and (
            handler.selection.keys(selected[0]) == selected[0].keys
        ):
            # Nothing is emitted for it, so it need not break the run of equations.
            deferred.append(eqn)
            continue
        flush()
        invals = [read(v) for v in eqn.invars]
        if eqn.primitive is log_p:
            new = log_rule(handler, site_of(eqn.params), invals, active)
            outs = event_outputs(invals) if returned_event_used else []
        else:
            rule = rules.get(eqn.primitive.name)
            if rule is None:
                raise NotImplementedError(
                    f"`{eqn.primitive.name}` contains lox.log calls ({_keys_text(_selected_sites(handler, eqn))}) "
                    f"and lox does not know how to collect logs through it. Move the logs out of the "
                    f"`{eqn.primitive.name}` or remove them with `lox.nolog`; please report this at the lox issue tracker."
                )
            outs, new = rule(handler, eqn, invals, active)
        collected.append(new)
        for v, x in zip(eqn.outvars, outs):
            write(v, x)
    flush()
    return [read(v) for v in jaxpr.outvars], concat([c for c in collected if c])


def _keys_text(sites) -> str:
    keys = dict.fromkeys(k for s in sites for k in s.keys)
    return "keys " + ", ".join(map(repr, keys))


def log_rule(handler: Handler, site: Site, operands: list, active) -> logdict | None:
    """Hand the selected part of an event to the handler; rebind the rest."""
    taken = handler.selection.keys(site)
    values, steps = site.split(operands)
    collected = handler.on_log(site, {k: values[k] for k in taken}, steps, active)
    # What the handler did not take stays a log, for outer transforms or the default.
    rest = site.keys if handler.keep_logs else tuple(k for k in site.keys if k not in taken)
    if rest:
        _rebind(site, values, steps, rest)
    return collected


def _rebind(site: Site, values: dict, steps: dict, keys: tuple[str, ...]) -> None:
    index = [site.keys.index(k) for k in keys]
    sub = site._replace(keys=keys, trees=tuple(site.trees[i] for i in index))
    flat = [leaf for k in keys for leaf in jax.tree_util.tree_leaves(values[k])]
    log_p.bind(*flat, *steps.values(), **sub._asdict())


# --- rules for higher-order primitives ---------------------------------------------------
# Every rule is `rule(handler, eqn, invals, active) -> (outs, logs)`. Logs leave
# a sub-jaxpr as extra outputs: a logdict is a pytree.
rules: dict[str, Callable] = {}


def _interpreted(handler: Handler, closed, active, record: list | None = None):
    """The jaxpr as a function returning (outputs, logs); the logs of its last
    trace land in `record` if given, to describe them in error messages."""

    def fun(*args):
        outs, logs = interpret(handler, closed.jaxpr, closed.consts, args, active)
        if record is not None:  # abstract values only: the arrays belong to this trace
            record[:] = [jax.tree_util.tree_map(jax.typeof, logs)]
        return outs, logs

    return fun


def scan_rule(handler, eqn, invals, active):
    p = _compat.scan_params(eqn.params)
    consts = invals[: p.num_consts]
    init = invals[p.num_consts : p.num_consts + p.num_carry]
    xs = invals[p.num_consts + p.num_carry :]
    if not handler.carries:
        carry, ys, logs = _scan(handler, p, consts, init, xs, active, p.length)
        return [*carry, *ys], logs
    entered = handler.enter_loop(eqn, p.jaxpr)
    chunk = handler.chunk_length(p.jaxpr, p.length) if entered else None
    if chunk is None:
        carry, ys, logs = _scan(handler, p, consts, init, xs, active, p.length)
    else:
        carry, ys = _chunked_scan(handler, p, consts, init, xs, active, chunk)
        logs = logdict()
    more = handler.exit_loop(entered, active)
    return [*carry, *ys], logs if more is None else concat([logs, more])


@contextlib.contextmanager
def _inside(handler, state, outside):
    """While JAX traces a loop body or branch: the handler goes on from `state`
    (what the body receives), and afterwards back to `outside` (the state
    before the loop), so that nothing of the body's trace stays referenced
    once JAX has built it (`jax.checking_leaks` would call that a leak)."""
    handler.resume(state)
    try:
        yield
    finally:
        handler.resume(outside)


def _scan(handler, p, consts, init, xs, active, length: int, chunked: bool = False):
    """`p`'s scan over `length` iterations of `xs`, interpreted: (carry, ys,
    logs). A `chunked` one is a chunk of `_chunked_scan`: the handler acts at
    its end, not after every iteration."""
    body_fun = _interpreted(handler, p.jaxpr, active)
    layout: list = []
    carries = handler.carries
    if carries:
        init = (list(init), handler.carry())

    def body(carry, x):
        if not carries:
            return body_from(carry, x)
        carry, state = carry
        with _inside(handler, state, outside=init[1]):
            return body_from(carry, x)

    def body_from(carry, x):
        token = _expansions.set((_compat.current_trace(), {}))
        try:
            outs, logs = body_fun(*consts, *carry, *x)
            originals = _expansions.get()[1]
        finally:
            _expansions.reset(token)
        new_carry = outs[: p.num_carry]
        if carries:
            if not chunked:
                handler.end_iteration(active)
            new_carry = (new_carry, handler.carry())
        # Event counts (of bounded loops inside) are summed, not stacked.
        logs, totals = _without_totals(logs)
        leaves, tree = jax.tree_util.tree_flatten(logs)
        # One event per iteration (the common case) leaves the body without its
        # event axis, exactly like a hand-written `ys`; and an array shared by
        # several keys (an event's step) leaves once.
        unique, where = unique_objects(leaves)
        squeeze = [leaf.shape[0] == 1 for leaf in unique]
        layout[:] = [tree, squeeze, where]
        ys_logs = [(originals[id(u)][1] if id(u) in originals else u[0]) if sq else u for u, sq in zip(unique, squeeze)]
        return new_carry, (outs[p.num_carry :], ys_logs, totals)

    # With `xs` the scan takes its length from them (a symbolic dimension under `jax.export`, which `length=` refuses).
    carry, (ys, unique, totals) = jax.lax.scan(body, init, xs, length=None if xs else length, reverse=p.reverse, unroll=p.unroll)
    if carries:
        carry, state = carry
        handler.resume(state)
    tree, squeeze, where = layout

    def events_in_order(x, squeezed):
        # (iterations, [events per iteration,] ...) → (events, ...) in execution
        # order; a reverse scan runs its last iteration first.
        x = jnp.flip(x, 0) if p.reverse else x
        return x if squeezed else x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])

    unique = [events_in_order(u, sq) for u, sq in zip(unique, squeeze)]
    leaves = [unique[i] for i in where]
    logs = jax.tree_util.tree_unflatten(tree, leaves)
    logs._totals = jax.tree_util.tree_map(lambda t: jnp.sum(t, axis=0), totals)
    return carry, ys, logs


def _without_totals(logs: logdict) -> tuple[logdict, dict]:
    if not logs._totals:
        return logs, {}
    return logs._like(dict(logs), logs.steps, totals={}), logs._totals


def _chunked_scan(handler, p, consts, init, xs, active, chunk: int):
    """A scan as a scan over chunks of `chunk` iterations (and one shorter
    chunk for the rest), calling ``handler.end_chunk(logs)`` after each with
    the chunk's logs: a handler that sends what a chunk logged then does so
    without a test in every iteration."""

    def run_chunk(carry, xs_chunk, length):
        with _inside(handler, carry[1], outside):
            carry, ys, logs = _scan(handler, p, consts, carry[0], xs_chunk, active, length, chunked=True)
            handler.end_chunk(logs, active)
            return (carry, handler.carry()), ys

    if p.length == 0:  # no chunk to run
        carry, ys, _ = _scan(handler, p, consts, init, xs, active, 0)
        return carry, ys
    full, rest = divmod(p.length, chunk)
    # The iterations of the full chunks, then the rest, in execution order
    # (a reverse scan runs from the end: its rest is at the front).
    main_at, rest_at = (slice(rest, None), slice(0, rest)) if p.reverse else (slice(0, full * chunk), slice(full * chunk, None))
    carry = (list(init), handler.carry())
    outside = carry[1]
    parts = {}
    if full:
        chunked_xs = [jnp.reshape(x[main_at], (full, chunk, *x.shape[1:])) for x in xs]
        carry, ys = jax.lax.scan(lambda c, x: run_chunk(c, x, chunk), carry, chunked_xs, length=full, reverse=p.reverse)
        parts["main"] = [jnp.reshape(y, (full * chunk, *y.shape[2:])) for y in ys]
    if rest:
        carry, parts["rest"] = run_chunk(carry, [x[rest_at] for x in xs], rest)
    order = ["rest", "main"] if p.reverse else ["main", "rest"]
    present = [parts[k] for k in order if k in parts]
    ys = present[0] if len(present) == 1 else [jnp.concatenate(pair) for pair in zip(*present)]
    handler.resume(carry[1])
    return carry[0], ys


def unique_objects(values: list) -> tuple[list, list[int]]:
    """The distinct objects of `values` and, for each value, its index among them."""
    unique, index, where = [], {}, []
    for v in values:
        if id(v) not in index:
            index[id(v)] = len(unique)
            unique.append(v)
        where.append(index[id(v)])
    return unique, where


rules["scan"] = scan_rule


def cond_rule(handler, eqn, invals, active):
    index, *ops = invals
    branches = _compat.cond_branches(eqn.params)
    records = [[] for _ in branches]
    carries = handler.carries
    if carries:
        plan = handler.enter_cond(branches)
        outside = handler.carry()
        ops = [outside, *ops]
    layout = None  # set when the branches log differently: their logs are padded to it

    def branch(i, closed):
        def fun(*ops):
            if not carries:
                return branch_from(*ops)
            state, *ops = ops
            with _inside(handler, state, outside):
                return branch_from(*ops)

        def branch_from(*ops):
            # Under vmap with a batched index both branches run for every element;
            # `index == i` is then the mask of elements that took this branch (tap
            # uses it; spool's outputs are selected per element by JAX itself).
            guard = active
            if handler.guards_branches:
                here = index == i
                guard = here if active is None else jnp.logical_and(active, here)
            outs, logs = _interpreted(handler, closed, guard, records[i])(*ops)
            logs = canonical(logs) if layout is None else layout.pad(canonical(logs))
            if carries:
                return outs, logs, handler.leave_branch(plan)
            return outs, logs

        return fun

    def switch():
        return jax.lax.switch(index, [branch(i, b) for i, b in enumerate(branches)], *ops)

    try:
        outs, logs, *state = switch()
    except TypeError:
        logged = [canonical(rec[0]) for rec in records if rec]
        if len(logged) < len(branches) or all(signature(r) == signature(logged[0]) for r in logged):
            raise  # not about the logs
        # Semantically, a key that some branches log and others do not (or log
        # fewer times) is a padded series: valid where the branch that ran logged it.
        layout = Layout(logged)
        outs, logs, *state = switch()
    if carries:
        handler.exit_cond(plan, state[0])
    return outs, logs


rules["cond"] = cond_rule


def while_rule(handler, eqn, invals, active):
    p = _compat.while_params(eqn.params)
    if handler.collects and not handler.bounds_loops:
        keys = _keys_text(_selected_sites(handler, eqn))
        raise ValueError(
            f"`{handler.name}` cannot collect logs ({keys}) inside `jax.lax.while_loop` (which is also what "
            "`jax.lax.fori_loop` becomes when its bounds are traced): the number of iterations, and so the "
            "number of events, is unknown at compile time. Give the spool a capacity "
            "(`lox.spool(f, max_events=N)` keeps the first N events of each key in the loop), use "
            "`jax.lax.scan` or a `fori_loop` with static bounds, stream the events with `lox.tap`, or remove "
            "them with `lox.nolog`."
        )
    cconsts = invals[: p.cond_nconsts]
    bconsts = invals[p.cond_nconsts : p.cond_nconsts + p.body_nconsts]
    init = invals[p.cond_nconsts + p.body_nconsts :]
    carries = handler.carries
    if carries:
        entered = handler.enter_loop(eqn, p.body_jaxpr)
        state = outside = handler.carry()

    def pred_fun(carry, h=handler):
        return interpret(h, p.cond_jaxpr.jaxpr, p.cond_jaxpr.consts, [*cconsts, *carry], active)[0][0]

    def cond_fun(carry):
        if carries:
            # Logs in the predicate use the state but cannot change it (the
            # predicate returns only a boolean); a handler that must, refuses.
            carry, state = carry
            with _inside(handler, state, outside), _in_predicate(True):
                pred = pred_fun(carry)
        else:
            pred = pred_fun(carry)
        # A predicate batched by vmap (a prefix of every carry's shape): loop while any element runs.
        return jnp.any(pred) if jnp.ndim(pred) else pred

    batched_pred = len(p.cond_jaxpr.out_avals[0].shape) > 0

    def body_fun(carry):
        if carries:
            carry, state = carry
            with _inside(handler, state, outside):
                new, guard = body(carry)
                handler.end_iteration(guard)
                return new, handler.carry()
        return body(carry)[0]

    def body(carry):
        guard = active
        if handler.guards_branches or batched_pred:
            here = pred_fun(carry, DropAll())  # its logs were emitted by cond_fun
            # A handler with state needs to know which elements of a batched loop run.
            if handler.guards_branches or carries:
                guard = here if active is None else jnp.logical_and(active, here)
        new = interpret(handler, p.body_jaxpr.jaxpr, p.body_jaxpr.consts, [*bconsts, *carry], guard)[0]
        if batched_pred:
            new = [jnp.where(jnp.reshape(here, here.shape + (1,) * (jnp.ndim(n) - here.ndim)), n, c) for n, c in zip(new, carry)]
        return new, guard

    if not carries:
        return jax.lax.while_loop(cond_fun, body_fun, list(init)), []
    outs, state = jax.lax.while_loop(cond_fun, body_fun, (list(init), state))
    handler.resume(state)
    return outs, handler.exit_loop(entered, active)


_predicate: contextvars.ContextVar[bool] = contextvars.ContextVar("lox_in_predicate", default=False)


@contextlib.contextmanager
def _in_predicate(value: bool):
    token = _predicate.set(value)
    try:
        yield
    finally:
        _predicate.reset(token)


def in_while_predicate() -> bool:
    """Whether the log being handled sits in a `while_loop`'s predicate."""
    return _predicate.get()


rules["while"] = while_rule


def jit_rule(handler, eqn, invals, active):
    # A nested jit is inlined: XLA would inline it anyway, and its logs become
    # part of the enclosing program.
    closed = _compat.call_jaxpr(eqn.params)
    return interpret(handler, closed.jaxpr, closed.consts, invals, active)


for _name in _compat.JIT_NAMES:
    rules[_name] = jit_rule


def remat_rule(handler, eqn, invals, active):
    p = _compat.remat_params(eqn.params)
    fun = _interpreted(handler, _compat.ClosedJaxpr(p.jaxpr, ()), active)
    if not handler.carries:
        return jax.checkpoint(fun, prevent_cse=p.prevent_cse, policy=p.policy)(*invals)
    outs, logs, state = jax.checkpoint(_threading(handler, fun), prevent_cse=p.prevent_cse, policy=p.policy)(
        handler.carry(), *invals
    )
    handler.resume(state)
    return outs, logs


def _threading(handler, fun):
    """`fun(*args) -> (outs, logs)` as `f(state, *args) -> (outs, logs, state)`,
    for a handler that carries state."""

    like = handler.snapshot()

    def threaded(state, *args):
        with handler.session(like):
            handler.resume(state)
            outs, logs = fun(*args)
            return outs, logs, handler.carry()

    return threaded


for _name in _compat.REMAT_NAMES:
    rules[_name] = remat_rule


# Semantically, the events of a custom_jvp / custom_vjp function are those of its
# primal function, whether or not it is differentiated: the rebuilt function
# returns them as extra outputs with zero tangents (their cotangents are
# ignored). The JVP/forward/backward rules run as the user wrote them; they
# usually call the primal function, whose events were collected already, so
# those keys are removed from the rule, and any other log in a rule stays in the
# program for an enclosing transform or the default output. (Under
# `spool(jax.grad(f))` JAX has replaced the function by its rule before lox sees
# it, so there the rule's logs are collected like any others.)
def _primal_and_original(handler, eqn, active) -> tuple[Callable, Callable]:
    """A custom_jvp/vjp equation's primal function, interpreted, and the
    equation itself as a function."""
    p = _compat.custom_call_params(eqn.params)
    primal = _interpreted(handler, p.call_jaxpr, active)

    def original(*args):
        return _compat.bind_equation(eqn, list(args))

    return primal, original


def _zero_tangent(x):
    # Integer outputs (steps, integer values) take float0 tangents.
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


def custom_jvp_rule(handler, eqn, invals, active):
    primal, original = _primal_and_original(handler, eqn, active)
    carries = handler.carries
    if carries:  # the handler's state goes in first and comes out last, with zero tangents
        primal, invals = _threading(handler, primal), [handler.carry(), *invals]
    fun = jax.custom_jvp(primal)

    @fun.defjvp
    def fun_jvp(primals, tangents):
        result = primal(*primals)
        if carries:
            primals, tangents = primals[1:], tangents[1:]
        _, out_tangents = without_logs(handler, eqn, lambda p, t: jax.jvp(original, p, t), primals, tangents)
        return result, (list(out_tangents), *(jax.tree_util.tree_map(_zero_tangent, r) for r in result[1:]))

    return _resumed(handler, fun(*invals))


def _resumed(handler, result):
    """(outs, logs[, state]) → (outs, logs), going on with the state."""
    if handler.carries:
        handler.resume(result[2])
    return result[0], result[1]


for _name in _compat.CUSTOM_JVP_NAMES:
    rules[_name] = custom_jvp_rule


def custom_vjp_rule(handler, eqn, invals, active):
    primal, original = _primal_and_original(handler, eqn, active)
    carries = handler.carries
    state_shapes: list = []
    if carries:
        primal, invals = _threading(handler, primal), [handler.carry(), *invals]
    fun = jax.custom_vjp(primal)

    def fwd(*args):
        result = primal(*args)
        if carries:
            state_shapes[:] = [jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), args[0])]
            args = args[1:]
        outs, pullback = without_logs(handler, eqn, lambda *a: jax.vjp(original, *a), *args)
        return (outs, *result[1:]), pullback

    def bwd(pullback, cotangents):
        out_cts = cotangents[0]
        arg_cts = tuple(without_logs(handler, eqn, pullback, list(out_cts)))
        if carries:  # nothing flows back into the handler's state
            return (jax.tree_util.tree_map(_zero_of, state_shapes[0]), *arg_cts)
        return arg_cts

    fun.defvjp(fwd, bwd)
    return _resumed(handler, fun(*invals))


def _zero_of(shape):
    if jnp.issubdtype(shape.dtype, jnp.inexact):
        return jnp.zeros(shape.shape, shape.dtype)
    return np.zeros(shape.shape, jax.dtypes.float0)


for _name in _compat.CUSTOM_VJP_NAMES:
    rules[_name] = custom_vjp_rule


# Inside `jax.shard_map` every device runs the body on its own shards, so a log
# there is an event per device: a tap calls back once per device, with that
# device's values. The tap's token goes in replicated and comes out once per
# device; the program goes on after the last device's call. Collecting the
# per-device events as outputs is not supported.
def shard_map_rule(handler, eqn, invals, active):
    p = _compat.shard_map_params(eqn.params)
    keys = _keys_text(_selected_sites(handler, eqn))
    if handler.collects or handler.keep_logs:
        raise ValueError(
            f"`{handler.name}` cannot collect logs ({keys}) from inside `jax.shard_map`, where each device logs "
            "its own shard. Stream them with `lox.tap` (one callback per device), return the values from the "
            "shard_map and log them outside, or remove the logs with `lox.nolog`."
        )
    carries = handler.carries
    if carries and not handler.can_enter_shard_map():
        raise NotImplementedError(
            f"`{handler.name}` cannot buffer the logs ({keys}) of a `jax.shard_map` inside a buffered loop. "
            "Put the loop inside the shard_map, or tap without `buffer`."
        )
    axes = tuple(sorted(p.manual_axes))
    replicated = jax.sharding.PartitionSpec()
    extra = []
    if carries:
        extra.append(handler.carry())
    if active is not None:
        extra.append(active)

    def body(*args):
        state, args = (args[0], args[1:]) if carries else (None, args)
        inner_active, args = (args[0], args[1:]) if active is not None else (None, args)
        if not carries:
            return interpret(handler, p.jaxpr.jaxpr, p.jaxpr.consts, list(args), inner_active)[0]
        with _inside(handler, state, outside=extra[0]):
            outs, logs = interpret(handler, p.jaxpr.jaxpr, p.jaxpr.consts, list(args), inner_active)
            per_device = jax.tree_util.tree_map(lambda x: jnp.reshape(x, (1,) * len(axes) + jnp.shape(x)), handler.carry())
            return outs, per_device

    in_specs = (*[replicated] * len(extra), *p.in_specs)
    out_specs = (list(p.out_specs), jax.sharding.PartitionSpec(*axes)) if carries else list(p.out_specs)
    mapped = jax.shard_map(body, mesh=p.mesh, in_specs=in_specs, out_specs=out_specs,
                           axis_names=set(p.manual_axes), check_vma=p.check_vma)
    result = mapped(*extra, *invals)
    if not carries:
        return result, []
    outs, per_device = result
    # Every device made the same calls: any device's token will do as the next call's input.
    handler.resume(jax.tree_util.tree_map(lambda x: jnp.max(x, axis=tuple(range(len(axes)))), per_device))
    return outs, []


for _name in _compat.SHARD_MAP_NAMES:
    rules[_name] = shard_map_rule


class DropAll(Handler):
    """Removes every log it selects (`lox.nolog` selects all)."""

    name = "lox.nolog"

    def __init__(self, selection: Selection = Selection()):
        self.selection = selection

    def on_log(self, site, values, steps, active):
        return None


def without_logs(handler: Handler, eqn, fun: Callable, *args):
    """Call a custom derivative rule `fun` without the logs of the primal
    function (which the rebuilt primal emitted already); `lox.nolog` removes
    the rule's other logs too."""
    if isinstance(handler, DropAll):
        dropped = Selection()
    else:
        primal_keys = {k for s in sites_in(_compat.custom_call_params(eqn.params).call_jaxpr) for k in s.keys}
        dropped = Selection(argnames=frozenset(primal_keys))
    closed, out_shape = jax.make_jaxpr(fun, return_shape=True)(*args)
    outs, _ = interpret(DropAll(dropped), closed.jaxpr, closed.consts,
                        jax.tree_util.tree_leaves(args))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)
