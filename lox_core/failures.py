"""A host callback that raised: its exception, raised again where lox's caller gets control.

XLA turns an exception raised in a host callback into a `JaxRuntimeError` that
holds only its text, and fails the program; in a multi-process job the other
processes then wait for the failed one, and every process ends by SIGABRT. So
lox's host calls never raise: `record` keeps the exception, with a note of what
raised it while delivering what, the program runs on, and until lox has raised
that exception again no host call delivers anything (the events after it would
reach a callback that failed halfway). It is raised, the same object with its
traceback ending in the callback, by the next `jax.effects_barrier()` (an eager
`lox.tap` call runs one) or the next logger call. One that nothing raised is
printed at exit. In a multi-process job each process publishes its failures
(JAX's key-value store), and at exit every process prints the others'.

The one exception: an error marked by `stop_program` (a logger that can no
longer keep its logs) is raised into XLA, to stop the program, and not kept.
"""

from __future__ import annotations

import atexit
import itertools
import os
import sys
import threading
import traceback
from typing import Callable, TypeVar

import jax

from lox_core import _compat

# The first exception recorded and not yet raised again. Every host call reads
# it without the lock: one load, and a stale None only delivers one more event.
pending: Exception | None = None
_lock = threading.Lock()
_numbers = itertools.count()  # the failures this process published
T = TypeVar("T")
EXIT_BARRIER_MS = 60_000  # how long a process waits at exit for the others to publish theirs


def record(error: Exception, note: str) -> None:
    """Keep `error` (raised by a host call; `note` says by what) for `raise_pending`."""
    global pending
    error.add_note(note)
    with _lock:
        first = pending is None
        if first:
            pending = error
    if not first:  # a callback of another device's thread, while the first one was pending
        print("lox: another host callback raised while an earlier exception waited to be raised:", file=sys.stderr)
        traceback.print_exception(error, file=sys.stderr)
        return
    index, count, client = _compat.distributed_runtime()
    if count > 1:
        text = "".join(traceback.format_exception(error))
        try:
            client.key_value_set(f"lox/failures/{index}/{next(_numbers)}", text)
        except Exception:  # noqa: BLE001 - the job's runtime is gone: this process still raises it
            pass


def stop_program(error: Exception) -> None:
    """Mark `error`, about to be raised by a host call, as one that must fail
    the program (a logger that can no longer keep its logs): `guarded` raises
    it into XLA, so that training stops instead of running on without logs,
    and does not keep it. It says how things stand, not what happened: the
    logger raises it again from each of its calls and host calls while it
    holds true, and once it no longer does (space was freed) the program runs
    and delivers again; a kept copy would fail every later host call, and
    `finish`, with a fault long cleared."""
    error.lox_stops_program = True  # pyright: ignore[reportAttributeAccessIssue]


def _stops_program(error: BaseException | None) -> bool:
    return getattr(error, "lox_stops_program", False)


def guarded(call: Callable[[], T], note: str) -> T | None:
    """``call()`` from a host callback, which must not raise into XLA: None
    where an earlier exception waits to be raised (nothing runs until it
    was), or where `call` raises (kept with `note`, see `record`). An
    exception marked by `stop_program` is raised into XLA instead, with `note`."""
    if pending is not None:
        return None
    try:
        return call()
    except Exception as error:  # noqa: BLE001 - XLA would abort with it: lox raises it later
        if _stops_program(error):
            error.add_note(note)
            raise
        record(error, note)
        return None


def raise_pending() -> None:
    """Raise the exception a host call raised, if one did since the last time."""
    global pending
    if pending is None:
        return
    with _lock:
        error, pending = pending, None
    if error is not None:
        raise error


def _report_at_exit() -> None:
    """Print what a host callback raised and nothing raised again, here or
    on another process of the job; then end the process with exit code 1, as
    the exception would have (an exit handler cannot set the exit code)."""
    global pending
    try:
        _compat.wait_for_effects()  # callbacks of programs still running
    except Exception:  # noqa: BLE001 - a failed program: JAX's own exit handler reports it
        pass
    with _lock:
        error, pending = pending, None
    failed = error is not None
    if failed:
        print("lox: a host callback raised, and nothing raised it again before exit:", file=sys.stderr)
        traceback.print_exception(error, file=sys.stderr)
    index, count, client = _compat.distributed_runtime()
    if count > 1:
        try:  # every process has run its callbacks: what any of them published is there
            client.wait_at_barrier("lox-failures-at-exit", EXIT_BARRIER_MS)
        except Exception:  # noqa: BLE001 - a process that never came: report what the others published
            pass
        for key, text in sorted(client.key_value_dir_get("lox/failures/")):
            process = int(key.split("/")[-2])
            if process != index:
                failed = True
                print(f"lox: a host callback raised on process {process} of this job:\n{text}", end="",
                      file=sys.stderr)
    if failed:
        # The handlers registered before this one (JAX's) are skipped: the job is ended here, as they would.
        sys.stdout.flush()
        sys.stderr.flush()
        if count > 1:
            try:
                jax.distributed.shutdown()
            except Exception:  # noqa: BLE001 - already shut down, or the coordinator is gone
                pass
        os._exit(1)


# Exit handlers run last registered first: this one before JAX's, which wait
# for effects (they would raise what is pending) and end the distributed job.
atexit.register(_report_at_exit)
_compat.check_after_effects_barrier(raise_pending)
