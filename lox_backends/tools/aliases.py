"""The earlier lox's tracker API, `lox.wandb` and `lox.neptune`: thin names over Loggers.

    run = lox.wandb.init(key, project="demo", name="mlp", config={"lr": 0.1})
    lox.wandb.log(run, logs)          # inside jax.jit and jax.vmap too
    lox.wandb.finish(run)             # outside jit

`init` takes the tracker's settings as the earlier lox passed them on to the
client (`project`, `entity`/`mode`...; the run's `name` and `config`). Each
`init` makes a Logger of the tracker's backend for its runs (the seeds of a
vmapped `init` are one group), closed once `finish` finished them all; the
`TrackerRun` that `init` returns names it (statically), so that `log` and
`finish` reach it. Everything else is the Logger's: a local log first, sending
in the background, one tracker run per seed under `jax.vmap`.
``WandbLogger(**settings)`` is a Logger whose every `init` gets the settings'
`name` and `config`.

A setting the backend does not take (a W&B ``group``, ``tags``...) is refused
by name, rather than dropped: use `lox.loggers.from_config` for the rest of the
backend's options (see docs/coming-from-lox.md).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Mapping

import jax
import numpy as np

from lox_backends.logger.logger import Logger, LoggerState
from lox_backends.plugin import hooks
from lox_backends.plugin.config import BackendConfig
from lox_backends.plugin.registry import registry
from lox_core.logdict import logdict


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrackerRun(LoggerState):
    """A `LoggerState` that also names (statically) its tracker and the Logger
    of the settings it was opened with."""

    tracker: str = dataclasses.field(default="", metadata={"static": True})
    logger: int = dataclasses.field(default=0, metadata={"static": True})


class TrackerLogger(Logger):
    """A Logger whose every `init` gets the run `name` and `config` it was made with."""

    def __init__(self, backends, name: str, config: Mapping[str, Any]):
        super().__init__(backends, name=name)
        self._config = dict(config)

    def init(self, key: jax.Array | None = None, **metadata: Any) -> LoggerState:
        return super().init(key, **{**self._config, **metadata})


class Tracker:
    """`init`, `log`, `finish` and the Logger factory of one tracker backend.

    `settings` are the backend's options that `init` takes by name; `target`,
    if given, is the setting that is the backend's target (Neptune's project).
    """

    def __init__(self, backend: str, settings: tuple[str, ...], target: str | None = None):
        self.backend, self.settings, self.target = backend, settings, target
        self._loggers: list[Logger] = []  # one per `init` call, in order
        self._finished: dict[int, set[int]] = {}  # index in _loggers → its runs that `finish` finished
        self._lock = threading.Lock()

    def _make(self, where: str, settings: dict[str, Any]) -> hooks.Backend:
        """The tracker's backend for `settings` (`where` names the call, for errors)."""
        unknown = [k for k in settings if k not in self.settings and k != self.target]
        if unknown:
            takes = ", ".join(f"`{k}`" for k in (self.target, *self.settings, "name", "config") if k)
            raise TypeError(
                f"`{where}` got {unknown[0]!r}, which lox's {self.backend} backend does not take: it takes {takes}. "
                f"Put run data in `config`, or use `lox.loggers.from_config('{self.backend}?...')` "
                "(see the backend's page for its options)."
            )
        options = {k: str(v) for k, v in settings.items() if k != self.target and v is not None}
        target = settings.get(self.target) if self.target else None
        return registry.create(BackendConfig(self.backend, target, options))

    def logger(self, *, name: str = "lox", config: Mapping[str, Any] | None = None, **settings: Any) -> Logger:
        """A Logger of the tracker whose runs are named after `name` (``name-0``,
        ``name-1``...) and get `config` as metadata at every `init`."""
        return TrackerLogger([self._make(f"{self.backend.capitalize()}Logger", settings)], name, config or {})

    def init(self, key: jax.Array | None = None, *, name: str | None = None,
             config: Mapping[str, Any] | None = None, run_id: str | None = None, resume: str = "never",
             from_step: int | None = None, **settings: Any) -> TrackerRun:
        """Open a tracker run (one per seed under `jax.vmap`) with `config` as
        its config and `name` as its name; eagerly or inside `jax.jit`.
        `run_id`, `resume` and `from_step` name and resume it as `Logger.init` does."""
        if "id" in settings and run_id is None:
            raise TypeError(f"`lox.{self.backend}.init` got id={settings['id']!r}: lox names a run with run_id= "
                            "(and resumes it with resume='allow'), e.g. run_id='job', resume='allow'.")
        logger = Logger([self._make(f"lox.{self.backend}.init", settings)], name=name or self.backend)
        with self._lock:
            self._loggers.append(logger)
            number = len(self._loggers) - 1
        metadata = {**(config or {}), **({"name": name} if name is not None else {})}
        state = logger.init(key, run_id=run_id, resume=resume, from_step=from_step, **metadata)
        return TrackerRun(state.run, self.backend, number, opened_by=state.opened_by)

    def logger_of(self, run: TrackerRun, where: str | None = None) -> Logger:
        """The Logger `run` belongs to: its `spool`, `tap`, `runs()`... take the run too."""
        if not isinstance(run, TrackerRun) or run.tracker != self.backend:
            where = where or f"lox.{self.backend}.logger_of"
            got = f"a run of lox.{run.tracker}" if isinstance(run, TrackerRun) else type(run).__name__
            raise TypeError(f"`{where}` takes the run `lox.{self.backend}.init` returned, got {got}.")
        return self._loggers[run.logger]

    def log(self, run: TrackerRun, logs: logdict) -> None:
        """Send a logdict (e.g. spooled logs) to the run; inside `jax.jit` and
        `jax.vmap` too (the runs of every seed in one host call)."""
        self.logger_of(run, f"lox.{self.backend}.log").log(run, logs)

    def finish(self, run: TrackerRun, timeout: float | None = None) -> None:
        """Finish the run (every seed) once what was logged to it is sent;
        outside jit. Its Logger closes once all the runs of its `init` are finished."""
        logger = self.logger_of(run, f"lox.{self.backend}.finish")
        logger.finish(run, timeout)
        with self._lock:
            finished = self._finished.setdefault(run.logger, set())
            finished.update(int(n) for n in np.asarray(run.run).reshape(-1))
            done = len(finished) == len(logger.runs())
        if done:
            logger.close(timeout)


wandb = Tracker("wandb", ("project", "entity", "mode", "local"))
neptune = Tracker("neptune", ("mode", "local"), target="project")
