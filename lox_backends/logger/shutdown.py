"""The end of the process: every live Logger is closed, so that what it holds is
written, at interpreter exit and on SIGTERM.

Loggers register themselves (weakly); `close_at_exit` runs as an exit handler.
A tracker whose client registers an exit handler of its own calls
`flush_before_exit_handlers` afterwards, so that lox's runs first.

SIGTERM is how SLURM, Kubernetes and the clouds stop a job (a preemption), and
SIGKILL follows a grace period later (30 s by default for SLURM, Kubernetes and
GCE spot VMs). Its default action ends the process without exit handlers: the
logs of up to ``flush_every`` seconds would be lost. So the first Logger made
in the main thread, where SIGTERM still has its default action, installs
`on_sigterm`: it writes what every live logger received, closes their runs
(status ``"killed"``: interrupted from outside, everything logged written; see
`lox_backends.runstore.layout`), all within `SIGTERM_WAIT` seconds, then ends
the process by SIGTERM as the default action would (its exit status says so).
A handler someone else installed (the user's, a library's; JAX's preemption
notifier, which ``jax.distributed.initialize`` installs below Python, too) is
never replaced: such a handler calls ``logger.flush()`` to write what was logged.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import threading
import time
import warnings
import weakref
from typing import Any, Protocol

# Imported first, so that its exit handler (which reports a host callback's exception that nothing
# raised again, then ends the process) is registered before `close_at_exit`, whatever imports lox
# first: exit handlers run last registered first, and the Logger's flush must run before it.
import lox_core.failures  # noqa: F401  # isort: skip

# Seconds lox takes on SIGTERM to write what it holds and close its runs, before the process
# ends: below the usual grace period (30 s) before SIGKILL, with time to spare for the rest.
SIGTERM_WAIT = 20.0


class _Closable(Protocol):
    name: str

    def close(self, timeout: float | None = None) -> None: ...

    def write_received(self, timeout: float | None = None) -> None: ...


_live: weakref.WeakSet[_Closable] = weakref.WeakSet()
_exiting = False
_terminated = False
_handler_pid: int | None = None  # the process that installed `on_sigterm`: a forked child inherits it


def exiting() -> bool:
    """Whether the process is ending (the exit flush, or `on_sigterm`'s, runs)."""
    return _exiting


def terminated() -> bool:
    """Whether the process is ending by SIGTERM (`on_sigterm` runs): its runs
    were interrupted, not finished."""
    return _terminated


def register(logger: _Closable) -> None:
    """A live logger, closed at the end of the process unless closed before.
    The first registered in the main thread installs `on_sigterm` (`handle_sigterm`)."""
    _live.add(logger)
    handle_sigterm()


def discard(logger: _Closable) -> None:
    _live.discard(logger)


def live() -> list[_Closable]:
    """The loggers not closed yet."""
    return list(_live)


def flush_before_exit_handlers() -> None:
    """Make lox's exit flush run before every exit handler registered so far
    (Python runs them last registered first). A tracker backend calls it after
    its client registered one of its own, that would otherwise end the
    tracker's runs before lox has sent them the last logs."""
    atexit.unregister(close_at_exit)
    atexit.register(close_at_exit)


def close_at_exit() -> None:
    global _exiting
    _exiting = True
    _close_live(None, "at exit")


def _close_live(timeout: float | None, when: str) -> None:
    """Close every live logger (each within what is left of `timeout` seconds,
    its own timeout where None); warn of those that fail, and close the others."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for logger in list(_live):
        try:
            logger.close(None if deadline is None else max(deadline - time.monotonic(), 0.1))
        except Exception as error:  # noqa: BLE001 - report, and close the others
            warnings.warn(f"lox: logger {logger.name!r} could not flush {when}: {error}", RuntimeWarning, stacklevel=1)


# --- SIGTERM ---------------------------------------------------------------------------------
def handle_sigterm() -> bool:
    """Install `on_sigterm` as SIGTERM's handler if nobody handles SIGTERM yet
    (its action is the default one, for Python and below it) and this is the
    main thread (the only one that may set handlers); whether it is installed."""
    if os.name != "posix" or threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(signal.SIGTERM)
    if current is on_sigterm:
        return True
    if current is not signal.SIG_DFL or _handled_below_python():
        return False  # someone's: theirs calls logger.flush() (module docstring)
    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except (ValueError, OSError):  # not the main interpreter
        return False
    global _handler_pid
    _handler_pid = os.getpid()
    return True


def _handled_below_python() -> bool:
    """Whether SIGTERM has a handler that Python does not know of: one installed
    by C code, e.g. JAX's preemption notifier (``jax.distributed.initialize``),
    which Python still reports as ``SIG_DFL``."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        action = ctypes.create_string_buffer(512)  # a struct sigaction, the handler first (Linux, macOS)
        if libc.sigaction(signal.SIGTERM, None, action) != 0:
            return False
        return ctypes.c_void_p.from_buffer(action).value not in (None, 0)  # 0: SIG_DFL
    except (OSError, AttributeError):  # no C library to ask: Python's word
        return False


def on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM's handler (`handle_sigterm`): write what every live logger holds
    and close its runs ("killed"), within `SIGTERM_WAIT` seconds, then end the
    process by SIGTERM. A second SIGTERM meanwhile changes nothing (the first
    one's end is bounded); one during the exit flush leaves that flush be."""
    global _exiting, _terminated
    if os.getpid() != _handler_pid:
        # A forked child (a data loader's worker): its copies of the parent's loggers have none of
        # their threads, and their runs are the parent's. It ends as SIGTERM's default action would.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    if _exiting:
        return
    _exiting = _terminated = True
    # In a thread of its own: this one (the main thread) may hold a lock, anywhere, that closing needs;
    # the wait for it is bounded whatever happens.
    deadline = time.monotonic() + SIGTERM_WAIT
    closing = threading.Thread(target=_write_then_close, args=(deadline,), name="lox-sigterm", daemon=True)
    closing.start()
    closing.join(SIGTERM_WAIT + 1.0)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.0)  # the signal ends the process before this ends
    os._exit(128 + signal.SIGTERM)  # as a shell reports it, should SIGTERM be blocked in this thread


def _write_then_close(deadline: float) -> None:
    """What every live logger received is written first, then the runs are
    closed: closing waits for the programs running on the device to end,
    which one long program (a whole training loop) may not do in time."""
    for logger in list(_live):
        try:
            logger.write_received(max(deadline - time.monotonic(), 0.1))
        except Exception as error:  # noqa: BLE001 - report, and write the others
            warnings.warn(f"lox: logger {logger.name!r} could not write what it holds on SIGTERM: {error}",
                          RuntimeWarning, stacklevel=1)
    _close_live(max(deadline - time.monotonic(), 0.1), "on SIGTERM")


atexit.register(close_at_exit)
