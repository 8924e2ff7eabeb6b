"""The plugin contract: the pluggy hook a plugin implements, and the backend it returns.

A plugin is any installed package that declares an entry point in the group
``lox`` pointing at a module (or object) with `hookimpl`-marked functions.
lox's own backends are plugins declared the same way in its ``pyproject.toml``.

    # my_plugin.py
    from lox_backends import hooks

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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import pluggy
import pyarrow as pa

from lox_backends.plugin.config import ConfigError, Option, check_options, parse

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
    raised), ``"killed"`` (SIGTERM ended the process, a preemption: everything
    logged to it was written, and the run may be resumed); a run read back
    later is also ``"killed"`` where its process died.

    A run opened again by id (``logger.init(run_id=..., resume="allow")``, after
    a preemption) has `resumed` set: a backend continues the run it has under
    that id rather than start another. With `from_step`, the events of steps
    ``>= from_step`` that reached the backend before are superseded by those
    that come now: a backend drops them where it can (TensorBoard's
    ``purge_step``), and says in its docs what it does otherwise.
    """

    run_id: str
    name: str
    group: str
    index: int = 0
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    status: str = "running"
    resumed: bool = False
    from_step: int | None = None


class Backend:
    """Where a Logger's data goes. Subclass it and override what you need.

    One instance serves one Logger and all of its runs. lox calls it from a
    background thread of its own (one per backend), never concurrently, in this
    order per run: `open_run`, any number of `write`, `flush` (also in between),
    `close_run`; `close` once at the end. `write` receives Arrow tables of one
    run, rows ordered by step (``plugins.md`` documents their schema).

    `target` is the part of the config string after ``name:`` (a folder, a
    URI), or None; `options` the ``?key=value`` pairs, as strings.

    A backend declares its options once, as `OPTIONS` (name → `Option`), with
    `EXAMPLE`, a config string that uses them (its name names the backend in
    messages; without one, a tracker's `tracker`, else the class name, does). `__init__` checks the options
    given against them, once, and keeps the typed values, with the defaults of
    those not given, in `settings`: an unknown option (with the close name, for
    a typo) or a value of the wrong type or range is refused there, where the
    Logger is made. A subclass adds to its parent's options with
    ``OPTIONS = {..., **Parent.OPTIONS}``.

    >>> from lox_backends.plugin.config import Option
    >>> class Every(Backend):
    ...     OPTIONS = {"every": Option("write every n-th batch", "int", 1, minimum=1)}
    ...     EXAMPLE = "every:runs?every=10"
    >>> Every("runs", {"every": "10"}).settings
    {'every': 10}
    >>> Every("runs", {"evry": "10"})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: the every backend has no option 'evry'; did you mean 'every'? Its options are: every (...

    Names that earlier lox releases used (``write_batch``, ``write_event``,
    ``options_help``, ``check_options``...) are refused where a subclass
    defines them, with a `TypeError` that says what to implement instead.
    """

    OPTIONS: ClassVar[Mapping[str, Option]] = {}
    EXAMPLE: ClassVar[str] = ""
    config: str | None = None  # the config string it was made from (set by lox, secrets masked): names it in messages

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        _refuse_old_names(cls)
        _check_declaration(cls)

    def __init__(self, target: str | None = None, options: dict[str, str] | None = None):
        self.target = target
        self.options = dict(options or {})
        # Named in messages by its EXAMPLE's backend; else a tracker by its config name (`tracker`), else its class.
        name = parse(self.EXAMPLE)[0].name if self.EXAMPLE else getattr(self, "tracker", None) or type(self).__name__
        try:
            self.settings: dict[str, Any] = check_options(name, self.options, self.OPTIONS, self.EXAMPLE)
        except ValueError as error:
            if self.OPTIONS or self.EXAMPLE or type(self).__module__.startswith("lox_backends."):
                raise
            # A plugin that declares neither, and reads self.options itself as lox 0.2 let it: tell its author.
            raise ValueError(f"{error} (To the author of {type(self).__qualname__}: a backend declares the options "
                             "it takes as OPTIONS = {name: Option(...)} and reads them from self.settings; "
                             "see plugins.md.)") from None

    if not TYPE_CHECKING:  # (hidden from type checkers, which would then accept any attribute)

        def __getattr__(self, name: str) -> Any:
            # Called only for attributes that do not exist: a backend written for an earlier
            # lox (`self.check_options(...)` in its __init__) learns what replaced the name.
            if name in _RENAMED:
                raise AttributeError(
                    f"lox backend {_named(type(self))} uses `{name}`, which lox no longer has: "
                    f"{_instead(type(self), name)}. See plugins.md.",
                    name=name, obj=self,
                )
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}", name=name, obj=self)

    def attach(self, backends: list[Backend]) -> None:
        """Called once, in the user's thread, when a Logger takes this backend,
        with all of that Logger's backends (this one included): to share
        something with another backend, or refuse to work beside it."""

    def open_run(self, run: RunInfo) -> None:
        """A run starts: create it in the backend, record its metadata."""

    def write(self, run: RunInfo, table: pa.Table) -> None:
        """Logs of `run` as an Arrow table: a spooled batch (`logger.spool`,
        `logger.log`), or a block of tapped events (`logger.tap`)."""

    def flush(self) -> None:
        """Make everything written so far durable or sent."""

    def summarize(self, run: RunInfo, values: dict[str, Any]) -> None:
        """Summary values of `run` given by the user (``logger.summary``): names
        to Python scalars (float, int, bool, str). A name given again replaces
        its value: the run's summary is the last value of each name. Comes in
        order with the run's tables, after `open_run`."""

    def runs_folder(self) -> str | None:
        """The folder of runs (lox's run format, `lox_backends.runstore.layout`)
        where this backend keeps its runs, local or a bucket URI; None if it keeps
        none. ``logger.init(run_id=...)`` looks there for a run of that id (to
        refuse it, or resume it). Called from the user's thread: return a
        value fixed when the backend was made."""
        return None

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


# What earlier lox releases called things: old name → (the name that replaced it, what to do).
_WRITE_TABLES = ("implement `write(self, run, table)`, which receives spooled batches and tapped events alike as "
                 "Arrow tables (`lox.logdict.from_arrow(table)` gives a logdict back)")
_DECLARE_OPTIONS = ("declare `OPTIONS = {{name: Option(help, ...){inherited}}}` (lox_backends.plugin.config.Option) "
                    "and `EXAMPLE`, a config string that uses them: `Backend.__init__` checks the options given "
                    "and keeps their values in `self.settings`")
_RENAMED = {
    "write_batch": ("write", "implement `write(self, run, table)` (the same arguments)"),
    "write_event": ("write", _WRITE_TABLES),
    "write_events": ("write", _WRITE_TABLES),
    "options_help": ("OPTIONS", _DECLARE_OPTIONS),
    "option_specs": ("OPTIONS", _DECLARE_OPTIONS),
    "check_options": ("OPTIONS", _DECLARE_OPTIONS),
    "example": ("EXAMPLE", "name it `EXAMPLE` (a config string that uses the backend's options)"),
}


def _named(cls: type) -> str:
    """The class as messages name it: its qualified name, without the function it was defined in."""
    return cls.__qualname__.rpartition("<locals>.")[2]


def _instead(cls: type, old: str) -> str:
    """What a backend written for an earlier lox does instead of using `old`."""
    parent = next((c for c in cls.__mro__[1:] if c is not Backend and c.__dict__.get("OPTIONS")), None)
    return _RENAMED[old][1].format(inherited=f", **{parent.__name__}.OPTIONS" if parent is not None else "")


def _refuse_old_names(cls: type) -> None:
    """A backend written for an earlier lox fails where it is defined, saying
    what to implement, rather than never being called. A name counts where a
    class defines it below the class that defines its replacement (a class
    that defines both, to work with older lox releases too, is fine)."""
    mro = [c for c in cls.__mro__ if c is not Backend and c is not object]

    def position(name: str) -> int:
        return next((i for i, c in enumerate(mro) if name in vars(c)), len(mro))

    for old, (new, _) in _RENAMED.items():
        if position(old) < position(new):
            raise TypeError(
                f"lox backend {_named(cls)} defines `{old}`, which lox no longer uses: "
                f"{_instead(cls, old)}. See plugins.md."
            )


def _check_declaration(cls: type[Backend]) -> None:
    """`OPTIONS` maps names to `Option`s; `EXAMPLE` is a config string of one
    backend that uses only those options (its name names the backend in messages)."""
    name, options, example = _named(cls), cls.OPTIONS, cls.EXAMPLE
    mapping = isinstance(options, Mapping)
    wrong = {k: v for k, v in options.items() if not isinstance(v, Option)} if mapping else options
    if not mapping or wrong:
        raise TypeError(
            f"lox backend {name}'s OPTIONS maps each option's name to a lox_backends.plugin.config.Option, "
            f"got {wrong!r}; e.g. OPTIONS = {{'every': Option('write every n-th batch', 'int', 1, minimum=1)}}."
        )
    if not isinstance(example, str):
        raise TypeError(f"lox backend {name}'s EXAMPLE is a config string, got {example!r}.")
    if not example:
        return
    try:
        configs = parse(example)
    except ConfigError as error:
        raise TypeError(f"lox backend {name}'s EXAMPLE is not a config string: {error}") from None
    if len(configs) != 1:
        raise TypeError(f"lox backend {name}'s EXAMPLE {example!r} names {len(configs)} backends, not one.")
    unknown = [option for option in configs[0].options if option not in options]
    if unknown:
        raise TypeError(
            f"lox backend {name}'s EXAMPLE {example!r} uses {', '.join(map(repr, unknown))}, "
            "which its OPTIONS does not declare."
        )


def check_backend(backend: Backend) -> None:
    """Refuse what a Logger cannot take as a backend."""
    if not isinstance(backend, Backend):
        raise TypeError(
            f"a lox Logger takes backends (subclasses of lox_backends.hooks.Backend), got {type(backend).__name__}."
        )


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
