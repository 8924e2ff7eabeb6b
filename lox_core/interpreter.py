"""The jaxpr interpreter behind `spool`, `tap` and `nolog`.

A transform is a `Handler`: it selects log events and says what each becomes
(an output, a host callback, nothing). The interpreter walks a jaxpr that
`jax.make_jaxpr` built for the handler; equations with nothing selected inside
are copied as they are, `lox_log` equations go to the handler, and higher-order
primitives that contain selected logs are rebuilt through JAX's public calls
(`lax.scan`, `lax.switch`, `lax.while_loop`, `jax.checkpoint`, `jax.custom_jvp`,
`jax.custom_vjp`) with bodies that are themselves interpreted. lox never edits
an equation or binds a control-flow primitive with internal parameters.

Order: handler and series → interpreter → per-primitive rules.
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from lox_core import _compat
from lox_core.primitive import Site, log_p, site_of


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
    name = "lox"

    def on_log(self, site: Site, values: dict, steps: dict, active) -> list[Series]:
        raise NotImplementedError


@dataclasses.dataclass
class Series:
    """Events of one key: a value pytree and steps, each with a leading event axis."""

    key: str
    value: Any
    steps: dict[str, Any]

    def signature(self):
        leaves, tree = jax.tree_util.tree_flatten(self.value)
        return (
            self.key, tree, tuple((x.shape, x.dtype) for x in leaves),
            tuple((n, s.shape, s.dtype) for n, s in self.steps.items()),
        )

    def describe(self) -> str:
        shapes = jax.tree_util.tree_map(lambda x: f"{x.dtype}{list(x.shape[1:])}", self.value)
        return f"{self.key!r}: {shapes}" + (f" with steps {', '.join(self.steps)}" if self.steps else "")


def flatten_series(series: list[Series]) -> tuple[list, Callable[[list], list[Series]]]:
    """Series → flat arrays, and the function that rebuilds them."""
    flat, layout = [], []
    for s in series:
        leaves, tree = jax.tree_util.tree_flatten(s.value)
        flat += leaves + list(s.steps.values())
        layout.append((s.key, tree, len(leaves), tuple(s.steps)))

    def rebuild(arrays: list) -> list[Series]:
        out, i = [], 0
        for key, tree, n, names in layout:
            value = jax.tree_util.tree_unflatten(tree, arrays[i : i + n])
            i += n
            steps = dict(zip(names, arrays[i : i + len(names)]))
            i += len(names)
            out.append(Series(key, value, steps))
        return out

    return flat, rebuild


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
        if not _compat.has_log_effect(eqn.effects):
            continue
        if eqn.primitive is log_p:
            found.append(site_of(eqn.params))
        for sub in _compat.subjaxprs_of(eqn):
            found.extend(sites_in(sub))
    _sites_cache[jaxpr] = result = tuple(found)
    return result


def _selected_sites(handler: Handler, eqn) -> list[Site]:
    if not _compat.has_log_effect(eqn.effects):
        return []
    sites = [site_of(eqn.params)] if eqn.primitive is log_p else [
        s for sub in _compat.subjaxprs_of(eqn) for s in sites_in(sub)
    ]
    return [s for s in sites if handler.selection.keys(s)]


# --- interpreter --------------------------------------------------------------------------
def interpret(handler: Handler, jaxpr, consts: Sequence, args: Sequence, active=None) -> tuple[list, list[Series]]:
    """Evaluate `jaxpr` on the current trace, handing selected logs to `handler`.

    Returns the jaxpr's outputs and the series the handler collected, in program
    order. `active` is a boolean scalar that is false where the enclosing `cond`
    branch was not taken (only under vmap, see `cond_rule`), or None.
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

    series: list[Series] = []
    pending: list = []
    for eqn in jaxpr.eqns:
        if not _selected_sites(handler, eqn):
            pending.append(eqn)
            continue
        if pending:
            _compat.inline_equations(pending, read, write)
            pending = []
        invals = [read(v) for v in eqn.invars]
        if eqn.primitive is log_p:
            outs, new = log_rule(handler, site_of(eqn.params), invals, active)
        else:
            rule = rules.get(eqn.primitive.name)
            if rule is None:
                raise NotImplementedError(
                    f"`{eqn.primitive.name}` contains lox.log calls ({_keys_text(_selected_sites(handler, eqn))}) "
                    f"and lox does not know how to collect logs through it. Move the logs out of the "
                    f"`{eqn.primitive.name}` or remove them with `lox.nolog`; please report this at the lox issue tracker."
                )
            outs, new = rule(handler, eqn, invals, active)
        series += new
        for v, x in zip(eqn.outvars, outs):
            write(v, x)
    if pending:
        _compat.inline_equations(pending, read, write)
    return [read(v) for v in jaxpr.outvars], series


def _keys_text(sites) -> str:
    keys = dict.fromkeys(k for s in sites for k in s.keys)
    return "keys " + ", ".join(map(repr, keys))


def log_rule(handler: Handler, site: Site, operands: list, active) -> tuple[list, list[Series]]:
    taken = handler.selection.keys(site)
    values, steps = site.split(operands)
    collected = handler.on_log(site, {k: values[k] for k in taken}, steps, active)
    # What the handler did not take stays a log, for outer transforms or the default.
    rest = site.keys if handler.keep_logs else tuple(k for k in site.keys if k not in taken)
    if rest:
        _rebind(site, values, steps, rest)
    return [], collected


def _rebind(site: Site, values: dict, steps: dict, keys: tuple[str, ...]) -> None:
    index = [site.keys.index(k) for k in keys]
    sub = site._replace(keys=keys, trees=tuple(site.trees[i] for i in index))
    flat = [leaf for k in keys for leaf in jax.tree_util.tree_leaves(values[k])]
    log_p.bind(*flat, *steps.values(), **sub._asdict())


# --- rules for higher-order primitives ---------------------------------------------------
# Every rule is `rule(handler, eqn, invals, active) -> (outs, series)`.
rules: dict[str, Callable] = {}


def _interpreted(handler: Handler, closed, active, record: list):
    """A function of the jaxpr's inputs returning (outputs, flat series); the
    series layout of the last trace lands in `record`."""

    def fun(*args):
        outs, series = interpret(handler, closed.jaxpr, closed.consts, args, active)
        flat, rebuild = flatten_series(series)
        record[:] = [rebuild, series]
        return outs, flat

    return fun


def scan_rule(handler, eqn, invals, active):
    p = _compat.scan_params(eqn.params)
    consts = invals[: p.num_consts]
    init = invals[p.num_consts : p.num_consts + p.num_carry]
    xs = invals[p.num_consts + p.num_carry :]
    record: list = []
    body_fun = _interpreted(handler, p.jaxpr, active, record)

    def body(carry, x):
        outs, flat = body_fun(*consts, *carry, *x)
        return outs[: p.num_carry], (outs[p.num_carry :], flat)

    carry, (ys, flat) = jax.lax.scan(body, init, xs, length=p.length, reverse=p.reverse, unroll=p.unroll)
    rebuild = record[0]

    def events_in_order(x):
        # (iterations, events per iteration, ...) → (events, ...) in execution
        # order; a reverse scan runs its last iteration first.
        x = jnp.flip(x, 0) if p.reverse else x
        return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])

    return [*carry, *ys], rebuild([events_in_order(x) for x in flat])


rules["scan"] = scan_rule


def cond_rule(handler, eqn, invals, active):
    index, *ops = invals
    branches = _compat.cond_branches(eqn.params)
    records = [[] for _ in branches]

    def branch(i, closed):
        def fun(*ops):
            # Under vmap with a batched index both branches run for every element;
            # `index == i` is then the mask of elements that took this branch (tap
            # uses it; spool's outputs are selected per element by JAX itself).
            guard = active
            if handler.guards_branches:
                here = index == i
                guard = here if active is None else jnp.logical_and(active, here)
            return _interpreted(handler, closed, guard, records[i])(*ops)

        return fun

    try:
        outs, flat = jax.lax.switch(index, [branch(i, b) for i, b in enumerate(branches)], *ops)
    except TypeError:
        _check_branches_log_alike(records)
        raise
    _check_branches_log_alike(records)
    return outs, records[0][0](flat)


rules["cond"] = cond_rule


def _check_branches_log_alike(records) -> None:
    first = records[0][1]
    for i, rec in enumerate(records[1:], start=1):
        if not rec:
            continue
        if [s.signature() for s in rec[1]] != [s.signature() for s in first]:
            a = "; ".join(s.describe() for s in first) or "nothing"
            b = "; ".join(s.describe() for s in rec[1]) or "nothing"
            keys = sorted({s.key for s in first} ^ {s.key for s in rec[1]}) or sorted(
                {s.key for s in first} | {s.key for s in rec[1]}
            )
            raise ValueError(
                f"the branches of a `jax.lax.cond`/`switch` log differently (keys {', '.join(map(repr, keys))}): "
                f"branch 0 logs {a}, branch {i} logs {b}. Every branch must log the same keys with the same "
                "shapes, dtypes and step names, because the logs become outputs of the cond. Log the same "
                "keys in every branch (e.g. a placeholder value) or move the log out of the cond."
            )


def while_rule(handler, eqn, invals, active):
    p = _compat.while_params(eqn.params)
    if handler.collects:
        keys = _keys_text(_selected_sites(handler, eqn))
        raise ValueError(
            f"`{handler.name}` cannot collect logs ({keys}) inside `jax.lax.while_loop` (which is also what "
            "`jax.lax.fori_loop` becomes when its bounds are traced): the number of iterations, and so the "
            "number of events, is unknown at compile time. Use `jax.lax.scan` or a `fori_loop` with static "
            "bounds, stream the events with `lox.tap`, or remove them with `lox.nolog`."
        )
    cconsts = invals[: p.cond_nconsts]
    bconsts = invals[p.cond_nconsts : p.cond_nconsts + p.body_nconsts]
    init = invals[p.cond_nconsts + p.body_nconsts :]

    def cond_fun(carry):
        return interpret(handler, p.cond_jaxpr.jaxpr, p.cond_jaxpr.consts, [*cconsts, *carry], active)[0][0]

    def body_fun(carry):
        return interpret(handler, p.body_jaxpr.jaxpr, p.body_jaxpr.consts, [*bconsts, *carry], active)[0]

    return jax.lax.while_loop(cond_fun, body_fun, list(init)), []


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
    record: list = []
    fun = _interpreted(handler, _compat.ClosedJaxpr(p.jaxpr, ()), active, record)
    outs, flat = jax.checkpoint(fun, prevent_cse=p.prevent_cse, policy=p.policy)(*invals)
    return outs, record[0](flat)


for _name in _compat.REMAT_NAMES:
    rules[_name] = remat_rule


# Semantically, the events of a custom_jvp / custom_vjp function are those of its
# primal function, whether or not it is differentiated: the rebuilt function
# returns them as extra outputs with zero tangents (cotangents are ignored).
# Logs inside the JVP, forward or backward rules themselves are removed when
# differentiating through lox, with a warning. (Under `spool(jax.grad(f))` JAX has
# already replaced the function by its rule before lox sees it, so the rule's logs
# are collected there like any other.)
def custom_jvp_rule(handler, eqn, invals, active):
    p = _compat.custom_call_params(eqn.params)
    record: list = []
    primal = _interpreted(handler, p.call_jaxpr, active, record)
    fun = jax.custom_jvp(primal)

    def original(*args):
        return _compat.bind_equation(eqn, list(args))

    @fun.defjvp
    def fun_jvp(primals, tangents):
        outs, flat = primal(*primals)
        _, out_tangents = without_logs(
            lambda p, t: jax.jvp(original, p, t), "JVP rule", _logged_keys(record), primals, tangents
        )
        return (outs, flat), (list(out_tangents), [jnp.zeros_like(x) for x in flat])

    outs, flat = fun(*invals)
    return outs, record[0](flat)


for _name in _compat.CUSTOM_JVP_NAMES:
    rules[_name] = custom_jvp_rule


def custom_vjp_rule(handler, eqn, invals, active):
    p = _compat.custom_call_params(eqn.params)
    record: list = []
    primal = _interpreted(handler, p.call_jaxpr, active, record)
    fun = jax.custom_vjp(primal)

    def original(*args):
        return _compat.bind_equation(eqn, list(args))

    def fwd(*args):
        _, flat = primal(*args)
        outs, pullback = without_logs(lambda *a: jax.vjp(original, *a), "forward rule", _logged_keys(record), *args)
        return (outs, flat), pullback

    def bwd(pullback, cotangents):
        out_cts, _ = cotangents
        return tuple(without_logs(pullback, "backward rule", _logged_keys(record), list(out_cts)))

    fun.defvjp(fwd, bwd)
    outs, flat = fun(*invals)
    return outs, record[0](flat)


for _name in _compat.CUSTOM_VJP_NAMES:
    rules[_name] = custom_vjp_rule


class DropAll(Handler):
    """Removes every log (`lox.nolog`)."""

    name = "lox.nolog"

    def on_log(self, site, values, steps, active):
        return []


def _logged_keys(record: list) -> frozenset[str]:
    return frozenset(s.key for s in record[1]) if record else frozenset()


def without_logs(fun: Callable, what: str, primal_keys: frozenset[str], *args):
    """Call `fun` with every log inside it removed.

    Rules usually call the primal function, whose events were collected already;
    other logs in the rule are lost, so those raise a warning.
    """
    closed, out_shape = jax.make_jaxpr(fun, return_shape=True)(*args)
    sites = [s for s in sites_in(closed.jaxpr) if not primal_keys.issuperset(s.keys)]
    if sites:
        warnings.warn(
            f"lox.log calls inside a custom derivative's {what} ({_keys_text(sites)}) are not collected when "
            "differentiating through a lox transform. Log in the primal function, or apply the lox "
            "transform outside `jax.grad` to see them.",
            stacklevel=2,
        )
    outs, _ = interpret(DropAll(), closed.jaxpr, closed.consts, jax.tree_util.tree_leaves(args))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)
