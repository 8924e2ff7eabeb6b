"""Media as files: pixels to PNG, frames to GIF, samples to WAV, and a batch of
images to one grid. Trackers call these in their backend's worker thread,
never in the training loop (``lox_backends.trackers.tables.media`` gives them
the events). PNG and GIF need Pillow (``pip install 'jax-lox[media]'``; every
tracker's extra brings it); WAV is written by Python's `wave` module.

>>> import numpy as np
>>> pixels = to_uint8(np.array([[0.0, 0.5], [1.0, 2.0]]))
>>> pixels.tolist()
[[0, 128], [255, 255]]
>>> grid(np.zeros((5, 2, 3, 1), np.uint8)).shape  # 5 images, 3 wide: 2 rows of 2 x 3 pixels, 1-pixel gaps
(5, 11, 1)
>>> png(np.zeros((2, 3, 3), np.uint8))[:8]
b'\\x89PNG\\r\\n\\x1a\\n'
>>> wav(np.zeros(8), rate=8000)[:4]
b'RIFF'
"""

from __future__ import annotations

import io
import math
import wave

import numpy as np


def to_uint8(pixels: np.ndarray) -> np.ndarray:
    """uint8 pixels: uint8 as they are, floats in [0, 1] scaled and rounded
    (clipped; NaN becomes 0)."""
    pixels = np.asarray(pixels)
    if pixels.dtype == np.uint8:
        return pixels
    scaled = np.nan_to_num(pixels.astype(np.float32), nan=0.0, posinf=1.0, neginf=0.0)
    return (np.clip(scaled, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def as_nhwc(pixels: np.ndarray) -> np.ndarray:
    """An image of any form `lox.image` takes as a batch ``(N, H, W, C)``."""
    pixels = np.asarray(pixels)
    if pixels.ndim == 2:
        pixels = pixels[..., None]
    return pixels if pixels.ndim == 4 else pixels[None]


def as_nthwc(frames: np.ndarray) -> np.ndarray:
    """A video of any form `lox.video` takes as a batch ``(N, T, H, W, C)``."""
    frames = np.asarray(frames)
    return frames if frames.ndim == 5 else frames[None]


def grid(images: np.ndarray, gap: int = 1) -> np.ndarray:
    """A batch ``(N, H, W, C)`` as one ``(rows * (H + gap) - gap, cols * (W + gap) - gap, C)``
    image, ``cols = ceil(sqrt(N))`` wide, row by row, with black gaps."""
    n, h, w, c = images.shape
    if n == 1:
        return images[0]
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    out = np.zeros((rows * (h + gap) - gap, cols * (w + gap) - gap, c), images.dtype)
    for i in range(n):
        r, col = divmod(i, cols)
        out[r * (h + gap) : r * (h + gap) + h, col * (w + gap) : col * (w + gap) + w] = images[i]
    return out


def video_grid(videos: np.ndarray, gap: int = 1) -> np.ndarray:
    """A batch of videos ``(N, T, H, W, C)`` as one video ``(T, ...)``: frame t is
    the `grid` of the N videos' frames t (what trackers showing one file per
    event show of a batch).

    >>> video_grid(np.zeros((4, 3, 2, 2, 1), np.uint8)).shape  # 4 videos of 3 frames: 2 x 2 of them
    (3, 5, 5, 1)
    """
    videos = np.asarray(videos)
    return np.stack([grid(videos[:, t], gap) for t in range(videos.shape[1])])


def _pil_image(hwc: np.ndarray):
    try:
        from PIL import Image
    except ImportError:
        raise ImportError(
            "lox renders images and video with Pillow, which is not installed: pip install 'jax-lox[media]'."
        ) from None
    hwc = to_uint8(hwc)
    mode = {1: "L", 3: "RGB", 4: "RGBA"}[hwc.shape[-1]]
    return Image.fromarray(hwc[..., 0] if mode == "L" else hwc, mode)


def png(hwc: np.ndarray) -> bytes:
    """One image ``(H, W, C)`` (C = 1, 3 or 4; floats in [0, 1] or uint8) as PNG bytes."""
    out = io.BytesIO()
    _pil_image(hwc).save(out, format="PNG")
    return out.getvalue()


def gif(thwc: np.ndarray, fps: float) -> bytes:
    """Frames ``(T, H, W, C)`` as an animated GIF looping at `fps` frames per second."""
    frames = [_pil_image(frame) for frame in np.asarray(thwc)]
    if frames[0].mode == "RGBA":  # GIF has no alpha channel
        frames = [f.convert("RGB") for f in frames]
    out = io.BytesIO()
    # Milliseconds per frame; GIF counts hundredths of a second, in 16 bits.
    duration = min(max(int(round(1000.0 / fps)), 10), 655350) if fps >= 1e-3 else 655350
    frames[0].save(out, format="GIF", save_all=True, append_images=frames[1:], duration=duration, loop=0)
    return out.getvalue()


def to_int16(samples: np.ndarray) -> np.ndarray:
    """Samples as int16: int16 as they are, floats in [-1, 1] scaled (clipped; NaN becomes 0)."""
    samples = np.asarray(samples)
    if samples.dtype == np.int16:
        return samples
    scaled = np.nan_to_num(samples.astype(np.float32), nan=0.0, posinf=1.0, neginf=-1.0)
    return np.round(np.clip(scaled, -1.0, 1.0) * 32767.0).astype(np.int16)


def wav(samples: np.ndarray, rate: int) -> bytes:
    """A clip ``(L,)`` or ``(L, C)`` as 16-bit PCM WAV bytes at `rate` samples per second."""
    pcm = to_int16(samples)
    channels = 1 if pcm.ndim == 1 else pcm.shape[1]
    out = io.BytesIO()
    with wave.open(out, "wb") as file:
        file.setnchannels(channels)
        file.setsampwidth(2)
        file.setframerate(int(rate))
        file.writeframes(pcm.astype("<i2").tobytes())
    return out.getvalue()
