"""The plugin contract: the pluggy hook a plugin implements, and the backend it returns.

A plugin is any installed package that declares an entry point in the group
``lox`` pointing at a module (or object) with `hookimpl`-marked functions.
lox's own backends are plugins declared the same way in its ``pyproject.toml``.

    # my_plugin.py
    import lox_backends.plugin.hooks as hooks

    class Backend(hooks.Backend):
        def write(self, run, table):
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
import warnings
from typing import Any, Callable

import pluggy
import pyarrow as pa

from lox_backends.plugin.config import Option, check_options

PROJECT = "lox"  # the pluggy project name and the entry-point group
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """One run, as a backend sees it.

    `run_id` is unique and safe as a folder name; `name` is for people; the
    runs one Logger opens (e.g. the seeds of a vmapped `init`) share `group`
    and are numbered by `index`. `metadata` holds the user's run metadata and config
    (JSON-compatible values). `status` is ``"running"`` until the run ends; the
    run `close_run` receives says how it ended: ``"finished"`` (everything
    logged to it was written), ``"failed"`` (logs were lost, or the program
    raised); a run read back later may also be ``"killed"`` (its process died).
    """

    run_id: str
    name: str
    group: str
    index: int = 0
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    status: str = "running"


class Backend:
    """Where a Logger's data goes. Subclass it and override what you need.

    One instance serves one Logger and all of its runs. lox calls it from a
    background thread of its own (one per backend), never concurrently, in this
    order per run: `open_run`, any number of `write`, `flush` (also in between),
    `close_run`; `close` once at the end. `write` receives Arrow tables of one
    run, rows ordered by step (``plugins.md`` documents their schema).

    `target` is the part of the config string after ``name:`` (a folder, a
    URI), or None; `options` the ``?key=value`` pairs, as strings.
    """

    config: str | None = None  # the config string it was made from (set by lox, secrets masked): names it in messages

    def __init__(self, target: str | None = None, options: dict[str, str] | None = None):
        self.target = target
        self.options = dict(options or {})

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _adapt_old_methods(cls)

    def check_options(self, backend: str, known: dict[str, str], example: str) -> None:
        """Refuse options this backend does not have (with the close name, for a
        typo): `known` maps each option to what it does; `example` is a config
        string that uses them. For typed, range-checked options, see
        `lox_backends.plugin.config.check_options`, which the built-in backends use."""
        check_options(backend, self.options, {name: Option(what) for name, what in known.items()}, example)

    def attach(self, backends: list[Backend]) -> None:
        """Called once, in the user's thread, when a Logger takes this backend,
        with all of that Logger's backends (this one included): to share
        something with another backend, or refuse to work beside it."""

    def open_run(self, run: RunInfo) -> None:
        """A run starts: create it in the backend, record its metadata."""

    def write(self, run: RunInfo, table: pa.Table) -> None:
        """Logs of `run` as an Arrow table: a spooled batch (`logger.spool`,
        `logger.log`), or a block of tapped events (`logger.tap`)."""

    write_batch = write  # its name before lox 0.2: subclasses written then call super().write_batch

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


def _adapt_old_methods(cls: type[Backend]) -> None:
    """Backends written before `write` existed: ``write_batch(run, table)`` had
    the same meaning and keeps working (with a warning); backends that only
    take tapped events as logdicts are refused when a Logger takes them
    (`check_backend`). A method counts where a class defines it below the
    class that defines `write` (a subclass of a built-in backend too)."""
    if not _newer(cls, "write_batch", "write"):
        return
    warnings.warn(
        f"lox backend {cls.__qualname__} implements `write_batch`, which lox now calls `write(run, table)` "
        "(tapped events arrive as tables too); rename the method. It is called as `write` meanwhile.",
        DeprecationWarning,
        stacklevel=3,
    )
    cls.write = lambda self, run, table: self.write_batch(run, table)  # type: ignore[method-assign]


def check_backend(backend: Backend) -> None:
    """Refuse a backend that implements only methods lox no longer calls."""
    if not isinstance(backend, Backend):
        raise TypeError(
            f"a lox Logger takes backends (subclasses of lox_backends.hooks.Backend), got {type(backend).__name__}."
        )
    cls = type(backend)
    old = [name for name in ("write_event", "write_events") if _newer(cls, name, "write")]
    if old:
        raise TypeError(
            f"lox backend {cls.__qualname__} implements `{old[0]}`, which lox no longer calls: implement "
            "`write(self, run, table)`, which receives spooled batches and tapped events alike as Arrow tables "
            "(`lox.logdict.from_arrow(table)` gives a logdict back). See plugins.md."
        )


def _newer(cls: type, method: str, than: str) -> bool:
    """Whether `cls` defines `method` in a class below the one defining `than`
    (or `than` is only the base class's no-op)."""
    def position(name: str) -> int:
        return next((i for i, c in enumerate(cls.__mro__) if name in vars(c) and c is not Backend), len(cls.__mro__))

    return position(method) < position(than)


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
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a dotted name whose parent package is missing
        return False
    if spec is None:
        return False
    # A folder of that name on sys.path (W&B's offline runs make ./wandb) is a namespace
    # package, not the client; dotted names may have namespace parents, top-level ones not.
    return "." in module or spec.origin is not None
