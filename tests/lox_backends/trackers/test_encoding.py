"""Media as files (lox_backends/trackers/encoding.py), decoded back with
Pillow and `wave` against the pixels and samples given."""

import io
import wave

import numpy as np
import pytest
from PIL import Image, ImageSequence

from lox_backends.trackers import encoding

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_png_decodes_to_the_uint8_pixels(channels):
    pixels = RNG.uniform(size=(5, 7, channels)).astype(np.float32)
    decoded = np.asarray(Image.open(io.BytesIO(encoding.png(pixels))))
    expected = np.round(pixels * 255).astype(np.uint8)
    assert decoded.reshape(expected.shape).tolist() == expected.tolist()


def test_to_uint8_clips_and_keeps_uint8():
    assert encoding.to_uint8(np.array([-1.0, 0.0, 0.5, 1.0, 7.0, np.nan])).tolist() == [0, 0, 128, 255, 255, 0]
    raw = np.array([3, 200], np.uint8)
    assert encoding.to_uint8(raw) is raw


def test_grid_places_each_image_row_by_row():
    images = np.stack([np.full((2, 3, 1), i, np.uint8) for i in range(1, 6)])
    out = encoding.grid(images)
    assert out.shape == (2 * 2 + 1, 3 * 3 + 2, 1)  # 3 wide, 2 rows, 1-pixel gaps
    for i in range(5):
        r, c = divmod(i, 3)
        assert (out[r * 3 : r * 3 + 2, c * 4 : c * 4 + 3] == i + 1).all()
    assert (out[2] == 0).all() and (out[:, 3] == 0).all()  # the gaps
    assert (out[3:, 8:] == 0).all()  # no sixth image
    assert encoding.grid(images[:1]).shape == (2, 3, 1)


def test_gif_holds_each_frame_at_the_fps():
    frames = np.zeros((4, 6, 6, 3), np.uint8)
    for t in range(4):
        frames[t, :, :, t % 3] = 60 * (t + 1)
    gif = Image.open(io.BytesIO(encoding.gif(frames, fps=5)))
    decoded = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(gif)]
    assert len(decoded) == 4 and gif.info["duration"] == 200
    for t in range(4):
        assert decoded[t].tolist() == frames[t].tolist()


@pytest.mark.parametrize(("fps", "duration"), [(1e-6, 655350), (1e6, 10)])
def test_gif_frame_durations_stay_within_what_gif_holds(fps, duration):
    # A GIF holds a frame's delay in 16 bits of hundredths of a second: fps=1e-6 failed the encoder (in the
    # backend's worker) with an OverflowError; browsers show delays below 10 ms at 100 ms.
    frames = np.stack([np.full((2, 2, 1), v, np.uint8) for v in (0, 255)])
    gif = Image.open(io.BytesIO(encoding.gif(frames, fps=fps)))
    assert gif.n_frames == 2 and gif.info["duration"] == duration


@pytest.mark.parametrize("shape", [(100,), (100, 2)])
def test_wav_holds_the_int16_samples_at_the_rate(shape):
    samples = RNG.uniform(-1.2, 1.2, size=shape).astype(np.float32)
    with wave.open(io.BytesIO(encoding.wav(samples, rate=8000))) as file:
        assert file.getframerate() == 8000 and file.getnchannels() == (1 if len(shape) == 1 else 2)
        pcm = np.frombuffer(file.readframes(file.getnframes()), "<i2").reshape(shape)
    assert pcm.tolist() == np.round(np.clip(samples, -1, 1) * 32767).astype(np.int16).tolist()
