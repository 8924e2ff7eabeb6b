"""`lox.nolog`: the same function with every log removed."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from lox_core.interpreter import DropAll
from lox_core.options import NologOptions
from lox_core.transform import Transformed, jitted, trace_and_interpret


def nolog(
    fun: Callable[..., Any],
    *,
    static_argnums: int | Sequence[int] = (),
    static_argnames: str | Iterable[str] = (),
) -> Callable[..., Any]:
    """Return `fun` with every `lox.log` inside it removed, also in nested jits.

    The result is jitted; its compiled program has no host callback and nothing
    the same function without `lox.log` calls would lack. Arguments are taken
    as `lox.spool` takes them: non-array leaves are static, and what `fun`
    changes in its arguments in place is written back.

    >>> import jax.numpy as jnp, lox
    >>> def f(x):
    ...     lox.log({"x": x})
    ...     return x + 1
    >>> lox.nolog(f)(jnp.float32(1.0)).item()
    2.0
    """
    handler = DropAll()

    def make_impl(get_fun):
        def removed(*args, **kwargs):
            out, _, _, changes = trace_and_interpret(get_fun(), handler, args, kwargs)
            return out, changes

        return removed

    program = jitted(fun, NologOptions(), make_impl, static_argnums, static_argnames)
    return Transformed(fun, lambda *args, **kwargs: program((), args, kwargs), program)
