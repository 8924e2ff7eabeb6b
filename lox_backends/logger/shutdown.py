"""Interpreter exit: every live Logger is closed, so that what it holds is written.

Loggers register themselves (weakly); `close_at_exit` runs as an exit handler.
A tracker whose client registers an exit handler of its own calls
`flush_before_exit_handlers` afterwards, so that lox's runs first.
"""

from __future__ import annotations

import atexit
import warnings
import weakref
from typing import Protocol

# Imported first, so that its exit handler (which reports a host callback's exception that nothing
# raised again, then ends the process) is registered before `close_at_exit`, whatever imports lox
# first: exit handlers run last registered first, and the Logger's flush must run before it.
import lox_core.failures  # noqa: F401  # isort: skip


class _Closable(Protocol):
    name: str

    def close(self, timeout: float | None = None) -> None: ...

    def write_received(self, timeout: float | None = None) -> None: ...


_live: weakref.WeakSet[_Closable] = weakref.WeakSet()
_exiting = False


def exiting() -> bool:
    """Whether the interpreter is exiting (the exit flush runs)."""
    return _exiting


def register(logger: _Closable) -> None:
    _live.add(logger)


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
    for logger in list(_live):
        try:
            logger.close()
        except Exception as error:  # noqa: BLE001 - report, and close the others
            warnings.warn(f"lox: logger {logger.name!r} could not flush at exit: {error}", RuntimeWarning, stacklevel=1)


atexit.register(close_at_exit)
