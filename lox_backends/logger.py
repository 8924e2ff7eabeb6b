"""Loggers: runs, and the backends their logs go to.

A `Logger` owns backends (from a config string such as
``"console,parquet:runs"``) and a background writer thread. `init` opens a run
and returns its state, a pytree: ``jax.vmap(logger.init)(keys)`` opens one run
per seed, and a vmapped `spool` / `tap` / `log` sends each seed's logs to its
own run, in one host call for all seeds. Device arrays are handed to the writer
as they are, so logging never waits for a device-to-host transfer; a backend's
error is raised by the next call to the logger (or by `finish`), and whatever is
pending is flushed at interpreter exit.
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
import os
import queue
import re
import secrets
import threading
import time
import warnings
import weakref
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import lox_core.spool
import lox_core.tap
from lox_backends import hooks
from lox_backends.config import BackendConfig, parse
from lox_backends.registry import registry
from lox_core.host import chain_end, chain_start, host_call
from lox_core.logdict import ARROW_COLUMNS as RESERVED_COLUMNS
from lox_core.logdict import NO_STEP, concat, logdict
from lox_core.transform import traced

DEFAULT_CONFIG = "parquet:lox-runs"
DEFAULT_TIMEOUT = 60.0  # seconds `finish` and interpreter exit wait for the writer
DEFAULT_FLUSH_EVERY = 5.0  # seconds between automatic flushes of the backends
BATCHES_EVERY = 0.25  # seconds batches and tapped events wait to be sent together
MAX_WAITING = 256


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LoggerState:
    """The runs a logger writes to: an int32 run number per element (batch axes
    under vmap). Pass it to `spool` / `tap` / `log` / `finish`."""

    run: jax.Array


class BackendError(RuntimeError):
    """A backend failed in the background writer."""


class _Writer:
    """One thread that calls the backends, in submission order.

    Tasks from the user's thread wait while `max_pending` tasks are queued
    (bounded memory), at most until their deadline. Tasks from JAX's callback
    threads never wait and never raise: a callback that blocks or raises would
    stall or break the computation it belongs to.
    """

    def __init__(self, name: str, every: float, periodic: Callable[[], None], max_pending: int = 256):
        self._every = every
        self._periodic = periodic  # run every `every` seconds, busy or idle
        self._queue: queue.Queue = queue.Queue()
        self._max_pending = max_pending
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._name = name
        self._stopped = False

    def submit(self, task: Callable[[], None], timeout: float | None = None, check: bool = True) -> None:
        """From the user's thread: raise what failed so far (if `check`), wait
        while the writer is far behind (up to `timeout` seconds), queue `task`."""
        if check:
            self.raise_errors()
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._queue.qsize() >= self._max_pending and self._running():
            if deadline is not None and time.monotonic() >= deadline:
                raise self._timeout(timeout)
            time.sleep(0.001)
        self._put(task)

    def submit_from_callback(self, task: Callable[[], None]) -> None:
        self._put(task)

    def _put(self, task) -> None:
        if not self._running():
            with self._lock:
                if not self._running() and not self._stopped:
                    self._thread = threading.Thread(target=self._run, name=f"lox-writer-{self._name}", daemon=True)
                    self._thread.start()
        self._queue.put(task)

    def _running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        due = time.monotonic() + self._every
        while True:
            try:
                task = self._queue.get(timeout=max(due - time.monotonic(), 0.0))
            except queue.Empty:
                task = None
            if task is _STOP:
                return
            if task is not None:
                self._call(task)
            if time.monotonic() >= due:
                self._call(self._periodic)
                due = time.monotonic() + self._every

    def _call(self, task) -> None:
        try:
            task()
        except BaseException as error:  # kept and raised in the user's thread
            with self._lock:
                self._errors.append(error)

    def run_and_wait(self, tasks: list, timeout: float | None) -> None:
        """Queue `tasks` even if something failed before, wait for them (all
        within `timeout` seconds), then raise what failed, before or during."""
        deadline = None if timeout is None else time.monotonic() + timeout
        left = lambda: None if deadline is None else max(deadline - time.monotonic(), 0.0)  # noqa: E731
        done = threading.Event()
        for task in [*tasks, done.set]:
            self.submit(task, left(), check=False)
        if not done.wait(left()):
            raise self._timeout(timeout)
        self.raise_errors()

    def stop(self, wait: bool = True) -> None:
        """End the thread once what is queued has run (waiting for it if `wait`)."""
        self._stopped = True
        if self._running():
            self._queue.put(_STOP)
            if wait:
                self._thread.join()

    def _timeout(self, timeout) -> TimeoutError:
        return TimeoutError(
            f"lox: the writer of logger {self._name!r} did not finish within {round(timeout, 1):g} s; a backend is slow "
            "or stuck. Pass a longer timeout (e.g. `logger.finish(state, timeout=600)`) or check the backends."
        )

    def raise_errors(self) -> None:
        with self._lock:
            errors, self._errors = self._errors, []
        if errors:
            more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
            first = str(errors[0]) if isinstance(errors[0], BackendError) else repr(errors[0])
            raise BackendError(f"lox: writing logs in the background failed: {first}{more}") from errors[0]


_STOP = object()  # ends the writer thread


_live_loggers: "weakref.WeakSet[Logger]" = weakref.WeakSet()
_init_calls = itertools.count()


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
    ):
        if not backends:
            raise ValueError("a lox Logger needs at least one backend, e.g. `lox.loggers.from_config('parquet:runs')`.")
        # One conversion now, in the caller's thread: the writer thread converts
        # every batch to Arrow and must not be the first to run it, because its
        # lazy imports register exit handlers, which fails while the
        # interpreter exits (when pending batches are flushed).
        import pyarrow.compute  # noqa: F401

        logdict({"warm-up": np.zeros(1)}, {"step": {"warm-up": np.zeros(1, np.int32)}}).to_arrow(run="")

        self.backends = list(backends)
        _share_local_logs(self.backends)
        self.name = name
        self.timeout = timeout
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "lox"
        self.group = f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        self._runs: list[hooks.RunInfo] = []
        self._open: set[int] = set()
        self._last_steps: dict[tuple[int, str], int] = {}  # (run, key) → highest step sent
        self._kinds: dict[str, tuple] = {}  # key → (dtype, event shape)
        self._closed_runs: set[int] = set()  # runs the writer has closed
        self._warned: set[tuple[int, str]] = set()
        self._lock = threading.Lock()
        self._waiting: list = []  # batches and events waiting for the writer's next tick
        self._dirty = False  # written to since the last flush
        self._flush_every = flush_every
        self._next_flush = time.monotonic() + flush_every
        self._writer = _Writer(safe, BATCHES_EVERY, self._tick)
        self._closed = False
        _live_loggers.add(self)

    def __repr__(self) -> str:
        return f"Logger({self.name!r}, backends=[{', '.join(type(b).__name__ for b in self.backends)}])"

    # --- runs ----------------------------------------------------------------------
    def init(self, key=None, **metadata) -> LoggerState:
        """Open a run and return its state.

        `key` is a PRNG key (recorded with the run, so a seed's run can be told
        apart); `metadata` is the run's metadata and config: Python values
        (JSON-compatible) apply to every run, arrays may differ per seed under
        vmap. ``name=`` names the run (seeds get ``name-0``, ``name-1``...).
        Works eagerly, under jit and under vmap: one run per element.
        """
        self._check_open()
        static = {k: v for k, v in metadata.items() if not isinstance(v, (jax.Array, np.ndarray, jax.core.Tracer))}
        dynamic = {k: jnp.asarray(v) for k, v in metadata.items() if k not in static}
        if key is None:
            seed = jnp.zeros((0,), jnp.uint32)
        elif jax.dtypes.issubdtype(getattr(key, "dtype", None), jax.dtypes.prng_key):
            seed = jax.random.key_data(key)
        else:
            seed = jnp.asarray(key)
        seed_ndim = seed.ndim
        # A different operand per `init` call, so that XLA never merges two
        # calls into one (the callback is pure to JAX, which lets vmap batch it).
        nonce = jnp.int32(next(_init_calls))

        def open_runs(seed, dynamic, nonce):
            seed, dynamic = np.asarray(seed), {k: np.asarray(v) for k, v in dynamic.items()}
            batch_shape = seed.shape[: seed.ndim - seed_ndim]
            runs = np.empty(batch_shape, np.int32)
            for position, index in enumerate(np.ndindex(batch_shape)):
                meta = dict(static)
                meta.update({k: v[index].tolist() for k, v in dynamic.items()})
                if key is not None:
                    meta["key"] = seed[index].tolist()
                runs[index] = self._open_run(meta, position if batch_shape else None)
            return runs

        run = jax.pure_callback(
            open_runs, jax.ShapeDtypeStruct((), jnp.int32), seed, dynamic, nonce, vmap_method="broadcast_all"
        )
        if not isinstance(run, jax.core.Tracer):
            # Called eagerly under `jax.set_mesh`, the callback returns an array whose
            # placement (an XLA "maximal" sharding) later programs refuse as an input.
            run = jnp.asarray(np.asarray(run))
        return LoggerState(run)

    def _open_run(self, metadata: dict, position: int | None) -> int:
        with self._lock:
            number = len(self._runs)
            base = str(metadata.get("name", self.name))
            if "name" not in metadata:
                name = f"{base}-{number}"  # unique within the logger
            else:  # the user's name; its seeds numbered within this `init`
                name = base if position is None else f"{base}-{position}"
            run = hooks.RunInfo(f"{self.group}-{number}", name, self.group, number, metadata)
            self._runs.append(run)
            self._open.add(number)
        # Inside `jax.pure_callback`: must not block or raise.
        self._writer.submit_from_callback(lambda: self._each_backend(lambda b: b.open_run(run)))
        return number

    def runs(self) -> list[hooks.RunInfo]:
        """Every run this logger opened, in order."""
        with self._lock:
            return list(self._runs)

    # --- logging -------------------------------------------------------------------
    def spool(self, fun: Callable, state: LoggerState, **options) -> Callable:
        """`lox.spool(fun, **options)` whose logs go to the state's runs, once per
        call (after the call, without waiting for the device). Returns ``fun``'s
        output only."""
        spooled = lox_core.spool.spool(fun, **options)

        def run(*args, **kwargs):
            self._check_open()  # a backend's earlier failure: raised before the step, not after it
            out, logs = spooled(*args, **kwargs)
            self._log(state, logs)
            return out

        return run

    def tap(self, fun: Callable, state: LoggerState, **options) -> Callable:
        """`lox.tap(fun)` whose events stream to the state's runs as they happen
        (under vmap, one host call per event for all seeds). With ``buffer=K``
        the events of loops cross to the host K at a time (see `lox.tap`)."""
        tapped = lox_core.tap.tap_with_context(
            fun, self._receive_event, wait=False, block_callback=self._receive_block, **options
        )

        def run(*args, **kwargs):
            self._check_open()
            return tapped(state.run, *args, **kwargs)

        return run

    def log(self, state: LoggerState, logs: logdict) -> None:
        """Write a logdict (e.g. spooled logs) to the state's runs; works inside
        and outside jit, and under vmap (one host call for all seeds)."""
        self._check_open()
        self._log(state, logs)

    def _log(self, state: LoggerState, logs: logdict) -> None:
        if not isinstance(logs, logdict):
            raise TypeError(f"`logger.log` takes a lox.logdict (e.g. spooled logs), got {type(logs).__name__}.")
        if not isinstance(state, LoggerState):
            raise TypeError(f"`logger.log` takes the state returned by `logger.init`, got {type(state).__name__}.")
        reserved = [n for n in logs.steps if n in RESERVED_COLUMNS]
        if reserved:
            raise ValueError(
                f"lox logger: the step name {reserved[0]!r} is reserved for a column of lox's tables "
                f"({', '.join(RESERVED_COLUMNS)}); rename the step, e.g. `lox.log(..., {reserved[0]}_step=i)`."
            )
        self._check_shapes(logs, np.ndim(state.run))
        for key, mask in logs.valid.items():
            if np.ndim(mask) != np.ndim(state.run) + 1:
                raise ValueError(
                    f"`logger.log`: key {key!r} has padding per `jax.vmap` element (a `while_loop` vmapped inside "
                    "`lox.spool(..., max_events=N)`), which a run's table cannot hold. Apply `jax.vmap` outside "
                    "the spool, with one run per element (`jax.vmap(logger.init)`)."
                )
        if traced((state, logs)):
            # Chained, not ordered: an ordered effect is refused on more than one device.
            chain_end(host_call(self._receive_batch, state.run, logs, guarded=False, token=chain_start()))
            return
        run = state.run
        batch_shape = np.shape(run)
        for key, value in [*logs.items(), *((f"the steps {n!r} of {k!r}", s) for n, d in logs.steps.items() for k, s in d.items())]:
            for leaf in jax.tree_util.tree_leaves(value):
                if np.shape(leaf)[: len(batch_shape)] != batch_shape:
                    what = key if key.startswith("the steps") else repr(key)
                    raise ValueError(
                        f"`logger.log`: the state holds runs of shape {batch_shape} (one per seed), but "
                        f"{what} has shape {np.shape(leaf)}; its leading axes must be the runs' "
                        "(call `logger.log` inside the vmapped function, or vmap the spooled function)."
                    )
        # Device arrays go to the writer as they are (no transfer in this thread);
        # NumPy arrays are copied, since the caller may reuse them.
        logs = jax.tree_util.tree_map(lambda x: x if isinstance(x, jax.Array) else np.array(x), logs)
        self._writer.submit(lambda: self._write_batch(len(batch_shape), run, logs))

    def _check_shapes(self, logs: logdict, batch_ndim: int) -> None:
        """A key keeps one dtype and event shape in all of a logger's runs (so that
        its series stay one array); checked here, in the caller's thread."""
        for key, value in logs.items():
            for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
                name = key + jax.tree_util.keystr(path)
                dtype = np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
                kind = (dtype, tuple(np.shape(leaf)[batch_ndim + 1 :]))
                known = self._kinds.setdefault(name, kind)
                if known != kind:
                    raise ValueError(
                        f"lox logger: {name!r} was logged as {known[0]}{list(known[1])} and now as "
                        f"{kind[0]}{list(kind[1])}; a key keeps one dtype and shape in a logger's runs. "
                        "Log the new values under another key (e.g. pad a smaller last batch, or log its mean)."
                    )

    def _receive_batch(self, batch_ndim: int, run, logs) -> None:
        # Copies: the host call's arrays may be buffers that XLA reuses.
        run, logs = np.array(run), jax.tree_util.tree_map(np.array, logs)
        self._writer.submit_from_callback(lambda: self._write_batch(batch_ndim, run, logs))

    def _receive_block(self, batch_ndim: int, logs: logdict, run) -> None:
        # A buffered tap's events: written like a spooled batch.
        self._receive_batch(batch_ndim, run, logs)

    def _receive_event(self, batch_ndim: int, event: logdict, run, took) -> None:
        # One task for all seeds: the host call returns at once, the writer splits.
        self._writer.submit_from_callback(lambda: self._write_event(batch_ndim, event, run, took))

    # --- in the writer thread --------------------------------------------------------
    def _write_batch(self, batch_ndim: int, run, logs: logdict) -> None:
        self._enqueue(("batch", batch_ndim, run, logs, None))

    def _write_event(self, batch_ndim: int, event: logdict, run, took) -> None:
        self._enqueue(("events", batch_ndim, run, event, took))

    def _enqueue(self, item) -> None:
        # Batches and tapped events wait a moment (`_tick`) and leave together:
        # one Arrow table per run for many spooled calls, one block per run for
        # many events. A loop that logs every step (or 64 seeds that stream)
        # then costs the writer, and the cores it shares with training, little.
        self._waiting.append(item)
        if len(self._waiting) >= MAX_WAITING:
            self._send_waiting()

    def _send_waiting(self) -> None:
        """Send what waits, in order: consecutive batches together, consecutive
        events of one structure together."""
        waiting, self._waiting = self._waiting, []
        groups: list[list] = []
        for item in waiting:
            if groups and _same_group(groups[-1][-1], item):
                groups[-1].append(item)
            else:
                groups.append([item])
        for group in groups:
            (self._send_batches if group[0][0] == "batch" else self._send_events)(group)

    def _send_batches(self, group) -> None:
        by_run: dict[int, list[logdict]] = {}
        for _, batch_ndim, run, logs, _ in group:
            run, logs = np.asarray(run), jax.tree_util.tree_map(np.asarray, logs)
            for index, part in _elements(batch_ndim, run, logs):
                by_run.setdefault(int(run[index]), []).append(part)

        def write(info, parts):
            self._check_still_open(info)
            try:
                parts = [concat(parts)]
            except ValueError:  # a key changed shape between calls: one table per call
                pass
            for part in parts:
                table = self._ordered_table(info, part)
                self._each_backend(lambda b: b.write_batch(info, table))

        self._for_runs([(self._runs[number], parts) for number, parts in by_run.items()], write)

    def _send_events(self, group) -> None:
        _, batch_ndim, run, _, _ = group[0]
        # Events of one structure, stacked along their event axis (after the batch axes).
        events = jax.tree_util.tree_map(lambda *xs: np.concatenate(xs, axis=batch_ndim), *[g[3] for g in group])
        took = np.stack([np.asarray(g[4]) for g in group], axis=-1)  # (*batch, events)
        run = np.asarray(run)
        items = []
        for index, part in _elements(batch_ndim, run, events):
            if took[index].any():
                items.append((self._runs[int(run[index])], jax.tree_util.tree_map(lambda x: x[took[index]], part)))

        def write(info, part):
            self._check_still_open(info)
            self._check_steps(info, part)
            self._each_backend(lambda b: b.write_events(info, part))

        self._for_runs(items, write)

    def _check_still_open(self, run: hooks.RunInfo) -> None:
        if run.index in self._closed_runs:
            raise ValueError(
                f"lox logger: logs for run {run.name!r} arrived after `logger.finish` closed it and were not "
                "written; log before `finish`, or open a new run with `logger.init`."
            )

    def _for_runs(self, items, write) -> None:
        """`write(run info, data)` for each item; one run's failure does not
        keep the others from their data."""
        failed = None
        for info, data in items:
            try:
                write(info, data)
            except (BackendError, ValueError) as error:
                failed = failed or error
            self._dirty = True
        if failed is not None:
            raise failed

    def _tick(self) -> None:
        self._send_waiting()
        # A crash loses at most `flush_every` seconds of logs.
        if self._dirty and time.monotonic() >= self._next_flush:
            self._flush_all()

    def _ordered_table(self, run: hooks.RunInfo, logs: logdict):
        import pyarrow.compute as pc

        self._check_steps(run, logs)
        self._check_dropped(run, logs)
        table = logs.to_arrow(run=run.run_id)
        primary = _primary_step(logs)
        if primary is not None and table.num_rows:
            steps = table.column(primary)
            if not (steps.null_count == 0 and _non_decreasing(steps.to_numpy())):
                # A stable sort: events of one step keep their program order.
                table = table.take(pc.sort_indices(table, sort_keys=[(primary, "ascending")]))  # nulls last
        return table

    def _check_steps(self, run: hooks.RunInfo, logs: logdict) -> None:
        primary = _primary_step(logs)
        if primary is None:
            return
        for key, steps in logs.steps[primary].items():
            steps = np.asarray(steps).reshape(-1)
            steps = steps[steps != NO_STEP]
            if steps.size == 0:
                continue
            last = self._last_steps.get((run.index, key))
            seq = steps if last is None else np.concatenate([[last], steps])
            backwards = np.flatnonzero(np.diff(seq) < 0)
            if backwards.size and (run.index, key) not in self._warned:
                self._warned.add((run.index, key))
                i = backwards[0]
                warnings.warn(
                    f"lox: in run {run.name!r} the {primary} of {key!r} goes backwards ({seq[i]} then {seq[i + 1]}). "
                    "lox sends each batch ordered by step, but trackers such as W&B drop rows whose step is "
                    "below one already sent: log in step order, or use another step name for this key.",
                    RuntimeWarning,
                    stacklevel=2,
                )
            self._last_steps[(run.index, key)] = int(seq.max())

    def _check_dropped(self, run: hooks.RunInfo, logs: logdict) -> None:
        """Warn (once per run and key) of events a spooled while loop had no room for."""
        lost = {key: int(np.sum(n)) for key, n in logs.dropped.items() if (run.index, "dropped " + key) not in self._warned}
        lost = {key: n for key, n in lost.items() if n}
        if not lost:
            return
        self._warned.update((run.index, "dropped " + key) for key in lost)
        counts = ", ".join(f"{n} of {key!r}" for key, n in lost.items())
        warnings.warn(
            f"lox: in run {run.name!r}, events did not fit in the buffer of a spooled `while_loop` and were "
            f"dropped ({counts}); the first `max_events` of each run of the loop are kept. Raise `max_events` "
            "of `lox.spool`/`logger.spool`.",
            RuntimeWarning,
            stacklevel=2,
        )

    # --- ending ----------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything logged so far has reached the backends (and they
        flushed it); raise what a backend raised."""
        jax.effects_barrier()  # tapped events still on their way from the device
        deadline = self._deadline(timeout)
        try:
            self._writer.run_and_wait([self._flush_all], _left(deadline))
        finally:
            self._wait_backends(deadline)

    def _deadline(self, timeout: float | None) -> float | None:
        timeout = self.timeout if timeout is None else timeout
        return None if timeout is None else time.monotonic() + timeout

    def _wait_backends(self, deadline: float | None) -> None:
        """Backends that send in a thread of their own (trackers) catch up."""
        for backend in self.backends:
            backend.wait(_left(deadline))

    def _flush_all(self) -> None:
        try:
            self._send_waiting()
        finally:  # what did arrive is made durable even if a part failed
            self._dirty = False
            self._next_flush = time.monotonic() + self._flush_every
            self._each_backend(lambda b: b.flush())

    def _each_backend(self, call: Callable[[hooks.Backend], None]) -> None:
        """`call` on every backend; one backend's error does not keep the others
        from their data (the errors are raised together afterwards)."""
        errors = []
        for backend in self.backends:
            try:
                call(backend)
            except Exception as error:  # noqa: BLE001 - re-raised below, with the backend named
                errors.append(BackendError(f"{type(backend).__name__}: {error!r}"))
                errors[-1].__cause__ = error
        if errors:
            raise errors[0] if len(errors) == 1 else BackendError("; ".join(str(e) for e in errors))

    def finish(self, state: LoggerState, timeout: float | None = None) -> None:
        """Close the state's runs (all seeds) after everything logged to them has
        been written; then raise what a backend raised, if anything did (the
        runs are closed all the same). Call it outside jit."""
        if self._closed:
            raise RuntimeError(f"the lox logger {self.name!r} was closed; create a new one.")
        if traced(state):
            raise TypeError("`logger.finish` must be called outside jax.jit / vmap, with the state `init` returned.")
        jax.effects_barrier()
        numbers = [int(n) for n in np.asarray(state.run).reshape(-1)]
        with self._lock:
            unknown = [n for n in numbers if n >= len(self._runs) or n < 0]
            if unknown:
                raise ValueError(f"`logger.finish` got run number {unknown[0]}, which this logger did not open.")
            closing = [self._runs[n] for n in numbers if n in self._open]
            self._open.difference_update(numbers)

        def close_run(run):
            try:
                self._send_waiting()
            finally:  # closed even if sending failed (the error is raised after)
                self._closed_runs.add(run.index)  # in the writer: what arrives later is refused
                self._each_backend(lambda b: b.close_run(run))

        tasks = [lambda run=run: close_run(run) for run in closing]
        deadline = self._deadline(timeout)
        try:
            self._writer.run_and_wait([*tasks, self._flush_all], _left(deadline))
        finally:  # trackers send what reached them even when a backend failed
            self._wait_backends(deadline)

    def close(self, timeout: float | None = None) -> None:
        """Flush and close every backend and stop the writer; the logger cannot be
        used afterwards. Raises what a backend raised."""
        if self._closed:
            return
        self._closed = True
        _live_loggers.discard(self)
        jax.effects_barrier()
        deadline = self._deadline(timeout)
        stuck = False
        try:
            self._writer.run_and_wait([self._flush_all, lambda: self._each_backend(lambda b: b.close())], _left(deadline))
        except TimeoutError:
            stuck = True  # in a backend: do not wait for the writer
            raise
        finally:  # also after an earlier backend error: the trackers still send everything
            self._writer.stop(wait=not stuck)
            self._wait_backends(deadline)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the lox logger {self.name!r} was closed; create a new one.")
        self._writer.raise_errors()


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def _share_local_logs(backends: list[hooks.Backend]) -> None:
    """One writer per local folder: a tracker whose local log is the folder of
    a parquet backend (or of another tracker) sends from that backend's files
    instead of writing every batch there a second time."""
    from lox_backends.parquet import ParquetBackend
    from lox_backends.tracker import TrackerBackend

    logs: dict[str, ParquetBackend] = {}
    for backend in backends:
        if isinstance(backend, ParquetBackend):
            if backend.root in logs:
                raise ValueError(
                    f"two parquet backends write to {backend.root!r}; every event would be saved twice. "
                    "Keep one, or give them different folders."
                )
            logs[backend.root] = backend
    for backend in backends:
        if isinstance(backend, TrackerBackend):
            if backend.local_root in logs:
                backend.share_log(logs[backend.local_root])
            else:
                logs[backend.local_root] = backend.log


def _same_group(a, b) -> bool:
    """Whether two waiting items can be sent together."""
    if a[0] != b[0]:
        return False
    if a[0] == "batch":
        return True
    # Events: same batch axes, same runs, same keys, shapes and steps.
    return (
        a[1] == b[1]
        and np.array_equal(np.asarray(a[2]), np.asarray(b[2]))
        and jax.tree_util.tree_structure(a[3]) == jax.tree_util.tree_structure(b[3])
        and [np.shape(x) for x in jax.tree_util.tree_leaves(a[3])] == [np.shape(x) for x in jax.tree_util.tree_leaves(b[3])]
    )


def _elements(batch_ndim: int, run: np.ndarray, logs: logdict):
    """(index, that element's logs) for each element of the leading batch axes."""
    for index in np.ndindex(run.shape[:batch_ndim]):
        yield index, (jax.tree_util.tree_map(lambda x: x[index], logs) if batch_ndim else logs)


def _non_decreasing(x: np.ndarray) -> bool:
    return bool(np.all(x[1:] >= x[:-1]))


def _primary_step(logs: logdict) -> str | None:
    """The step name rows are ordered by: ``step`` if present, else the first."""
    names = list(logs.steps)
    return "step" if "step" in names else (names[0] if names else None)


def flush_before_exit_handlers() -> None:
    """Make lox's exit flush run before every exit handler registered so far
    (Python runs them last registered first). A tracker backend calls it after
    its client registered one of its own, that would otherwise end the
    tracker's runs before lox has sent them the last logs."""
    atexit.unregister(_flush_at_exit)
    atexit.register(_flush_at_exit)


@atexit.register
def _flush_at_exit() -> None:
    for logger in list(_live_loggers):
        try:
            logger.close()
        except Exception as error:  # noqa: BLE001 - report, and flush the others
            warnings.warn(f"lox: logger {logger.name!r} could not flush at exit: {error}", RuntimeWarning)


# --- constructing loggers -----------------------------------------------------------------
def from_config(
    config: str | None = None,
    *,
    name: str = "lox",
    timeout: float = DEFAULT_TIMEOUT,
    flush_every: float = DEFAULT_FLUSH_EVERY,
) -> Logger:
    """A Logger for a config string such as ``"console,parquet:runs"``.

    Without `config`, the ``LOX_BACKENDS`` environment variable is used, and
    without it ``parquet:lox-runs`` (the embedded default: Parquet files in
    ``./lox-runs``). See `lox_backends.config` for the grammar.

    >>> [type(b).__name__ for b in from_config("console,memory").backends]
    ['ConsoleBackend', 'MemoryBackend']
    """
    if config is None:
        config = os.environ.get("LOX_BACKENDS") or DEFAULT_CONFIG
    return Logger([registry.create(c) for c in parse(config)], name=name, timeout=timeout, flush_every=flush_every)


def backend_logger(
    backend: str,
    target: str | None = None,
    *,
    name: str = "lox",
    timeout: float = DEFAULT_TIMEOUT,
    flush_every: float = DEFAULT_FLUSH_EVERY,
    **options,
) -> Logger:
    """A Logger for one backend by name: ``backend_logger("parquet", "runs",
    compression="zstd")``; `options` are the backend's (its ``?key=value``)."""
    config = BackendConfig(backend, target, {k: str(v) for k, v in options.items()})
    return Logger([registry.create(config)], name=name, timeout=timeout, flush_every=flush_every)


def ConsoleLogger(**options) -> Logger:  # noqa: N802 - the name users know
    """A Logger that shows the latest values of every run on the console: a
    live table on a terminal, a line per run at most every `interval` seconds
    elsewhere (``ConsoleLogger(interval=5)``)."""
    return backend_logger("console", None, **options)


def SaveLogger(path: str | os.PathLike = "lox-runs", **options) -> Logger:  # noqa: N802
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


def MultiLogger(*loggers: Logger, name: str = "lox") -> Logger:  # noqa: N802
    """One Logger writing to the backends of all `loggers` (which must not have
    opened runs yet: their backends now belong to the combined logger).

    >>> both = MultiLogger(backend_logger("memory"), backend_logger("memory"))
    >>> [type(b).__name__ for b in both.backends]
    ['MemoryBackend', 'MemoryBackend']
    """
    if not loggers or not all(isinstance(lg, Logger) for lg in loggers):
        raise TypeError("`MultiLogger` takes one or more Loggers, e.g. MultiLogger(ConsoleLogger(), SaveLogger('runs')).")
    used = [lg.name for lg in loggers if lg.runs() or lg._closed]
    if used:
        raise ValueError(
            f"`MultiLogger` takes fresh loggers, but {used[0]!r} has opened runs or was closed; "
            "combine the loggers before calling `init`."
        )
    for lg in loggers:
        lg._closed = True
        lg._writer.stop()
        _live_loggers.discard(lg)
    backends: list[hooks.Backend] = [b for lg in loggers for b in lg.backends]
    return Logger(backends, name=name, timeout=max(lg.timeout for lg in loggers),
                  flush_every=min(lg._flush_every for lg in loggers))
