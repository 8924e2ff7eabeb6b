"""Where the logs that no transform captures go: the active destination.

``with logger.active(state):`` (`lox_backends.logger`) makes a *destination*
active in the calling thread (a `contextvars` stack: blocks nest, the
innermost wins). Every `lox.log` that no `spool`, `tap` or `nolog` captures
then goes to it instead of the console: an eager one at once, in the caller's
thread; one inside a compiled program through that program's host call, when
the event reaches the host. A `lox.tap` with no callback sends to it too.

A compiled program does not know which thread dispatched it, so its host call
finds its destination one of two ways:

- *keyed*: the block set a JAX configuration value in the jit key (per
  thread), so functions run inside the block are traced and compiled for it,
  and their host calls name its destination. Blocks are keyed when the default
  is ``"off"`` (its compiled functions have no host call: those run inside the
  block are compiled again, once, with one), when a block of another thread is
  open, and inside a keyed block.
- *unkeyed*: with the default ``"console"`` a first block leaves the jit key as
  it is, so functions compiled before it keep their program (no retrace); their
  host call sends each event to the innermost unkeyed block open when it
  arrives, and prints it when none is.

Opening and leaving a block wait for the events of the programs dispatched
before (`jax.effects_barrier`), so that each event reaches the block (or
console) of where its program was dispatched.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
from typing import Iterable, Iterator, NamedTuple, Protocol

import numpy as np

from lox_core import _compat, failures
from lox_core.logdict import logdict


class Destination(Protocol):
    """What an active block sends to (a Logger's runs)."""

    key: int  # one per destination, never reused: the jit key of keyed blocks
    # Why a log inside `shard_map` (whose host calls run per device) cannot reach it, or None.
    per_device_error: str | None

    def deliver(self, batch_ndim: int, event: logdict, took: np.ndarray | None) -> None:
        """One event on the host: its arrays have `batch_ndim` vmap axes, then
        an event axis of 1; `took` (None: all) says which elements logged it."""

    def deliver_block(self, batch_ndim: int, logs: logdict) -> None:
        """Several events at once (a buffered tap's), `batch_ndim` vmap axes in front."""


class _Entry(NamedTuple):
    destination: Destination
    keyed: bool


_stack: contextvars.ContextVar[tuple[_Entry, ...]] = contextvars.ContextVar("lox_active", default=())
# The innermost entry of every thread with a block open, for host calls (which
# run in threads of their own and cannot read the dispatching thread's context).
_open: dict[int, list[_Entry]] = {}
_by_key: dict[int, Destination] = {}
_lock = threading.Lock()
_keys = itertools.count(1)


def new_key() -> int:
    """A key for a new destination (0 means none)."""
    return next(_keys)


def current() -> Destination | None:
    """The innermost destination active in this thread (context), or None."""
    stack = _stack.get()
    return stack[-1].destination if stack else None


def keyed_elsewhere() -> bool:
    """Whether this context's innermost block is keyed but JAX's configuration
    (per thread) does not say so: the context was copied into another thread
    (`asyncio.to_thread`, `contextvars.copy_context().run`), where what is
    compiled has no key."""
    stack = _stack.get()
    return bool(stack) and stack[-1].keyed and _compat.active_run_state.value != stack[-1].destination.key


def current_unkeyed() -> Destination | None:
    """The innermost destination active in this thread (context) if its block
    is unkeyed (a compiled program finds it on arrival), or None."""
    stack = _stack.get()
    return stack[-1].destination if stack and not stack[-1].keyed else None


@contextlib.contextmanager
def activate(destination: Destination) -> Iterator[Destination]:
    """Within: uncaptured logs go to `destination` (see the module docstring)."""
    # The events of what was dispatched before the block (an outer block's, or printed) arrive
    # before it opens: an asynchronous program's (a GPU's, several devices') would reach it.
    _compat.wait_for_effects()
    stack = _stack.get()
    thread = threading.get_ident()
    with _lock:
        if any(not any(e is s for s in stack) for e in _open.get(thread, ())):
            # JAX keys its compiled functions per thread, not per context: the tasks would share one run.
            raise RuntimeError(
                "`logger.active`: a block of another asyncio task (or context) is open in this thread, and "
                "JAX cannot tell the tasks of one thread apart: their events would go to each other's runs. "
                "Open one block around the tasks (`with logger.active(state): asyncio.run(main())`), run each "
                "task's JAX work in a thread of its own, with its block in it (`await asyncio.to_thread(work)`, "
                "`work` opening the block), or pass the state explicitly (`logger.tap(f, state)`)."
            )
        others = {entries[-1].destination.key for t, entries in _open.items() if t != thread and entries}
        keyed = (
            _compat.default_output_state.value == "off"
            or bool(others - {destination.key})
            or any(entry.keyed for entry in stack)
        )
        entry = _Entry(destination, keyed)
        _open.setdefault(thread, []).append(entry)
        _by_key[destination.key] = destination
    token = _stack.set((*stack, entry))
    key_context = _compat.active_run_state(destination.key) if keyed else contextlib.nullcontext()
    try:
        with key_context:
            yield destination
    finally:
        # The events of what was dispatched in the block arrive before it ends, also when
        # it ends by an exception (they are the run's last logs).
        _compat.wait_for_effects()
        _stack.reset(token)
        with _lock:
            entries = _open[thread]
            entries.remove(entry)
            if not entries:
                del _open[thread]
            if not any(e.destination.key == destination.key for es in _open.values() for e in es):
                _by_key.pop(destination.key, None)
    failures.raise_pending()  # what a host call of the block raised, raised where the block ends


def compiled_key() -> int:
    """The destination key the program being traced or lowered now is
    compiled for (a keyed block's), or 0."""
    return _compat.active_run_state.value


def for_host_call(key: int) -> Destination | None:
    """Where an event of a compiled program goes, when it reaches the host:
    the destination it was compiled for (`key`), if its block is still open;
    else, for a program compiled outside keyed blocks, the one unkeyed block
    open (None: none is; the default applies)."""
    if key:
        return _by_key.get(key)
    with _lock:
        # At most one: a block opened while another thread's is open is keyed, and a thread's
        # second asyncio task cannot open one (`activate`).
        unkeyed = [entries[-1].destination for entries in _open.values() if entries and not entries[-1].keyed]
    return unkeyed[0] if unkeyed else None


def runs_for(runs: np.ndarray, batch_shape: tuple[int, ...], keys: Iterable[str]) -> tuple[np.ndarray, bool]:
    """The run of each element of an event vmapped over `batch_shape`, for a
    block whose state holds `runs`: element i of a vmap over the runs goes to
    run i (inner vmap axes to the same run), an event that is not vmapped to
    every run. Returns the runs, of the event's batch shape, and whether the
    event must first be given to every run (broadcast over `runs`' axes)."""
    runs = np.asarray(runs)
    if runs.ndim == 0:
        return (runs if not batch_shape else np.broadcast_to(runs, batch_shape)), False
    if not batch_shape:
        return runs, True
    if tuple(batch_shape[: runs.ndim]) == runs.shape:
        return np.broadcast_to(runs.reshape(runs.shape + (1,) * (len(batch_shape) - runs.ndim)), batch_shape), False
    raise ValueError(
        f"lox.log of {', '.join(map(repr, keys))}: the active run's state holds runs of shape {runs.shape} (one "
        f"per seed), but the event is vmapped over {tuple(batch_shape)}. Vmap the function over the seeds, with "
        "one element per run (`jax.vmap(step)(...)` of the same size as `jax.vmap(logger.init)(keys)`), or open the "
        "block with one run."
    )
