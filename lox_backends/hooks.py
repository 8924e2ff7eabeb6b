"""The plugin contract: the pluggy hook a plugin implements, and the backend it returns.

A plugin is any installed package that declares an entry point in the group
``lox`` pointing at a module (or object) with `hookimpl`-marked functions.
lox's own backends are plugins declared the same way in its ``pyproject.toml``.

    # my_plugin.py
    import lox_backends.hooks as hooks

    class Backend(hooks.Backend):
        def write_batch(self, run, table):
            print(run.name, table.num_rows)

    @hooks.hookimpl
    def lox_backends():
        return [hooks.BackendSpec("mine", Backend, description="prints row counts")]

See ``plugins.md`` for the whole tutorial.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from typing import TYPE_CHECKING, Any, Callable

import pluggy

if TYPE_CHECKING:  # pyarrow is imported only where tables are built
    import pyarrow as pa

    from lox_core.logdict import logdict

PROJECT = "lox"  # the pluggy project name and the entry-point group
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """One run, as a backend sees it.

    `run_id` is unique and safe as a folder name; `name` is for people; the
    runs one Logger opens (e.g. the seeds of a vmapped `init`) share `group`
    and are numbered by `index`. `metadata` holds the user's run metadata and config
    (JSON-compatible values).
    """

    run_id: str
    name: str
    group: str
    index: int = 0
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


class Backend:
    """Where a Logger's data goes. Subclass it and override what you need.

    One instance serves one Logger and all of its runs. lox calls it from one
    background thread, never concurrently, in this order per run: `open_run`,
    any number of `write_batch` / `write_event`, `flush` (also in between),
    `close_run`; `close` once at the end. Tables handed to `write_batch` hold
    one run, with rows ordered by step (see ``plugins.md`` for their schema).

    `target` is the part of the config string after ``name:`` (a folder, a
    URI), or None; `options` the ``?key=value`` pairs, as strings.
    """

    def __init__(self, target: str | None = None, options: dict[str, str] | None = None):
        self.target = target
        self.options = dict(options or {})

    def check_options(self, backend: str, known: dict[str, str], example: str) -> None:
        """Refuse options this backend does not have: `known` maps each option to
        what it does; `example` is a config string that uses them."""
        unknown = sorted(set(self.options) - set(known))
        if unknown:
            listed = "; ".join(f"{name} ({what})" for name, what in known.items()) or "none"
            raise ValueError(
                f"the {backend} backend has no option {unknown[0]!r}; its options are: {listed}. E.g. {example!r}."
            )

    def open_run(self, run: RunInfo) -> None:
        """A run starts: create it in the backend, record its metadata."""

    def write_batch(self, run: RunInfo, table: "pa.Table") -> None:
        """A spooled batch of `run`'s logs, as an Arrow table."""

    def write_event(self, run: RunInfo, event: "logdict") -> None:
        """One tapped event of `run` (a one-event logdict of NumPy arrays)."""

    def write_events(self, run: RunInfo, events: "logdict") -> None:
        """Consecutive tapped events of `run`, in order, as one logdict (every
        key's series holds its events). lox delivers tapped events this way, a
        few times per second; by default each goes to `write_event`. Override
        it to handle a block at once (faster when many seeds stream)."""
        from lox_core.logdict import event_count

        for i in range(max(map(event_count, events.values()), default=0)):
            self.write_event(run, events.slice[i : i + 1])

    def flush(self) -> None:
        """Make everything written so far durable or sent."""

    def close_run(self, run: RunInfo) -> None:
        """The run has finished."""

    def close(self) -> None:
        """The Logger is done with this backend."""

    def wait(self, timeout: float | None) -> None:
        """Block (at most `timeout` seconds) until what this backend received has
        reached its destination. Called from the user's thread by
        `logger.flush`, `finish` and `close`, after `flush` / `close_run` /
        `close`; only backends that send in a thread of their own (trackers)
        need it."""


@dataclasses.dataclass(frozen=True)
class BackendSpec:
    """A backend a plugin offers, found by `name` in config strings.

    `backend` is the Backend subclass, or a ``"module:attribute"`` string that
    is imported only when the backend is used (so that a plugin whose heavy
    dependencies are missing can still be listed). `requires` names the modules
    the backend needs; `install` is the command that installs them (for lox's
    own backends, one of its extras), shown when one
    is missing.
    """

    name: str
    backend: type[Backend] | str
    description: str = ""
    requires: tuple[str, ...] = ()
    install: str | None = None

    def install_hint(self) -> str:
        return self.install or f"pip install {' '.join(self.missing() or self.requires)}"

    def missing(self) -> list[str]:
        """The required modules that are not installed."""
        return [m for m in self.requires if not _installed(m)]

    def load(self) -> Callable[..., Backend]:
        if isinstance(self.backend, str):
            module, _, attribute = self.backend.partition(":")
            return getattr(importlib.import_module(module), attribute)
        return self.backend


class Hooks:
    """The hook specifications (what pluggy checks implementations against)."""

    @hookspec
    def lox_backends(self) -> list[BackendSpec]:
        """Return the backends this plugin provides."""
        raise NotImplementedError



def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a dotted name whose parent package is missing
        return False
