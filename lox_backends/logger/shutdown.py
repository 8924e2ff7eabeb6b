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

Python runs a handler in the main thread, between two bytecodes: not while the
main thread waits for one long device program (a whole training loop in one
``jax.jit`` call), which would keep SIGTERM from ending the process until
SIGKILL. So SIGTERM also wakes a thread of lox's (`signal.set_wakeup_fd`: the
signal's number is written to a socket as it arrives), which does the same at
once; where someone set a wakeup fd already (asyncio's signal handlers), the
handler alone does it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
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
    _watch_wakeups()
    return True


_wakeups: tuple[socket.socket, socket.socket] | None = None  # (read, write) ends of the wakeup fd's socket


def _watch_wakeups() -> None:
    """SIGTERM wakes `_watch` as it arrives, whatever the main thread does
    (module docstring); not where a wakeup fd was set already (it stays)."""
    global _wakeups
    read, write = socket.socketpair()
    write.setblocking(False)  # as set_wakeup_fd requires: a full socket drops a byte, never blocks a signal
    try:
        previous = signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
    except (ValueError, OSError):
        previous = None
    if previous != -1:
        if previous is not None:
            signal.set_wakeup_fd(previous)  # someone's (asyncio's): theirs, and the handler alone for lox
        read.close()
        write.close()
        return
    _wakeups = (read, write)
    threading.Thread(target=_watch, args=(read,), name="lox-sigterm-watch", daemon=True).start()


def _watch(read: socket.socket) -> None:
    """The numbers of the signals Python handles, as they arrive: on SIGTERM, end the process."""
    try:
        while True:
            received = read.recv(256)
            if not received:
                return
            # Not once someone installed a handler of their own after lox's: theirs runs instead.
            if signal.SIGTERM in received and signal.getsignal(signal.SIGTERM) is on_sigterm:
                _terminate()
                return
    except OSError:  # closed (a forked child's copy): nothing to watch
        return


# A forked child (a data loader's worker) has copies of the parent's loggers without their threads,
# and the parent's runs: its SIGTERM takes the default action, from its first instant (a child stuck
# in C before any Python runs, on a lock a thread of its parent held, could not be ended by a Python
# handler), and its signals must not wake the parent's watcher through the socket they would share.
# So while the process forks, SIGTERM has its default action and no wakeup fd is set; the parent
# gets both back at once.
_forking_from_main = False  # `_before_fork` took lox's handler away: `_after_fork_in_parent` puts it back


def _before_fork() -> None:
    global _forking_from_main
    with contextlib.suppress(ValueError, OSError):  # a fork from another thread: `_in_forked_child` then
        if signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _forking_from_main = True
        if _wakeups is not None:
            signal.set_wakeup_fd(-1)


def _after_fork_in_parent() -> None:
    global _forking_from_main
    with contextlib.suppress(ValueError, OSError):
        if _forking_from_main:
            signal.signal(signal.SIGTERM, on_sigterm)
        if _wakeups is not None:
            signal.set_wakeup_fd(_wakeups[1].fileno(), warn_on_full_buffer=False)
    _forking_from_main = False


def _in_forked_child() -> None:
    global _forking_from_main
    _forking_from_main = False
    if signal.getsignal(signal.SIGTERM) is on_sigterm:  # forked from another thread than the main one
        with contextlib.suppress(ValueError, OSError):  # (the forking thread is the child's main one)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _close_wakeups()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_in_forked_child)


@atexit.register  # (registered before `close_at_exit`, so it runs after it)
def _close_wakeups() -> None:
    """No wakeup fd, and its socket closed (its watcher ends): at exit, and in a forked child."""
    global _wakeups
    if _wakeups is not None:
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
        for end in _wakeups:
            end.close()
        _wakeups = None


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
    if os.getpid() != _handler_pid:
        # A forked child (a data loader's worker): its copies of the parent's loggers have none of
        # their threads, and their runs are the parent's. It ends as SIGTERM's default action would.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    if _terminated:  # the watcher (`_watch`) ends the process: training stops here meanwhile
        time.sleep(SIGTERM_WAIT + 2.0)
        return
    _terminate()


_terminating = threading.Lock()


def _terminate() -> None:
    """Write, close and end the process by SIGTERM (`on_sigterm`), once, from the
    main thread's handler or the watcher, whichever comes first."""
    global _exiting, _terminated
    with _terminating:
        if _exiting:
            return  # the other one does it, or the exit flush runs
        _exiting = _terminated = True
    # In a thread of its own: the main thread may hold a lock, anywhere, that closing needs;
    # the wait for it is bounded whatever happens.
    deadline = time.monotonic() + SIGTERM_WAIT
    closing = threading.Thread(target=_write_then_close, args=(deadline,), name="lox-sigterm", daemon=True)
    closing.start()
    closing.join(SIGTERM_WAIT + 1.0)
    _default_sigterm()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.0)  # the signal ends the process before this ends
    os._exit(128 + signal.SIGTERM)  # as a shell reports it, should SIGTERM be blocked in this thread


def _default_sigterm() -> None:
    """SIGTERM's default action back, from any thread (Python's `signal.signal`
    only works in the main thread: the C library's does anywhere)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal.restype = ctypes.c_void_p
        libc.signal(signal.SIGTERM, None)  # SIG_DFL
    except (OSError, AttributeError):  # no C library to ask: `_terminate` exits with SIGTERM's status instead
        pass


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
