"""lox's cost, as ratios against hand-written JAX run side by side in one process.

    python -m benchmarks            # everything (a few minutes on 2 CPU cores)
    python -m benchmarks steady tap # chosen sections

Every figure is a ratio of medians over interleaved repetitions, so that a noisy
shared machine slows both sides alike. Nothing here is asserted in the tests.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
import warnings

import jax
import jax.numpy as jnp

import lox
from benchmarks import programs
from benchmarks.timing import block, row, side_by_side

lox.set_default("off")


# --- sections ---------------------------------------------------------------------------
def steady():
    if programs.GPU:  # the step of the CPU figures is launch overhead on a GPU: a recurrent cell instead
        print(f"Steady state: {programs.STEPS:,}-step scan of a {programs.GPU_HIDDEN}-unit recurrent cell logging "
              "a scalar and a 64-vector per step")
        logged, _ = programs.rnn(programs.GPU_HIDDEN)
        hand_written, reps, rounds = programs.rnn_by_hand(programs.GPU_HIDDEN), 5, 9
    else:
        print(f"Steady state: {programs.STEPS:,}-step scan logging a scalar and a 64-vector per step")
        logged, hand_written, reps, rounds = programs.scan_logged, programs.scan_by_hand, 20, 15
    xs = jnp.linspace(0.0, 1.0, programs.STEPS)
    spooled = lox.spool(logged)
    jitted_spool = jax.jit(lox.spool(logged))
    by_hand = jax.jit(hand_written)
    for f in (spooled, jitted_spool, by_hand):
        block(f(xs))
    t = side_by_side(
        {"hand": lambda: block(by_hand(xs)), "spool": lambda: block(spooled(xs)),
         "jit(spool)": lambda: block(jitted_spool(xs))},
        reps=reps, rounds=rounds,
    )
    row("hand-written (values carried out as ys)", f"{t['hand'] * 1e3:.3f} ms")
    row("lox.spool(f)", f"{t['spool'] * 1e3:.3f} ms", t["spool"] / t["hand"], "target <= 1.02")
    row("jax.jit(lox.spool(f))", f"{t['jit(spool)'] * 1e3:.3f} ms", t["jit(spool)"] / t["hand"], "target <= 1.02")

    mem = lambda f: f.lower(xs).compile().memory_analysis().temp_size_in_bytes  # noqa: E731
    ours, ref = mem(jax.jit(lox.spool(logged))), mem(by_hand)
    row("compiled temporary memory, spool / hand-written", f"{ours} B / {ref} B", ours / max(ref, 1), "target <= 1")


def first_call():
    print("First call (trace + transform + lower + compile) of n equations, fresh functions each time")
    x = jnp.ones(64)
    for n in (1_000, 5_000):
        t = side_by_side(
            {"hand": lambda n=n: block(jax.jit(programs.chain_by_hand(n))(x)),
             "spool": lambda n=n: block(lox.spool(programs.chain_logged(n))(x))},
            reps=1, rounds=5, summary=min,
        )
        row(f"{n} equations: hand-written", f"{t['hand'] * 1e3:.1f} ms")
        row(f"{n} equations: lox.spool", f"{t['spool'] * 1e3:.1f} ms", t["spool"] / t["hand"], "target <= 1.1")


def transform():
    print("Transform cost (trace + rewrite + lower, no XLA compile), fresh functions each time")
    x = jnp.ones(64)
    per_eqn = []
    for n in (1_000, 5_000, 20_000):
        for name, logged, by_hand in (
            ("top-level logs", programs.chain_logged, programs.chain_by_hand),
            ("logs in a scan body", programs.scanned_chain_logged, programs.scanned_chain_by_hand),
        ):
            t = side_by_side(
                {"hand": lambda by_hand=by_hand, n=n: jax.jit(by_hand(n)).lower(x),
                 "spool": lambda logged=logged, n=n: lox.spool(logged(n)).lower(x)},
                reps=1, rounds=9 if n < 20_000 else 5, summary=min,
            )
            row(f"{n} eqns, {name}: hand-written", f"{t['hand'] * 1e3:.1f} ms")
            row(f"{n} eqns, {name}: lox.spool", f"{t['spool'] * 1e3:.1f} ms", t["spool"] / t["hand"], "target <= 1.2")
            if name == "top-level logs":
                per_eqn.append((n, t["spool"] / n))
    for n, s in per_eqn:
        row(f"lox.spool per equation at {n} eqns", f"{s * 1e6:.1f} us", None, "linear: flat across sizes")


def log_calls():
    print("Lowering jax.jit(lox.spool(f)) with n separate lox.log calls, each under its own key "
          "(10 equations per call)")
    x = jnp.ones(64)
    for n in (1_000, 5_000, 10_000, 20_000):
        t = side_by_side(
            {"hand": lambda n=n: jax.jit(programs.named_layers_by_hand(n)).lower(x),
             "spool": lambda n=n: jax.jit(lox.spool(programs.named_layers_logged(n))).lower(x)},
            reps=1, rounds=5 if n <= 5_000 else 3, summary=min,
        )
        row(f"{n} log calls: hand-written", f"{t['hand']:.2f} s")
        row(f"{n} log calls: lox.spool", f"{t['spool']:.2f} s", t["spool"] / t["hand"], "target <= 1.4")


def dispatch():
    print("Per-call dispatch of jax.jit(f) where f calls lox.log, the default 'off' (a step left with its logs)")
    x = jnp.ones(8)

    def logged(x):
        lox.log({"x": x.sum()}, step=1)
        return x * 2

    def by_hand(x):
        return x * 2

    plain, nolog, spooled, hand = jax.jit(logged), jax.jit(lox.nolog(logged)), jax.jit(lox.spool(logged)), \
        jax.jit(by_hand)
    for f in (plain, nolog, spooled, hand):
        block(f(x))
    calls = 2_000
    loop = lambda f: lambda: [f(x) for _ in range(calls)] and block(f(x))  # noqa: E731
    t = side_by_side({"hand": loop(hand), "nolog": loop(nolog), "plain": loop(plain), "spool": loop(spooled)},
                     reps=3, rounds=9)
    per_call = {name: seconds / (calls + 1) * 1e6 for name, seconds in t.items()}
    row("jax.jit(f without the log), by hand", f"{per_call['hand']:.2f} us")
    row("jax.jit(lox.nolog(f))", f"{per_call['nolog']:.2f} us", t["nolog"] / t["hand"])
    row("jax.jit(f) with lox.log, default off", f"{per_call['plain']:.2f} us", t["plain"] / t["hand"])
    row("  the same, as a ratio to jax.jit(lox.nolog(f))", "", t["plain"] / t["nolog"], "target <= 1.1")
    row("jax.jit(lox.spool(f)) (logs returned)", f"{per_call['spool']:.2f} us", t["spool"] / t["hand"])


def compile_growth():
    print("Compile time on CPU, elementwise chain of n ops logged every 10 ops (XLA duplicates the chain)")
    x = jnp.ones(64)
    for n in (500, 1_000, 2_000):
        hand = jax.jit(programs.sin_chain_by_hand(n)).lower(x)
        ours = lox.spool(programs.sin_chain_logged(n)).lower(x)
        t0 = time.perf_counter()
        hc = hand.compile()
        th = time.perf_counter() - t0
        t0 = time.perf_counter()
        oc = ours.compile()
        to = time.perf_counter() - t0
        row(f"n={n}: hand-written compile / sin ops in HLO", f"{th * 1e3:.0f} ms / {programs.count_sines(hc)}")
        row(f"n={n}: lox.spool compile / sin ops in HLO", f"{to * 1e3:.0f} ms / {programs.count_sines(oc)}", to / th)


def tap():
    print("Tap: per-event cost against a hand-written jax.debug.callback (1,000-step scan)")
    xs = jnp.arange(1_000.0)
    sink = []
    tapped = lox.tap(programs.scan_one_scalar, lambda e: sink.append(1))
    # The hand-written equivalent hands the user the same information: value and step.
    by_hand = jax.jit(programs.scan_debug_callback(lambda v, s: sink.append({"c": v, "step": s})))
    plain = jax.jit(lox.nolog(programs.scan_one_scalar))

    def run(f):
        block(f(xs))
        jax.effects_barrier()

    for f in (tapped, by_hand, plain):
        run(f)
    t = side_by_side({"hand": lambda: run(by_hand), "tap": lambda: run(tapped), "none": lambda: run(plain)}, reps=3)
    per = lambda k: (t[k] - t["none"]) / xs.shape[0]  # noqa: E731
    row("no logging", f"{t['none'] * 1e3:.2f} ms")
    row("hand-written jax.debug.callback, per event", f"{per('hand') * 1e6:.1f} us")
    row("lox.tap, per event", f"{per('tap') * 1e6:.1f} us", per("tap") / per("hand"), "target <= 1")


def buffer():
    if programs.GPU:  # two workloads: launch overhead only, and a step that does work
        workloads = (
            (f"a {programs.STEPS:,}-step scan of the CPU figures' `steady` step (a 64-vector: launch overhead only)",
             programs.scan_logged, programs.scan_buffered_by_hand, False, True),
            # Without the raw per-event callback: XLA's GPU compiler (JAX 0.11.2, H200) aborts on that
            # program (`Check failed: shape.IsArray() || shape.IsTuple()` in its fusion cost analysis).
            (f"a {programs.STEPS:,}-step scan of a {programs.GPU_HIDDEN}-unit recurrent cell",
             *programs.rnn(programs.GPU_HIDDEN), False, False),
        )
        reps, rounds = 1, 5
    else:
        small, medium = programs.rnn(256), programs.rnn(1024)
        workloads = (
            ("the 10,000-step scan of `steady` (~0.1 us of work per step)", programs.scan_logged,
             programs.scan_buffered_by_hand, False, True),
            ("a 10,000-step scan of a 256-unit recurrent cell (~2.5 us per step)", *small, False, True),
            ("a 10,000-step scan of a 1024-unit recurrent cell (~27 us per step)", *medium, True, True),
        )
        reps, rounds = 3, 7
    for title, logged, by_hand, quick, with_raw in workloads:
        _buffer(title, logged, by_hand, quick, reps, rounds, with_raw)


def _buffer(title, logged, by_hand, quick=False, reps=3, rounds=7, with_raw=True):
    """quick: a slow step, where per-event tap would take minutes: the
    buffered tap against no logging and spool only. with_raw=False: without
    the hand-written callback per event."""
    print(f"Buffered tap: {title}, a scalar and a 64-vector per step to a callback")
    xs = jnp.linspace(0.0, 1.0, programs.STEPS)
    received = [0]

    def count_block(block):  # what a sink does at least: look at what it got
        received[0] += block["loss"].shape[0]

    def count_event(event):  # the same, for one `lox.Event`
        received[0] += "loss" in event

    def count_raw(*values):
        received[0] += 1

    def count_hand_buffer(loss, h, step, count):
        received[0] += int(count)

    def raw(xs):  # the hand-written per-event callback: `logged` with jax.debug.callback for lox.log
        def log(data, step):
            jax.debug.callback(count_raw, *data.values(), step, ordered=True)

        original, lox.log = lox.log, log
        try:
            return jax.make_jaxpr(logged)(xs)
        finally:
            lox.log = original

    raw_jaxpr = raw(xs)
    candidates = {
        "none": jax.jit(lox.nolog(logged)),
        "spool": lox.spool(logged),
        "raw": jax.jit(lambda xs: jax.core.eval_jaxpr(raw_jaxpr.jaxpr, raw_jaxpr.consts, xs)),
        "tap": lox.tap(logged, count_event),
        "hand100": jax.jit(by_hand(count_hand_buffer, 100)),
    }
    sizes = (10, 100, 1000)
    for size in sizes:
        candidates[f"buffer{size}"] = lox.tap(logged, count_block, buffer=size)
    if quick:
        sizes = (100,)
        candidates = {k: candidates[k] for k in ("none", "spool", "buffer100")}
    if not with_raw:
        del candidates["raw"]

    def run(f):
        block(f(xs))
        jax.effects_barrier()

    for name, f in candidates.items():
        received[0] = 0
        run(f)
        assert name in ("none", "spool") or received[0] == programs.STEPS, (name, received[0])
    t = side_by_side({name: (lambda f=f: run(f)) for name, f in candidates.items()},
                     reps=1 if quick else reps, rounds=5 if quick else rounds)
    base = t["none"]
    row("no logging (lox.nolog)", f"{base * 1e3:.2f} ms")
    row("lox.spool (values kept on device)", f"{t['spool'] * 1e3:.2f} ms", t["spool"] / base)
    if not quick:
        if with_raw:
            row("raw jax.debug.callback per event", f"{t['raw'] * 1e3:.2f} ms", t["raw"] / base)
        else:
            row("raw jax.debug.callback per event", "not run", None, "XLA aborts compiling it here")
        row("lox.tap per event", f"{t['tap'] * 1e3:.2f} ms", t["tap"] / base)
        row("hand-written buffer of 100 + debug.callback", f"{t['hand100'] * 1e3:.2f} ms", t["hand100"] / base)
    for size in sizes:
        name = f"buffer{size}"
        target = "target <= 1.1" if size == 100 else ""
        row(f"lox.tap(buffer={size})", f"{t[name] * 1e3:.2f} ms", t[name] / base, target)
    row("lox.tap(buffer=100) / lox.spool (the floor: same outputs, no host calls)", "", t["buffer100"] / t["spool"])
    if not quick:
        row("lox.tap(buffer=100) / hand-written buffer of 100", "", t["buffer100"] / t["hand100"])


def while_loops():
    for title, step in (
        ("the step of `steady` (~0.1 us of work)", programs._step),
        ("a 256-unit recurrent cell (~2.5 us per step)", programs.rnn_step),
    ):
        print(f"Spooled while loop: {programs.STEPS:,} steps of {title}, a scalar and a 64-vector per step, "
              f"max_events={programs.STEPS:,}")
        xs = jnp.linspace(0.0, 1.0, programs.STEPS)
        n = programs.STEPS
        candidates = {
            "none": jax.jit(lox.nolog(programs.while_logged(step))),
            "hand": jax.jit(programs.while_by_hand(step, programs.STEPS)),
            "spool": lox.spool(programs.while_logged(step), max_events=programs.STEPS),
        }
        _, logs = candidates["spool"](xs, n)
        _, by_hand, count = candidates["hand"](xs, n)
        assert int(logs.count["loss"]) == int(count) == n
        t = side_by_side({name: (lambda f=f, xs=xs, n=n: block(f(xs, n))) for name, f in candidates.items()},
                         reps=5, rounds=9)
        row("no logging (lox.nolog)", f"{t['none'] * 1e3:.2f} ms")
        row("hand-written buffers in the loop's carry", f"{t['hand'] * 1e3:.2f} ms", t["hand"] / t["none"], "vs none")
        row(f"lox.spool(f, max_events={programs.STEPS:_})", f"{t['spool'] * 1e3:.2f} ms", t["spool"] / t["hand"],
            "vs hand-written")


def devices():
    print("Several devices: tap of the `steady` scan (1,000 steps) on 8 CPU devices, per event")
    if jax.device_count() < 8:
        # The device count is fixed when JAX starts: measure in a process of its own.
        import os
        import subprocess

        flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
        out = subprocess.run([sys.executable, "-m", "benchmarks", "devices"], env={**os.environ, "XLA_FLAGS": flags},
                             capture_output=True, text=True, check=True).stdout
        print("\n".join(out.splitlines()[2:]))  # without the header lines printed above
        return
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((8,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    steps = 1_000
    xs = jax.device_put(jnp.linspace(0.0, 1.0, steps * 8).reshape(steps, 8), NamedSharding(mesh, P(None, "d")))
    received = [0]

    def on_event(*args):
        received[0] += 1

    def sharded(xs):  # each step mixes the 8 shards of its row into the scalar the scan carries
        def body(carry, ix):
            i, x = ix
            carry, loss = programs._step(carry, jnp.mean(x))
            lox.log({"loss": loss, "h": carry[1]}, step=i)
            return carry, None

        return jax.lax.scan(body, (0.0, jnp.zeros(64)), (jnp.arange(steps), xs))[0]

    def raw(xs):  # unordered: an ordered callback is refused on 8 devices
        def body(carry, ix):
            i, x = ix
            carry, loss = programs._step(carry, jnp.mean(x))
            jax.debug.callback(on_event, loss, carry[1], i, ordered=False)
            return carry, None

        return jax.lax.scan(body, (0.0, jnp.zeros(64)), (jnp.arange(steps), xs))[0]

    candidates = {"none": jax.jit(lox.nolog(sharded)), "spool": lox.spool(sharded), "raw": jax.jit(raw),
                  "tap": lox.tap(sharded, on_event), "buffer100": lox.tap(sharded, on_event, buffer=100)}

    def run(f):
        block(f(xs))
        jax.effects_barrier()

    for f in candidates.values():
        run(f)
    t = side_by_side({name: (lambda f=f: run(f)) for name, f in candidates.items()}, reps=3, rounds=7)
    per = lambda k: (t[k] - t["none"]) / steps  # noqa: E731
    row("no logging", f"{t['none'] * 1e3:.2f} ms")
    row("lox.spool", f"{t['spool'] * 1e3:.2f} ms", t["spool"] / t["none"])
    row("raw jax.debug.callback (unordered), per event", f"{per('raw') * 1e6:.1f} us")
    row("lox.tap (ordered by data), per event", f"{per('tap') * 1e6:.1f} us", per("tap") / per("raw"), "vs raw")
    row("lox.tap(buffer=100), whole loop", f"{t['buffer100'] * 1e3:.2f} ms", t["buffer100"] / t["none"], "vs none")


def arrow():
    print("Arrow: 1,000,000 scalar float32 events (4 keys x 250,000, with a step) written to a Parquet file")
    import os  # here, so that the other sections run without pyarrow
    import tempfile

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lox_backends.runstore import writer

    n, keys = 250_000, ["loss", "accuracy", "lr", "grad_norm"]
    rng = np.random.default_rng(0)
    values = {k: rng.standard_normal(n).astype(np.float32) for k in keys}
    steps = np.arange(n, dtype=np.int32)
    logs = lox.logdict(values, steps={"step": dict.fromkeys(keys, steps)})

    def by_hand(path):
        # What one writes without lox: the same arrays in a key / step / value table.
        key = pa.DictionaryArray.from_arrays(
            pa.array(np.repeat(np.arange(len(keys), dtype=np.int32), n)), pa.array(keys, pa.string()))
        table = pa.table({"key": key, "step": np.concatenate([steps] * len(keys)),
                          "value": np.concatenate([values[k] for k in keys])})
        pq.write_table(table, path)

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "logs.parquet")
        t = side_by_side({"hand": lambda: by_hand(path), "lox": lambda: writer.write_table(logs.to_arrow(), path),
                          "to_arrow": lambda: logs.to_arrow()}, reps=3)
    table = logs.to_arrow()
    back = side_by_side({"from_arrow": lambda: lox.logdict.from_arrow(table)}, reps=3)["from_arrow"]
    row("hand-built key/step/value table + write_table", f"{t['hand'] * 1e3:.1f} ms")
    row("logdict.to_arrow + the parquet backend's write_table", f"{t['lox'] * 1e3:.1f} ms", t["lox"] / t["hand"],
        "rate >= 0.8 of direct (ratio <= 1.25)")
    row("logdict.to_arrow alone", f"{t['to_arrow'] * 1e3:.1f} ms")
    row("logdict.from_arrow of that table", f"{back * 1e3:.1f} ms")


def logger():
    print(f"Logger: a training loop (MLP {programs.WIDTH}x{programs.WIDTH}, batch {programs.BATCH}) calling "
          "logger.spool to Parquet every step")
    import shutil
    import tempfile

    key = jax.random.key(0)
    params = programs.mlp_init(key)
    x = jax.random.normal(key, (programs.BATCH, programs.WIDTH))
    y = jnp.sin(x[:, :1])
    steps = 200
    plain = jax.jit(programs.train_step_plain)
    spool_only = lox.spool(programs.train_step_logged)  # the transform alone: its logs are left on the device
    with tempfile.TemporaryDirectory() as folder:
        saver = lox.loggers.SaveLogger(folder)
        state = saver.init(key)
        logged = saver.spool(programs.train_step_logged, state)

        def loop(step_fn):
            p = params
            for i in range(steps):
                p = step_fn(p, x, y, i)
            block(p)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # each repetition logs steps 0-199 again
            spooled = lambda p, x, y, i: spool_only(p, x, y, i)[0]  # noqa: E731
            loop(plain), loop(logged), loop(spooled)
            saver.flush()
            t = side_by_side({"hand": lambda: loop(plain), "lox": lambda: (loop(logged), saver.flush()),
                              "spool": lambda: loop(spooled)}, reps=1, rounds=7)
        saver.finish(state)
        rows = lox.load(folder)
    (logs,) = rows.values()
    row("without logging, per step", f"{t['hand'] / steps * 1e6:.0f} us")
    row("logger.spool to Parquet every step (flushed), per step", f"{t['lox'] / steps * 1e6:.0f} us",
        t["lox"] / t["hand"], "throughput >= 97% (ratio <= 1.031)")
    row("lox.spool alone (logs left on the device), per step", f"{t['spool'] / steps * 1e6:.0f} us",
        t["spool"] / t["hand"])
    row("steps saved and read back", f"{logs['loss'].shape[0]}")

    print("Logger: tapped events under vmap to Parquet, per event, 64 seeds against 1 "
          "(200-step scan, 1 scalar per step)")
    xs = jnp.linspace(0.0, 1.0, 200)
    folder = tempfile.mkdtemp()
    memory = lox.loggers.SaveLogger(folder)
    one, many = memory.init(key), jax.vmap(memory.init)(jax.random.split(key, 64))
    tap_one = jax.jit(lambda s, xs: memory.tap(programs.scan_one_scalar, s)(xs))
    xs_many = xs + jnp.arange(64.0)[:, None]  # each seed its own data: the scan itself is batched
    tap_many = jax.jit(jax.vmap(lambda s, xs: memory.tap(programs.scan_one_scalar, s)(xs)))
    none_one = jax.jit(lox.nolog(programs.scan_one_scalar))
    none_many = jax.jit(jax.vmap(lox.nolog(programs.scan_one_scalar)))
    raw_one = jax.jit(programs.scan_debug_callback(lambda v, s: None))
    raw_many = jax.jit(jax.vmap(programs.scan_debug_callback(lambda v, s: None)))
    user_one = jax.jit(lox.tap(programs.scan_one_scalar, lambda event: None))
    user_many = jax.jit(jax.vmap(lox.tap(programs.scan_one_scalar, lambda event: None)))
    batched_one = jax.jit(lox.tap(programs.scan_one_scalar, lambda event, took: None, batched=True))
    batched_many = jax.jit(jax.vmap(lox.tap(programs.scan_one_scalar, lambda event, took: None, batched=True)))
    candidates = {"1": (tap_one, one, xs), "64": (tap_many, many, xs_many), "none1": (none_one, xs),
                  "none64": (none_many, xs_many), "raw1": (raw_one, xs), "raw64": (raw_many, xs_many),
                  "user1": (user_one, xs), "user64": (user_many, xs_many),
                  "batched1": (batched_one, xs), "batched64": (batched_many, xs_many)}
    # The cost to the training loop: until the program has run and handed every
    # event to the logger; the logger's writer thread is drained between
    # repetitions, outside the timing, and its own throughput reported below.
    times = {name: [] for name in candidates}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # each repetition logs steps 0-199 again
        for _ in range(7):
            for name, (f, *args) in candidates.items():
                memory.flush()
                gc.collect()
                t0 = time.perf_counter()
                block(f(*args))
                jax.effects_barrier()
                times[name].append(time.perf_counter() - t0)
        t = {name: statistics.median(ts) for name, ts in times.items()}
        per = lambda a, b: (t[a] - t[b]) / xs.shape[0]  # noqa: E731
        row("raw jax.debug.callback, 1 seed, per event", f"{per('raw1', 'none1') * 1e6:.1f} us")
        row("raw jax.debug.callback, 64 seeds under vmap, per event", f"{per('raw64', 'none64') * 1e6:.1f} us",
            per("raw64", "none64") / per("raw1", "none1"))
        row("lox.tap (a callback per element), 1 seed, per event", f"{per('user1', 'none1') * 1e6:.1f} us")
        row("lox.tap (a callback per element), 64 seeds, per event", f"{per('user64', 'none64') * 1e6:.1f} us",
            per("user64", "none64") / per("user1", "none1"))
        row("lox.tap(batched=True), 1 seed, per event", f"{per('batched1', 'none1') * 1e6:.1f} us")
        row("lox.tap(batched=True), 64 seeds, per event", f"{per('batched64', 'none64') * 1e6:.1f} us",
            per("batched64", "none64") / per("batched1", "none1"), "target <= 2")
        row("logger.tap, 1 seed, per event", f"{per('1', 'none1') * 1e6:.1f} us")
        row("logger.tap, 64 seeds under vmap, per event", f"{per('64', 'none64') * 1e6:.1f} us",
            per("64", "none64") / per("1", "none1"), "target <= 2")
        memory.flush()
        t0 = time.perf_counter()
        block(tap_many(many, xs_many))
        memory.flush()
        writer = time.perf_counter() - t0
    row("events written per second, 64 runs (until flushed)", f"{64 * xs.shape[0] / writer:,.0f} /s")
    memory.close()
    shutil.rmtree(folder)


def storage():
    seeds, seconds = 1024, 16.0
    print(f"Storage: {seeds:,} vmapped seeds logging to parquet for {seconds:g} s (a spooled call per step of "
          "a small tanh network per seed, 2 scalars per seed and step)")
    import pathlib
    import shutil
    import tempfile

    import numpy as np
    import pyarrow.dataset as ds

    from lox_backends.runstore import reader

    x = jax.random.normal(jax.random.key(1), (8, 64))

    def train_step(w, i):
        h = jnp.tanh(jnp.tanh(x @ w) @ w)
        lox.log({"loss": jnp.mean(h**2), "w0": w[0, 0]}, step=i)
        return w * 0.999 + 1e-3 * jnp.mean(h)

    folder = tempfile.mkdtemp()
    try:
        logger = lox.loggers.SaveLogger(folder)
        states = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), seeds))
        step = jax.jit(jax.vmap(lambda state, w, i: logger.spool(train_step, state)(w, i), in_axes=(0, 0, None)))
        w = jax.random.normal(jax.random.key(2), (seeds, 64, 64)) / 8
        start, i = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            w = step(states, w, i)
            i += 1
        block(w)
        last_call = time.perf_counter()
        logger.finish(states)
        finished = time.perf_counter() - last_call
        files = sorted(str(p) for p in pathlib.Path(folder).rglob("batch-*.parquet"))
        # lox 0.1 wrote one file per run and flush: the (run, file) pairs the files hold now.
        before = sum(len(reader.runs_in(path)) for path in files)
        t = side_by_side({"pyarrow": lambda: ds.dataset(folder, format="parquet").to_table(),
                          "lox": lambda: lox.load(folder)}, reps=1, rounds=9)
        loaded = lox.load(folder)
        rows = sum(int(np.size(logs["loss"])) for logs in loaded.values())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    row("steps logged per seed", f"{i:,}")
    row("loss events read back (all seeds)", f"{rows:,}", None, f"= {seeds} x {i}" if rows == seeds * i else "LOST")
    row("batch files written (one per run and flush before)", f"{len(files):,} ({before:,})", len(files) / before,
        "<= 1/32 of before (ratio <= 0.031)")
    row("finish, after the last call", f"{finished:.2f} s", None, "<= 2 s")
    row("pyarrow.dataset(DIR).to_table()", f"{t['pyarrow'] * 1e3:.0f} ms")
    row("lox.load(DIR), every run as a logdict", f"{t['lox'] * 1e3:.0f} ms", t["lox"] / t["pyarrow"],
        "<= 1.5x pyarrow")


def trackers():
    from benchmarks.trackers import trackers

    trackers()


def buckets():
    from benchmarks.buckets import buckets  # moto's S3 server only when asked for

    try:
        buckets()
    except ModuleNotFoundError as error:
        print(f"  buckets: not installed ({error.name}); pip install 'jax-lox[test]' (moto[server])")


def tensorboard():
    from benchmarks.trackers import tensorboard  # tensorboardX only when asked for

    try:
        tensorboard()
    except ModuleNotFoundError as error:
        print(f"  tensorboard: not installed ({error.name}); pip install 'jax-lox[tensorboard]'")


def imports():
    print("`import lox` against `import jax`: fresh processes, interleaved, median of 7 each")
    import subprocess  # here: only this section starts processes

    def fresh(statement: str) -> float:
        code = f"import time; t = time.perf_counter(); {statement}; print(time.perf_counter() - t)"
        return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)

    times: dict[str, list[float]] = {"jax": [], "lox": [], "lox.loggers": []}
    for _ in range(7):
        times["jax"].append(fresh("import jax"))
        times["lox"].append(fresh("import lox"))
        times["lox.loggers"].append(fresh("import lox.loggers"))
    jax_s, lox_s, loggers_s = (statistics.median(times[name]) for name in ("jax", "lox", "lox.loggers"))
    row("import jax", f"{jax_s * 1e3:.0f} ms")
    row("import lox", f"+{(lox_s - jax_s) * 1e3:.0f} ms", lox_s / jax_s, "target <= import jax + 100 ms")
    row("import lox.loggers (the Logger layer, pyarrow)", f"+{(loggers_s - jax_s) * 1e3:.0f} ms", loggers_s / jax_s)


def media():
    from benchmarks.media import media  # image batches in the logger's loop, on-device histograms

    media()


def active():
    from benchmarks.active import active  # `with logger.active(state):` against logger.tap, per event

    active()


def system():
    from benchmarks.system import system  # the system metrics' sampler, beside a loop

    system()


def runs():
    from benchmarks.runs import runs  # writes 1,024 runs, and starts an S3 server

    runs()


def frameworks():
    from benchmarks.frameworks import frameworks  # flax, equinox and optax only when asked for

    frameworks()


SECTIONS = {"steady": steady, "first_call": first_call, "transform": transform, "compile": compile_growth,
            "log_calls": log_calls, "dispatch": dispatch, "tap": tap, "buffer": buffer, "while": while_loops,
            "devices": devices, "arrow": arrow, "logger": logger, "storage": storage, "buckets": buckets,
            "trackers": trackers, "tensorboard": tensorboard, "media": media, "active": active,
            "system": system, "runs": runs, "frameworks": frameworks,
            "imports": imports}


def main(argv: list[str]) -> None:
    chosen = argv or list(SECTIONS)
    unknown = [c for c in chosen if c not in SECTIONS]
    if unknown:
        raise SystemExit(f"unknown section {unknown[0]!r}: choose from {', '.join(SECTIONS)}")
    device = jax.devices()[0]
    print(f"JAX {jax.__version__} on {device.platform} ({device.device_kind}); "
          "ratio = lox / hand-written (lower is better)")
    for name in chosen:
        try:
            SECTIONS[name]()
        except ModuleNotFoundError as error:  # a section's package (a tracker, moto, tensorboardX) is missing
            print(f"  {name}: skipped, {error.name} is not installed")
        print()


if __name__ == "__main__":
    main(sys.argv[1:])
