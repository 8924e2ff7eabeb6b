"""`lox.wandb`: the earlier lox's Weights & Biases names over lox's ``wandb`` backend.

    run = lox.wandb.init(key, project="demo", mode="offline", name="mlp", config={"lr": 0.1})
    lox.wandb.log(run, logs)   # a logdict, inside jax.jit / jax.vmap too
    lox.wandb.finish(run)

`init` takes ``project``, ``entity``, ``mode`` and ``local`` (the backend's
options), ``name`` and ``config``; ``WandbLogger(**the same)`` is a Logger, and
``logger_of(run)`` the Logger of a run (for its ``spool`` and ``tap``). See
"Coming from the earlier lox" in the docs for what differs.
"""

from lox_backends.aliases import TrackerRun as TrackerRun
from lox_backends.aliases import wandb as _wandb

init = _wandb.init
log = _wandb.log
finish = _wandb.finish
logger_of = _wandb.logger_of
WandbLogger = _wandb.logger

__all__ = ["init", "log", "finish", "logger_of", "WandbLogger", "TrackerRun"]
