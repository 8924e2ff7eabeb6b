"""`lox.neptune`: the earlier lox's Neptune names over lox's ``neptune`` backend.

    run = lox.neptune.init(key, project="me/demo", mode="offline", name="mlp", config={"lr": 0.1})
    lox.neptune.log(run, logs)   # a logdict, inside jax.jit / jax.vmap too
    lox.neptune.finish(run)

`init` takes ``project`` (the backend's target), ``mode`` and ``local``,
``name`` and ``config``; ``NeptuneLogger(**the same)`` is a Logger, and
``logger_of(run)`` the Logger of a run (for its ``spool`` and ``tap``). See
"Coming from the earlier lox" in the docs for what differs.
"""

from lox_backends.aliases import TrackerRun as TrackerRun
from lox_backends.aliases import neptune as _neptune

init = _neptune.init
log = _neptune.log
finish = _neptune.finish
logger_of = _neptune.logger_of
NeptuneLogger = _neptune.logger

__all__ = ["init", "log", "finish", "logger_of", "NeptuneLogger", "TrackerRun"]
