"""`lox.tap`: every log becomes a call of a host callback, as it happens."""

from __future__ import annotations

import contextvars
import threading
from typing import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from lox_core import console
from lox_core.host import chain_end, chain_start, host_call
from lox_core import buffer as buffering
from lox_core.interpreter import StatefulHandler, in_while_predicate, single_event, unique_objects
from lox_core.logdict import event_count, logdict
from lox_core.primitive import event_logdict, vmap_of_cond_message
from lox_core.spool import selection
from lox_core.transform import Transformed, jitted, trace_and_interpret, traced


def print_event(event: logdict) -> None:
    """The default tap callback: one readable line per event (a buffered tap
    delivers several events of a key at once: one line each, key by key)."""
    if all(event_count(v) == 1 for v in event.values()):
        values = {k: jax.tree_util.tree_map(lambda x: x[0], v) for k, v in event.items()}
        steps = {name: next(iter(per_key.values()))[0] for name, per_key in event.steps.items()}
        print(console.format_event(values, steps), flush=True)
        return
    for key, value in event.items():
        for i in range(event_count(value)):
            values = {key: jax.tree_util.tree_map(lambda x: x[i], value)}
            steps = {name: per_key[key][i] for name, per_key in event.steps.items() if key in per_key}
            print(console.format_event(values, steps), flush=True)


def _one_event(x):
    return x[None]


# The value handed to each callback along with the event (`tap_with_context`),
# set while the tapped function is traced.
_context: contextvars.ContextVar = contextvars.ContextVar("lox_tap_context", default=None)


class _State:
    """What a tap carries through the program it rewrites: the token that
    chains its host calls (see `lox_core.host`), and how the loop being
    buffered keeps its events: in `buffers` in its carry, or, for a scan
    whose events can be counted (`collecting`), as the outputs of chunks of
    iterations, like `lox.spool`'s."""

    __slots__ = ("token", "buffers", "collecting")

    def __init__(self, buffers: buffering.Buffers | None = None, collecting: bool = False):
        self.token = None
        self.buffers = buffers
        self.collecting = collecting


class TapHandler(StatefulHandler):
    guards_branches = True
    name = "lox.tap"

    def __init__(
        self, selection, callback: Callable, prefix: str, with_context: bool = False, batched: bool = False,
        buffer: int | None = None, block_callback: Callable | None = None,
    ):
        super().__init__()
        self.selection = selection
        self.callback = callback
        # With a context, buffered events go to ``block_callback(batch_ndim, logs, context)``.
        self.block_callback = block_callback
        self.prefix = prefix
        self.with_context = with_context
        self.batched = batched
        self.buffer = buffer
        # Devices call back from threads of their own (shard_map): one callback at a time.
        self._lock = threading.Lock()

    # --- the carried state (see `StatefulHandler`) -------------------------------------
    def fresh_state(self, like=None):
        # The buffers' arrays come with the state resumed.
        if like is None:
            return _State()
        return _State(like.buffers.structure() if like.buffers is not None else None, like.collecting)

    def _token(self):
        state = self.state
        if state.token is None:
            state.token = jnp.zeros((), jnp.int32)
        return state.token

    def carry(self):
        state = self.state
        token = self._token()
        return (token,) if state.buffers is None else (token, state.buffers.carry())

    def resume(self, carried) -> None:
        state = self.state
        state.token = carried[0]
        if len(carried) > 1:
            state.buffers.resume(carried[1])

    def can_enter_shard_map(self) -> bool:
        return self.state.buffers is None and not self.state.collecting

    def enter_loop(self, eqn, body):
        state = self.state
        if self.buffer is None or state.buffers is not None or state.collecting:
            return None  # unbuffered, or inside a loop that buffers already
        body = getattr(body, "jaxpr", body)
        kinds = buffering.kinds_in(self.selection, body)
        if not kinds:
            return None
        buffering.check_one_shape_per_key(kinds)
        # A scan that logs the same events in every iteration (its conds log
        # alike in each branch, no while loop inside logs) keeps them as the
        # outputs of chunks of about `buffer` events, each sent when it ends:
        # what `lox.spool` costs, plus a host call per chunk.
        if (eqn.primitive.name == "scan" and buffering.appends(self.selection, body, scans=True)
                and buffering.conds_log_alike(self.selection, body)):
            state.collecting = True
            return "collect"
        state.buffers = buffering.Buffers(kinds, self.buffer)
        return "buffers"

    def end_iteration(self, active) -> None:
        buffers = self.state.buffers
        if buffers is not None:
            buffers.commit()
            self._send_when(_both(buffers.n >= buffers.size, active))

    def chunk_length(self, body, length: int) -> int | None:
        # A scan that logs a known number of events per iteration sends after
        # each chunk of about `buffer` events: no test in every iteration.
        per_iteration = buffering.appends(self.selection, getattr(body, "jaxpr", body), scans=self.state.collecting)
        if not per_iteration:  # a loop inside logs: as many events as it runs
            return None
        return max(1, min(length, self.buffer // sum(per_iteration.values())))

    # Under `vmap`, an element that finished a while loop (or did not take a
    # branch) still runs it on values that are thrown away: `active` is false
    # there, and it sends nothing (its events were, or will be, sent).
    def end_chunk(self, logs, active) -> None:
        if self.state.collecting:
            self._send_logs(logs, active)
            return
        buffers = self.state.buffers
        buffers.commit()
        self._send_when(active)

    def exit_loop(self, entered, active) -> None:
        if entered == "collect":
            self.state.collecting = False
        elif entered == "buffers":  # the last, partial buffer
            buffers = self.state.buffers
            buffers.commit()
            self._send_when(_both(buffers.n > 0, active))
            self.state.buffers = None

    def enter_cond(self, branches):
        buffers = self.state.buffers
        return None if buffers is None else buffers.plan_cond(self.selection, branches)

    def leave_branch(self, plan):
        if plan is None:
            return self.carry()
        return self._token(), self.state.buffers.leave_branch(plan)

    def exit_cond(self, plan, carried) -> None:
        if plan is None:
            return self.resume(carried)
        state = self.state
        state.token = carried[0]
        state.buffers.exit_cond(plan, carried[1])

    def _send_when(self, when) -> None:
        state = self.state
        buffers = state.buffers
        kinds, prefix, callback, lock = buffers.kinds, self.prefix, self.callback, self._lock
        context, block_callback = self._context(buffers.kinds[0].keys), self.block_callback

        def deliver(batch_ndim, when, counts, arrays, context):
            elements = None if block_callback is None else buffering.elements(batch_ndim, np.shape(when), context)
            with lock:
                for e, block in buffering.blocks(kinds, prefix, batch_ndim, when, counts, arrays):
                    if block_callback is None:
                        callback(block)
                    else:  # one element's events, routed with its context
                        block_callback(0, block, elements[e])

        def send(token, when, counts, arrays):
            return host_call(deliver, when, counts, arrays, context, token=token)

        state.token = buffers.send_when(when, self._token(), send)

    def _context(self, keys):
        """The routing context of `tap_with_context` (None for `lox.tap`)."""
        if not self.with_context:
            return None
        context = _context.get()
        if context is None:
            # JAX traces custom_jvp/custom_vjp rules lazily, after the tapped call returned.
            raise NotImplementedError(
                f"a logger's tap cannot route the event with keys {', '.join(map(repr, keys))} to its run: it is "
                "logged in a jax.custom_jvp / custom_vjp function that is being differentiated, whose rules JAX "
                "traces after `logger.tap` returned. Log outside the custom function, or use `logger.spool`."
            )
        return context

    def _send_logs(self, logs: logdict, when) -> None:
        """Send a chunk's logs (each key's events in program order), one
        logdict per vmap element, of the elements where `when` (all if None)."""
        callback, lock = self.callback, self._lock
        if self.prefix:
            logs = logs.prefix(self.prefix)
        leaves, tree = jax.tree_util.tree_flatten(logs)
        unique, where = unique_objects(leaves)  # an event's keys share their steps: sent once
        context, block_callback = self._context(list(logs)), self.block_callback

        def block_of(arrays):  # the chunk's logs, from the unique arrays
            return jax.tree_util.tree_unflatten(tree, [arrays[i] for i in where])

        def deliver(batch_ndim, unique, when, context):
            # The user's callback gets copies (np.array): the host call's arrays may be buffers that XLA reuses.
            if batch_ndim == 0 and block_callback is None:  # the common case, kept cheap: one block, no routing
                if when is None or when:
                    block = block_of([np.array(x) for x in unique])
                    with lock:
                        callback(block)
                return
            batch_shape = np.shape(unique[0])[:batch_ndim]
            sending = np.broadcast_to(True if when is None else when, batch_shape)
            if block_callback is not None and sending.all():  # all elements at once, routed by the context
                block = block_of(unique)
                with lock:
                    block_callback(batch_ndim, block, context)
                return
            contexts = None if block_callback is None else buffering.elements(batch_ndim, batch_shape, context)
            for e, index in enumerate(np.ndindex(batch_shape)):
                if not sending[index]:
                    continue
                block = block_of([np.array(x[index]) for x in unique])
                with lock:
                    if block_callback is None:
                        callback(block)
                    else:
                        block_callback(0, block, contexts[e])

        self.state.token = host_call(deliver, unique, when, context, token=self._token())

    # --- events ----------------------------------------------------------------------
    def on_log(self, site, values, steps, active):
        if site.in_select:
            raise ValueError(vmap_of_cond_message(site, "tapped"))
        keys, names = list(values), list(steps)  # lists: flattening a dict sorts it
        state = self.state
        if state.collecting:
            return event_logdict(values, steps, expand=single_event)
        if state.buffers is not None:
            self._buffer(site, keys, values, steps, active)
            return None
        callback, prefix, with_context, batched = self.callback, self.prefix, self.with_context, self.batched
        lock = self._lock

        def deliver(*args):
            with lock:
                deliver_unlocked(*args)

        def deliver_unlocked(batch_ndim, taken, vals, stps, context):
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

        context = self._context(keys)
        state.token = host_call(
            deliver, active, [values[k] for k in keys], [steps[n] for n in names], context, token=self._token()
        )
        return None

    def _buffer(self, site, keys, values, steps, active) -> None:
        where = ", ".join(map(repr, keys))
        if in_while_predicate():
            raise NotImplementedError(
                f"`lox.tap(..., buffer=K)` cannot buffer the event with keys {where}: it is logged in the "
                "predicate of a `jax.lax.while_loop`, which cannot pass the buffer on. Log it in the loop's "
                "body, or tap without `buffer`."
            )
        if active is not None and jnp.ndim(active):
            raise NotImplementedError(
                f"`lox.tap(..., buffer=K)` cannot buffer the event with keys {where}: it is logged in a "
                "`jax.lax.while_loop` whose predicate is batched by `jax.vmap`, so its elements stop at "
                "different iterations. Apply `vmap` outside the tap (`jax.vmap(lox.tap(f, callback, "
                "buffer=K))`), or tap without `buffer`."
            )
        kind = buffering.kind_of(keys, values, steps)
        leaves = [x for k in keys for x in jax.tree_util.tree_leaves(values[k])]
        self.state.buffers.append(kind, leaves, list(steps.values()), active)


def _both(a, b):
    return a if b is None else jnp.logical_and(a, b)


def tap(
    fun: Callable,
    callback: Callable[[logdict], None] | None = None,
    *,
    argnames: Iterable[str] | None = None,
    tags: Iterable[str] | None = None,
    prefix: str = "",
    batched: bool = False,
    buffer: int | None = None,
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

    With ``buffer=K``, events logged inside a loop (`scan`, `while_loop`,
    `fori_loop`) stay on device and cross to the host once per `K` events
    (about `K` for a scan: whole iterations), and once more with the rest when
    the loop ends: `callback` then gets those events at once, one logdict
    holding each key's events in program order with their steps (under
    `jax.vmap(lox.tap(...))`, one per element, in the same call). Events
    outside loops are delivered one by one as without `buffer`. Nothing is
    lost or delivered twice: concatenating what `callback` received gives the
    events an unbuffered tap delivers. A scan that logs the same events in
    every iteration runs in chunks whose logs leave as `spool`'s do, so it
    costs what spooling costs plus one host call per chunk; other loops carry
    the buffer and test after each iteration whether it is full. In a
    buffered loop, each key keeps one shape and dtype.

    Host calls are put in order by data dependency (each returns a token the
    next one takes), not by an ordered effect; tapped functions called one
    after another in a jitted function (under `vmap` or `grad` there too)
    share that chain, so their events arrive in call order. A tapped function
    runs on several devices: under a sharded `jax.jit` the callback runs once
    per event with the whole arrays; inside `jax.shard_map`, once per device
    with that device's values, each device's events in program order.

    Arguments are taken as `lox.spool` takes them: non-array leaves are static,
    and what `fun` changes in its arguments in place is written back.

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
    >>> blocks = []
    >>> out = lox.tap(f, blocks.append, buffer=2)(jnp.arange(5))
    >>> [b["c"].tolist() for b in blocks], blocks[-1].step["c"].tolist()
    ([[0, 1], [3, 6], [10]], [4])
    """
    if batched and callback is None:
        raise TypeError("`lox.tap(f, batched=True)` needs a callback that takes (event, took); the default prints single events.")
    buffer = _check_buffer(buffer, batched)
    handler = TapHandler(selection(argnames, tags), callback or print_event, prefix, batched=batched, buffer=buffer)

    def make_impl(get_fun):
        def tapped(token, *args, **kwargs):
            out, _, (token, *_), changes = trace_and_interpret(get_fun(), handler, args, kwargs, carried=(token,))
            return (out, token), changes

        return tapped

    config = ("tap", handler.selection, callback, prefix, batched, buffer)
    # The token comes first (`leading=1`).
    program = jitted(fun, config, make_impl, static_argnums, static_argnames, leading=1)

    def call(*args, **kwargs):
        out, token = program((chain_start(),), args, kwargs)
        chain_end(token)
        if not traced((args, kwargs)):
            jax.effects_barrier()  # deliver every event before returning
        return out

    return Transformed(fun, call, program)


def _check_buffer(buffer, batched: bool) -> int | None:
    if buffer is None:
        return None
    if isinstance(buffer, bool) or not isinstance(buffer, (int, np.integer)) or buffer < 1:
        raise ValueError(f"`lox.tap` buffer must be an integer >= 1 (events per host call), got {buffer!r}.")
    if batched:
        raise TypeError(
            "`lox.tap` takes `buffer` or `batched=True`, not both: a buffer is delivered per vmap element, "
            "as one logdict of several events. Drop one of them."
        )
    return int(buffer)


def tap_with_context(
    fun: Callable,
    callback: Callable[[logdict, object], None],
    *,
    argnames: Iterable[str] | None = None,
    tags: Iterable[str] | None = None,
    prefix: str = "",
    wait: bool = True,
    buffer: int | None = None,
    block_callback: Callable | None = None,
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

    With ``buffer=K`` (as in `tap`), the events of loops reach
    ``block_callback(batch_ndim, logs, context)`` instead, several at a time:
    `logs` as spooled logs are, with the batch axes in front.
    """
    buffer = _check_buffer(buffer, batched=False)
    if buffer is not None and block_callback is None:
        raise TypeError("`tap_with_context(..., buffer=K)` needs a `block_callback` for the buffered events.")
    handler = TapHandler(selection(argnames, tags), callback, prefix, with_context=True, buffer=buffer,
                         block_callback=block_callback)

    def make_impl(get_fun):
        def tapped(token, context, *args, **kwargs):
            reset = _context.set(context)
            try:
                out, _, (token, *_), changes = trace_and_interpret(get_fun(), handler, args, kwargs, carried=(token,))
                return (out, token), changes
            finally:
                _context.reset(reset)

        return tapped

    config = ("tap_with_context", handler.selection, callback, prefix, buffer, block_callback)
    # The token and `context` come first (`leading=2`).
    program = jitted(fun, config, make_impl, static_argnums, static_argnames, leading=2)

    def call(context, *args, **kwargs):
        out, token = program((chain_start(), context), args, kwargs)
        chain_end(token)
        if wait and not traced((context, args, kwargs)):
            jax.effects_barrier()
        return out

    # It holds `fun`, which the cache refers to weakly.
    return Transformed(fun, call, program, leading=1)
