"""`lox.wandb`: the earlier lox's Weights & Biases names over lox's ``wandb`` backend.

    run = lox.wandb.init(key, project="demo", mode="offline", name="mlp", config={"lr": 0.1})
    lox.wandb.log(run, logs)   # a logdict, inside jax.jit / jax.vmap too
    lox.wandb.finish(run)

See "Coming from the earlier lox" in the docs for what differs from it.
"""

from typing import Any, Mapping

import jax

from lox.loggers import Logger
from lox_backends.tools.aliases import TrackerRun as TrackerRun
from lox_backends.tools.aliases import wandb as _tracker
from lox_core.logdict import logdict


def init(key: jax.Array | None = None, *, name: str | None = None, config: Mapping[str, Any] | None = None,
         run_id: str | None = None, resume: str = "never", from_step: int | None = None,
         **settings: Any) -> TrackerRun:
    """Open a Weights & Biases run (one per seed under `jax.vmap`), eagerly or
    inside `jax.jit`. `settings` are the backend's options: ``project``, ``entity``, ``mode``
    and ``local``; `name` is the run's name and `config` its config. `run_id`, `resume`
    and `from_step` name the run and resume it after a preemption (see `lox.loggers.Logger.init`)."""
    return _tracker.init(key, name=name, config=config, run_id=run_id, resume=resume, from_step=from_step,
                         **settings)


def log(run: TrackerRun, logs: logdict) -> None:
    """Send a logdict (e.g. spooled logs) to `run`; inside `jax.jit` and `jax.vmap` too."""
    _tracker.log(run, logs)


def finish(run: TrackerRun, timeout: float | None = None) -> None:
    """Finish `run` (every seed) once what was logged to it is sent; outside jit."""
    _tracker.finish(run, timeout)


def logger_of(run: TrackerRun) -> Logger:
    """The Logger behind `run`: its `spool`, `tap` and `runs()` take the run too."""
    return _tracker.logger_of(run)


def WandbLogger(*, name: str = "lox", config: Mapping[str, Any] | None = None, **settings: Any) -> Logger:  # noqa: N802
    """A Logger of Weights & Biases whose runs are named ``name-0``, ``name-1``... and
    get `config` at every `init`; `settings` as `init` takes them."""
    return _tracker.logger(name=name, config=config, **settings)


__all__ = ["init", "log", "finish", "logger_of", "WandbLogger", "TrackerRun"]
