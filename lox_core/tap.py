"""`lox.tap`: every log becomes a call of a host callback, as it happens."""

from __future__ import annotations

from typing import Callable, Iterable

import jax
import numpy as np

from lox_core import console
from lox_core.interpreter import Handler
from lox_core.logdict import logdict
from lox_core.primitive import vmap_of_cond_message
from lox_core.spool import selection
from lox_core.transform import jitted, trace_and_interpret, wraps


def print_event(event: logdict) -> None:
    """The default tap callback: one readable line per event."""
    values = {k: jax.tree_util.tree_map(lambda x: x[0], v) for k, v in event.items()}
    steps = {name: next(iter(per_key.values()))[0] for name, per_key in event.steps.items()}
    print(console.format_event(values, steps), flush=True)


class TapHandler(Handler):
    guards_branches = True
    name = "lox.tap"

    def __init__(self, selection, callback: Callable, prefix: str):
        self.selection = selection
        self.callback = callback
        self.prefix = prefix

    def on_log(self, site, values, steps, active):
        if site.in_select:
            raise ValueError(vmap_of_cond_message(site, "tapped"))
        keys, names = list(values), list(steps)  # lists: flattening a dict sorts it
        flat, tree = jax.tree_util.tree_flatten(([values[k] for k in keys], [steps[n] for n in names]))
        callback, prefix = self.callback, self.prefix

        def deliver(*leaves):
            vals, stps = jax.tree_util.tree_unflatten(tree, [np.asarray(x)[None] for x in leaves])
            data = {prefix + k: v for k, v in zip(keys, vals)}
            callback(logdict(data, {n: dict.fromkeys(data, s) for n, s in zip(names, stps)}))

        if active is None:
            jax.debug.callback(deliver, *flat, ordered=True)
        else:
            # Inside a cond branch that vmap may run for every element: only the
            # elements that took the branch deliver (one call per element under vmap).
            def deliver_if_taken(taken, *leaves):
                if np.all(taken):
                    deliver(*leaves)

            jax.debug.callback(deliver_if_taken, active, *flat, ordered=True)
        return None


def tap(
    fun: Callable,
    callback: Callable[[logdict], None] | None = None,
    *,
    argnames: Iterable[str] | None = None,
    tags: Iterable[str] | None = None,
    prefix: str = "",
    static_argnums=(),
    static_argnames=(),
) -> Callable:
    """Return `fun` with every log delivered to ``callback(event)`` as it happens.

    Each `lox.log` event becomes one call of `callback` with a one-event
    :class:`lox.logdict` (the same convention as `spool`, so adding up all
    tapped events gives the spooled logs), in execution order. The default
    callback prints the event. `argnames`, `tags` and `prefix` work as in
    `lox.spool`; unselected events stay in the function.

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
    """
    handler = TapHandler(selection(argnames, tags), callback or print_event, prefix)

    def make_impl(get_fun):
        def tapped(*args, **kwargs):
            return trace_and_interpret(get_fun(), handler, args, kwargs)[0]

        return tapped

    config = ("tap", handler.selection, callback, prefix)
    compiled = jitted(fun, config, make_impl, static_argnums, static_argnames)

    def call(*args, **kwargs):
        out = compiled(*args, **kwargs)
        if not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((args, kwargs))):
            jax.effects_barrier()  # deliver every event before returning
        return out

    return wraps(fun, call, compiled)
