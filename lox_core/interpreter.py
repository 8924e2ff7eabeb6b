"""The jaxpr interpreter behind `spool`, `tap` and `nolog`.

A transform is a `Handler`: it selects log events and says what each becomes
(an output, a host callback, nothing), and it may carry state of its own (a
pytree of arrays) through the program. The interpreter walks a jaxpr that
`jax.make_jaxpr` built for the handler; equations with nothing selected inside
are emitted as they are (`lox_core.segments`), `lox_log` equations go to the
handler, and higher-order primitives that contain selected logs go to a rule,
which rebuilds them through JAX's public calls (`lax.scan`, `lax.switch`,
`lax.while_loop`, `jax.checkpoint`, `jax.custom_jvp`, `jax.custom_vjp`,
`jax.shard_map`) with bodies that are themselves interpreted. lox never
edits an equation or binds a control-flow primitive with internal parameters.

Every rule has one code path: the handler's state goes into each body as an
input and comes out as an output (`threaded`), an empty pytree for handlers
that keep none. What a handler decides about loops and branches happens in
its hooks (`enter_loop`, `run_scan`, `enter_cond`, ...), not in the rules.

Adding a primitive: a rule `rule(handler, eqn, invals, active) -> (outs,
logs)` registered with `@rule_for(_compat.some_p)` below, plus a parameter
reader in `_compat` (see the contributor page of the docs).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import weakref
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lox_core import _compat, segments
from lox_core.branches import Layout
from lox_core.logdict import concat, event_totals, logdict, padded_logdict
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


class Loop(NamedTuple):
    """A loop equation the interpreter is about to rebuild."""

    eqn: object  # the equation (its parameters are read through `_compat`)
    body: object  # the body's jaxpr
    length: int | None  # a scan's number of iterations; None for a while loop
    predicate: object = None  # a while loop's predicate jaxpr


class Handler:
    """What a transform does with the log events it selects.

    A handler's state lives in a context variable, one per interpretation
    (`session`): the state a loop, branch or function passes in and out is
    `carry()` (a pytree of arrays; empty by default), and the handler goes on
    from a carried state with `resume`. The hooks below are called by the
    rules at fixed points; their defaults do nothing.
    """

    selection: Selection = Selection()
    name = "lox"
    keep_logs = False  # whether selected events stay visible to outer transforms
    defers_logs = False  # whether on_log emits nothing, so it may run after later equations
    uses_active = False  # whether on_log needs `active` in cond branches and while loops (tap)
    drops_logs = False  # whether what it selects goes nowhere (nolog): a custom derivative rule's logs go too

    def __init__(self):
        self._state: contextvars.ContextVar = contextvars.ContextVar(f"lox_{type(self).__name__}_state")

    def on_log(self, site: Site, values: dict, steps: dict, active) -> logdict | None:
        """Handle one event (`values` holds the selected keys only); return the
        logs it contributes to the enclosing program's outputs, if any.
        `active` (None: always) is false where the event did not really
        happen: under `vmap` a loop or branch runs for elements that finished
        it or did not take it, and what they compute is thrown away."""
        raise NotImplementedError

    # --- state ---------------------------------------------------------------------
    # The states, loop and branch plans of the hooks below are each handler's own: `Any`.
    def fresh_state(self, like=None) -> Any:
        """A new state (None for a handler without one), taking the static
        parts of `like` (a state) if given."""
        return None

    @property
    def state(self):
        return self._state.get(None)

    @contextlib.contextmanager
    def session(self, like=None):
        """One interpretation, or one body of it: a fresh state (a copy of the
        static parts of `like`), dropped at the end. Bodies that JAX traces
        after the interpretation ended (custom derivative rules) hold nothing
        of the state they were made in."""
        token = self._state.set(self.fresh_state(like))
        try:
            yield
        finally:
            self._state.reset(token)

    def snapshot(self):
        """The static parts of the current state, for bodies traced later."""
        return self.fresh_state(self.state)

    def carry(self) -> Any:
        """The current state, to pass into a loop, branch or function."""
        return ()

    def resume(self, carried) -> None:
        """Go on with the state a loop, branch or function returned."""

    # --- loops -----------------------------------------------------------------------
    def enter_loop(self, loop: Loop) -> Any:
        """Before a loop that holds selected logs; returns what `run_scan` and
        `exit_loop` need. A handler that cannot handle the loop raises here."""
        return None

    def run_scan(self, entered, scan: "Scan", init: list, xs: list):
        """Run a scan that `enter_loop` entered: ``scan(init, xs)`` runs it
        whole; a handler may run it in parts instead (`Scan`)."""
        return scan(init, xs)

    def end_iteration(self, active) -> None:
        """At the end of each loop iteration (`active` as in `on_log`)."""

    def exit_loop(self, entered, active) -> logdict | None:
        """After the loop, with its final state resumed; the logs the loop
        returns, if the handler kept them in its state."""
        return None

    # --- branches --------------------------------------------------------------------
    def enter_cond(self, branches) -> Any:
        """Before a cond; returns a plan for `leave_branch` and `exit_cond`."""
        return None

    def leave_branch(self, plan, branch: int) -> Any:
        """At the end of branch number `branch`: the state it returns."""
        return self.carry()

    def exit_cond(self, plan, carried) -> None:
        """After the cond, with the state its taken branch returned."""
        self.resume(carried)

    # --- other places ----------------------------------------------------------------
    def enter_shard_map(self, keys: str) -> None:
        """Before a `shard_map` that holds selected logs (`keys` names them);
        raises if the handler cannot take them from there."""


@contextlib.contextmanager
def continuing(handler: Handler, like, state):
    """While JAX traces a body: the handler in a session of its own (static
    parts from `like`, a `snapshot`) going on from `state`, the body's input.
    Nothing of the body's trace stays referenced once JAX has built it."""
    with handler.session(like):
        handler.resume(state)
        yield


def threaded(handler: Handler, closed, active) -> Callable:
    """A sub-jaxpr as ``f(state, *args) -> (outs, logs, state)``, interpreted
    with the handler going on from `state`: what every higher-order rule
    calls."""
    like = handler.snapshot()

    def fun(state, *args):
        with continuing(handler, like, state):
            outs, logs = interpret(handler, closed.jaxpr, closed.consts, args, active)
            return outs, logs, handler.carry()

    return fun


def signature(logs: logdict):
    leaves, tree = jax.tree_util.tree_flatten(logs)
    return tree, tuple((x.shape, x.dtype) for x in leaves)


def canonical(logs: logdict) -> logdict:
    """The same logs with keys and step names sorted, so that branches that log
    the same things in another order produce the same pytree."""
    keys = sorted(logs)
    steps = {n: {k: logs.steps[n][k] for k in keys if k in logs.steps[n]} for n in sorted(logs.steps)}
    # With the padding masks and counts of bounded loops (`max_events`), also sorted.
    valid = {k: logs.valid[k] for k in keys if k in logs.valid}
    counts = event_totals(logs)
    totals = {k: counts[k] for k in keys if k in counts}
    return padded_logdict({k: logs[k] for k in keys}, steps, valid, totals)


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
    expanded = _compat.add_event_axis(x)
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
            return []
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

    def log_operands(eqn) -> list:
        return _compat.literal_operands([read(v) for v in eqn.invars])

    def write(v, x):
        if not isinstance(v, _compat.DropVar):
            env[v] = x

    # One value per variable, as `jax.core.eval_jaxpr` requires too.
    for v, x in zip(jaxpr.constvars, consts, strict=True):
        write(v, x)
    for v, x in zip(jaxpr.invars, args, strict=True):
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

    collected: list[logdict | None] = []  # None: an equation that contributes no logs
    pending: list = []  # equations with nothing to handle, inlined as one run
    deferred: list = []  # logs wholly consumed by the handler, after that run

    def flush():
        if pending:
            counts = use_counts()
            inside = collections.Counter(v for e in pending for v in e.invars if not isinstance(v, _compat.Literal))
            segments.emit_run(pending, read, write, lambda v: counts[v] > inside[v])
            pending.clear()
        for eqn in deferred:
            collected.append(log_rule(handler, site_of(eqn.params), log_operands(eqn), active))
        deferred.clear()

    seen_outside = _compat.logs_seen(outside=True)
    for eqn in jaxpr.eqns:
        selected = _selected_sites(handler, eqn)
        if not selected:
            if eqn.primitive is log_p and not seen_outside:
                # Nothing would see this log: left out, so that it adds no effect.
                if is_used(eqn.outvars):
                    flush()
                    for v, x in zip(eqn.outvars, event_outputs(log_operands(eqn)), strict=True):
                        write(v, x)
                continue
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
        if eqn.primitive is log_p:
            invals = log_operands(eqn)
            new = log_rule(handler, site_of(eqn.params), invals, active)
            outs = event_outputs(invals) if returned_event_used else []
        else:
            rule = rules.get(eqn.primitive)
            if rule is None:
                raise NotImplementedError(
                    f"`{eqn.primitive.name}` contains lox.log calls ({selected_keys(handler, eqn)}) "
                    f"and lox does not know how to collect logs through it. Move the logs out of the "
                    f"`{eqn.primitive.name}` or remove them with `lox.nolog`; please report this at the lox "
                    "issue tracker."
                )
            outs, new = rule(handler, eqn, [read(v) for v in eqn.invars], active)
        collected.append(new)
        # Not strict: a log whose returned event nobody reads has no outputs (`outs` is empty).
        for v, x in zip(eqn.outvars, outs, strict=False):
            write(v, x)
    flush()
    return [read(v) for v in jaxpr.outvars], concat([c for c in collected if c])


def _keys_text(sites) -> str:
    keys = dict.fromkeys(k for s in sites for k in s.keys)
    return "keys " + ", ".join(map(repr, keys))


def selected_keys(handler: Handler, eqn) -> str:
    """The keys of the selected logs inside an equation, for error messages."""
    return _keys_text(_selected_sites(handler, eqn))


def log_rule(handler: Handler, site: Site, operands: list, active) -> logdict | None:
    """Hand the selected part of an event to the handler; rebind the rest."""
    taken = handler.selection.keys(site)
    values, steps = site.split(operands)
    collected = handler.on_log(site, {k: values[k] for k in taken}, steps, active)
    # What the handler did not take stays a log, for outer transforms or the default.
    rest = site.keys if handler.keep_logs else tuple(k for k in site.keys if k not in taken)
    if rest and _compat.logs_seen(outside=True):  # else nothing would see them: no effect left
        _rebind(site, values, steps, rest)
    return collected


def _rebind(site: Site, values: dict, steps: dict, keys: tuple[str, ...]) -> None:
    index = [site.keys.index(k) for k in keys]
    sub = site._replace(keys=keys, trees=tuple(site.trees[i] for i in index))
    flat = [leaf for k in keys for leaf in jax.tree_util.tree_leaves(values[k])]
    log_p.bind(*flat, *steps.values(), **sub._asdict())


# --- rules for higher-order primitives ---------------------------------------------------
# Every rule is `rule(handler, eqn, invals, active) -> (outs, logs)`. Logs leave
# a sub-jaxpr as extra outputs (a logdict is a pytree), and the handler's state
# as one more (`threaded`). Rules are listed in a fixed order: calls, loops,
# branches, remat, custom derivatives, shard_map.
Rule = Callable[[Handler, object, list, object], tuple]
rules: dict[object, Rule] = {}


def rule_for(*primitives) -> Callable[[Rule], Rule]:
    """Register the decorated function as the rule of `primitives` (objects from `_compat`)."""

    def register(fun: Rule) -> Rule:
        for primitive in primitives:
            rules[primitive] = fun
        return fun

    return register


@rule_for(_compat.jit_p, _compat.closed_call_p)
def jit_rule(handler, eqn, invals, active):
    # A nested jit is inlined: XLA would inline it anyway, and its logs become
    # part of the enclosing program (on the same trace: no state to thread).
    closed = _compat.call_jaxpr(eqn.params)
    return interpret(handler, closed.jaxpr, closed.consts, invals, active)


@rule_for(_compat.scan_p)
def scan_rule(handler, eqn, invals, active):
    p = _compat.scan_params(eqn.params)
    consts = invals[: p.num_consts]
    init = invals[p.num_consts : p.num_consts + p.num_carry]
    xs = invals[p.num_consts + p.num_carry :]
    entered = handler.enter_loop(Loop(eqn, p.jaxpr.jaxpr, p.length))
    carry, ys, logs = handler.run_scan(entered, Scan(handler, p, consts, active), init, xs)
    more = handler.exit_loop(entered, active)
    return [*carry, *ys], logs if more is None else concat([logs, more])


class Scan:
    """A scan equation being rebuilt: ``scan(init, xs, length)`` runs `length`
    iterations of its interpreted body over `xs` (the whole scan by default)
    on the handler's current state, and returns ``(carry, ys, logs)``. A
    handler's `run_scan` may run it in parts: with ``per_iteration=False`` the
    handler's `end_iteration` is not called after each iteration."""

    def __init__(self, handler: Handler, p: _compat.ScanParams, consts: list, active):
        self.handler, self.p, self.consts, self.active = handler, p, consts, active
        self.length, self.reverse = p.length, p.reverse

    def __call__(self, init: list, xs: list, length: int | None = None, per_iteration: bool = True):
        handler, p, consts, active = self.handler, self.p, self.consts, self.active
        length = p.length if length is None else length
        like = handler.snapshot()
        layout: list = []

        def body(carry, x):
            carry, state = carry
            with continuing(handler, like, state):
                expansions: tuple = (_compat.current_trace(), {})
                token = _expansions.set(expansions)
                try:
                    outs, logs = interpret(handler, p.jaxpr.jaxpr, p.jaxpr.consts, [*consts, *carry, *x], active)
                    originals = expansions[1]  # what `single_event` recorded on this trace
                finally:
                    _expansions.reset(token)
                if per_iteration:
                    handler.end_iteration(active)
                new_carry = (outs[: p.num_carry], handler.carry())
            # Event counts (of bounded loops inside) are summed, not stacked.
            logs, totals = _without_totals(logs)
            leaves, tree = jax.tree_util.tree_flatten(logs)
            # One event per iteration (the common case) leaves the body without its
            # event axis, exactly like a hand-written `ys`; and an array shared by
            # several keys (an event's step) leaves once.
            unique, where = unique_objects(leaves)
            squeeze = [leaf.shape[0] == 1 for leaf in unique]
            layout[:] = [tree, squeeze, where]
            ys_logs = [
                (originals[id(u)][1] if id(u) in originals else u[0]) if sq else u
                for u, sq in zip(unique, squeeze, strict=True)
            ]
            return new_carry, (outs[p.num_carry :], ys_logs, totals)

        # With `xs` the scan takes its length from them (a symbolic dimension under `jax.export`, which
        # `length=` refuses).
        (carry, state), (ys, unique, totals) = jax.lax.scan(
            body, (list(init), handler.carry()), xs, length=None if xs else length, reverse=p.reverse, unroll=p.unroll
        )
        handler.resume(state)
        tree, squeeze, where = layout

        def events_in_order(x, squeezed):
            # (iterations, [events per iteration,] ...) → (events, ...) in execution
            # order; a reverse scan runs its last iteration first.
            x = jnp.flip(x, 0) if p.reverse else x
            return x if squeezed else x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])

        unique = [events_in_order(u, sq) for u, sq in zip(unique, squeeze, strict=True)]
        logs = jax.tree_util.tree_unflatten(tree, [unique[i] for i in where])
        totals = jax.tree_util.tree_map(lambda t: jnp.sum(t, axis=0), totals)
        return carry, ys, padded_logdict(dict(logs), logs.steps, logs.valid, totals)


def _without_totals(logs: logdict) -> tuple[logdict, dict]:
    totals = event_totals(logs)
    if not totals:
        return logs, {}
    return padded_logdict(dict(logs), logs.steps, logs.valid, {}), totals


def unique_objects(values: list) -> tuple[list, list[int]]:
    """The distinct objects of `values` and, for each value, its index among them."""
    unique, index, where = [], {}, []
    for v in values:
        if id(v) not in index:
            index[id(v)] = len(unique)
            unique.append(v)
        where.append(index[id(v)])
    return unique, where


@rule_for(_compat.while_p)
def while_rule(handler, eqn, invals, active):
    p = _compat.while_params(eqn.params)
    entered = handler.enter_loop(Loop(eqn, p.body_jaxpr.jaxpr, None, p.cond_jaxpr.jaxpr))
    cconsts = invals[: p.cond_nconsts]
    bconsts = invals[p.cond_nconsts : p.cond_nconsts + p.body_nconsts]
    init = invals[p.cond_nconsts + p.body_nconsts :]
    like = handler.snapshot()
    batched_pred = len(p.cond_jaxpr.out_avals[0].shape) > 0

    def pred_fun(carry, h=handler):
        return interpret(h, p.cond_jaxpr.jaxpr, p.cond_jaxpr.consts, [*cconsts, *carry], active)[0][0]

    def cond_fun(carry):
        carry, state = carry
        # Logs in the predicate use the state but cannot change it (the
        # predicate returns only a boolean); a handler that must, refuses.
        with continuing(handler, like, state), _in_predicate(True):
            pred = pred_fun(carry)
        # A predicate batched by vmap (a prefix of every carry's shape): loop while any element runs.
        return jnp.any(pred) if jnp.ndim(pred) else pred

    def body_fun(carry):
        carry, state = carry
        with continuing(handler, like, state):
            guard, here = active, None
            if handler.uses_active or batched_pred:
                # Under vmap, the elements whose own predicate is false are done: not active.
                here = pred_fun(carry, DropAll())  # its logs were emitted by cond_fun
                guard = here if active is None else jnp.logical_and(active, here)
            new = interpret(handler, p.body_jaxpr.jaxpr, p.body_jaxpr.consts, [*bconsts, *carry], guard)[0]
            if batched_pred and here is not None:  # (`here` is always set when the predicate is batched)
                new = [
                    jnp.where(jnp.reshape(here, here.shape + (1,) * (jnp.ndim(n) - here.ndim)), n, c)
                    for n, c in zip(new, carry, strict=True)
                ]
            handler.end_iteration(guard)
            return new, handler.carry()

    outs, state = jax.lax.while_loop(cond_fun, body_fun, (list(init), handler.carry()))
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


@rule_for(_compat.cond_p)
def cond_rule(handler, eqn, invals, active):
    index, *ops = invals
    branches = _compat.cond_branches(eqn.params)
    records = [[] for _ in branches]
    plan = handler.enter_cond(branches)
    like = handler.snapshot()
    layout = None  # set when the branches log differently: their logs are padded to it

    def branch(i, closed):
        def fun(state, *ops):
            with continuing(handler, like, state):
                # Under vmap with a batched index both branches run for every element;
                # `index == i` is then the mask of elements that took this branch (tap
                # uses it; spool's outputs are selected per element by JAX itself).
                guard = active
                if handler.uses_active:
                    here = index == i
                    guard = here if active is None else jnp.logical_and(active, here)
                outs, logs = interpret(handler, closed.jaxpr, closed.consts, ops, guard)
                records[i][:] = [jax.tree_util.tree_map(jax.typeof, logs)]
                logs = canonical(logs) if layout is None else layout.pad(canonical(logs))
                return outs, logs, handler.leave_branch(plan, i)

        return fun

    def switch():
        return jax.lax.switch(index, [branch(i, b) for i, b in enumerate(branches)], handler.carry(), *ops)

    try:
        outs, logs, state = switch()
    except TypeError:
        logged = [canonical(rec[0]) for rec in records if rec]
        if len(logged) < len(branches) or all(signature(r) == signature(logged[0]) for r in logged):
            raise  # not about the logs
        # Semantically, a key that some branches log and others do not (or log
        # fewer times) is a padded series: valid where the branch that ran logged it.
        layout = Layout(logged)
        outs, logs, state = switch()
    handler.exit_cond(plan, state)
    return outs, logs


@rule_for(_compat.remat_p)
def remat_rule(handler, eqn, invals, active):
    p = _compat.remat_params(eqn.params)
    fun = threaded(handler, _compat.ClosedJaxpr(p.jaxpr, ()), active)
    outs, logs, state = jax.checkpoint(fun, prevent_cse=p.prevent_cse, policy=p.policy)(handler.carry(), *invals)
    handler.resume(state)
    return outs, logs


# Semantically, the events of a custom_jvp / custom_vjp function are those of its
# primal function, whether or not it is differentiated: the rebuilt function
# returns them as extra outputs with zero tangents (their cotangents are
# ignored), and the handler's state goes in first and comes out last, with zero
# tangents too. The JVP/forward/backward rules run as the user wrote them; they
# usually call the primal function, whose events were collected already, so
# those keys are removed from the rule, and any other log in a rule stays in the
# program for an enclosing transform or the default output. (Under
# `spool(jax.grad(f))` JAX has replaced the function by its rule before lox sees
# it, so there the rule's logs are collected like any others.)
def _primal_and_original(handler, eqn, active) -> tuple[Callable, Callable]:
    """A custom_jvp/vjp equation's primal function, interpreted and threaded,
    and the equation itself as a function."""
    p = _compat.custom_call_params(eqn.params)
    primal = threaded(handler, p.call_jaxpr, active)

    def original(*args):
        return _compat.bind_equation(eqn, list(args))

    return primal, original


def _zero_tangent(x):
    # Integer outputs (steps, integer values) take float0 tangents.
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


@rule_for(_compat.custom_jvp_call_p)
def custom_jvp_rule(handler, eqn, invals, active):
    primal, original = _primal_and_original(handler, eqn, active)
    fun = jax.custom_jvp(primal)

    @fun.defjvp
    def fun_jvp(primals, tangents):
        result = primal(*primals)
        _, out_tangents = without_logs(handler, eqn, lambda p, t: jax.jvp(original, p, t), primals[1:], tangents[1:])
        return result, (list(out_tangents), *(jax.tree_util.tree_map(_zero_tangent, r) for r in result[1:]))

    outs, logs, state = fun(handler.carry(), *invals)
    handler.resume(state)
    return outs, logs


@rule_for(_compat.custom_vjp_call_p)
def custom_vjp_rule(handler, eqn, invals, active):
    primal, original = _primal_and_original(handler, eqn, active)
    state_shapes: list = []
    fun = jax.custom_vjp(primal)

    def fwd(state, *args):
        result = primal(state, *args)
        state_shapes[:] = [jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)]
        outs, pullback = without_logs(handler, eqn, lambda *a: jax.vjp(original, *a), *args)
        return (outs, *result[1:]), pullback

    def bwd(pullback, cotangents):
        arg_cts = tuple(without_logs(handler, eqn, pullback, list(cotangents[0])))
        # Nothing flows back into the handler's state.
        return (jax.tree_util.tree_map(_zero_of, state_shapes[0]), *arg_cts)

    fun.defvjp(fwd, bwd)
    outs, logs, state = fun(handler.carry(), *invals)
    handler.resume(state)
    return outs, logs


def _zero_of(shape):
    if jnp.issubdtype(shape.dtype, jnp.inexact):
        return jnp.zeros(shape.shape, shape.dtype)
    return np.zeros(shape.shape, jax.dtypes.float0)


# Inside `jax.shard_map` every device runs the body on its own shards, so a log
# there is an event per device: a tap calls back once per device, with that
# device's values. The handler's state goes in replicated and comes out once
# per device; the program goes on after the last device's call. Collecting the
# per-device events as outputs is not supported (`enter_shard_map` refuses).
@rule_for(_compat.shard_map_p)
def shard_map_rule(handler, eqn, invals, active):
    p = _compat.shard_map_params(eqn.params)
    handler.enter_shard_map(selected_keys(handler, eqn))
    axes = tuple(sorted(p.manual_axes))
    replicated = jax.sharding.PartitionSpec()
    extra = [handler.carry()] + ([] if active is None else [active])
    like = handler.snapshot()

    def body(state, *args):
        inner_active, args = (args[0], args[1:]) if active is not None else (None, args)
        with continuing(handler, like, state):
            outs, logs = interpret(handler, p.jaxpr.jaxpr, p.jaxpr.consts, list(args), inner_active)
            per_device = jax.tree_util.tree_map(
                lambda x: jnp.reshape(x, (1,) * len(axes) + jnp.shape(x)), handler.carry()
            )
            return outs, per_device

    in_specs = (*[replicated] * len(extra), *p.in_specs)
    out_specs = (list(p.out_specs), jax.sharding.PartitionSpec(*axes))
    # (`Callable`: JAX 0.8 leaves the type of `shard_map`'s result to inference, which loses it.)
    mapped: Callable = jax.shard_map(body, mesh=p.mesh, in_specs=in_specs, out_specs=out_specs,
                                     axis_names=set(p.manual_axes), check_vma=p.check_vma)
    outs, per_device = mapped(*extra, *invals)
    # Every device made the same calls: any device's state (a token) will do as the next call's input.
    handler.resume(jax.tree_util.tree_map(lambda x: jnp.max(x, axis=tuple(range(len(axes)))), per_device))
    return outs, []


class DropAll(Handler):
    """Removes every log it selects (`lox.nolog` selects all)."""

    name = "lox.nolog"
    drops_logs = True

    def __init__(self, selection: Selection = Selection()):
        super().__init__()
        self.selection = selection

    def on_log(self, site, values, steps, active):
        return None


def without_logs(handler: Handler, eqn, fun: Callable, *args):
    """Call a custom derivative rule `fun` without the logs of the primal
    function (which the rebuilt primal emitted already); `lox.nolog` removes
    the rule's other logs too (`Handler.drops_logs`)."""
    if handler.drops_logs:
        dropped = Selection()
    else:
        primal_keys = {k for s in sites_in(_compat.custom_call_params(eqn.params).call_jaxpr) for k in s.keys}
        dropped = Selection(argnames=frozenset(primal_keys))
    closed, out_shape = jax.make_jaxpr(fun, return_shape=True)(*args)
    outs, _ = interpret(DropAll(dropped), closed.jaxpr, closed.consts,
                        jax.tree_util.tree_leaves(args))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)
