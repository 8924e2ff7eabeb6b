"""What the trackers' tests log of every kind, and what a tracker should show of
it, worked out by hand (NumPy), independently of lox's encoders.

`inputs(step)` holds the arrays of two seeds (leading axis); `log_every_kind`
logs one seed's, inside `jit`, `vmap`, spool or tap; `log_text` logs text from
Python. Pixels are whole numbers of 255ths and samples of 32767ths, so that what
a tracker shows (uint8 pixels, int16 samples) is exactly the integers drawn.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

import lox

SEEDS = 2
N, H, W, T, L = 3, 4, 5, 3, 64  # images per batch, height, width, frames, samples
VIDEOS = 2  # videos in the batch of videos
FPS, RATE = 5, 8000
BINS, RANGE = 6, (-1.0, 1.0)
VALUES = 100  # values the histogram counts
LEVELS = np.array([0, 63, 126, 189, 252], np.uint8)  # few colours: a GIF's palette holds them exactly


def inputs(step: int) -> dict[str, np.ndarray]:
    """The integers behind what is logged at `step`, for each seed (axis 0)."""
    rng = np.random.default_rng(step)
    frames = LEVELS[rng.integers(0, len(LEVELS), (SEEDS, VIDEOS, T, H, W, 3))]
    frames[:, :, :, 0, 0] = np.arange(T)[None, None, :, None] * 60  # no two frames alike (a GIF merges those)
    clip = LEVELS[rng.integers(0, len(LEVELS), (SEEDS, T, H, W, 1))]
    clip[:, :, 0, 0] = np.arange(T)[None, :, None] * 60
    return {
        "pixels": rng.integers(0, 256, (SEEDS, N, H, W, 3)).astype(np.uint8),
        "mask": rng.integers(0, 256, (SEEDS, H, W)).astype(np.uint8),
        "frames": frames,
        "clip": clip,
        "sound": rng.integers(-32767, 32768, (SEEDS, L, 2)).astype(np.int16),
        "values": rng.uniform(-0.2, 0.9, (SEEDS, VALUES)).astype(np.float32),
    }


def log_every_kind(x: dict, step: int) -> None:
    """Log one seed's `inputs` as every kind, and their mean as a scalar."""
    lox.log({
        "samples": lox.image(x["pixels"].astype(jnp.float32) / 255),  # a batch (N, H, W, 3) of floats
        "mask": lox.image(x["mask"]),  # one grey image (H, W) of uint8
        "rollouts": lox.video(x["frames"], fps=FPS),  # a batch of videos (VIDEOS, T, H, W, 3) of uint8
        "clip": lox.video(x["clip"].astype(jnp.float32) / 255, fps=FPS),  # one grey video (T, H, W, 1)
        "sound": lox.audio(x["sound"].astype(jnp.float32) / 32767, rate=RATE),  # stereo (L, 2)
        "weights": lox.histogram(x["values"], bins=BINS, range=RANGE),
        "loss": jnp.mean(x["values"]),
    }, step=step)


def texts(step: int) -> dict:
    """Text for `logger.log` with both seeds' state: one str for both, and
    each seed's list (n,) and table (rows, cols)."""
    return {
        "note": f"step **{step}**",
        "lines": np.array([[f"seed {s} line {i}" for i in range(2)] for s in range(SEEDS)]),
        "table": np.array([[[f"{s}:{r},{c}" for c in range(3)] for r in range(2)] for s in range(SEEDS)]),
    }


def log_text(logger, states, step: int) -> None:
    logger.log(states, texts(step), step=step)


def histogram(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The counts and edges `lox.histogram(values, bins=BINS, range=RANGE)` gives, by NumPy."""
    return np.histogram(values.astype(np.float64), bins=BINS, range=RANGE)
