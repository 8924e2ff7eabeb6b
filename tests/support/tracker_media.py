"""Media that the MLflow and Neptune tests log, and what those trackers must
show of it, computed here by hand with NumPy (grids, uint8 pixels, int16
samples, histogram counts), independently of lox's encoders.

`log_media(seed, i)` logs, inside jit/scan/vmap, at step i:

* ``samples``: a batch of 2 RGB uint8 images (H x W) — shown as one grid, the
  two side by side with a black 1-pixel column between them;
* ``grey``: one (H, W) float image in [0, 1] — uint8 ``round(255 x)``;
* ``rollout``: a (3, H, W, 1) uint8 video at 5 fps — a GIF of 3 frames;
* ``rollouts``: a batch of 2 such videos — one GIF whose frames are grids;
* ``sound``: a (64,) float clip at 8000 Hz (multiples of 1/16 in [-1, 1]) —
  16-bit WAV of ``round(32767 x)``;
* ``weights``: the histogram of 50 integers in [0, 16], 5 bins;
* ``loss``: a scalar, which stays a metric.

`media_chunk(seed, start)` logs them at steps ``start ... start + MEDIA_STEPS - 1`` in a scan.

`log_text(logger, states, i)` logs, from Python, a caption per run (a str) and
a 2 x 2 table of strings.
"""

import io
import json

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image, ImageSequence

import lox

H, W = 3, 4
RATE = 8000
FPS = 5
BINS = 5
KEYS = ("samples", "grey", "rollout", "rollouts", "sound", "weights")


def _k(seed, i):
    return seed * 7 + i


def log_media(seed, i):
    k = _k(seed, i)
    base = jnp.arange(2 * H * W * 3).reshape(2, H, W, 3)
    frames = jnp.arange(3 * H * W).reshape(3, H, W, 1)
    lox.log({
        "samples": lox.image(((base * 5 + k * 11) % 256).astype(jnp.uint8)),
        "grey": lox.image(((jnp.arange(H * W).reshape(H, W) * 3 + k) % 256).astype(jnp.float32) / 255),
        "rollout": lox.video(((frames * 9 + k) % 256).astype(jnp.uint8), fps=FPS),
        "rollouts": lox.video(((jnp.stack([frames, frames + 40]) * 7 + k) % 256).astype(jnp.uint8), fps=FPS),
        "sound": lox.audio((((jnp.arange(64) * (k + 1)) % 29 - 14) / 16).astype(jnp.float32), rate=RATE),
        "weights": lox.histogram(((jnp.arange(50) * (k + 3)) % 17).astype(jnp.float32), bins=BINS),
        "loss": k * 0.5,
    }, step=i)


MEDIA_STEPS = 3  # steps of one media_chunk


def media_chunk(seed, start):
    def step(carry, i):
        log_media(seed, i)
        return carry, None

    jax.lax.scan(step, 0, start + jnp.arange(MEDIA_STEPS))


def log_batches(logger, key, seeds, calls):
    """Media (`media_chunk`) and text (`log_text`) of `seeds` vmapped runs of
    `logger`, `MEDIA_STEPS` steps per call, one batch file per call; then the runs finish."""
    states = jax.vmap(lambda k: logger.init(k))(jax.random.split(key, seeds))
    chunk = jax.jit(jax.vmap(lambda state, seed, start: logger.spool(media_chunk, state)(seed, start),
                             in_axes=(0, 0, None)))
    for call in range(calls):
        chunk(states, jnp.arange(seeds), MEDIA_STEPS * call)
        for i in range(MEDIA_STEPS * call, MEDIA_STEPS * (call + 1)):
            log_text(logger, states, seeds, i)
        logger.flush()
    logger.finish(states)


def reference(seed, i):
    """What the trackers must show of `log_media(seed, i)`, by hand."""
    k = _k(seed, i)
    base = np.arange(2 * H * W * 3).reshape(2, H, W, 3)
    samples = ((base * 5 + k * 11) % 256).astype(np.uint8)
    gap = np.zeros((H, 1, 3), np.uint8)
    frames = np.arange(3 * H * W).reshape(3, H, W, 1)
    rollouts = ((np.stack([frames, frames + 40]) * 7 + k) % 256).astype(np.uint8)
    sound = (((np.arange(64) * (k + 1)) % 29 - 14) / 16).astype(np.float32)  # exact in float32
    values = ((np.arange(50) * (k + 3)) % 17).astype(np.float64)
    counts, edges = np.histogram(values, bins=BINS)
    return {
        "samples": np.concatenate([samples[0], gap, samples[1]], axis=1),  # one row of 2: H x (2W + 1)
        "grey": ((np.arange(H * W).reshape(H, W) * 3 + k) % 256).astype(np.uint8),
        "rollout": ((frames * 9 + k) % 256).astype(np.uint8)[..., 0],  # T x H x W
        "rollouts": np.stack([np.concatenate([rollouts[0, t], np.zeros((H, 1, 1), np.uint8), rollouts[1, t]], 1)
                              for t in range(3)])[..., 0],
        "sound": sound,  # as float32; `int16` gives the WAV's samples
        "weights": (counts, edges),
    }


def int16(samples):
    """Float samples in [-1, 1] as 16-bit PCM: scaled by 32767 and rounded."""
    return np.round(np.clip(samples, -1, 1) * 32767).astype(np.int16)


def caption(seed, i):
    return f"seed {seed}, step {i}: a ✓ caption"


def table(seed, i):
    return [[f"row 0 of {seed}", str(i)], ["row, 1", f"{seed * i}"]]


def log_text(logger, states, seeds, i):
    """A caption per run, and a table, at step i: `seeds` runs of a vmapped
    state (None: one run, seed 0's text, given as a str and a list)."""
    if seeds is None:
        logger.log(states, {"caption": caption(0, i), "table": table(0, i)}, step=i)
        return
    captions = np.array([caption(s, i) for s in range(seeds)], dtype=np.dtypes.StringDType())
    tables = np.array([table(s, i) for s in range(seeds)], dtype=np.dtypes.StringDType())
    logger.log(states, {"caption": captions, "table": tables}, step=i)


# --- decoding what the trackers hold -------------------------------------------------------
def png_pixels(data: bytes) -> np.ndarray:
    """A PNG's pixels as uint8, (H, W) for grey, (H, W, C) otherwise."""
    return np.asarray(Image.open(io.BytesIO(data)))


def gif_frames(data: bytes) -> tuple[np.ndarray, list[int]]:
    """A GIF's frames (grey, T x H x W) and each frame's duration in ms."""
    image = Image.open(io.BytesIO(data))
    frames, durations = [], []
    for frame in ImageSequence.Iterator(image):
        frames.append(np.asarray(frame.convert("L")))
        durations.append(frame.info["duration"])
    return np.stack(frames), durations


def wav_samples(data: bytes) -> tuple[np.ndarray, int, int]:
    """A WAV's int16 samples, its rate and channels."""
    import wave

    with wave.open(io.BytesIO(data)) as file:
        assert file.getsampwidth() == 2
        return (np.frombuffer(file.readframes(file.getnframes()), "<i2"), file.getframerate(),
                file.getnchannels())


def check_histogram(data: bytes, seed, i) -> None:
    got = json.loads(data)
    counts, edges = reference(seed, i)["weights"]
    assert got["counts"] == counts.tolist()
    np.testing.assert_allclose(got["edges"], edges, rtol=1e-6)  # lox's edges are float32


def check_media_file(key: str, data: bytes, seed, i) -> None:
    """A file of a video, audio clip or histogram against the reference."""
    want = reference(seed, i)[key]
    if key in ("rollout", "rollouts"):
        frames, durations = gif_frames(data)
        np.testing.assert_array_equal(frames, want)
        assert durations == [1000 // FPS] * 3
    elif key == "sound":
        samples, rate, channels = wav_samples(data)
        assert (rate, channels) == (RATE, 1)
        np.testing.assert_array_equal(samples, int16(want))
    elif key == "weights":
        check_histogram(data, seed, i)
    else:
        raise AssertionError(f"no file expected for {key!r}")
