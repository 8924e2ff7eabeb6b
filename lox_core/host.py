"""Host calls that `vmap` turns into one call for the whole batch.

`jax.debug.callback` under `vmap` calls the host once per batch element (64
seeds cost 64 calls). `host_call` binds a primitive whose batching rule keeps
the batch instead: the callback runs once, with every argument carrying the
batch axes in front, and learns how many there are.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir

from lox_core import _compat

host_call_p = Primitive("lox_host_call")
host_call_p.multiple_results = True


class _Callback:
    """The user's callback with the pytree of its arguments."""

    def __init__(self, fun: Callable, tree):
        self.fun = fun
        self.tree = tree

    def __call__(self, batch_ndim: int, *leaves) -> None:
        args = jax.tree_util.tree_unflatten(self.tree, [np.asarray(x) for x in leaves])
        self.fun(batch_ndim, *args)


def host_call(callback: Callable[..., None], *args: Any, ordered: bool = True, guarded: bool = True) -> None:
    """Call ``callback(batch_ndim, *args)`` on the host with NumPy arrays.

    Outside `vmap` `batch_ndim` is 0. Under `vmap` (nested or not) the callback
    still runs once per execution: every array leaf of `args` then has
    `batch_ndim` leading batch axes, unbatched arguments broadcast to them.
    `ordered` calls run in program order, like ``jax.debug.callback(...,
    ordered=True)``. Inside a `cond` that vmap turns into a select, both
    branches run for every element: a caller that passes no mask of the branch
    taken among its arguments says ``guarded=False``, and then gets an error there.

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
    host_call_p.bind(*leaves, callback=_Callback(callback, tree), batch_ndim=0, ordered=bool(ordered), guarded=bool(guarded))


@host_call_p.def_effectful_abstract_eval
def _abstract_eval(*avals, callback, batch_ndim, ordered, guarded):
    return [], {_compat.ordered_debug_effect if ordered else _compat.debug_effect}


@host_call_p.def_impl
def _impl(*args, callback, batch_ndim, ordered, guarded):
    callback(batch_ndim, *args)
    return []


def _lowering(*args, callback, batch_ndim, ordered, guarded):
    jax.debug.callback(lambda *a: callback(batch_ndim, *a), *args, ordered=ordered)
    return []


mlir.register_lowering(host_call_p, mlir.lower_fun(_lowering, multiple_results=True))


def _batch(axis_size, args, dims, *, callback, batch_ndim, ordered, guarded):
    if not guarded and _compat.batching_cond_into_select():
        raise ValueError(
            "a lox logger call (`logger.log`) sits in a `jax.lax.cond` whose predicate is batched by `jax.vmap`: "
            "vmap runs both branches for every element, so the call would write the branch an element did not "
            "take. Move the call out of the cond (log its result), or vmap the function that calls the logger."
        )
    # Batch axes go in front, in the order vmaps are applied (outermost first).
    moved = [
        jax.numpy.broadcast_to(x, (axis_size, *x.shape)) if d is None else jax.numpy.moveaxis(x, d, 0)
        for x, d in zip(args, dims)
    ]
    host_call_p.bind(*moved, callback=callback, batch_ndim=batch_ndim + 1, ordered=ordered, guarded=guarded)
    return [], []


_compat.register_batching_rule(host_call_p, _batch)


def _jvp(primals, tangents, **params):
    # Called with primal values only, once (the tangents carry nothing to say).
    return host_call_p.bind(*primals, **params), []


ad.primitive_jvps[host_call_p] = _jvp
