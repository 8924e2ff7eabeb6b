"""Turning a handler into a function transform: trace, interpret, jit, cache."""

from __future__ import annotations

import functools
import inspect
import weakref
from typing import Any, Callable, Hashable

import jax
import numpy as np

from lox_core.interpreter import Handler, interpret
from lox_core.logdict import logdict


def traced(tree) -> bool:
    """Whether any leaf of `tree` is a tracer (the call is being traced)."""
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


def trace_and_interpret(fun: Callable, handler: Handler, args: tuple, kwargs: dict, carried=None):
    """Run `fun(*args, **kwargs)` on the current trace with its logs handled:
    ``(out, logs)``. For a handler that carries state, `carried` (if given) is
    the state to start from, and the state at the end comes back too:
    ``(out, logs, carried)``."""
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    # Under jit every array argument is a tracer; anything else is a static value.
    dynamic = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.core.Tracer)]

    def flat_fun(*dynamic_leaves):
        filled = list(leaves)
        for i, x in zip(dynamic, dynamic_leaves):
            filled[i] = x
        a, k = jax.tree_util.tree_unflatten(tree, filled)
        return fun(*a, **k)

    closed, out_shape = jax.make_jaxpr(flat_fun, return_shape=True)(*[leaves[i] for i in dynamic])
    with handler.session():
        if carried is not None:
            handler.resume(carried)
        outs, logs = interpret(handler, closed.jaxpr, closed.consts, [leaves[i] for i in dynamic])
        out = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)
        return (out, logs) if carried is None else (out, logs, handler.carry())


# id(fun) → (weak reference to fun, {config: jitted}). Keyed by identity, not
# equality: two distinct callables that compare equal must not share an entry
# that holds only one of them.
_cache: dict[int, tuple[weakref.ref, dict]] = {}
_PER_FUNCTION = 32  # configurations kept per function (e.g. tap with a new lambda each call)


def static_arguments(fun: Callable, static_argnums=(), static_argnames=(), leading: int = 0) -> dict:
    """The static arguments of `fun`, as `jax.jit` options for a function that
    takes `leading` arguments before `fun`'s.

    `jax.jit(fun, static_argnums=1)` also treats that parameter as static when
    it is passed by keyword (and `static_argnames` by position): it reads
    `fun`'s signature. The functions lox jits in `fun`'s place take
    ``(*args, **kwargs)``, so both are spelled out here, from `fun`'s
    signature, with positions shifted by `leading`.
    """
    argnums = () if static_argnums is None else tuple(np.atleast_1d(static_argnums).tolist())
    argnames = () if static_argnames is None else (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
    if not argnums and not argnames:  # the common case: no signature to read (`lox.spool(f)` may be made every step)
        return {"static_argnums": (), "static_argnames": ()}
    try:
        parameters = list(inspect.signature(fun).parameters.values())
    except (TypeError, ValueError):  # no signature to read (some builtins): as given
        parameters = []
    # Parameters that can be passed either way, like `jax.jit` infers them.
    either = {i: p.name for i, p in enumerate(parameters) if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD}
    names = argnames + tuple(name for i, name in either.items() if i in argnums and name not in argnames)
    nums = argnums + tuple(i for i, name in either.items() if name in argnames and i not in argnums)
    return {
        "static_argnums": tuple(i + leading if i >= 0 else i for i in nums),
        "static_argnames": names,
    }


def jitted(fun: Callable, config: Hashable, make_impl: Callable, static_argnums=(), static_argnames=(), leading: int = 0):
    """`jax.jit(make_impl(fun))`, shared by every call with the same `fun` and `config`.

    `make_impl` makes a function of `leading` arguments and then `fun`'s;
    `static_argnums` and `static_argnames` are `fun`'s (see `static_arguments`).
    Sharing the jitted function lets a fresh `lox.spool(f)` reuse the compiled
    program of an earlier one without tracing `f` again. The cache holds `fun`
    weakly, so it does not keep functions (and what they close over) alive.
    """
    static = static_arguments(fun, static_argnums, static_argnames, leading)
    key = (config, static["static_argnums"], static["static_argnames"])
    make = lambda get_fun: jax.jit(make_impl(get_fun), **static)  # noqa: E731
    try:
        hash(key)
        ref = weakref.ref(fun, lambda _, i=id(fun): _cache.pop(i, None))
    except TypeError:  # not weak-referenceable, or an unhashable option: no sharing
        return make(lambda: fun)
    entry = _cache.get(id(fun))
    if entry is None or entry[0]() is not fun:
        entry = _cache[id(fun)] = (ref, {})
    per_fun = entry[1]
    if key not in per_fun:
        if len(per_fun) >= _PER_FUNCTION:
            per_fun.pop(next(iter(per_fun)))
        per_fun[key] = make(entry[0])
    return per_fun[key]


def wraps(fun: Callable, call: Callable, compiled, make_lowerable: Callable | None = None) -> Callable:
    """The user-facing wrapper: keeps `fun` alive, exposes `lower`/`trace` of
    `compiled`, or of the jitted function ``make_lowerable()`` makes on first
    use (when `compiled` takes more than the user passes)."""

    @functools.wraps(fun)
    def wrapper(*args, **kwargs):
        return call(*args, **kwargs)

    lowerable = functools.cache(make_lowerable or (lambda: compiled))

    def lower(*args, **kwargs):
        return lowerable().lower(*args, **kwargs)

    def trace(*args, **kwargs):
        return lowerable().trace(*args, **kwargs)

    # `compiled` holds `fun` only weakly (see `jitted`); all three hold it
    # (`functools.wraps` set the wrapper's), so that `lox.spool(f).lower(x)` works.
    lower.__wrapped__ = trace.__wrapped__ = fun
    wrapper.lower, wrapper.trace = lower, trace
    return wrapper
