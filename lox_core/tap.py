"""`lox.tap`: every log becomes a call of a host callback, as it happens."""

from __future__ import annotations

import contextvars
from typing import Callable, Iterable

import jax
import numpy as np

from lox_core import console
from lox_core.host import host_call
from lox_core.interpreter import Handler
from lox_core.logdict import logdict
from lox_core.primitive import vmap_of_cond_message
from lox_core.spool import selection
from lox_core.transform import jitted, trace_and_interpret, traced, wraps


def print_event(event: logdict) -> None:
    """The default tap callback: one readable line per event."""
    values = {k: jax.tree_util.tree_map(lambda x: x[0], v) for k, v in event.items()}
    steps = {name: next(iter(per_key.values()))[0] for name, per_key in event.steps.items()}
    print(console.format_event(values, steps), flush=True)


def _one_event(x):
    return x[None]


# The value handed to each callback along with the event (`tap_with_context`),
# set while the tapped function is traced.
_context: contextvars.ContextVar = contextvars.ContextVar("lox_tap_context", default=None)


class TapHandler(Handler):
    guards_branches = True
    name = "lox.tap"

    def __init__(self, selection, callback: Callable, prefix: str, with_context: bool = False, batched: bool = False):
        self.selection = selection
        self.callback = callback
        self.prefix = prefix
        self.with_context = with_context
        self.batched = batched

    def on_log(self, site, values, steps, active):
        if site.in_select:
            raise ValueError(vmap_of_cond_message(site, "tapped"))
        keys, names = list(values), list(steps)  # lists: flattening a dict sorts it
        callback, prefix, with_context, batched = self.callback, self.prefix, self.with_context, self.batched

        def deliver(batch_ndim, taken, vals, stps, context):
            if batch_ndim == 0 and not (with_context or batched):
                # One event, the common case: nothing to route, nothing to split. (A
                # batched event of `tap(vmap(f))` in a while loop whose predicate is
                # batched goes out while any element runs.)
                if taken is None or np.any(taken):
                    data = {
                        prefix + k: v[None] if isinstance(v, np.ndarray) else jax.tree_util.tree_map(_one_event, v)
                        for k, v in zip(keys, vals)
                    }
                    callback(logdict._trusted(data, {n: dict.fromkeys(data, s[None]) for n, s in zip(names, stps)}))
                return
            batch_shape = np.shape(jax.tree_util.tree_leaves((taken, vals, stps))[0])[:batch_ndim]
            # Elements that took their cond branch (all of them outside a cond).
            if taken is None:
                took = np.ones(batch_shape, bool)
            else:  # a mask over inner vmap axes too (tap of a vmapped while loop): any element of them
                taken = np.asarray(taken)
                took = taken.reshape(batch_shape) if taken.size == np.prod(batch_shape) else taken.reshape(*batch_shape, -1).any(-1)
            if with_context or batched:
                # The batched event (batch axes, then the event axis) in one call.
                # Copies (np.array): the callee may keep them, and XLA may reuse its buffers.
                data = {prefix + k: jax.tree_util.tree_map(lambda x: np.expand_dims(np.array(x), batch_ndim), v) for k, v in zip(keys, vals)}
                per_name = {n: dict.fromkeys(data, np.expand_dims(np.array(s), batch_ndim)) for n, s in zip(names, stps)}
                if batched:
                    callback(logdict._trusted(data, per_name), took)
                else:
                    callback(batch_ndim, logdict(data, per_name), jax.tree_util.tree_map(np.array, context), took)
                return
            # Under vmap one host call carries the whole batch, delivered as one
            # event per element: views with the event axis, sliced per element.
            flat = [jax.tree_util.tree_flatten(v) for v in vals]
            leaves = [[np.expand_dims(x, batch_ndim) for x in leaves] for leaves, _ in flat]
            steps_e = [np.expand_dims(s, batch_ndim) for s in stps]
            names_p = [prefix + k for k in keys]
            single = [tree.num_leaves == 1 and tree.num_nodes == 1 for _, tree in flat]
            indices = range(batch_shape[0]) if batch_ndim == 1 else list(np.ndindex(batch_shape))
            took_flat = took.reshape(-1).tolist()  # Python bools: cheap to test per element
            for index, taken_here in zip(indices, took_flat):
                if taken_here:
                    data = {
                        name: ls[0][index] if one else jax.tree_util.tree_unflatten(tree, [x[index] for x in ls])
                        for name, ls, one, (_, tree) in zip(names_p, leaves, single, flat)
                    }
                    callback(logdict._trusted(data, {n: dict.fromkeys(data, s[index]) for n, s in zip(names, steps_e)}))

        context = _context.get() if with_context else None
        if with_context and context is None:
            # JAX traces custom_jvp/custom_vjp rules lazily, after the tapped call returned.
            raise NotImplementedError(
                f"a logger's tap cannot route the event with keys {', '.join(map(repr, keys))} to its run: it is "
                "logged in a jax.custom_jvp / custom_vjp function that is being differentiated, whose rules JAX "
                "traces after `logger.tap` returned. Log outside the custom function, or use `logger.spool`."
            )
        host_call(deliver, active, [values[k] for k in keys], [steps[n] for n in names], context)
        return None


def tap(
    fun: Callable,
    callback: Callable[[logdict], None] | None = None,
    *,
    argnames: Iterable[str] | None = None,
    tags: Iterable[str] | None = None,
    prefix: str = "",
    batched: bool = False,
    static_argnums=(),
    static_argnames=(),
) -> Callable:
    """Return `fun` with every log delivered to ``callback(event)`` as it happens.

    Each `lox.log` event becomes one call of `callback` with a one-event
    :class:`lox.logdict` (the same convention as `spool`, so adding up all
    tapped events gives the spooled logs), in execution order. The default
    callback prints the event. `argnames`, `tags` and `prefix` work as in
    `lox.spool`; unselected events stay in the function.

    Under `jax.vmap` (``jax.vmap(lox.tap(f, callback))``) one host call
    carries the event of every element, and `callback` is called once per
    element with that element's event. With ``batched=True`` it is called once
    per event instead, as ``callback(event, took)``: the arrays of `event`
    have the vmap axes in front of the event axis, and the boolean array
    `took` (the vmap axes' shape; ``()`` outside vmap) says which elements
    logged it (inside a `cond` with a batched predicate, those that took the
    branch; the other elements' values are meaningless). That costs one
    callback per event however many elements there are.

    The tapped function is jitted. Called with concrete arrays, it returns only
    after every callback has run; inside an enclosing `jax.jit`, call
    `jax.effects_barrier()` to wait for them.

    >>> import jax, jax.numpy as jnp, lox
    >>> def f(xs):
    ...     def step(c, x):
    ...         lox.log({"c": c + x}, step=x)
    ...         return c + x, None
    ...     return jax.lax.scan(step, 0, xs)[0]
    >>> events = []
    >>> out = lox.tap(f, events.append)(jnp.arange(3))
    >>> [e["c"].tolist() for e in events]
    [[0], [1], [3]]
    >>> batches = []
    >>> out = jax.vmap(lox.tap(f, lambda event, took: batches.append(event), batched=True))(jnp.ones((2, 3), int))
    >>> [b["c"].tolist() for b in batches]
    [[[1], [1]], [[2], [2]], [[3], [3]]]
    """
    if batched and callback is None:
        raise TypeError("`lox.tap(f, batched=True)` needs a callback that takes (event, took); the default prints single events.")
    handler = TapHandler(selection(argnames, tags), callback or print_event, prefix, batched=batched)

    def make_impl(get_fun):
        def tapped(*args, **kwargs):
            return trace_and_interpret(get_fun(), handler, args, kwargs)[0]

        return tapped

    config = ("tap", handler.selection, callback, prefix, batched)
    compiled = jitted(fun, config, make_impl, static_argnums, static_argnames)

    def call(*args, **kwargs):
        out = compiled(*args, **kwargs)
        if not traced((args, kwargs)):
            jax.effects_barrier()  # deliver every event before returning
        return out

    return wraps(fun, call, compiled)


def tap_with_context(
    fun: Callable,
    callback: Callable[[logdict, object], None],
    *,
    argnames: Iterable[str] | None = None,
    tags: Iterable[str] | None = None,
    prefix: str = "",
    wait: bool = True,
    static_argnums=(),
    static_argnames=(),
) -> Callable:
    """Like `tap`, for code that routes events: returns ``g(context, *args,
    **kwargs)`` that runs ``fun(*args, **kwargs)`` and, once per event, calls
    ``callback(batch_ndim, event, context, took)``. Under `vmap` (`batch_ndim`
    batch axes) that is still one call for the whole batch: `event`'s arrays
    have the batch axes in front of the event axis, `context` (a pytree of
    arrays, e.g. run ids) has them in front, and the boolean array `took` says
    which elements logged the event (inside a cond, those that took the
    branch). Loggers route events to runs this way. With ``wait=False`` an
    eager call returns without waiting for its callbacks (`jax.effects_barrier`
    waits for them).
    """
    handler = TapHandler(selection(argnames, tags), callback, prefix, with_context=True)

    def make_impl(get_fun):
        def tapped(context, *args, **kwargs):
            token = _context.set(context)
            try:
                return trace_and_interpret(get_fun(), handler, args, kwargs)[0]
            finally:
                _context.reset(token)

        return tapped

    config = ("tap_with_context", handler.selection, callback, prefix)
    # `context` comes first: the positions of static arguments shift by one.
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    shifted = tuple(i + 1 if i >= 0 else i for i in static_argnums)
    compiled = jitted(fun, config, make_impl, shifted, static_argnames)

    def call(context, *args, **kwargs):
        out = compiled(context, *args, **kwargs)
        if wait and not traced((context, args, kwargs)):
            jax.effects_barrier()
        return out

    return wraps(fun, call, compiled)  # holds `fun`, which the cache refers to weakly
