"""`lox.tap`: every log becomes a call of a host callback, as it happens."""

from __future__ import annotations

import contextvars
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lox_core import _compat
from lox_core import buffer as buffering
from lox_core.active import current as active_destination
from lox_core.active import for_host_call as destination_of
from lox_core.delivery import Delivery, print_event
from lox_core.host import callback_name, chain_end, chain_start, host_call
from lox_core.interpreter import Handler, in_while_predicate, single_event, unique_objects
from lox_core.logdict import logdict
from lox_core.options import TapOptions, positive_int, selection, string
from lox_core.primitive import event_logdict, vmap_of_cond_message
from lox_core.transform import Transformed, jitted, trace_and_interpret, traced

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

    def __init__(self, buffers: buffering.TapBuffer | None = None, collecting: bool = False):
        self.token = None
        self.buffers = buffers
        self.collecting = collecting


class TapHandler(Handler):
    uses_active = True
    name = "lox.tap"

    def __init__(self, options: TapOptions):
        super().__init__()
        self.selection = options.selection
        self.prefix = options.prefix
        self.with_context = options.with_context
        self.buffer = options.buffer
        self.delivery = Delivery(options.callback, options.prefix, options.batched, options.with_context,
                                 options.block_callback, blocks=options.buffer is not None)
        self.per_device_error = options.per_device_error
        self.check = options.check

    def _check_placement(self) -> None:
        """Refuse a host call that would run on every device, where the caller says why."""
        if self.per_device_error is not None and _compat.manual_axes():
            raise ValueError(self.per_device_error)

    # --- the carried state (see `Handler`) ---------------------------------------------
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

    def enter_shard_map(self, keys: str) -> None:
        if self.state.buffers is not None or self.state.collecting:
            raise NotImplementedError(
                f"`{self.name}` cannot buffer the logs ({keys}) of a `jax.shard_map` inside a buffered loop. "
                "Put the loop inside the shard_map, or tap without `buffer`."
            )

    # --- loops: the buffers of `buffer=K` ----------------------------------------------
    def enter_loop(self, loop):
        state = self.state
        if self.buffer is None or state.buffers is not None or state.collecting:
            return None  # unbuffered, or inside a loop that buffers already
        kinds = buffering.kinds_in(self.selection, loop.body)
        if not kinds:
            return None
        # A scan that logs the same events in every iteration (its conds log
        # alike in each branch, no while loop inside logs) keeps them as the
        # outputs of chunks of about `buffer` events, each sent when it ends:
        # what `lox.spool` costs, plus a host call per chunk. Either way a key
        # keeps one shape (`TapBuffer` checks it for its own loops).
        if (loop.length is not None and buffering.appends(self.selection, loop.body, scans=True)
                and buffering.conds_log_alike(self.selection, loop.body)):
            buffering.check_one_shape_per_key(kinds)
            state.collecting = True
            return "collect"
        state.buffers = buffering.TapBuffer(kinds, self.buffer)
        return "buffers"

    def run_scan(self, entered, scan, init, xs):
        buffer = self.buffer  # set whenever a loop was `entered`
        if entered is None or buffer is None:
            return scan(init, xs)
        # A scan that logs a known number of events per iteration sends after
        # each chunk of about `buffer` events: no test in every iteration.
        per_iteration = buffering.appends(self.selection, scan.p.jaxpr.jaxpr, scans=self.state.collecting)
        if not per_iteration:  # a loop inside logs: as many events as it runs
            return scan(init, xs)
        chunk = max(1, min(scan.length, buffer // sum(per_iteration.values())))
        carry, ys = buffering.in_chunks(self, scan, init, xs, chunk, lambda logs: self._end_chunk(logs, scan.active))
        return carry, ys, logdict()

    def end_iteration(self, active) -> None:
        buffers = self.state.buffers
        if buffers is not None:
            buffers.commit()
            self._send_when(_both(buffers.n >= buffers.size, active))

    # Under `vmap`, an element that finished a while loop (or did not take a
    # branch) still runs it on values that are thrown away: `active` is false
    # there, and it sends nothing (its events were, or will be, sent).
    def _end_chunk(self, logs, active) -> None:
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

    def leave_branch(self, plan, branch: int):
        if plan is None:
            return self.carry()
        return self._token(), self.state.buffers.leave_branch(plan, branch)

    def exit_cond(self, plan, carried) -> None:
        if plan is None:
            return self.resume(carried)
        state = self.state
        state.token = carried[0]
        state.buffers.exit_cond(plan, carried[1])

    def _send_when(self, when) -> None:
        state = self.state
        buffers = state.buffers
        deliver, context = self.delivery.buffers(buffers.groups, buffers.key_order), self._context(buffers.key_order)
        note = self._note([self.prefix + key for key in buffers.key_order], block=True)

        def send(token, when, counts, arrays):
            return host_call(deliver, when, counts, arrays, context, token=token, note=note)

        self._check_placement()

        state.token = buffers.send_when(when, self._token(), send)

    def _note(self, keys: list[str], block: bool = False) -> str:
        """What an exception of the callback gets as its note (see `lox_core.failures`)."""
        delivery = self.delivery
        callback = delivery.block_callback if block and delivery.block_callback is not None else delivery.callback
        delivering = ", ".join(map(repr, keys))
        return f"raised by {self.name} callback {callback_name(callback)} while delivering keys {delivering}"

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
        if self.prefix:
            logs = logs.prefix(self.prefix)
        leaves, tree = jax.tree_util.tree_flatten(logs)
        unique, where = unique_objects(leaves)  # an event's keys share their steps: sent once
        deliver = self.delivery.chunk(tree, where)
        self._check_placement()
        self.state.token = host_call(deliver, unique, when, self._context(list(logs)), token=self._token(),
                                     note=self._note(list(logs), block=True))

    # --- events ----------------------------------------------------------------------
    def on_log(self, site, values, steps, active):
        if site.in_select:
            raise ValueError(vmap_of_cond_message(site, "tapped"))
        keys, names = list(values), list(steps)  # lists: flattening a dict sorts it
        if self.check is not None:  # refused at the call, as `logger.log` refuses it
            event, context = event_logdict(values, steps), self._context(keys)
            runs_shape = () if context is None else np.shape(context)
            self.check(event.prefix(self.prefix) if self.prefix else event, runs_shape)
        state = self.state
        if state.collecting:
            return event_logdict(values, steps, expand=single_event)
        if state.buffers is not None:
            self._buffer(keys, values, steps, active)
            return None
        deliver = self.delivery.event(keys, names)
        context = self._context(keys)
        self._check_placement()
        state.token = host_call(
            deliver, active, [values[k] for k in keys], [steps[n] for n in names], context, token=self._token(),
            note=self._note([self.prefix + k for k in keys]),
        )
        return None

    def _buffer(self, keys, values, steps, active) -> None:
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
        self.state.buffers.append(values, steps, active)


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
    static_argnums: int | Sequence[int] = (),
    static_argnames: str | Iterable[str] = (),
) -> Callable[..., Any]:
    """Return `fun` with every log delivered to ``callback(event)`` as it happens.

    Each `lox.log` event becomes one call of `callback` with a
    :class:`lox.Event`, in execution order: each key's value as NumPy, in the
    shape it was logged with (a scalar as a NumPy scalar), and the steps as
    ints (``event["loss"]``, ``event.step``). ``event.to_logdict()`` is the
    one-event `lox.logdict` of the `spool` convention, so the events add up to
    the spooled logs. The default callback prints the event, or inside
    ``with logger.active(state):`` sends it to the state's runs. `argnames`,
    `tags` and `prefix` work as in `lox.spool`; unselected events stay in the
    function.

    Under `jax.vmap` (``jax.vmap(lox.tap(f, callback))``) one host call
    carries the event of every element, and `callback` is called once per
    element with that element's event. With ``batched=True`` it is called once
    per event instead, as ``callback(event, took)``: `event` is a one-event
    logdict whose arrays have the vmap axes in front of the event axis, and
    the boolean array `took` (the vmap axes' shape; ``()`` outside vmap) says which elements
    logged it (inside a `cond` with a batched predicate, those that took the
    branch; the other elements' values are meaningless). That costs one
    callback per event however many elements there are.

    With ``buffer=K``, events logged inside a loop (`scan`, `while_loop`,
    `fori_loop`) stay on device and cross to the host once per `K` events
    (about `K` for a scan: whole iterations), and once more with the rest when
    the loop ends: `callback` then gets those events at once, one logdict
    holding each key's events in program order with their steps (under
    `jax.vmap(lox.tap(...))`, one per element, in the same call). Events
    outside loops are delivered one by one, each as a one-event logdict. A
    callback written for single events serves blocks through
    `logdict.events`: ``lambda block: [callback(e) for e in block.events()]``.
    Nothing is lost or delivered twice: concatenating what `callback`
    received gives the events an unbuffered tap delivers. A scan that logs the same events in
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

    An exception `callback` raises does not reach XLA (which would raise a
    `JaxRuntimeError` holding its text, and abort a multi-process job): the
    program runs on, and the exception itself, with a note naming the callback
    and the keys it was given, is raised by the call (with concrete arrays), or
    else by the next `jax.effects_barrier()` or logger call. Until then lox
    delivers no event (to any callback). One that nothing raised is printed on
    stderr at exit; in a multi-process job, every process prints the others'
    there.

    >>> import jax, jax.numpy as jnp, lox
    >>> def f(xs):
    ...     def step(c, x):
    ...         lox.log({"c": c + x}, step=x)
    ...         return c + x, None
    ...     return jax.lax.scan(step, 0, xs)[0]
    >>> events = []
    >>> out = lox.tap(f, events.append)(jnp.arange(3))
    >>> events
    [Event({'c': 0}, step=0), Event({'c': 1}, step=1), Event({'c': 3}, step=2)]
    >>> int(events[-1]["c"]), events[-1].step
    (3, 2)
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
        raise TypeError(
            "`lox.tap(f, batched=True)` needs a callback that takes (event, took); the default prints single events."
        )
    options = TapOptions(selection(argnames, tags), callback or print_event, string("`lox.tap` prefix", prefix),
                         bool(batched), _check_buffer(buffer, batched))
    handler = TapHandler(options)

    def make_impl(get_fun):
        def tapped(token, *args, **kwargs):
            out, _, (token, *_), changes = trace_and_interpret(get_fun(), handler, args, kwargs, carried=(token,))
            return (out, token), changes

        return tapped

    # The token comes first (`leading=1`).
    program = jitted(fun, options, make_impl, static_argnums, static_argnames, leading=1)
    routed: list[Callable] = []  # with no callback: `fun` tapped to the active run, named by its key

    def call(*args, **kwargs):
        destination = active_destination() if callback is None else None
        if destination is not None:  # inside `with logger.active(state)`: to its runs, not the console
            if not routed:
                # One program for every block: the key is an operand, the destination found on arrival
                # (the block is open until its events arrived), and nothing here holds it.
                routed.append(tap_with_context(
                    fun, _to_active, argnames=argnames, tags=tags, prefix=prefix, buffer=buffer,
                    static_argnums=static_argnums, static_argnames=static_argnames,
                    block_callback=lambda nd, logs, key: _to_active(nd, logs, key, None, block=True)))
            return routed[0](np.int32(destination.key), *args, **kwargs)
        out, token = program((chain_start(),), args, kwargs)
        chain_end(token)
        if not traced((args, kwargs)):
            jax.effects_barrier()  # deliver every event before returning
        return out

    return Transformed(fun, call, program)


def _to_active(batch_ndim: int, logs: logdict, key, took: np.ndarray | None, block: bool = False) -> None:
    """A routed tap's event (or, with `block`, a buffer's events) to the block
    whose key (`key`, with any vmap axes) it was called with; printed as
    outside blocks when that block is gone (an enclosing program compiled in
    the block and run after it)."""
    destination = destination_of(int(np.asarray(key).reshape(-1)[0]))
    if destination is None:
        batch = np.shape(jax.tree_util.tree_leaves(logs)[0])[:batch_ndim]
        for i in np.ndindex(batch):
            if took is None or np.asarray(took)[i]:
                print_event(jax.tree_util.tree_map(lambda x, i=i: x[i], logs))
    elif block:
        destination.deliver_block(batch_ndim, logs)
    else:
        destination.deliver(batch_ndim, logs, took)


def _check_buffer(buffer, batched: bool) -> int | None:
    buffer = positive_int("`lox.tap` buffer", buffer, "events per host call")
    if buffer is not None and batched:
        raise TypeError(
            "`lox.tap` takes `buffer` or `batched=True`, not both: a buffer is delivered per vmap element, "
            "as one logdict of several events. Drop one of them."
        )
    return buffer


def tap_with_context(
    fun: Callable,
    callback: Callable[[int, logdict, Any, np.ndarray], None],
    *,
    argnames: Iterable[str] | None = None,
    tags: Iterable[str] | None = None,
    prefix: str = "",
    wait: bool = True,
    buffer: int | None = None,
    block_callback: Callable | None = None,
    per_device_error: str | None = None,
    check: Callable[[logdict, tuple[int, ...]], None] | None = None,
    static_argnums: int | Sequence[int] = (),
    static_argnames: str | Iterable[str] = (),
) -> Callable[..., Any]:
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

    With `per_device_error`, an event logged inside `shard_map` or `pmap`
    (whose host calls run on every device) raises a ValueError saying that.
    `check(event, context_shape)` is called with each event, as a one-event
    logdict, while the function is traced: what it raises is raised there.
    """
    options = TapOptions(selection(argnames, tags), callback, string("`logger.tap` prefix", prefix),
                         buffer=_check_buffer(buffer, batched=False), with_context=True, block_callback=block_callback,
                         per_device_error=per_device_error, check=check)
    if options.buffer is not None and block_callback is None:
        raise TypeError("`tap_with_context(..., buffer=K)` needs a `block_callback` for the buffered events.")
    handler = TapHandler(options)

    def make_impl(get_fun):
        def tapped(token, context, *args, **kwargs):
            reset = _context.set(context)
            try:
                out, _, (token, *_), changes = trace_and_interpret(get_fun(), handler, args, kwargs, carried=(token,))
                return (out, token), changes
            finally:
                _context.reset(reset)

        return tapped

    # The token and `context` come first (`leading=2`).
    program = jitted(fun, options, make_impl, static_argnums, static_argnames, leading=2)

    def call(context, *args, **kwargs):
        out, token = program((chain_start(), context), args, kwargs)
        chain_end(token)
        if wait and not traced((context, args, kwargs)):
            jax.effects_barrier()
        return out

    # It holds `fun`, which the cache refers to weakly.
    return Transformed(fun, call, program, leading=1)
