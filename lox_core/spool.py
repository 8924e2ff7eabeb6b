"""`lox.spool`: every log becomes an output of one compiled program."""

from __future__ import annotations

from typing import Callable, Iterable

import jax

from lox_core.interpreter import Handler, Selection, single_event, unique_objects
from lox_core.logdict import REDUCTIONS, logdict
from lox_core.primitive import event_logdict, vmap_of_cond_message
from lox_core.transform import jitted, trace_and_interpret, wraps


class _SharedOnce(logdict):
    """Spooled logs as the output of spool's compiled program: a logdict whose
    pytree holds each distinct array once. The keys of one event share one step
    array, which would otherwise be an output per key (and XLA copies an array
    output twice). Which leaves are the same is fixed when the object is built
    (from the traced arrays), so its pytree structure never depends on the
    identity of whatever it holds later. `lox.spool` hands users a plain
    logdict made from it."""

    __slots__ = ("_where",)

    def __init__(self, data=(), steps=None, where=None):
        super().__init__(data, steps)
        if where is None:
            leaves = jax.tree_util.tree_leaves(logdict(self, self.steps))
            where = tuple(unique_objects(leaves)[1])
        self._where = where

    def _flatten(self):
        leaves, tree = jax.tree_util.tree_flatten(logdict(self, self.steps))
        first = {}
        for leaf, i in zip(leaves, self._where):
            first.setdefault(i, leaf)
        return [first[i] for i in range(len(first))], (tree, self._where)

    @classmethod
    def _unflatten(cls, aux, unique):
        tree, where = aux
        logs = jax.tree_util.tree_unflatten(tree, [unique[i] for i in where])
        return cls(logs, logs.steps, where)


jax.tree_util.register_pytree_node(_SharedOnce, _SharedOnce._flatten, _SharedOnce._unflatten)


class SpoolHandler(Handler):
    collects = True
    defers_logs = True
    name = "lox.spool"

    def __init__(self, selection: Selection, keep_logs: bool):
        self.selection = selection
        self.keep_logs = keep_logs

    def on_log(self, site, values, steps, active):
        if site.in_select:
            raise ValueError(vmap_of_cond_message(site, "spooled"))
        return event_logdict(values, steps, expand=single_event)


def selection(argnames, tags) -> Selection:
    return Selection(_names("argnames", argnames), _names("tags", tags))


def _names(what: str, names) -> frozenset[str] | None:
    if names is None:
        return None
    if isinstance(names, str):
        names = [names]
    names = frozenset(names)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"`{what}` must be strings, got {bad[0]!r}.")
    return names


def spool(
    fun: Callable,
    *,
    argnames: Iterable[str] | None = None,
    tags: Iterable[str] | None = None,
    keep_logs: bool = False,
    interval: int | None = None,
    reduce: str | None = None,
    prefix: str = "",
    static_argnums=(),
    static_argnames=(),
) -> Callable:
    """Return a function that gives ``(out, logs)``: `fun`'s output and its logs.

    Every `lox.log` event inside `fun` becomes an output of one compiled program
    (spool is jitted, and caches per input signature like `jax.jit`). ``logs`` is
    a :class:`lox.logdict` whose series stack the events of each key along a
    leading axis, in program order; ``logs.step[key]`` holds their steps.

    Args:
      fun: the function to spool.
      argnames: keep only these keys.
      tags: keep only events that carry one of these tags.
      keep_logs: leave the logs in the spooled function, so that an enclosing
        `spool` or `tap` sees them again (by default they are consumed here).
      interval: keep every `interval`-th event of each key.
      reduce: reduce each series to one event: mean, sum, min, max, first, last.
      prefix: prepended to every key.
      static_argnums: as in `jax.jit`.
      static_argnames: as in `jax.jit`.

    Events that `argnames`/`tags` do not select stay in the function as logs,
    for an enclosing transform (or the default console output) to handle. The
    keys of one event share one step array (one object, computed once): copy
    the logs (``jax.tree_util.tree_map(jnp.copy, logs)``) before donating them.

    >>> import jax, jax.numpy as jnp, lox
    >>> def f(xs):
    ...     def step(c, x):
    ...         c = c + x
    ...         lox.log({"c": c}, step=x)
    ...         return c, None
    ...     return jax.lax.scan(step, 0, xs)[0]
    >>> out, logs = lox.spool(f)(jnp.arange(4))
    >>> int(out), logs["c"].tolist(), logs.step["c"].tolist()
    (6, [0, 1, 3, 6], [0, 1, 2, 3])
    """
    chosen = selection(argnames, tags)
    if reduce is not None and reduce not in REDUCTIONS:
        raise ValueError(f"unknown reduce mode {reduce!r} for `lox.spool`: use one of {', '.join(REDUCTIONS)}.")
    if interval is not None and (isinstance(interval, bool) or not isinstance(interval, int) or interval < 1):
        raise ValueError(f"`lox.spool` interval must be an integer >= 1, got {interval!r}.")
    if not isinstance(prefix, str):
        raise TypeError(f"`lox.spool` prefix must be a string, got {prefix!r}.")
    handler = SpoolHandler(chosen, bool(keep_logs))

    def make_impl(get_fun):
        def spooled(*args, **kwargs):
            out, logs = trace_and_interpret(get_fun(), handler, args, kwargs)
            if interval is not None:
                logs = logs.slice[::interval]
            if reduce is not None:
                logs = logs.reduce(reduce)
            if prefix:
                logs = logs.prefix(prefix)
            return out, _SharedOnce(logs, logs.steps)

        return spooled

    config = ("spool", chosen, bool(keep_logs), interval, reduce, prefix)
    compiled = jitted(fun, config, make_impl, static_argnums, static_argnames)

    def call(*args, **kwargs):
        out, shared = compiled(*args, **kwargs)
        return out, logdict(shared, shared.steps)

    return wraps(fun, call, compiled)
