"""Host calls that `vmap` turns into one call for the whole batch.

`jax.debug.callback` under `vmap` calls the host once per batch element (64
seeds cost 64 calls). `host_call` binds a primitive whose batching rule keeps
the batch instead: the callback runs once, with every argument carrying the
batch axes in front, and learns how many there are.

Host calls can be put in order two ways. An ordered effect (like
``jax.debug.callback(..., ordered=True)``) threads XLA's token, which JAX
refuses for programs on more than one device. A *chained* call takes an
integer token and returns the next one, so the next call, which takes that
token, runs after it: order by data dependency, which any number of devices
allows (`lox.tap` chains its calls). The token counts the calls that ran.

Separate chains are in no order with respect to each other, so each jaxpr
being staged (a jitted function, a loop body, a branch) keeps one chain for
all the tapped functions called in it, under `vmap` and `grad` too
(`chain_start`, `chain_end`): their host calls run in the order the
functions are called.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any, Callable

import jax
import jax.core
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir

from lox_core import _compat, failures

host_call_p = Primitive("lox_host_call")
host_call_p.multiple_results = True


class _Callback:
    """The user's callback with the pytree of its arguments, and what to say if it raises."""

    def __init__(self, fun: Callable, tree, note: str):
        self.fun = fun
        self.tree = tree
        self.note = note

    def __call__(self, batch_ndim: int, *leaves) -> None:
        def deliver():
            self.fun(batch_ndim, *jax.tree_util.tree_unflatten(self.tree, [np.asarray(x) for x in leaves]))

        failures.guarded(deliver, self.note)


def host_call(callback: Callable[..., None], *args: Any, ordered: bool = True, guarded: bool = True, token=None,
              note: str | None = None):
    """Call ``callback(batch_ndim, *args)`` on the host with NumPy arrays.

    Outside `vmap` `batch_ndim` is 0. Under `vmap` (nested or not) the callback
    still runs once per execution: every array leaf of `args` then has
    `batch_ndim` leading batch axes, unbatched arguments broadcast to them.
    `ordered` calls run in program order, like ``jax.debug.callback(...,
    ordered=True)``. Inside a `cond` that vmap turns into a select, both
    branches run for every element: a caller that passes no mask of the branch
    taken among its arguments says ``guarded=False``, and then gets an error there.

    With an int32 `token` the call is chained instead of ordered: it runs after
    the call that returned `token`, and returns the token for the next call
    (``token + 1``; under vmap, with the batch axes).

    An exception `callback` raises is not raised into XLA: `lox_core.failures`
    keeps it, with `note` added (what raised it while delivering what), and
    raises it at the next `jax.effects_barrier()`.

    >>> import jax, jax.numpy as jnp
    >>> seen = []
    >>> def f(x):
    ...     host_call(lambda nd, x: seen.append((nd, x.shape)), x)
    ...     return x
    >>> _ = jax.jit(jax.vmap(f))(jnp.ones((4, 3))); jax.effects_barrier()
    >>> seen
    [(1, (4, 3))]
    """
    leaves, tree = jax.tree_util.tree_flatten(args)
    leaves = [x if isinstance(x, (jax.Array, jax.core.Tracer)) else jax.numpy.asarray(x) for x in leaves]
    chained = token is not None
    if chained:
        leaves.insert(0, jax.numpy.asarray(token, jax.numpy.int32))
    outs = host_call_p.bind(
        *leaves, callback=_Callback(callback, tree, note or f"raised by lox's host call {callback_name(callback)}"),
        batch_ndim=0, ordered=bool(ordered) and not chained,
        guarded=bool(guarded), chained=chained,
    )
    return outs[0] if chained else None


def callback_name(callback: Callable) -> str:
    """How an error names `callback`: its qualified name, or its repr."""
    return getattr(callback, "__qualname__", None) or repr(callback)


@host_call_p.def_effectful_abstract_eval
def _abstract_eval(*avals, callback, batch_ndim, ordered, guarded, chained):
    return avals[:1] if chained else [], {_compat.ordered_debug_effect if ordered else _compat.debug_effect}


def _run(callback, batch_ndim, chained, args):
    if chained:
        token, *args = args
        callback(batch_ndim, *args)
        return [np.asarray(token) + np.int32(1)]
    callback(batch_ndim, *args)
    return []


@host_call_p.def_impl
def _impl(*args, callback, batch_ndim, ordered, guarded, chained):
    return _run(callback, batch_ndim, chained, args)


def _debug_lowering(*args, callback, batch_ndim, ordered, guarded, chained):
    jax.debug.callback(lambda *a: callback(batch_ndim, *a), *args, ordered=ordered)
    return []


def _lowering(ctx, *args, callback, batch_ndim, ordered, guarded, chained):
    if chained:
        # An unordered callback with a result: XLA keeps it (it has effects)
        # and runs it before whatever consumes the token it returns.
        run = lambda *a: tuple(_run(callback, batch_ndim, True, a))  # noqa: E731
        return _compat.lower_callback_with_results(ctx, run, args)
    lower = mlir.lower_fun(_debug_lowering, multiple_results=True)
    return lower(
        ctx, *args, callback=callback, batch_ndim=batch_ndim, ordered=ordered, guarded=guarded, chained=chained
    )


# Not cached: like io_callback's, each call site holds its own Python callback.
_compat.register_lowering(host_call_p, _lowering, cacheable=False)


def _batch(axis_size, args, dims, *, callback, batch_ndim, ordered, guarded, chained):
    if not guarded and batching_cond_into_select():
        raise ValueError(
            "a lox logger call (`logger.log`) sits in a `jax.lax.cond` whose predicate is batched by `jax.vmap`: "
            "vmap runs both branches for every element, so the call would write the branch an element did not "
            "take. Move the call out of the cond (log its result), or vmap the function that calls the logger."
        )
    # Batch axes go in front, in the order vmaps are applied (outermost first).
    moved = [
        jax.numpy.broadcast_to(x, (axis_size, *x.shape)) if d is None else jax.numpy.moveaxis(x, d, 0)
        for x, d in zip(args, dims, strict=True)
    ]
    params = dict(callback=callback, batch_ndim=batch_ndim + 1, ordered=ordered, guarded=guarded)
    if chained:  # the token is not one of the callback's arguments: no batch axis to tell it about
        outs = host_call_p.bind(*moved, **params, chained=True)
        return outs, [0]
    host_call_p.bind(*moved, **params, chained=False)
    return [], []


_compat.register_batching_rule(host_call_p, _batch)


def _jvp(primals, tangents, **params):
    # Called with primal values only, once (the tangents carry nothing to say).
    outs = host_call_p.bind(*primals, **params)
    return outs, [ad.Zero(_compat.tangent_aval(x)) for x in outs]


ad.primitive_jvps[host_call_p] = _jvp


# The chain of each jaxpr being staged: a weak reference to the last token a
# tapped function called there returned. `chain_hold_p` keeps that token alive
# exactly as long as the jaxpr being built (it is the input of one of its
# equations), so nothing here keeps a finished trace or its tracers alive.
_chains: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

chain_hold_p = Primitive("lox_chain_hold")
chain_hold_p.multiple_results = True


@chain_hold_p.def_effectful_abstract_eval
def _hold_abstract_eval(token):
    # An effect, so that it is not dead code: the equation (and the token it
    # takes) stays with the jaxpr until the jaxpr is built.
    return [], {_compat.debug_effect}


chain_hold_p.def_impl(lambda token: [])
_compat.register_lowering(chain_hold_p, lambda ctx, token: [])  # no code: it only marks the chain's end


def _hold_batch(axis_size, args, dims):
    (token,), (dim,) = args, dims
    # One host call ran for the whole batch: the chain goes on from its largest count.
    chain_hold_p.bind(token if dim is None else jax.lax.reduce_max(token, (dim,)))
    return [], []


def _hold_jvp(primals, tangents):
    chain_hold_p.bind(*primals)
    return [], []


_compat.register_batching_rule(chain_hold_p, _hold_batch)
ad.primitive_jvps[chain_hold_p] = _hold_jvp
_compat.register_staging_rule(chain_hold_p, lambda trace, tracers: _chains.__setitem__(trace, weakref.ref(tracers[0])))


def chain_start():
    """The token a tapped function called now starts from: the one the last
    tapped function staged into the same jaxpr returned, or 0 (an eager call
    runs alone and waits for its calls)."""
    trace = _compat.staging_trace()
    ref = _chains.get(trace) if trace is not None else None
    token = ref() if ref is not None else None
    return np.int32(0) if token is None else token


def chain_end(token) -> None:
    """Record the token a tapped function called now returned, for the next."""
    if _compat.staging_trace() is not None:
        chain_hold_p.bind(token)


def batching_cond_into_select() -> bool:
    """Whether the batching rule now running was called while `vmap` turns a
    `cond` with a batched predicate into a `select`: both branches then run for
    every element, so a log in either branch would fire for all of them. Read
    from the Python stack (see `_compat.is_cond_into_select_frame`)."""
    frame = sys._getframe(1)
    while frame is not None:
        if _compat.is_cond_into_select_frame(frame):
            return True
        frame = frame.f_back
    return False
