"""Turning a handler into a function transform: trace, interpret, jit, cache, write back."""

from __future__ import annotations

import functools
import inspect
import weakref
from typing import Any, Callable, NamedTuple

import jax
import jax.core
import numpy as np

from lox_core import _compat, arguments
from lox_core.interpreter import Handler, interpret
from lox_core.logdict import logdict
from lox_core.options import NologOptions, SpoolOptions, TapOptions


def traced(tree) -> bool:
    """Whether any leaf of `tree` is a tracer (the call is being traced)."""
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(tree))


class Interpreted(NamedTuple):
    """What `trace_and_interpret` gives back."""

    out: Any  # the function's output
    logs: logdict  # the logs the handler collected
    carried: Any  # the handler's state at the end (None unless asked for)
    changes: arguments.Changes | None  # what the function changed in its arguments


def trace_and_interpret(fun: Callable, handler: Handler, args: tuple, kwargs: dict, carried=None) -> Interpreted:
    """Run `fun(*args, **kwargs)` on the current trace with its logs handled.

    For a handler that carries state, `carried` (if given) is the state to
    start from, and the state at the end comes back too. Non-array leaves of
    the arguments are constants and those of the output come back as they
    are; what `fun` changed in its arguments comes back as `changes` (see
    `lox_core.arguments`).
    """
    leaves, tree, shared = arguments.flatten((args, kwargs))
    # Under jit every array argument is a tracer; anything else is a static value.
    dynamic = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.core.Tracer)]
    found: list = []  # set while `fun` is traced: how to rebuild its output, what it changed

    def flat_fun(*dynamic_leaves):
        filled = list(leaves)
        for i, x in zip(dynamic, dynamic_leaves, strict=True):  # traced with one leaf per index
            filled[i] = x
        copy = jax.tree_util.tree_unflatten(tree, filled)
        if shared:  # one object where the caller's arguments hold one object
            copy = arguments.share(copy, shared)
            filled = jax.tree_util.tree_leaves(copy)
        a, k = copy
        check_static = arguments.guard_static(handler.name, fun, filled, copy)
        out = fun(*a, **k)
        check_static()
        out_arrays, rebuild = arguments.partition(arguments.returned_arguments(out, copy, filled))
        changes = arguments.changes(handler.name, fun, tree, filled, a, k)
        # What to rebuild with the outputs; nothing that holds this trace's tracers.
        found[:] = [rebuild, None if changes is None else (changes.paths, changes.static)]
        return out_arrays, [] if changes is None else changes.arrays

    # Every `lox.log` traced here binds, in nested jits too (which JAX traces
    # anew in this context) and in custom derivative rules traced while the
    # program is rebuilt.
    with _compat.capturing():
        closed = jax.make_jaxpr(flat_fun)(*[leaves[i] for i in dynamic])
        rebuild, changed = found
        with handler.session():
            if carried is not None:
                handler.resume(carried)
            outs, logs = interpret(handler, closed.jaxpr, closed.consts, [leaves[i] for i in dynamic])
            n = len(outs) - (0 if changed is None else len(changed[0]))
            changes = None if changed is None else arguments.Changes(changed[0], outs[n:], changed[1], handler.name)
            return Interpreted(rebuild(outs[:n]), logs, None if carried is None else handler.carry(), changes)


# id(fun) → (weak reference to fun, {config: Program}). Keyed by identity, not
# equality: two distinct callables that compare equal must not share an entry
# that holds only one of them.
_cache: dict[int, tuple[weakref.ref, dict]] = {}
_PER_FUNCTION = 32  # configurations kept per function (e.g. tap with a new lambda each call)


def static_arguments(fun: Callable, static_argnums=(), static_argnames=()) -> dict:
    """The static arguments of `fun`, as `jax.jit` options.

    `jax.jit(fun, static_argnums=1)` also treats that parameter as static when
    it is passed by keyword (and `static_argnames` by position): it reads
    `fun`'s signature. lox's programs take ``(*args, **kwargs)``, so both are
    spelled out here, from `fun`'s signature.
    """
    argnums = () if static_argnums is None else tuple(np.atleast_1d(static_argnums).tolist())
    if static_argnames is None:
        argnames = ()
    else:
        argnames = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
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
    return {"static_argnums": nums, "static_argnames": names}


class Program:
    """A transform's compiled program: ``impl(*leading, *args, **kwargs) ->
    (result, changes)`` under one `jax.jit`, called with filtered arguments
    (see `lox_core.arguments`): the array leaves are its arguments, the rest
    is static. Calling it writes the changes back into the caller's arguments
    and returns the result. `name` names the transform in error messages."""

    def __init__(self, impl: Callable, name: str, leading: int, static_argnums: tuple, static_argnames: tuple):
        self.name = name
        self.static_argnums, self.static_argnames = static_argnums, static_argnames

        def flat(signature: arguments.Signature, *values):
            args, kwargs = signature.rebuild(values[leading:])
            result, changes = impl(*values[:leading], *args, **kwargs)
            return _leaving(result), changes

        # Arguments that are all arrays and numbers (hand-written JAX) need no
        # filtering, and hold nothing a function could change in place: they
        # go to `jax.jit` as they are, with the static arguments it handles.
        def direct(*values, **kwargs):
            return _leaving(impl(*values, **kwargs)[0])

        self._jitted = jax.jit(flat, static_argnums=0)
        self._direct = jax.jit(direct, static_argnums=shifted(static_argnums, leading), static_argnames=static_argnames)

    def __call__(self, leading: tuple, args: tuple, kwargs: dict):
        if arguments.plain(args, kwargs):
            result = self._direct(*leading, *args, **kwargs)
        else:
            signature, dynamic = arguments.split(self.name, args, kwargs, self.static_argnums, self.static_argnames)
            result, changes = self._jitted(signature, *leading, *dynamic)
            if changes is not None:
                changes.apply(args, kwargs)
        # An output with non-array leaves leaves the program as a `Filtered` node.
        return result.value((args, kwargs)) if type(result) is arguments.Filtered else result


def _leaving(result):
    """A program's result as it leaves the program: a `Filtered` node when it
    holds non-array leaves, as it is otherwise."""
    filtered = arguments.Filtered.of(result)
    return filtered if filtered.static else result


def shifted(argnums: tuple, leading: int) -> tuple:
    """Static argument numbers of a function called with `leading` arguments before them."""
    return tuple(i + leading if i >= 0 else i for i in argnums)


def jitted(
    fun: Callable,
    options: SpoolOptions | TapOptions | NologOptions,
    make_impl: Callable,
    static_argnums=(),
    static_argnames=(),
    leading: int = 0,
) -> Program:
    """The `Program` of ``make_impl(get_fun)``, shared by every call with the same `fun` and `options`.

    `options` is the transform's frozen options dataclass (`lox_core.options`),
    whose `transform` names it in error messages: every field is part of the
    cache key, so programs compiled for other options are never reused.
    `make_impl` makes ``impl(*leading, *args, **kwargs) -> (result, changes)``
    from a function returning `fun`; `static_argnums` and `static_argnames` are
    `fun`'s. Sharing the program lets a fresh `lox.spool(f)` reuse the compiled
    program of an earlier one without tracing `f` again. The cache holds `fun`
    weakly, so it does not keep functions (and what they close over) alive.
    """
    static = static_arguments(fun, static_argnums, static_argnames)
    key = (options, static["static_argnums"], static["static_argnames"])
    make = lambda get_fun: Program(make_impl(get_fun), options.transform, leading, **static)  # noqa: E731
    try:
        hash(key)
        # The cache is bound now: at interpreter exit the module's globals may be gone when `fun` is collected.
        fun_id = id(fun)
        ref = weakref.ref(fun, lambda _, i=fun_id, cache=_cache: cache.pop(i, None))
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


class Transformed:
    """The function a lox transform returns: calls `call`, and lowers or
    traces the same computation under `jax.jit` with `fun`'s signature and
    the static arguments of its `program` (`lower`, `trace`: of `lowered` if
    given, a variant of `call` that shows what runs; `call` takes `leading`
    arguments before `fun`'s). It holds `fun` (the program cache holds it
    only weakly)."""

    def __init__(self, fun: Callable, call: Callable, program: Program, leading: int = 0,
                 lowered: Callable | None = None):
        # Not `functools.wraps`: it would copy `fun.__dict__`, and `jax.jit(self)`
        # copies this one's, so attributes must not shadow `lower` and `trace`.
        functools.update_wrapper(self, fun, updated=())
        self._call = call
        self._lowered = lowered or call
        # `fun`'s static arguments, as its program read them; `call` takes `leading` arguments before `fun`'s.
        self._static: dict[str, Any] = {
            "static_argnums": shifted(program.static_argnums, leading),
            "static_argnames": program.static_argnames,
        }

    def __call__(self, *args, **kwargs):
        return self._call(*args, **kwargs)

    def __get__(self, instance, owner=None):
        # A method decorated with a transform: bound to its instance like a function.
        return self if instance is None else functools.partial(self, instance)

    @functools.cached_property
    def _lowerable(self):
        def public(*args, **kwargs):
            return self._lowered(*args, **kwargs)

        public.__name__ = public.__qualname__ = getattr(self, "__name__", "lox")  # names the lowered module
        return jax.jit(public, **self._static)

    @functools.cached_property
    def _lowerable_filtered(self):
        def public(signature, *dynamic):
            args, kwargs = signature.rebuild(dynamic)
            return self._lowered(*args, **kwargs)

        public.__name__ = public.__qualname__ = getattr(self, "__name__", "lox")
        return jax.jit(public, static_argnums=0)

    def _staged(self, method: str, args, kwargs):
        # Arguments with non-array leaves (not static arguments) cannot pass through
        # `jax.jit` as they are: then the program takes their array leaves only.
        signature, dynamic = arguments.split("lox", args, kwargs)
        if not signature.filtered:
            return getattr(self._lowerable, method)(*args, **kwargs)
        return getattr(self._lowerable_filtered, method)(signature, *dynamic)

    def lower(self, *args, **kwargs):
        """As `jax.jit(f).lower`: the lowered program of this call. When the
        arguments hold non-array leaves, the program takes their array leaves
        only (``jax.tree_util.tree_leaves`` of the arrays, in order)."""
        return self._staged("lower", args, kwargs)

    def trace(self, *args, **kwargs):
        """As `jax.jit(f).trace`: the traced program of this call (see `lower`)."""
        return self._staged("trace", args, kwargs)

    def __repr__(self) -> str:
        return f"<lox-transformed {getattr(self, '__name__', 'function')}>"
