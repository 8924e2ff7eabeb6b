"""The cost of an active run (``python -m benchmarks active``), side by side in one process.

A 1,000-step scan that logs a scalar per step, written without lox in it
(`programs.scan_one_scalar`), sends its events to a memory logger's run in three
ways: ``with logger.active(state):`` around the jitted function (compiled for
the block: the default ``"off"``), the same with the default ``"console"``
(the function's host call finds the block when each event arrives), and
`logger.tap` of the function. Each call is timed until its events reached the
logger (`jax.effects_barrier`); the cost per event is the time over the same
scan without logs (`lox.nolog`), divided by the events. The issue's target:
an event through the active run costs what it costs through `logger.tap`.
The last rows take the Logger out: a destination and a tap callback that
each spend 20 us per event, so that the figures are lox's own paths.
"""

from __future__ import annotations

import time
import warnings

import jax
import jax.numpy as jnp

import lox
from benchmarks import programs
from benchmarks.timing import block, row, side_by_side
from lox_core import active as active_blocks

EVENTS = 1_000


def active():
    print(f"Active run: per-event cost of a {EVENTS:,}-step scan logging a scalar, to a memory logger's run")
    xs = jnp.arange(float(EVENTS))
    # Each call logs steps 0 to 999 again: the run's "step goes backwards" warning says nothing here.
    warnings.filterwarnings("ignore", message=".*goes backwards.*", category=RuntimeWarning)
    logger = lox.loggers.from_config("memory")
    state = logger.init(name="benchmark")
    plain = jax.jit(lox.nolog(programs.scan_one_scalar))
    tapped = logger.tap(programs.scan_one_scalar, state)
    keyed = jax.jit(programs.scan_one_scalar)  # the benchmarks run with the default "off"
    found = jax.jit(programs.scan_one_scalar)

    def run_plain():
        block(plain(xs))

    def run_tap():
        block(tapped(xs))
        jax.effects_barrier()

    def run_keyed():
        with logger.active(state):  # leaving the block waits for its events
            block(keyed(xs))

    def run_found():
        lox.set_default("console")
        try:
            with logger.active(state):
                block(found(xs))
        finally:
            lox.set_default("off")

    for run in (run_plain, run_tap, run_keyed, run_found):
        run()
    reps, rounds = 3, 5
    t = side_by_side({"none": run_plain, "tap": run_tap, "keyed": run_keyed, "found": run_found}, reps, rounds)
    per = lambda k: (t[k] - t["none"]) / EVENTS  # noqa: E731
    row("no logging", f"{t['none'] * 1e3:.2f} ms")
    row("logger.tap, per event", f"{per('tap') * 1e6:.1f} us")
    row("logger.active (default off: compiled for it), per event", f"{per('keyed') * 1e6:.1f} us",
        per("keyed") / per("tap"), "target <= 1.1 (against logger.tap)")
    row("logger.active (default console: found on arrival)", f"{per('found') * 1e6:.1f} us",
        per("found") / per("tap"), "target <= 1.1 (against logger.tap)")
    _own_path(xs)
    logger.finish(state)
    logged = logger.backends[0].logs(logger.runs()[0].run_id)
    calls = 3 * (1 + reps * rounds)  # three ways, each once to warm up, then timed
    assert logged["c"].shape[0] == EVENTS * calls, "every event reached the run once"


class _Spending:
    """A destination that spends a fixed time per event (what a Logger's
    `_receive_event` costs, about 20 us) and keeps nothing: lox's own path,
    without a router thread to compete with."""

    per_device_error = None

    def __init__(self, seconds: float):
        self.key = active_blocks.new_key()
        self.seconds = seconds

    def deliver(self, batch_ndim, event, took):
        start = time.perf_counter()
        while time.perf_counter() - start < self.seconds:
            pass

    def deliver_block(self, batch_ndim, logs):
        self.deliver(batch_ndim, logs, None)


def _own_path(xs):
    """The same scan to a destination that spends 20 us per event, against
    `lox.tap` to a callback that spends the same: the cost of lox's paths."""
    spending = _Spending(20e-6)
    in_block = jax.jit(programs.scan_one_scalar)
    tapped = lox.tap(programs.scan_one_scalar, lambda event: spending.deliver(0, event, None))
    plain = jax.jit(lox.nolog(programs.scan_one_scalar))

    def run_block():
        with active_blocks.activate(spending):
            block(in_block(xs))

    for run in (run_block, lambda: tapped(xs), lambda: block(plain(xs))):
        run()
    t = side_by_side({"none": lambda: block(plain(xs)), "tap": lambda: tapped(xs), "block": run_block}, reps=3)
    per = lambda k: (t[k] - t["none"]) / EVENTS  # noqa: E731
    row("lox.tap to a callback spending 20 us, per event", f"{per('tap') * 1e6:.1f} us")
    row("an active block to a destination spending 20 us", f"{per('block') * 1e6:.1f} us", per("block") / per("tap"),
        "(lox's own paths, no router thread)")
