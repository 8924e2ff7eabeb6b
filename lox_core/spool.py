"""`lox.spool`: every log becomes an output of one compiled program."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from lox_core.buffer import SpoolBuffer, batched_loops, kinds_in
from lox_core.interpreter import Handler, Selection, in_while_predicate, selected_keys, single_event
from lox_core.logdict import REDUCTIONS, every, logdict, plain, shared_once
from lox_core.options import SpoolOptions, positive_int, selection, string
from lox_core.primitive import event_logdict, vmap_of_cond_message
from lox_core.transform import Transformed, jitted, trace_and_interpret


class SpoolHandler(Handler):
    """`lox.spool`: every selected event becomes outputs of the program."""

    defers_logs = True
    name = "lox.spool"

    def __init__(self, selection: Selection, keep_logs: bool):
        super().__init__()
        self.selection = selection
        self.keep_logs = keep_logs

    def on_log(self, site, values, steps, active) -> logdict | None:  # None: a subclass buffers the event
        if site.in_select:
            raise ValueError(vmap_of_cond_message(site, "spooled"))
        return event_logdict(values, steps, expand=single_event)

    def enter_loop(self, loop) -> Any:  # what a subclass's `exit_loop` needs
        if loop.length is None:
            raise ValueError(
                f"`{self.name}` cannot collect logs ({selected_keys(self, loop.eqn)}) inside `jax.lax.while_loop` "
                "(which is also what `jax.lax.fori_loop` becomes when its bounds are traced): the number of "
                "iterations, and so the number of events, is unknown at compile time. Give the spool a capacity "
                "(`lox.spool(f, max_events=N)` keeps the first N events of each key in the loop), use "
                "`jax.lax.scan` or a `fori_loop` with static bounds, stream the events with `lox.tap`, or remove "
                "them with `lox.nolog`."
            )
        return None

    def enter_shard_map(self, keys: str) -> None:
        raise ValueError(
            f"`{self.name}` cannot collect logs ({keys}) from inside `jax.shard_map`, where each device logs "
            "its own shard. Stream them with `lox.tap` (one callback per device), return the values from the "
            "shard_map and log them outside, or remove the logs with `lox.nolog`."
        )


class _Bounds:
    """What a bounded spool carries: the buffers of the loop being spooled, if any."""

    __slots__ = ("buffers",)

    def __init__(self, buffers: SpoolBuffer | None = None):
        self.buffers = buffers


class BoundedSpoolHandler(SpoolHandler):
    """`lox.spool(f, max_events=N)`: as `SpoolHandler`, and the logs of a
    `while_loop` go to buffers of `N` events per key (`lox_core.buffer`)."""

    def __init__(self, selection: Selection, keep_logs: bool, max_events: int):
        super().__init__(selection, keep_logs)
        self.max_events = max_events

    def fresh_state(self, like=None):
        return _Bounds(like.buffers.structure() if like is not None and like.buffers is not None else None)

    def carry(self):
        buffers = self.state.buffers
        return () if buffers is None else buffers.carry()

    def resume(self, carried) -> None:
        if self.state.buffers is not None:
            self.state.buffers.resume(carried)

    def enter_loop(self, loop):
        state = self.state
        # Scans stack their events; a while loop inside a bounded one passes its buffers on.
        if loop.length is not None or state.buffers is not None:
            return False
        if kinds_in(self.selection, loop.predicate):
            self._refuse_in_predicate(_keys_in(self.selection, loop.predicate))
        kinds = kinds_in(self.selection, loop.body)
        if not kinds:
            return False
        state.buffers = SpoolBuffer(kinds, self.max_events, *batched_loops(self.selection, loop.eqn))
        return True

    def exit_loop(self, entered, active):
        if not entered:
            return None
        logs = self.state.buffers.logs()
        self.state.buffers = None
        return logs

    def on_log(self, site, values, steps, active):
        buffers = self.state.buffers
        if buffers is None:
            return super().on_log(site, values, steps, active)
        if site.in_select:
            raise ValueError(vmap_of_cond_message(site, "spooled"))
        if in_while_predicate():
            self._refuse_in_predicate(list(values))
        buffers.append(values, steps, active)
        return None

    @staticmethod
    def _refuse_in_predicate(keys) -> None:
        raise NotImplementedError(
            f"`lox.spool(..., max_events=N)` cannot spool the keys {', '.join(map(repr, keys))}: they are logged "
            "in the predicate of a `jax.lax.while_loop`, which returns only a boolean and so cannot pass the "
            "buffers on. Log them in the loop's body, or stream them with `lox.tap`."
        )


def _keys_in(selection: Selection, jaxpr) -> list[str]:
    return list(dict.fromkeys(k for kind in kinds_in(selection, jaxpr) for k in kind.keys))


def spool(
    fun: Callable,
    *,
    argnames: Iterable[str] | None = None,
    tags: Iterable[str] | None = None,
    keep_logs: bool = False,
    interval: int | None = None,
    reduce: str | None = None,
    prefix: str = "",
    max_events: int | None = None,
    static_argnums: int | Sequence[int] = (),
    static_argnames: str | Iterable[str] = (),
) -> Callable[..., Any]:
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
      max_events: collect the logs of `jax.lax.while_loop`s (and of
        `fori_loop`s with traced bounds) too, keeping at most this many events
        of each key per run of the outermost such loop (see below).
      static_argnums: as in `jax.jit`.
      static_argnames: as in `jax.jit`.

    *Arguments.* Array leaves of the arguments (JAX and NumPy arrays) are
    traced; every other leaf (a function, a string, an object) is static, as
    under `eqx.filter_jit`: part of the cache key, by value when hashable and
    by identity otherwise (`static_argnums` makes a whole argument static, and
    must be hashable). Python numbers are traced as `jax.jit` traces them when
    passed as arguments or in tuples, lists and dicts, and static as fields of
    other nodes (a module's). Non-array leaves of the output come back as
    `fun` returned them. When `fun` updates its arguments in place (a flax.nnx
    model or optimizer, an `nnx.Variable`, a dict it assigns into), the array
    leaves it changed are written back into the objects passed, which end as
    `fun` alone would have left them; an object held in two places stays one
    object, and one that `fun` returns comes back as the caller's own. A
    change of their structure (an attribute added, a static flag changed)
    raises at the call.

    *Conditionals.* A key that the branches of a `cond`/`switch` log
    differently (some not at all, or a different number of times) comes back
    padded to the most events any branch logs, with ``logs.valid[key]`` true
    on the events of the branch that ran (as for `max_events` below).

    Events that `argnames`/`tags` do not select stay in the function as logs,
    for an enclosing transform (or the default console output) to handle. The
    keys of one event share one step array (one object, computed once): copy
    the logs (``jax.tree_util.tree_map(jnp.copy, logs)``) before donating them.

    A while loop runs a number of times known only at run time, so by default
    its logs are refused. With ``max_events=N`` the outermost while loop that
    logs carries a buffer of `N` events per key on device (loops inside it add
    to the same buffer), which it returns when it ends: each of its keys
    comes back as a *padded* series of `N` events per run of the loop, the
    first `N` it logged followed by padding. ``logs.valid[key]`` marks the
    recorded events, ``logs.count[key]`` counts them, and
    ``logs.dropped[key]`` counts the events a full buffer dropped: check it,
    or choose `N` with room to spare. Reductions, `interval` and Arrow
    conversion (loggers) leave the padding out; ``logs.trim()`` removes it on
    the host. Padding holds zeros, with :data:`lox.NO_STEP` as its steps.
    Under a `jax.vmap` inside the spool, a while loop whose predicate is
    batched runs until every element is done, and an event takes the same
    slot in every element (padding where an element did not log it): an
    element may then keep fewer than `N` events when others log more. Apply
    `vmap` outside (``jax.vmap(lox.spool(f, max_events=N))``) for `N` per element.

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
    >>> def halve(n):
    ...     def body(carry):
    ...         n, i = carry
    ...         lox.log({"n": n}, step=i)
    ...         return n // 2, i + 1
    ...     return jax.lax.while_loop(lambda c: c[0] > 0, body, (n, 0))[1]
    >>> steps, logs = lox.spool(halve, max_events=8)(100)
    >>> int(steps), int(logs.count["n"]), int(logs.dropped["n"]), logs.trim()["n"].tolist()
    (7, 7, 0, [100, 50, 25, 12, 6, 3, 1])
    """
    if reduce is not None and reduce not in REDUCTIONS:
        raise ValueError(f"unknown reduce mode {reduce!r} for `lox.spool`: use one of {', '.join(REDUCTIONS)}.")
    options = SpoolOptions(
        selection(argnames, tags), bool(keep_logs), positive_int("`lox.spool` interval", interval), reduce,
        string("`lox.spool` prefix", prefix),
        positive_int("`lox.spool` max_events", max_events, "events kept per key and loop"),
    )
    if options.max_events is None:
        handler = SpoolHandler(options.selection, options.keep_logs)
    else:
        handler = BoundedSpoolHandler(options.selection, options.keep_logs, options.max_events)

    def make_impl(get_fun):
        def spooled(*args, **kwargs):
            out, logs, _, changes = trace_and_interpret(get_fun(), handler, args, kwargs)
            if options.interval is not None:
                logs = every(logs, options.interval)
            if options.reduce is not None:
                logs = logs.reduce(options.reduce)
            if options.prefix:
                logs = logs.prefix(options.prefix)
            return (out, shared_once(logs)), changes

        return spooled

    program = jitted(fun, options, make_impl, static_argnums, static_argnames)

    def call(*args, **kwargs):
        out, shared = program((), args, kwargs)
        return out, plain(shared)

    # Lowered as it runs: with the steps shared by several keys returned once.
    return Transformed(fun, call, program, lowered=lambda *args, **kwargs: program((), args, kwargs))
