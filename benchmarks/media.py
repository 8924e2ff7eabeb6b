"""The cost of logging media (``python -m benchmarks media``), side by side in one process.

* An image batch (16x64x64x3, floats) generated from the model and logged every
  100 steps of the logger benchmark's training loop (`programs.train_step_logged`:
  an MLP 512x512, batch 512, `logger.spool` to Parquet every step), against the
  same loop without the images. The step that logs the images is a second
  spooled function, chosen in Python (``if i % 100 == 0``), as a training loop
  does. 100-step segments with and without the images alternate, each timed
  until its logs are flushed to the Parquet files.
* `lox.histogram` of a 1,000,000-element array: the bytes a spooled call hands
  to the host (counts, edges, step) against the array's own, and its time
  against `jnp.histogram` with the same bins, both jitted, alternated.
"""

from __future__ import annotations

import gc
import math
import statistics
import tempfile
import time
import warnings

import jax
import jax.numpy as jnp

import lox
from benchmarks import programs
from benchmarks.timing import block, row, side_by_side

SAMPLES = (16, 64, 64, 3)
EVERY = 100
HISTOGRAM_SIZE, BINS = 1_000_000, 64


def samples(params, x):
    """A batch of images "generated" by the model: hidden activations mapped to [0, 1]."""
    h = jnp.tanh(x @ params["w1"]).reshape(-1)[: math.prod(SAMPLES)]
    return (h.reshape(SAMPLES) + 1.0) / 2.0


def train_step_logged_images(params, x, y, i):
    """`programs.train_step_logged`, also logging a batch of generated samples as images."""
    lox.log({"samples": lox.image(samples(params, x))}, step=i)
    return programs.train_step_logged(params, x, y, i)


def images_in_training(segments: int = 21) -> None:
    print(f"Media: a {'x'.join(map(str, SAMPLES))} image batch logged every {EVERY} steps of the logger "
          f"benchmark's loop (logger.spool to Parquet every step), {EVERY}-step segments alternated")
    key = jax.random.key(0)
    params = programs.mlp_init(key)
    x = jax.random.normal(key, (programs.BATCH, programs.WIDTH))
    y = jnp.sin(x[:, :1])
    with tempfile.TemporaryDirectory() as folder:
        saver = lox.loggers.SaveLogger(folder)
        state = saver.init(key)
        logged = saver.spool(programs.train_step_logged, state)
        with_images = saver.spool(train_step_logged_images, state)

        def segment(images: bool):
            """`EVERY` steps, the first logging the images or not, until their logs are written:
            segments alternate, so that a busy machine slows both sides alike."""
            p = params
            for i in range(EVERY):
                p = (with_images if images and i == 0 else logged)(p, x, y, i)
            block(p)
            saver.flush()

        wall: dict[bool, list[float]] = {False: [], True: []}
        cpu: dict[bool, list[float]] = {False: [], True: []}  # this process's CPU time, all its threads
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # each segment logs the same steps again
            segment(False), segment(True)  # compiled, files opened
            for _ in range(segments):
                for images in (False, True):
                    gc.collect()
                    t0, c0 = time.perf_counter(), time.process_time()
                    segment(images)
                    wall[images].append(time.perf_counter() - t0)
                    cpu[images].append(time.process_time() - c0)
        saver.finish(state)
        (logs,) = lox.load(folder).values()
    t = {name: statistics.median(wall[images]) for name, images in (("scalars", False), ("images", True))}
    c = {name: statistics.median(cpu[images]) for name, images in (("scalars", False), ("images", True))}
    row("scalars every step, per step", f"{t['scalars'] / EVERY * 1e6:.0f} us")
    row(f"+ images every {EVERY} steps, per step", f"{t['images'] / EVERY * 1e6:.0f} us",
        t["images"] / t["scalars"], "throughput >= 98% (ratio <= 1.02)")
    row("  the same in CPU time of the process (all threads)", f"{c['images'] / EVERY * 1e6:.0f} us",
        c["images"] / c["scalars"], f"scalars only: {c['scalars'] / EVERY * 1e6:.0f} us")
    row("bytes of one image event (float32)", f"{math.prod(SAMPLES) * 4:,} B")
    row("image events saved and read back", f"{len(logs['samples'])}", None, f"= {segments + 1} segments")


def histogram_cost(rounds: int = 15, reps: int = 20) -> None:
    print(f"Media: lox.histogram of a {HISTOGRAM_SIZE:,}-element float32 array, {BINS} bins, "
          "against jnp.histogram (both jitted)")
    x = jax.random.normal(jax.random.key(0), (HISTOGRAM_SIZE,))

    def logged(x):
        lox.log({"weights": lox.histogram(x, bins=BINS)}, step=0)

    _, logs = jax.jit(lox.spool(logged))(x)
    moved = sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(logs))  # every array the program returns for it
    row("the array", f"{x.nbytes:,} B")
    row("what a spooled lox.histogram hands to the host", f"{moved:,} B", None,
        f"{moved / x.nbytes:.3%} of the array (target <= 1%)")

    ours = jax.jit(lambda x: lox.histogram(x, bins=BINS))
    ref = jax.jit(lambda x: jnp.histogram(x, bins=BINS))
    spooled = jax.jit(lox.spool(logged))
    mine, theirs = ours(x), ref(x)
    assert (mine.counts == theirs[0]).all(), "lox.histogram counts differ from jnp.histogram's"
    for f in (ours, ref, spooled):
        block(f(x))
    t = side_by_side({"jnp": lambda: block(ref(x)), "lox": lambda: block(ours(x)),
                      "spool": lambda: block(spooled(x))}, reps=reps, rounds=rounds)
    row("jax.jit(jnp.histogram)", f"{t['jnp'] * 1e3:.3f} ms")
    row("jax.jit(lox.histogram)", f"{t['lox'] * 1e3:.3f} ms", t["lox"] / t["jnp"], "target <= 1.1")
    row("jax.jit(lox.spool(f)), f logging it", f"{t['spool'] * 1e3:.3f} ms", t["spool"] / t["jnp"])


def media() -> None:
    images_in_training()
    print()
    histogram_cost()
