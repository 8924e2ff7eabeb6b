"""System metrics (``python -m benchmarks system``): what one sample costs the
sampler's thread (host CPU and memory, the process's RSS, each local device's
`memory_stats()`), and a real Logger with ``system=0.2`` beside a jitted loop
that logs every step, read back: the keys it wrote (on a GPU, each device's
memory in use and peak) and the loop's steps per second with and without the
sampler, side by side.
"""

from __future__ import annotations

import time
import timeit

import jax
import jax.numpy as jnp
import psutil

import lox
from benchmarks.timing import row
from lox_backends.logger import system as sampling

SECONDS = 2.0  # of the loop, with and without the sampler, alternated twice


def system():
    print("System metrics: one sample, and a Logger sampling every 0.2 s beside a jitted loop")
    process, devices = psutil.Process(), jax.local_devices()
    sampling.sample(process, devices)
    n = 200
    per = timeit.timeit(lambda: sampling.sample(process, devices), number=n) / n
    row(f"one sample (host + {len(devices)} {devices[0].platform} devices), sampler thread", f"{per * 1e6:.0f} us")
    rates = {None: [], 0.2: []}
    for round_ in range(2):
        for every in rates:
            rates[every].append(_steps_per_second(every, report=round_ == 0))
    off, on = max(rates[None]), max(rates[0.2])
    row("loop without the sampler", f"{off:,.0f} steps/s")
    row("loop with system=0.2", f"{on:,.0f} steps/s", off / on, "target <= 1.01 (time per step)")


def _steps_per_second(every: float | None, report: bool) -> float:
    logger = lox.loggers.from_config("memory", system=every)
    state = logger.init(name="system")
    width = 2048 if jax.devices()[0].platform != "cpu" else 256

    def epoch(w, start):
        def step(w, i):
            w = jnp.tanh(w @ w * 1e-3)
            lox.log({"loss": w.mean()}, step=start + i)
            return w, None

        return jax.lax.scan(step, w, jnp.arange(50))[0]

    call = jax.jit(logger.spool(epoch, state))
    w = call(jnp.ones((width, width)), 0)
    jax.block_until_ready(w)
    start, began = 50, time.perf_counter()
    while time.perf_counter() - began < SECONDS:
        w = call(w, start)
        start += 50
    jax.block_until_ready(w)
    elapsed = time.perf_counter() - began
    logger.finish(state)
    logs = logger.backends[0].logs()
    keys = sorted(k for k in logs if k.startswith("system/"))
    if every is not None and report:
        devices = [k for k in keys if k.startswith("system/device")]
        row("keys written", f"{len(keys)}, of which {len(devices)} of devices")
        for key in devices[:2]:
            row(f"  {key}, last", f"{float(logs[key][-1]) / 2**20:,.1f} MiB")
    logger.close()
    return (start - 50) / elapsed
