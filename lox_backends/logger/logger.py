"""Loggers: runs, and the backends their logs go to.

A `Logger` owns backends (from a config string such as
``"console,parquet:runs"``). `init` opens a run and returns its state, a
pytree: ``jax.vmap(logger.init)(keys)`` opens one run per seed, and a vmapped
`spool` / `tap` / `log` sends each seed's logs to its own run, in one host call
for all seeds.

Logging never waits for a device-to-host transfer nor for a backend. A router
thread (`lox_backends.logger.worker`) gathers what arrives (`lox_backends.logger.pending`),
checks it (`lox_backends.logger.checks`) and turns it into one Arrow table per run;
each backend then gets it in a thread of its own, so a slow or stuck backend
never holds back another. A backend's error warns at once and is raised by the
next call to the logger (or by `finish`); whatever is pending is written at
interpreter exit (`lox_backends.logger.shutdown`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import numbers
import os
import sys
import threading
import time
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa

from lox_backends.logger import metadata as run_metadata
from lox_backends.logger import shutdown, worker
from lox_backends.logger.active_run import ActiveRun
from lox_backends.logger.checks import LogChecks
from lox_backends.logger.pending import Part, Waiting
from lox_backends.logger.processes import Job, host_local
from lox_backends.logger.resume import Resume
from lox_backends.logger.runs import Runs, new_group, safe_name
from lox_backends.logger.system import Sampler
from lox_backends.logger.worker import BackendError, BackendWorker, Worker
from lox_backends.plugin import hooks
from lox_backends.plugin.config import (
    BackendConfig,
    check_logger_options,
    check_media_limit,
    check_system,
    parse,
    seconds,
)
from lox_backends.plugin.registry import registry
from lox_backends.runstore import filesystems
from lox_backends.runstore.layout import DEFAULT_DIR
from lox_backends.runstore.table import check_summary_name, flatten
from lox_core import active, failures, media, runtime, schema, spool, tap
from lox_core.arrow import to_arrow_runs
from lox_core.host import chain_end, chain_start, host_call
from lox_core.logdict import logdict
from lox_core.primitive import loggable
from lox_core.transform import traced

__all__ = ["BackendError", "Logger", "LoggerState", "from_config", "backend_logger", "ConsoleLogger",
           "SaveLogger", "MultiLogger", "DEFAULT_CONFIG"]

DEFAULT_CONFIG = f"parquet:{DEFAULT_DIR}"
DEFAULT_TIMEOUT = 60.0  # seconds `finish` and interpreter exit wait for the backends
DEFAULT_FLUSH_EVERY = 5.0  # seconds between automatic flushes of the backends
BATCHES_EVERY = 0.25  # seconds batches and tapped events wait to be sent together
MAX_ROUTER_BACKLOG = 256  # calls the router may fall behind before the user's thread waits
EXIT_WAIT_FOR_FAULT = 2.0  # seconds interpreter exit waits for a backend that fails (a full disk): one more try
SAY_WAITING_AFTER = 5.0  # seconds of waiting at exit after which lox says what it waits for
DEFAULT_MAX_PENDING = 256 * 2**20  # bytes of logs a backend may hold unwritten (it fails) before lox stops
DEFAULT_MEDIA_LIMIT = 64 * 2**20  # bytes of one event of one key of images, video, audio, histograms or text
ON_ERROR = ("raise", "warn")  # what a Logger does once a backend holds `max_pending` bytes it cannot write


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LoggerState:
    """The runs a logger writes to: an int32 run number per element (batch axes
    under vmap), and which logger opened them (its group, static). Pass it to
    that logger's `spool` / `tap` / `log` / `finish`."""

    run: jax.Array
    opened_by: str | None = dataclasses.field(default=None, kw_only=True, metadata={"static": True})  # its group


_init_calls = itertools.count()
_logger_names: dict[str, str] = {}  # group -> the name of the logger that opened it, for messages


class Logger:
    """Runs and the backends their logs go to (see the module docstring).

    >>> import jax, jax.numpy as jnp, lox
    >>> logger = lox.loggers.from_config("memory")
    >>> def train(w):
    ...     def step(w, i):
    ...         lox.log({"w": w}, step=i)
    ...         return w * 0.5, None
    ...     return jax.lax.scan(step, w, jnp.arange(3))[0]
    >>> state = logger.init(jax.random.key(0), lr=0.1)
    >>> w = logger.spool(train, state)(1.0)
    >>> logger.finish(state)
    >>> logger.backends[0].logs()["w"].tolist(), logger.backends[0].logs().step["w"].tolist()
    ([1.0, 0.5, 0.25], [0, 1, 2])
    """

    def __init__(
        self,
        backends: Sequence[hooks.Backend],
        name: str = "lox",
        timeout: float = DEFAULT_TIMEOUT,
        flush_every: float = DEFAULT_FLUSH_EVERY,
        processes: str = "first",
        max_pending: int = DEFAULT_MAX_PENDING,
        on_error: str = "raise",
        media_limit: int | Mapping[str, int] = DEFAULT_MEDIA_LIMIT,
        system: float | None = None,
    ):
        timeout, flush_every, max_pending = check_logger_options(timeout, flush_every, max_pending, on_error, ON_ERROR)
        media_limit = check_media_limit(media_limit, DEFAULT_MEDIA_LIMIT)
        system = check_system(system)
        if not backends:
            raise ValueError("a lox Logger needs at least one backend, e.g. `lox.loggers.from_config('parquet:runs')`.")
        for backend in backends:
            hooks.check_backend(backend)
        # One conversion now, in the caller's thread: the router must not be the
        # first to run it, because what it imports on first use registers exit
        # handlers, which fails while the interpreter exits (when the last logs go out).
        warm_up = logdict({"x": np.zeros(2)}, {"step": {"x": np.array([1, 0], np.int32)}})
        schema.order_by_step(warm_up.to_arrow(run=""))
        self.backends: list[hooks.Backend] = list(backends)
        for backend in self.backends:
            backend.attach(self.backends)
        self.name: str = name
        self.timeout: float = timeout
        self.max_pending: int = max_pending
        self.on_error: str = on_error
        # In a multi-process job: run ids agreed by every process, and who writes (lox_backends.logger.processes).
        self._job = Job(processes)
        self._runs = Runs(name, group=self._job.group(lambda: new_group(name), timeout))
        self.group: str = self._runs.group  # shared by the runs this logger opens
        _logger_names[self.group] = name
        self.media_limit: dict[str, int] = media_limit  # key -> bytes ("*": every other key)
        self._checks = LogChecks(media_limit)
        self._waiting = Waiting()
        self._dirty = False  # written to since the last flush
        self._flush_every = flush_every
        self._next_flush = time.monotonic() + flush_every
        safe = safe_name(name)
        names = _names(self.backends)
        self._outlets = [BackendWorker(b, n, safe, timeout) for b, n in zip(self.backends, names, strict=True)]
        self._over_budget_warned: set[str] = set()  # outlets whose dropped writes were warned about (on_error="warn")
        self._lost_runs: set[str] = set()  # runs whose logs could not be converted (router thread)
        self._gave_up: dict[str, int] = {}  # outlet -> its progress when a wait for it timed out
        for backend in self.backends:  # how often a local log's writer says it is alive (lox_backends.parquet)
            log = getattr(backend, "log", backend)
            if hasattr(log, "heartbeat_every"):
                setattr(log, "heartbeat_every", flush_every)  # noqa: B010 - any backend's local log has one
        self._announced: set[int] = set()  # runs whose open_run went to the backends (router thread)
        self._named_inits: dict[str, int] = {}  # group -> `init(run_id=...)` calls so far (keys agreed by processes)
        self._router = Worker(f"lox-{safe}", every=BATCHES_EVERY, periodic=self._tick)
        self.system: float | None = system  # seconds between samples of system metrics (None: none)
        # Sampled by a process that writes, from its first run on (lox_backends.logger.system).
        self._system: Sampler | None = None
        if system is not None and self._job.writes:
            self._system = Sampler(system, f"lox-system-{safe}", self._router, self._write_system,
                                   self._runs.any_open, MAX_ROUTER_BACKLOG)
        self._destinations: dict[tuple, ActiveRun] = {}  # `active` blocks' runs -> their destination (one each)
        self._closed = False
        shutdown.register(self)

    @property
    def writes(self) -> bool:
        """Whether this process writes the runs of this logger (in a job of several
        processes, only process 0 does unless ``processes="each"``)."""
        return self._job.writes

    def __repr__(self) -> str:
        return f"Logger({self.name!r}, backends=[{', '.join(type(b).__name__ for b in self.backends)}])"

    # --- runs ----------------------------------------------------------------------
    def init(self, key: jax.Array | None = None, *, run_id: str | None = None, resume: str = "never",
             from_step: int | None = None, **metadata: Any) -> LoggerState:
        """Open a run and return its state.

        `key` is a PRNG key (recorded with the run, so a seed's run can be told
        apart); `metadata` is the run's metadata and config: Python values
        (JSON-compatible) apply to every run, arrays may differ per seed under
        vmap. ``name=`` names the run (seeds get ``name-0``, ``name-1``...).
        Works eagerly, under jit and under vmap: one run per element.

        `run_id` names the run exactly (vmapped seeds get ``<run_id>-0``,
        ``<run_id>-1``..., the same at every restart), and `resume` says what
        happens when a run of that id exists where the backends keep runs:
        ``"never"`` (the default) refuses it, ``"allow"`` goes on with it
        (its folder, its metadata, its trackers' runs), ``"must"`` refuses an
        id with no run. A job restarted from a checkpoint of step N passes
        ``from_step=N``: what the run logged from step N on before it stopped
        is superseded by what it logs now (each step is read once). These three
        are not metadata.

        >>> import lox, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> logger = lox.loggers.from_config(f"parquet:{folder}")
        >>> def train(loss, steps):
        ...     for step in steps:
        ...         lox.log({"loss": loss}, step=step)
        >>> state = logger.init(run_id="job", lr=0.1)
        >>> logger.spool(train, state)(1.0, [6, 7, 8])
        >>> logger.finish(state)  # (as if killed at step 8, after a checkpoint of step 7)
        >>> state = logger.init(run_id="job", resume="allow", from_step=7)  # restarted from it
        >>> logger.spool(train, state)(0.5, [7, 8])
        >>> logger.finish(state)
        >>> lox.load(f"{folder}/job")["loss"].tolist()
        [1.0, 0.5, 0.5]
        """
        self._check_open()
        self._job.check_unchanged()
        request = Resume.of(run_id, resume, from_step, self._job.index if self._job.processes == "each" else None)
        if request is not None and runtime.staging_trace() is not None and self._job.count > 1:
            raise ValueError("in a multi-process job, call `logger.init(run_id=...)` outside jax.jit: every process "
                             "must agree on which runs are resumed.")
        if self._job.count > 1 and self._job.processes == "each":
            if runtime.staging_trace() is not None:
                raise ValueError(
                    "with `processes='each'`, call `logger.init` outside jax.jit in a multi-process job: inside "
                    "it, only the process of the program's first device would open the runs."
                )
            metadata = {**metadata, "process_index": self._job.index}
        # Checked at the call; JAX arrays (tracers too) are converted per run, in the callback.
        template, dynamic = run_metadata.split(metadata)
        seed = run_metadata.key_data(key)
        seed_ndim = seed.ndim
        # A different operand per `init` call, so that XLA never merges two
        # calls into one (the callback is pure to JAX, which lets vmap batch it).
        nonce = jnp.int32(next(_init_calls))
        # Called eagerly (neither traced nor vmapped): the runs a run id names are decided here, so
        # that an id refused raises here, on every process of a job alike; raised by the host call,
        # it would be a callback's failure, which a job reports again at exit (`lox_core.failures`).
        eager = runtime.staging_trace() is None and not traced((seed, dynamic))
        decided = self._named_runs(request, ()) if request is not None and eager else None

        def open_runs(seed, dynamic, nonce):
            seed = np.asarray(seed)
            batch_shape = seed.shape[: seed.ndim - seed_ndim]
            numbers = np.empty(batch_shape, np.int32)
            named = decided if decided is not None else \
                self._named_runs(request, batch_shape) if request is not None else None
            for position, index in enumerate(np.ndindex(batch_shape)):
                meta = template.fill(dynamic, index)
                if key is not None:
                    meta["key"] = seed[index].tolist()
                run = self._runs.open(meta, position if batch_shape else None,
                                      named[position] if named is not None else None)
                if self._job.writes:  # inside `jax.pure_callback`: must not block or raise
                    self._router.submit(lambda run=run: self._announce(run))
                numbers[index] = run.index
            return numbers

        def open_runs_or_none(seed, dynamic, nonce):
            # An exception is raised by lox afterwards (lox_core.failures), not into XLA; no runs (-1) then.
            note = f"raised by `logger.init` of lox logger {self.name!r} while opening runs"
            numbers = failures.guarded(lambda: open_runs(seed, dynamic, nonce), note)
            return np.full(np.shape(seed)[: np.ndim(seed) - seed_ndim], -1, np.int32) if numbers is None else numbers

        def opened(seed, dynamic, nonce):
            run = jax.pure_callback(
                open_runs_or_none, jax.ShapeDtypeStruct((), jnp.int32), seed, dynamic, nonce,
                vmap_method="broadcast_all",
            )
            return _replicated(run)

        # In a program of its own (inlined into the caller's jit), so that eager
        # calls, vmapped or not, get their result replicated as well.
        run = jax.jit(opened)(seed, dynamic, nonce)
        if not traced(run):  # a host value, placed as arrays made here are (also under `jax.disable_jit`)
            run = jnp.asarray(np.asarray(run))
            failures.raise_pending()
        return LoggerState(run, opened_by=self.group)

    def _named_runs(self, request: Resume, batch_shape: tuple[int, ...]) -> list[hooks.RunInfo]:
        """The runs of an `init` given a run id, resumed where they exist (process
        0 decides, in a job of several): their id, name, group and resume."""
        ids = request.ids(batch_shape)
        opened, open_now = self._runs.ids()
        folders = list(dict.fromkeys(f for b in self.backends if (f := b.runs_folder()) is not None))
        counted = self._named_inits[request.group] = self._named_inits.get(request.group, 0) + 1
        resumed = set(self._job.agree(
            f"{self.group}/init-{request.group}-{counted}",
            lambda: sorted(request.decide(ids, folders, opened, open_now)), self.timeout,
        ))
        return [hooks.RunInfo(run_id, run_id, request.group, resumed=run_id in resumed,
                              from_step=request.from_step if run_id in resumed else None) for run_id in ids]

    def runs(self) -> list[hooks.RunInfo]:
        """Every run this logger opened, in order, with its `status`: "running"
        until `finish` (or the exit) closed it and every backend wrote what was
        logged to it; then "finished", or "failed" where a backend lost some of
        its logs or the program ended by an uncaught exception, or "killed"
        where SIGTERM ended the process (`lox_backends.logger.shutdown`)."""
        return [self._current(run) for run in self._runs.all()]

    def _current(self, run: hooks.RunInfo) -> hooks.RunInfo:
        if run.status == "running":
            return run
        lost = run.run_id in self._lost_runs or any(run.run_id in o.lost_runs for o in self._outlets)
        if run.status == "failed" or lost:
            status = "failed"
        elif any(outlet.holds(run.run_id) for outlet in self._outlets):
            status = "running"  # its end waits for a backend that cannot write yet
        else:
            status = run.status  # "finished", or "killed" by SIGTERM
        return dataclasses.replace(run, status=status)

    # --- logging -------------------------------------------------------------------
    def spool(self, fun: Callable[..., Any], state: LoggerState, **options: Any) -> Callable[..., Any]:
        """`lox.spool(fun, **options)` whose logs go to the state's runs, once per
        call (after the call, without waiting for the device). Returns ``fun``'s
        output only."""
        spooled = spool.spool(fun, **options)

        def run(*args, **kwargs):
            self._check_state(state, "spool")
            self._check_open()  # a backend's earlier failure: raised before the step, not after it
            out, logs = spooled(*args, **kwargs)
            self._log(state, logs)
            return out

        return run

    def tap(self, fun: Callable[..., Any], state: LoggerState, **options: Any) -> Callable[..., Any]:
        """`lox.tap(fun)` whose events stream to the state's runs as they happen
        (under vmap, one host call per event for all seeds). With ``buffer=K``
        the events of loops cross to the host K at a time (see `lox.tap`).
        What `log` refuses (a key's new shape or dtype, a series name two keys
        give) is refused when ``fun`` is traced, at the call."""
        tapped = tap.tap_with_context(
            fun, self._receive_event, wait=False, block_callback=self._receive_block,
            per_device_error=self._job.per_device_error, check=self._checks.check, **options
        )

        def run(*args, **kwargs):
            self._check_state(state, "tap")
            self._check_open()
            return tapped(state.run, *args, **kwargs)

        return run

    def active(self, state: LoggerState) -> contextlib.AbstractContextManager[LoggerState]:
        """Within ``with logger.active(state):``, every `lox.log` that no
        `spool`, `tap` or `nolog` captures goes to the state's runs: eagerly,
        inside `jax.jit` (functions jitted without lox, library code), as
        `logger.tap` sends its events (host calls chained, not ordered). A
        vmapped state (``jax.vmap(logger.init)(keys)``) sends element i of a
        vmapped function's events to run i, in one host call for all runs; an
        event that is not vmapped goes to every run. A `lox.tap(f)` without a
        callback sends there too, ``buffer=K`` included.

        Blocks nest (the innermost wins) and belong to the thread (context)
        that opens them; outside any block `lox.set_default` applies. Opening
        and leaving the block wait for the events of what was dispatched
        before (each event goes where its program was called). With the
        default ``"console"``, functions compiled before the block send their
        events to it without being traced again; with ``"off"``, a function
        compiled before the block has no host call: it is traced and compiled
        again, once, when it runs inside the block (see docs/anywhere.md).

        >>> import jax, jax.numpy as jnp, lox
        >>> logger = lox.loggers.from_config("memory")
        >>> @jax.jit
        ... def evaluate(x):
        ...     lox.log({"acc": x.mean()}, step=7)  # library code: no logger in sight
        ...     return x
        >>> state = logger.init(name="eval")
        >>> with logger.active(state):
        ...     _ = evaluate(jnp.arange(4.0))
        >>> logger.finish(state)
        >>> logger.backends[0].logs()["acc"].tolist(), logger.backends[0].logs().step["acc"].tolist()
        ([1.5], [7])
        """
        self._check_open()
        self._check_state(state, "active")
        if traced(state):
            raise TypeError(
                "`logger.active` takes the state itself, not a traced one: open the block outside `jax.jit`, "
                "`vmap` and lox transforms (`with logger.active(state): train(...)`), with the state `logger.init` "
                "returned."
            )
        runs = np.array(state.run)
        still_open = set(self._runs.open_numbers())
        # (-1: an `init` that failed under jit or vmap, whose error `_check_open` raised first.)
        finished = [self._runs[n].name for n in np.unique(runs).tolist() if n >= 0 and n not in still_open]
        if finished:
            raise ValueError(
                f"`logger.active` got a state whose runs {', '.join(map(repr, finished))} were finished by "
                "`logger.finish`: nothing logged in the block could be written. Open the block before `finish`, "
                "or open new runs with `logger.init`."
            )
        signature = (runs.shape, runs.tobytes())
        destination = self._destinations.get(signature)
        if destination is None:
            # One per set of runs: a block opened again reuses what was compiled for it.
            destination = self._destinations[signature] = ActiveRun(
                runs, self._receive_event, self._receive_block, self._checks.check, self._job.per_device_error)

        @contextlib.contextmanager
        def block():
            with active.activate(destination):
                yield state
            self._check_open()  # what went wrong writing the block's logs, raised where it ends

        return block()

    def log(self, state: LoggerState, logs: logdict | Mapping[str, Any], **steps: Any) -> None:
        """Write a logdict (e.g. spooled logs) to the state's runs; works inside
        and outside jit, and under vmap (one host call for all seeds).

        A plain dict is one event, at the `steps` given: ``logger.log(state,
        {"sample": text, "acc": 0.9}, step=i)``. This is how text is logged
        (strings, or rectangular lists of them: a table), from Python: eagerly,
        or in a tap's callback. With a vmapped state (several runs), each
        value's leading axes are the runs' (one per seed), but for a Python
        number or str, which every run gets."""
        self._check_open()
        if isinstance(logs, Mapping) and not isinstance(logs, logdict):
            logs = _event(logs, steps, np.shape(state.run) if isinstance(state, LoggerState) else ())
        elif steps:
            raise TypeError(
                f"`logger.log` got steps ({', '.join(steps)}) with a lox.logdict, which carries its own steps; "
                "pass steps with a plain dict of one event: `logger.log(state, {\"loss\": x}, step=i)`."
            )
        self._log(state, logs)

    def _log(self, state: LoggerState, logs: logdict) -> None:
        if not isinstance(logs, logdict):
            raise TypeError(f"`logger.log` takes a lox.logdict (e.g. spooled logs) or a plain dict of one event "
                            f"(`logger.log(state, {{\"loss\": x}}, step=i)`), got {type(logs).__name__}.")
        self._check_state(state, "log")
        self._checks.check(logs, tuple(np.shape(state.run)))  # shapes are static: traced ones too
        if traced((state, logs)):
            if self._job.per_device_error is not None and runtime.manual_axes():
                raise ValueError(self._job.per_device_error)
            # Chained, not ordered: an ordered effect is refused on more than one device.
            note = f"raised by lox logger {self.name!r} while receiving keys {', '.join(map(repr, logs))}"
            chain_end(host_call(self._receive_logged, state.run, logs, guarded=False, token=chain_start(), note=note))
            return
        if self._job.count > 1:
            logs = host_local(logs)  # on every process at once: values sharded across processes gathered
            if not self._job.writes:
                return  # process 0 writes them
        # Device arrays go to the router as they are (no transfer in this thread);
        # NumPy arrays are copied, since the caller may reuse them.
        logs = jax.tree_util.tree_map(lambda x: x if isinstance(x, jax.Array) else np.array(x), logs)
        runs, batch_ndim = state.run, np.ndim(state.run)
        self._wait_for_room()
        self._router.submit(lambda: self._add(self._waiting.add_batch(batch_ndim, runs, logs)))

    def summary(self, state: LoggerState, values: Mapping[str, Any]) -> None:
        """Set summary values of the state's runs, e.g. ``{"best_acc": acc}``: the
        last value given under a name is the run's (shown by ``lox runs``, in the
        table of runs `lox.runs`, sent to trackers as their summary). Values are
        scalars per run: Python numbers, bools and strings, or numeric arrays of
        shape ``()``; works eagerly, under jit and under vmap (one value per
        seed). A name that clashes with a column of the table of runs (``name``,
        a metadata key, ``loss.min``...) is refused here.

        Every run also keeps, without asking, the last, least and greatest value
        and the count of each key of scalars it logged (``loss.last``...)."""
        self._check_open()
        self._check_state(state, "summary")
        if not isinstance(values, Mapping):
            raise TypeError(f"`logger.summary` takes a dict of names to values, got {type(values).__name__}.")
        metadata_columns = {name for run in self._runs.all() for name, _ in flatten(run.metadata)}
        plain: dict[str, Any] = {}
        arrays: dict[str, Any] = {}
        run_shape = np.shape(state.run)
        for name, value in values.items():
            check_summary_name(name, metadata_columns)
            if isinstance(value, (str, bool, int, float)):
                plain[name] = value
                continue
            shape, dtype = np.shape(value), getattr(value, "dtype", None)
            # jnp's issubdtype: bfloat16 and float8 are numbers to JAX, not to NumPy
            if dtype is None or not loggable(dtype) or \
                    jnp.issubdtype(dtype, jnp.complexfloating) or shape not in ((), run_shape):
                raise TypeError(
                    f"`logger.summary` got {name!r} = {type(value).__name__} of shape {shape} and dtype {dtype}: a "
                    "summary value is one scalar per run (a Python number, bool or str, or a real number array "
                    "of shape ()); log arrays with `lox.log` instead."
                )
            arrays[name] = value
        if traced((state, arrays)):
            if self._job.per_device_error is not None and runtime.manual_axes():
                raise ValueError(self._job.per_device_error)
            note = f"raised by lox logger {self.name!r} while receiving summary values {', '.join(map(repr, values))}"
            callback = functools.partial(self._receive_summary, plain)
            chain_end(host_call(callback, state.run, arrays, guarded=False, token=chain_start(), note=note))
            return
        if self._job.count > 1:
            arrays = host_local(arrays)
            if not self._job.writes:
                return
        runs, arrays = np.asarray(state.run), {name: np.asarray(value) for name, value in arrays.items()}
        self._wait_for_room()
        self._router.submit(lambda: self._summarize(runs, plain, arrays))

    def _receive_summary(self, plain: dict[str, Any], batch_ndim: int, runs, arrays) -> None:
        if not self._job.writes:
            return  # as in `_receive_batch`
        runs, arrays = np.array(runs), {name: np.array(value) for name, value in arrays.items()}
        self._router.submit(lambda: self._summarize(runs, plain, arrays))

    def _summarize(self, runs: np.ndarray, plain: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """In the router: after what was logged before, each run's values to every backend."""
        self._send_waiting()
        for index in np.ndindex(runs.shape):
            run = self._runs[int(runs[index])]
            self._runs.check_open(run)
            self._announce(run)
            values = {**plain, **{name: np.broadcast_to(value, runs.shape)[index].item()
                                  for name, value in arrays.items()}}
            self._to_backends(lambda b, run=run, values=values: b.summarize(run, values), label="summarize")

    def _wait_for_room(self) -> None:
        """Bounded memory: the user's thread waits while the router is far behind."""
        deadline = time.monotonic() + self.timeout
        while self._router.backlog() >= MAX_ROUTER_BACKLOG and self._router.alive():
            if time.monotonic() >= deadline:
                raise self._unfinished(self.timeout, [], router_stuck=True)
            time.sleep(0.001)

    # --- from JAX's callback threads (never block, never raise) ----------------------
    def _receive_batch(self, batch_ndim: int, runs, logs) -> None:
        self._check_budget(in_program=True)
        if not self._job.writes:
            return  # a program each process runs alone: process 0 ran it too (see lox_backends.logger.processes)
        # Copies: the host call's arrays may be buffers that XLA reuses.
        runs, logs = np.array(runs), jax.tree_util.tree_map(np.array, logs)
        self._router.submit(lambda: self._add(self._waiting.add_batch(batch_ndim, runs, logs)))

    def _receive_logged(self, batch_ndim: int, runs, logs) -> None:
        # `logger.log` / `spool` under jit: the runs' axes lead the logs', vmapped or not
        # (a vmapped state passed to a function that is not vmapped, with its logs).
        self._receive_batch(max(batch_ndim, np.ndim(runs)), runs, logs)

    def _receive_block(self, batch_ndim: int, logs: logdict, runs) -> None:
        # A buffered tap's events: written like a spooled batch.
        self._receive_batch(batch_ndim, runs, logs)

    def _receive_event(self, batch_ndim: int, event: logdict, runs, took) -> None:
        self._check_budget(in_program=True)
        if not self._job.writes:
            return  # as in `_receive_batch`
        # One task for all seeds: the host call returns at once, the router splits.
        took = np.array(took)  # the event and runs are copies already (lox_core.delivery); this may be a view
        self._router.submit(lambda: self._add(self._waiting.add_events(batch_ndim, runs, event, took)))

    # --- in the router thread --------------------------------------------------------
    def _add(self, full: bool) -> None:
        if full:
            self._send_waiting()

    def _tick(self) -> bool | float:
        """Send what waits; flush now and then. When to tick again: at the next
        flush while something was written since the last one or runs are open
        (logs that arrive bring the tick sooner, see `Worker`); else never (the
        router sleeps)."""
        try:
            self._send_waiting()
        finally:  # also when some logs were refused: the rest is on its way, and made durable in time
            # A crash loses at most `flush_every` seconds of logs; while runs are open,
            # the flush also tells readers the process is alive (a heartbeat).
            busy = self._dirty or self._runs.any_open()
            if busy and time.monotonic() >= self._next_flush:
                self._flush_backends()
        if not (self._dirty or self._runs.any_open()):
            return False
        return max(self._next_flush - time.monotonic(), 0.0)

    def _announce(self, run: hooks.RunInfo) -> None:
        """`open_run` to every backend, once per run, before any of its tables."""
        if run.index not in self._announced:
            self._announced.add(run.index)
            self._to_backends(lambda b: b.open_run(run), label="open_run")
            if self._system is not None:
                self._system.start()

    def _send_waiting(self) -> None:
        """What waits, as one table per run and part, to every backend. Logs that
        cannot be converted fail their runs (all runs open then, where lox cannot
        tell whose they were); late logs of a finished run are refused, and fail
        no run."""
        tables: list[tuple[hooks.RunInfo, pa.Table]] = []
        nbytes = 0
        failed: Exception | None = None
        for group in self._waiting.take():
            # A part that cannot be converted does not keep the others from the backends.
            try:
                parts, error = group.parts()
            except Exception as error:  # noqa: BLE001 - raised below, after the rest is sent
                failed = failed or error
                self._lose(None)
                continue
            if error is not None:  # an item of the group that could not be split
                failed = failed or error
                self._lose(None)
            for part in parts:
                try:
                    converted, size, error = self._tables(part)
                except Exception as error:  # noqa: BLE001 - as above
                    failed = failed or error
                    self._lose(part.runs)
                    continue
                tables.extend(converted)
                nbytes += size
                failed = failed or error
        if self._system is not None:
            self._system.saw(tables)  # each run's latest step, where its system metrics go
        self._hand_on(tables, nbytes)
        if failed is not None:
            raise failed

    def _hand_on(self, tables: list[tuple[hooks.RunInfo, pa.Table]], nbytes: int) -> None:
        """Tables made in the router to every backend, each run announced first."""
        for run in {run.index: run for run, _ in tables}.values():
            self._announce(run)  # a run whose logs overtook its `init` callback
        if tables:
            self._dirty = True
            self._write(tables, nbytes)

    def _write_system(self, values: dict[str, float]) -> None:
        """A sample of system metrics (`lox_backends.logger.system`) to every open
        run, after what was logged before it, at the latest step that reached the logger."""
        assert self._system is not None
        self._send_waiting()
        tables: list[tuple[hooks.RunInfo, pa.Table]] = []
        nbytes = 0
        for run_numbers, logs in self._system.rows(values, [self._runs[n] for n in self._runs.open_numbers()]):
            converted, size, _ = self._tables(Part(run_numbers, 1, logs))  # a run closed since is left out
            tables += converted
            nbytes += size
        self._hand_on(tables, nbytes)

    def _lose(self, numbers: np.ndarray | None) -> None:
        """Runs (all those open, without `numbers`) some of whose logs were not written."""
        lost = self._runs.open_numbers() if numbers is None else np.asarray(numbers).reshape(-1).tolist()
        self._lost_runs.update(self._runs[int(n)].run_id for n in lost)

    def _write(self, tables: list[tuple[hooks.RunInfo, pa.Table]], nbytes: int) -> None:
        """The tables (`nbytes` bytes) to every backend, counted until flushed; a
        backend that holds more than `max_pending` bytes it could not write gets
        no more with ``on_error="warn"`` (the loss is warned about and reported)."""
        runs = frozenset(run.run_id for run, _ in tables)
        for outlet in self._outlets:
            if self.on_error == "warn" and outlet.unwritten() > self.max_pending and outlet.failing():
                outlet.drop(runs)
                if outlet.name not in self._over_budget_warned:
                    self._over_budget_warned.add(outlet.name)
                    warnings.warn(f"{self._budget_message(outlet)} With on_error='warn', lox drops the logs "
                                  f"{outlet.name} cannot take until it works again; their runs end as 'failed'.",
                                  RuntimeWarning, stacklevel=2)
                continue
            outlet.write(tables, nbytes)
            if outlet.unwritten() > self.max_pending // 2:
                outlet.flush()  # large tables: written now, not only at the next periodic flush

    def _tables(self, part: Part) -> tuple[list[tuple[hooks.RunInfo, pa.Table]], int, ValueError | None]:
        """A part's table for each of its runs, ordered by step; their bytes; and
        why a run's logs were refused (they arrived after `finish`), if one's were."""
        if part.batch_ndim == 0:
            run = self._runs[int(part.runs)]
            try:
                self._runs.check_open(run)
            except ValueError as error:
                return [], 0, error
            self._checks.warn_steps([run], part.logs)
            self._checks.warn_dropped(run, part.logs)
            table = schema.order_by_step(part.logs.to_arrow(run=run.run_id))
            return [(run, table)], table.nbytes, None
        # A vmapped batch: every run's rows converted at once, then handed out as slices
        # (its bytes counted once: each slice's `nbytes` counts the dictionary of every run id).
        runs = [self._runs[int(n)] for n in part.runs.reshape(-1)]
        self._checks.warn_steps(runs, part.logs, part.batch_ndim)
        table, offsets = to_arrow_runs(part.logs, [run.run_id for run in runs], part.batch_ndim)
        tables, failed = [], None
        for i, run in enumerate(runs):
            try:
                self._runs.check_open(run)
            except ValueError as error:
                failed = failed or error
                continue
            tables.append((run, table.slice(offsets[i], offsets[i + 1] - offsets[i])))
        return tables, table.nbytes if tables else 0, failed

    def _flush_backends(self) -> None:
        self._dirty = False
        self._next_flush = time.monotonic() + self._flush_every
        for outlet in self._outlets:
            outlet.flush()

    def _to_backends(self, method: Callable[[hooks.Backend], None], label: str = "call") -> None:
        for outlet in self._outlets:
            outlet.call(method, label)

    # --- ending ----------------------------------------------------------------------
    def flush(self, state: LoggerState | float | None = None, timeout: float | None = None) -> None:
        """Wait until everything logged so far has reached the backends (and they
        flushed it); raise what a backend raised. Every run is flushed: a
        `state` (as `finish` takes) may be passed, which changes nothing; a
        number first is the timeout (``logger.flush(30)``)."""
        if isinstance(state, LoggerState):
            if traced(state):
                raise TypeError("`logger.flush` must be called outside jax.jit / vmap.")
            self._check_state(state, "flush")
        elif state is not None:
            if timeout is not None or isinstance(state, bool) or not isinstance(state, (int, float)):
                raise TypeError(
                    f"`logger.flush` takes a state from `logger.init` and/or a timeout in seconds, got {state!r}."
                )
            timeout = float(state)
        pending = _effects_barrier()  # tapped events still on their way from the device
        try:
            self._finish_tasks([], timeout)
        finally:
            if pending is not None:
                raise pending

    def finish(self, state: LoggerState, timeout: float | None = None) -> None:
        """Close the state's runs (all seeds) after everything logged to them has
        been written; then raise what a backend raised, if anything did (the
        runs are closed all the same). Call it outside jit."""
        if self._closed:
            raise RuntimeError(f"the lox logger {self.name!r} was closed; create a new one.")
        if traced(state):
            raise TypeError("`logger.finish` must be called outside jax.jit / vmap, with the state `init` returned.")
        self._check_state(state, "finish")
        pending = _effects_barrier()
        try:
            # A process that does not write may not know runs opened under jit (on process 0).
            # -1: no run (an `init` under vmap or jit that failed: its error is `pending`, raised below).
            numbers = [int(n) for n in np.asarray(host_local(state.run)).reshape(-1) if n >= 0]
            self._close_runs(self._runs.finishing(numbers, strict=self._job.writes), timeout)
            if self._system is not None:
                self._system.poke()  # its thread ends if no run is open
        finally:
            if pending is not None:
                raise pending

    def _close_runs(self, closing: list[hooks.RunInfo], timeout: float | None,
                    then: Callable[[], None] | None = None) -> None:
        """`closing`'s `close_run` to every backend after what was logged to them,
        each backend told how the run ended for it (`RunInfo.status`: "failed"
        where logs were lost; "killed" when SIGTERM ends the process)."""
        # At exit, after an uncaught exception, or a host callback's that nothing raised again (the process ends with 1)
        exited_by_error = shutdown.exiting() and (getattr(sys, "last_value", None) is not None
                                                  or failures.pending is not None)
        ended = "killed" if shutdown.terminated() else "finished"  # SIGTERM (a preemption): interrupted, to resume

        def status(run: hooks.RunInfo, outlet: BackendWorker) -> str:
            failed = exited_by_error or run.run_id in self._lost_runs or run.run_id in outlet.lost_runs
            return "failed" if failed else ended

        def close_run(run: hooks.RunInfo) -> None:
            self._runs.mark_finished(run)  # in order with the logs: what arrives later is refused
            if self._job.writes:
                for outlet in self._outlets:
                    outlet.call(lambda b, o=outlet: b.close_run(dataclasses.replace(run, status=status(run, o))),
                                "close_run")

        for run in closing:  # ended: `runs` tells how (`_current`)
            self._runs.set_status(run.index, "failed" if exited_by_error else ended)
        self._finish_tasks([lambda run=run: close_run(run) for run in closing], timeout, then)

    def write_received(self, timeout: float | None = None) -> None:
        """Write and flush what reached this logger so far, without waiting for
        the device (`flush` does): for when a program may never finish, e.g.
        another process of the job died. Raises what a backend raised."""
        self._finish_tasks([], timeout)

    def close(self, timeout: float | None = None) -> None:
        """Close the runs still open (status "finished", or "failed" where logs
        were lost or the program ended by an uncaught exception), flush and
        close every backend and stop the threads; the logger cannot be used
        afterwards. Raises what a backend raised."""
        if self._closed:
            return
        self._closed = True
        shutdown.discard(self)
        if self._system is not None:
            self._system.stop()
        runtime.wait_for_effects()  # without raising a callback's exception: closing must not stop halfway
        stuck = False
        closing = self._runs.finishing(self._runs.open_numbers()) if self._job.writes else []
        try:
            self._close_runs(closing, timeout, then=lambda: self._to_backends(lambda b: b.close(), label="close"))
        except TimeoutError:
            stuck = True
            raise
        except BackendError:
            stuck = any(outlet.fault is not None for outlet in self._outlets)
            raise
        finally:  # threads stop even after a backend error; a stuck one is left to its daemon thread
            self._router.stop(wait=not stuck, timeout=1.0)
            for outlet in self._outlets:  # one that fails makes its last tries (`runs` then says what they lost)
                outlet.stop(wait=not stuck or outlet.fault is not None, timeout=1.0)

    def _finish_tasks(self, tasks: list[Callable[[], None]], timeout: float | None,
                      then: Callable[[], None] | None = None) -> None:
        """In the router: what waits is sent, then `tasks`, a flush of every
        backend and `then`; wait for the router and every backend to get there
        (all within `timeout` seconds), and for trackers to send. Raise what
        failed; a BackendError naming what a failing backend still holds; or a
        TimeoutError naming what is stuck. At interpreter exit, a backend that
        an earlier wait gave up on and that made no progress since is not
        waited for again."""
        timeout = self.timeout if timeout is None else seconds("timeout", timeout, "how long this call waits", 60)
        deadline = time.monotonic() + timeout
        left = lambda: max(deadline - time.monotonic(), 0.0)  # noqa: E731

        def in_router() -> None:
            failed: Exception | None = None
            try:
                try:
                    self._send_waiting()
                except Exception as error:  # noqa: BLE001 - raised below, once the runs are closed
                    failed = error
                for task in tasks:
                    task()
            finally:  # what did arrive is made durable (and closed) even if a part failed
                self._flush_backends()
                if then is not None:
                    then()
                barriers.extend((outlet, outlet.barrier()) for outlet in self._outlets)
            if failed is not None:
                raise failed

        barriers: list[tuple[BackendWorker, threading.Event]] = []
        self._router.submit(in_router)
        for outlet in self._outlets:
            outlet.retry_now()  # the fault may be fixed (space freed): not the backoff's wait
        router_stuck = not self._router.barrier().wait(left())
        stuck, given_up = [], []
        exiting = shutdown.exiting()
        for outlet, reached in barriers:
            if exiting and self._gave_up.get(outlet.name) == outlet.progress():
                wait = 0.0  # an earlier wait gave up on it, and it made no progress since
                given_up.append(outlet)
            elif exiting and outlet.fault is not None:
                wait = min(left(), EXIT_WAIT_FOR_FAULT)  # the one try `retry_now` asked for
            else:
                wait = left()
            if exiting and wait > SAY_WAITING_AFTER and not reached.wait(SAY_WAITING_AFTER):
                print(f"lox: at exit, waiting up to {wait:.0f} s for backend {outlet.name} of logger {self.name!r} "
                      "to write what it holds.", file=sys.stderr, flush=True)
            if not reached.wait(wait):
                stuck.append(outlet)
                self._gave_up[outlet.name] = outlet.progress()
        # Trackers send what reached them (in threads of their own), also after a failure.
        for outlet, reached in barriers:
            if reached.is_set():
                outlet.backend.wait(left())
        if stuck or router_stuck:
            self._raise_errors()  # a backend that failed outright says so first
            raise self._unfinished(timeout, stuck, router_stuck, given_up)
        self._raise_errors()

    def _unfinished(self, timeout: float | None, stuck: list[BackendWorker], router_stuck: bool,
                    given_up: list[BackendWorker] | None = None) -> Exception:
        """What `_finish_tasks` raises for backends it waited for in vain (`given_up`:
        those an earlier call had given up on, not waited for again)."""
        within = "at exit" if shutdown.exiting() else f"within {round(timeout or 0, 1):g} s"
        if given_up and all(outlet in given_up for outlet in stuck) and not router_stuck:
            within = "(lox gave up on it before, and it has made no progress since)"
        failing = [outlet for outlet in stuck if outlet.fault is not None]
        if failing:
            lines = [f"{outlet.name} could not write {outlet.unwritten_summary()} {within}: {outlet.fault}"
                     for outlet in failing]
            if shutdown.exiting():  # no later call can write them
                return BackendError(
                    "lox: " + "; ".join(lines) + ". The process exits: they are lost. Next time, fix the fault "
                    "(free space on the disk, bring the store back) before the script ends, or give "
                    "`logger.finish` a longer timeout."
                )
            return BackendError(
                "lox: " + "; ".join(lines) + ". lox keeps them in memory and writes them as soon as the fault "
                "clears (free space on the disk, bring the store back), then `logger.flush()` returns; they are "
                "lost if this process ends first."
            )
        names = ([self._router.name] if router_stuck else []) + [outlet.name for outlet in stuck]
        return TimeoutError(
            f"lox: {', '.join(names)} of logger {self.name!r} did not finish {within}; "
            "a backend is slow or stuck (the other backends have their data). Pass a longer timeout "
            "(e.g. `logger.finish(state, timeout=600)`) or check the backends."
        )

    def _check_budget(self, in_program: bool = False) -> None:
        """With ``on_error="raise"``: a BackendError while a backend holds more
        than `max_pending` bytes it could not write, so that training stops
        instead of running on without logs; from a host call (`in_program`) it
        fails the program (`lox_core.failures.stop_program`), and is not kept:
        once what was held is written, the same program logs again."""
        if self.on_error != "raise":
            return
        for outlet in self._outlets:
            if outlet.unwritten() > self.max_pending and outlet.failing():
                error = BackendError(
                    f"{self._budget_message(outlet)} Training stops here, so that no more logs are lost. lox writes "
                    "what it holds as soon as the backend works again (free space on its disk, bring its store "
                    "back; `logger.flush()` waits for it). To train on without these logs instead, pass "
                    "`on_error='warn'` (or a larger `max_pending`) to the logger."
                )
                if in_program:
                    failures.stop_program(error)
                raise error

    def _budget_message(self, outlet: BackendWorker) -> str:
        cause = (f": {outlet.fault}" if outlet.fault is not None
                 else f" (a call to it has run more than {worker.HANGS_AFTER:g} s: it hangs, or cannot keep up)")
        return (f"lox: backend {outlet.name} holds {outlet.unwritten_summary()} that it could not write{cause}; "
                f"that is more than the logger's max_pending ({self.max_pending} bytes).")

    def _check_state(self, state: Any, method: str) -> None:
        """Refuse what is not a state, and a state another logger opened (its run numbers are another's runs)."""
        if not isinstance(state, LoggerState):
            raise TypeError(f"`logger.{method}` takes the state returned by `logger.init`, got {type(state).__name__}.")
        if state.opened_by is not None and state.opened_by != self.group:
            other = _logger_names.get(state.opened_by, "?")
            raise ValueError(
                f"`logger.{method}` of lox logger {self.name!r} (group {self.group!r}) got a state that lox logger "
                f"{other!r} opened (group {state.opened_by!r}): its run numbers are that logger's runs. Pass each "
                "state to the logger whose `init` returned it."
            )

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the lox logger {self.name!r} was closed; create a new one.")
        failures.raise_pending()  # a host callback's exception (lox_core.failures)
        self._raise_errors()
        self._check_budget()

    def _raise_errors(self) -> None:
        errors: list[BaseException] = list(self._router.take_errors())
        for outlet in self._outlets:
            errors += outlet.errors()
        if errors:
            more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
            first = str(errors[0]) if isinstance(errors[0], BackendError) else repr(errors[0])
            raise BackendError(f"lox: writing logs in the background failed: {first}{more}") from errors[0]

    def _stop(self) -> None:
        """Give up the backends without closing them (`MultiLogger` takes them)."""
        self._closed = True
        shutdown.discard(self)
        if self._system is not None:
            self._system.stop()
        self._router.stop()
        for outlet in self._outlets:
            outlet.stop()


def _event(data: Mapping[str, Any], steps: dict[str, Any], runs_shape: tuple[int, ...]) -> logdict:
    """A plain dict of one event (`logger.log`) as a logdict: an event axis
    after the runs' axes, Python numbers and strings given to every run."""
    values: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise TypeError(f"`logger.log` keys must be strings, got {key!r} ({type(key).__name__}).")
        text = media.as_text(key, value)
        if text is not None:
            value = text if isinstance(value, (np.ndarray, list, tuple)) else np.broadcast_to(text, runs_shape)
        else:
            _check_value(key, value, runs_shape)
            value = jax.tree_util.tree_map(  # a Python number, alone or in a pytree: every run's
                lambda v: np.broadcast_to(np.asarray(v), runs_shape) if isinstance(v, (bool, int, float)) else v, value)
        if value is None or not jax.tree_util.tree_leaves(value):
            raise TypeError(f"`logger.log` got no value for key {key!r}; log an array, a number or a str.")
        values[key] = jax.tree_util.tree_map(functools.partial(_with_event_axis, len(runs_shape)), value)
    per_name: dict[str, dict[str, Any]] = {}
    for name, step in steps.items():
        if isinstance(step, bool) or not isinstance(step, (int, np.integer, jax.Array)) or np.ndim(step) != 0:
            raise TypeError(f"`logger.log` step {name!r} must be an integer scalar, got {step!r}.")
        at = _with_event_axis(len(runs_shape), jnp.broadcast_to(step, runs_shape) if isinstance(step, jax.Array)
                              else np.broadcast_to(np.asarray(step, np.int64), runs_shape))
        per_name[name] = dict.fromkeys(values, at)
    return logdict(values, per_name)


def _check_value(key: str, value, runs_shape: tuple[int, ...]) -> None:
    """Refuse at the call what lox's tables cannot store (bytes, objects, a str
    or a kind inside a pytree), which would fail the run in the background."""
    if not (runs_shape and isinstance(value, media.Media)):  # a vmapped kind's shape starts with the runs'
        media.check(key, value, where="logger.log")
    for leaf in jax.tree_util.tree_leaves(value):
        dtype = getattr(leaf, "dtype", None)
        if dtype is None and not isinstance(leaf, numbers.Number):
            raise TypeError(
                f"`logger.log` got a {type(leaf).__name__} for key {key!r}; log numbers, numeric or boolean arrays "
                "(or pytrees of them), a kind (`lox.image(x)`...) or text (a str, or a rectangular list of them, "
                "as the whole value of a key)."
            )
        if dtype is not None and not loggable(dtype):
            raise TypeError(
                f"`logger.log` got an array of dtype {dtype} for key {key!r}; log numeric or boolean arrays, or "
                "text as a str or a NumPy array of str (not bytes)."
            )


def _with_event_axis(position: int, x):
    xp = jnp if isinstance(x, jax.Array) else np  # a tracer is a jax.Array too
    return xp.expand_dims(xp.asarray(x), position)


def _effects_barrier() -> Exception | None:
    """`jax.effects_barrier()`, returning what a host call raised (`lox_core.failures`)
    instead of raising it: `flush` and `finish` raise it once they wrote and closed
    the runs (a logger that stopped a program on a full disk writes what it holds
    when space is freed; a callback's bug does not leave the runs open)."""
    try:
        jax.effects_barrier()
    except Exception as error:  # noqa: BLE001 - raised by the caller, after its work
        return error
    return None


def _replicated(x: jax.Array) -> jax.Array:
    """`x` replicated over the mesh of `jax.set_mesh`, if one is set. A host
    callback's result is placed on the first device only (an XLA "maximal"
    sharding), and a program whose output keeps that placement hands back an
    array that later programs under a mesh refuse as an input."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.manual_axes or runtime.staging_trace() is None:  # in a shard_map: per device
        return x
    if all(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
        return jax.sharding.reshard(x, jax.sharding.PartitionSpec())  # explicit axes take no constraint
    return jax.lax.with_sharding_constraint(x, jax.sharding.PartitionSpec())


def _names(backends: list[hooks.Backend]) -> list[str]:
    """What messages call each backend: the config string it was made from
    (``parquet:runs``, ``badplugin``), else its class, with its target where
    two backends share a class (or its position, where names still clash)."""
    classes = [type(b).__name__ for b in backends]
    names = [b.config or (c if classes.count(c) == 1 else f"{c}({getattr(b, 'target', None) or ''})")
             for c, b in zip(classes, backends, strict=True)]
    return [n if names.count(n) == 1 else f"{n}#{i}" for i, n in enumerate(names)]


# --- constructing loggers -----------------------------------------------------------------
def from_config(
    config: str | None = None,
    *,
    name: str = "lox",
    timeout: float = DEFAULT_TIMEOUT,
    flush_every: float = DEFAULT_FLUSH_EVERY,
    processes: str = "first",
    max_pending: int = DEFAULT_MAX_PENDING,
    on_error: str = "raise",
    media_limit: int | Mapping[str, int] = DEFAULT_MEDIA_LIMIT,
    system: float | None = None,
) -> Logger:
    """A Logger for a config string such as ``"console,parquet:runs"``.

    Without `config`, the ``LOX_BACKENDS`` environment variable is used, and
    without it ``parquet:lox-runs`` (the embedded default: Parquet files in
    ``./lox-runs``). See `lox_backends.plugin.config` for the grammar. In a job of
    several processes (`jax.distributed`), process 0 writes every run, or with
    ``processes="each"`` each process writes runs of its own (see
    `lox_backends.logger.processes`).

    >>> [type(b).__name__ for b in from_config("console,memory").backends]
    ['ConsoleBackend', 'MemoryBackend']

    `media_limit` bounds the bytes of one event of a key of images, video,
    audio, histograms or text (default 64 MiB): a bigger one is refused at the
    call, naming the key. An int applies to every key; a dict gives keys
    limits of their own, and ``"*"`` every other key's.

    ``system=N`` writes system metrics to every open run every N seconds:
    host CPU and memory, this process's memory, each local device's memory
    in use and peak (GPUs, TPUs), and the run's steps per second, as keys
    ``system/...`` at the run's latest step (see
    `lox_backends.logger.system`). None (the default): none.
    """
    media_limit = check_media_limit(media_limit, DEFAULT_MEDIA_LIMIT)
    system = check_system(system)
    if config is None:
        config = os.environ.get("LOX_BACKENDS") or DEFAULT_CONFIG
    # The options first: refused before any backend is made (and `timeout` bounds making them).
    timeout, flush_every, max_pending = check_logger_options(timeout, flush_every, max_pending, on_error, ON_ERROR)
    with filesystems.time_limit(timeout):  # a backend checks its bucket when it is made
        backends = [registry.create(c) for c in parse(config)]
    return Logger(backends, name=name, timeout=timeout, flush_every=flush_every, processes=processes,
                  max_pending=max_pending, on_error=on_error, media_limit=media_limit, system=system)


def backend_logger(
    backend: str,
    target: str | None = None,
    *,
    name: str = "lox",
    timeout: float = DEFAULT_TIMEOUT,
    flush_every: float = DEFAULT_FLUSH_EVERY,
    processes: str = "first",
    max_pending: int = DEFAULT_MAX_PENDING,
    on_error: str = "raise",
    media_limit: int | Mapping[str, int] = DEFAULT_MEDIA_LIMIT,
    system: float | None = None,
    **options: Any,
) -> Logger:
    """A Logger for one backend by name: ``backend_logger("parquet", "runs",
    compression="zstd")``; `options` are the backend's (its ``?key=value``)."""
    config = BackendConfig(backend, target, {k: str(v) for k, v in options.items()})
    timeout, flush_every, max_pending = check_logger_options(timeout, flush_every, max_pending, on_error, ON_ERROR)
    media_limit = check_media_limit(media_limit, DEFAULT_MEDIA_LIMIT)
    system = check_system(system)
    with filesystems.time_limit(timeout):  # a backend checks its bucket when it is made
        made = registry.create(config)
    return Logger([made], name=name, timeout=timeout, flush_every=flush_every,
                  processes=processes, max_pending=max_pending, on_error=on_error, media_limit=media_limit,
                  system=system)


def ConsoleLogger(**options: Any) -> Logger:  # noqa: N802 - the name users know
    """A Logger that shows the latest values of every run on the console: a
    live table on a terminal, a line per run at most every `interval` seconds
    elsewhere (``ConsoleLogger(interval=5)``)."""
    return backend_logger("console", None, **options)


def SaveLogger(path: str | os.PathLike[str] = DEFAULT_DIR, **options: Any) -> Logger:  # noqa: N802
    """A Logger that saves runs as Parquet files under `path` (read them back
    with `lox.load(path)`).

    >>> import tempfile, numpy as np, lox
    >>> folder = tempfile.mkdtemp()
    >>> saver = SaveLogger(folder)
    >>> state = saver.init(name="saved")
    >>> saver.log(state, lox.logdict({"loss": np.array([0.5, 0.25])}, {"step": {"loss": np.array([0, 1])}}))
    >>> saver.finish(state)
    >>> [(logs["loss"].tolist(), logs.step["loss"].tolist()) for logs in lox.load(folder).values()]
    [([0.5, 0.25], [0, 1])]
    """
    return backend_logger("parquet", os.fspath(path), **options)


def MultiLogger(*loggers: Logger, name: str = "lox", processes: str = "first") -> Logger:  # noqa: N802
    """One Logger writing to the backends of all `loggers` (which must not have
    opened runs yet: their backends now belong to the combined logger). It
    samples system metrics at the least `system` interval of theirs, if any.

    >>> both = MultiLogger(backend_logger("memory"), backend_logger("memory"))
    >>> [type(b).__name__ for b in both.backends]
    ['MemoryBackend', 'MemoryBackend']
    """
    if not loggers or not all(isinstance(lg, Logger) for lg in loggers):
        raise TypeError(
            "`MultiLogger` takes one or more Loggers, e.g. MultiLogger(ConsoleLogger(), SaveLogger('runs'))."
        )
    used = [lg.name for lg in loggers if lg.runs() or lg._closed]
    if used:
        raise ValueError(
            f"`MultiLogger` takes fresh loggers, but {used[0]!r} has opened runs or was closed; "
            "combine the loggers before calling `init`."
        )
    for lg in loggers:
        lg._stop()
    backends: list[hooks.Backend] = [b for lg in loggers for b in lg.backends]
    return Logger(backends, name=name, timeout=max(lg.timeout for lg in loggers),
                  flush_every=min(lg._flush_every for lg in loggers), processes=processes,
                  max_pending=min(lg.max_pending for lg in loggers),
                  on_error="raise" if any(lg.on_error == "raise" for lg in loggers) else "warn",
                  media_limit=loggers[0].media_limit if len(loggers) == 1 else _least_limits(loggers),
                  system=min((lg.system for lg in loggers if lg.system is not None), default=None))


def _least_limits(loggers: Sequence[Logger]) -> dict[str, int]:
    """The media limits of several loggers combined: each key's least."""
    keys = {key for lg in loggers for key in lg.media_limit}
    return {key: min(lg.media_limit.get(key, lg.media_limit["*"]) for lg in loggers) for key in keys}
