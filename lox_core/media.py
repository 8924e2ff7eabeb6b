"""Kinds of logged values: images, video, audio, on-device histograms and text.

Wrap a value where it is logged, inside `jax.jit`, `scan`, `cond` or `vmap`
like any value, and every backend renders it as what it is (an image in
TensorBoard and W&B, a PNG artifact in MLflow...):

>>> import jax, jax.numpy as jnp, lox
>>> def step(x):
...     lox.log({"samples": lox.image(x), "weights": lox.histogram(x, bins=4)}, step=0)
...     return x
>>> _, logs = lox.spool(step)(jnp.linspace(0.0, 1.0, 2 * 8 * 8).reshape(2, 8, 8, 1))
>>> logs.kind
{'samples': 'image', 'weights': 'histogram'}
>>> logs["samples"].pixels.shape, logs["weights"].counts.tolist()
((1, 2, 8, 8, 1), [[32, 32, 32, 32]])

A kind is a pytree node whose options (``fps``, ``rate``) are static, part of
the pytree structure: the same options do not retrace, and spool, tap, scan
and vmap carry the kind along with the arrays. Each kind's arrays keep the
shape they were logged with, after the event axis (and the axes `jax.vmap`
adds). `kind_of` names the kind of any logged series: ``scalar`` and
``array`` for plain values, ``text`` for strings (logged from Python only:
`logger.log`, eager `lox.log`), and the kinds of this module.

`check` runs where the key is known (`lox.log`, a Logger's checks) and refuses
a shape or dtype the kind cannot show, naming the key.
"""

from __future__ import annotations

import json
import math
import numbers
from typing import Any, ClassVar

import jax
import jax.export
import jax.numpy as jnp
import numpy as np

KINDS = ("scalar", "array", "text", "image", "video", "audio", "histogram")
MEDIA_KINDS = ("image", "video", "audio", "histogram")
RENDERED_KINDS = ("text", *MEDIA_KINDS)  # the kinds backends render as something other than numbers


class Media:
    """A logged value of a kind other than ``scalar``/``array``/``text``.

    `arrays` are its array fields by name (one for an image, video or audio;
    ``counts`` and ``edges`` for a histogram), `options` its static options.
    """

    kind: ClassVar[str]
    fields: ClassVar[tuple[str, ...]]
    __slots__ = ()

    @property
    def arrays(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.fields}

    @property
    def options(self) -> dict[str, Any]:
        return {}

    def replace_arrays(self, arrays: list) -> Media:
        """The same kind and options holding `arrays` (in `fields` order)."""
        return type(self)(*arrays, **self.options)

    @classmethod
    def series_names(cls, key: str) -> list[str]:
        """The series names of this kind under `key`, in `fields` order: the key
        itself for one array, ``key/field`` for each array of several."""
        return [key] if len(cls.fields) == 1 else [f"{key}/{name}" for name in cls.fields]

    def series(self, key: str) -> list[tuple[str, Any]]:
        """The series this value gives under `key` (`series_names`), with their arrays."""
        return list(zip(self.series_names(key), (getattr(self, name) for name in self.fields), strict=True))

    def __getitem__(self, index) -> Media:
        """Index every array along its leading axes: ``logs["samples"][0]`` is the first event's image."""
        if isinstance(index, (int, np.integer)) and not -len(self) <= index < len(self):
            # (JAX arrays clamp an index out of range: refused here, as a sequence does)
            raise IndexError(f"index {index} is out of range for lox.{self.kind} of {len(self)} along its first axis")
        return self.replace_arrays([getattr(self, name)[index] for name in self.fields])

    def __len__(self) -> int:
        return len(getattr(self, self.fields[0]))

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def dtype_class(self) -> str:
        """What the numbers of its first array mean: ``integer`` (uint8 pixels,
        int16 samples) or ``float`` (in [0, 1] or [-1, 1]); a histogram's, ``counts``."""
        dtype = getattr(getattr(self, self.fields[0]), "dtype", None)
        return "integer" if dtype is not None and np.issubdtype(np.dtype(dtype), np.integer) else "float"

    def __eq__(self, other) -> bool:
        if type(other) is not type(self) or other.options != self.options:
            return False
        return all(np.array_equal(np.asarray(a), np.asarray(b))
                   for a, b in zip(self.arrays.values(), other.arrays.values(), strict=True))

    __hash__ = None  # type: ignore[assignment]  # holds arrays

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={_describe(getattr(self, name))}" for name in self.fields)
        options = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"lox.{self.kind}({shown}{options})"


class _OneArray(Media):
    """A kind of one array (image, video, audio), which NumPy reads as that array."""

    __slots__ = ()

    def __array__(self, dtype=None, copy=None):
        return np.asarray(getattr(self, self.fields[0]), dtype=dtype)


class Image(_OneArray):
    """An image, or a batch of them: ``(H, W)``, ``(H, W, C)`` or ``(N, H, W, C)``
    with C in 1, 3, 4 (grey, RGB, RGBA); floats in [0, 1] or uint8."""

    kind = "image"
    fields = ("pixels",)
    __slots__ = ("pixels",)

    def __init__(self, pixels):
        self.pixels = pixels


class Video(_OneArray):
    """A video, or a batch of them: ``(T, H, W, C)`` or ``(N, T, H, W, C)``,
    floats in [0, 1] or uint8, at `fps` frames per second."""

    kind = "video"
    fields = ("frames",)
    __slots__ = ("frames", "fps")

    def __init__(self, frames, fps: float = 4.0):
        self.frames = frames
        self.fps = fps

    @property
    def options(self) -> dict[str, Any]:
        return {"fps": self.fps}


class Audio(_OneArray):
    """A clip: mono ``(L,)`` or ``(L, C)`` channels, floats in [-1, 1] (or
    int16 samples), at `rate` samples per second."""

    kind = "audio"
    fields = ("samples",)
    __slots__ = ("samples", "rate")

    def __init__(self, samples, rate: int = 16000):
        self.samples = samples
        self.rate = rate

    @property
    def options(self) -> dict[str, Any]:
        return {"rate": self.rate}


class Histogram(Media):
    """Counts per bin (``(bins,)``) and the bins' edges (``(bins + 1,)``): bin
    i holds the values v with ``edges[i] <= v < edges[i + 1]``, the last bin
    its right edge too, as `numpy.histogram` counts them."""

    kind = "histogram"
    fields = ("counts", "edges")
    __slots__ = ("counts", "edges")

    def __init__(self, counts, edges):
        self.counts = counts
        self.edges = edges

    def dtype_class(self) -> str:
        return "counts"


_CLASSES: dict[str, type[Media]] = {cls.kind: cls for cls in (Image, Video, Audio, Histogram)}


def _register(cls: type[Media]) -> None:
    keys = tuple(jax.tree_util.GetAttrKey(name) for name in cls.fields)

    def flatten_with_keys(value):
        return list(zip(keys, (getattr(value, n) for n in cls.fields), strict=True)), tuple(value.options.items())

    def flatten(value):
        return [getattr(value, n) for n in cls.fields], tuple(value.options.items())

    def unflatten(options, children):
        out = object.__new__(cls)
        for name, child in zip(cls.fields, children, strict=True):
            object.__setattr__(out, name, child)
        for name, option in options:
            object.__setattr__(out, name, option)
        return out

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)


# (Parameters named as JAX 0.8 types them.)
def _serialize_options(aux_data) -> bytes:
    return json.dumps(list(aux_data)).encode()


def _deserialize_options(serialized_aux_data: bytes):
    return tuple(tuple(pair) for pair in json.loads(serialized_aux_data))


for _cls in _CLASSES.values():
    _register(_cls)
    # `jax.export` serializes a program's output pytree: a kind's options as JSON.
    jax.export.register_pytree_node_serialization(
        _cls, serialized_name=f"lox.{_cls.kind}", serialize_auxdata=_serialize_options,
        deserialize_auxdata=_deserialize_options,
    )


# --- what users call -------------------------------------------------------------------------
def image(pixels) -> Image:
    """Log `pixels` as an image: ``lox.log({"samples": lox.image(x)}, step=i)``.

    ``(H, W)`` (grey), ``(H, W, C)`` or a batch ``(N, H, W, C)``, with C = 1,
    3 or 4; floats in [0, 1] (clipped) or uint8. Trackers that show lists of
    images (TensorBoard, W&B) show a batch as N images; the others (MLflow,
    Neptune, `lox plot`'s files) as one grid, ``ceil(sqrt(N))`` images wide.
    The shape and dtype are checked where the image is logged, naming the key.

    >>> import jax.numpy as jnp, lox
    >>> lox.image(jnp.zeros((4, 28, 28, 1)))
    lox.image(pixels=float32[4, 28, 28, 1])
    """
    return Image(pixels)


def video(frames, fps: float = 4.0) -> Video:
    """Log `frames` as a video: ``(T, H, W, C)`` or a batch ``(N, T, H, W, C)``
    (C = 1, 3 or 4; floats in [0, 1] or uint8), shown at `fps` frames per second.
    TensorBoard shows it as an animated image; the other trackers as a GIF.

    >>> import jax.numpy as jnp, lox
    >>> lox.video(jnp.zeros((8, 16, 16, 3)), fps=10)
    lox.video(frames=float32[8, 16, 16, 3], fps=10)
    """
    if isinstance(fps, bool) or not isinstance(fps, numbers.Real) or not math.isfinite(fps) or fps <= 0:
        raise ValueError(f"`lox.video` takes fps > 0 (a Python number, static), got {fps!r}.")
    # A NumPy number as a Python one: options are stored as JSON (files, `jax.export`).
    return Video(frames, fps.item() if isinstance(fps, np.generic) else fps)


def audio(samples, rate: int = 16000) -> Audio:
    """Log `samples` as sound: mono ``(L,)`` or ``(L, C)`` channels, floats in
    [-1, 1] (clipped) or int16, at `rate` samples per second (a Python int).

    >>> import jax.numpy as jnp, lox
    >>> lox.audio(jnp.zeros(16000), rate=16000)
    lox.audio(samples=float32[16000], rate=16000)
    """
    if isinstance(rate, bool) or not isinstance(rate, numbers.Integral) or rate <= 0:
        raise ValueError(f"`lox.audio` takes rate > 0 samples per second (a Python int, static), got {rate!r}.")
    return Audio(samples, int(rate))


def histogram(values, bins: int = 64, range: tuple[float, float] | None = None) -> Histogram:  # noqa: A002
    """The histogram of `values`, computed where they are (on the device):
    only its counts and edges are logged, never the array.

    `bins` equal bins span `range` (default: the least and greatest finite
    value; ``(v - 0.5, v + 0.5)`` when all are v, ``(0, 1)`` when none is
    finite, as `numpy.histogram`). Bin i counts ``edges[i] <= v < edges[i + 1]``,
    the last bin its right edge too; NaN, infinities and values outside
    `range` are not counted. Counts are int32 (int64 with 64-bit types on),
    edges float32 (float64 for float64 values).

    >>> import numpy as np, lox
    >>> h = lox.histogram(np.array([0.0, 0.1, 0.9, 1.0]), bins=2)
    >>> h.counts.tolist(), h.edges.tolist()
    ([2, 2], [0.0, 0.5, 1.0])
    """
    if isinstance(bins, bool) or not isinstance(bins, numbers.Integral) or bins < 1:
        raise ValueError(f"`lox.histogram` takes bins >= 1 (a Python int, static), got {bins!r}.")
    bins = int(bins)
    x = jnp.asarray(values)
    if not (jnp.issubdtype(x.dtype, jnp.integer) or jnp.issubdtype(x.dtype, jnp.floating)
            or jnp.issubdtype(x.dtype, jnp.bool_)):
        raise TypeError(f"`lox.histogram` takes real numbers, got an array of dtype {x.dtype}.")
    dtype = x.dtype if x.dtype in (jnp.float32, jnp.float64) else jnp.float32
    flat = x.reshape(-1).astype(dtype)
    finite = jnp.isfinite(flat)
    if range is None:
        lo = jnp.min(jnp.where(finite, flat, jnp.inf), initial=jnp.inf)
        hi = jnp.max(jnp.where(finite, flat, -jnp.inf), initial=-jnp.inf)
        none = lo > hi  # no finite value
        lo, hi = jnp.where(none, 0.0, lo).astype(dtype), jnp.where(none, 1.0, hi).astype(dtype)
        same = lo == hi
        lo, hi = jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)
    else:
        lo, hi = _check_range(range)
        lo, hi = jnp.asarray(lo, dtype), jnp.asarray(hi, dtype)
    edges = jnp.linspace(lo, hi, bins + 1, dtype=dtype)
    # The bin by arithmetic, then corrected against the edges themselves (as NumPy
    # does), so that the counts are those of the edges returned, bit for bit.
    # In halves where hi - lo overflows the dtype (values beyond half its largest); not
    # always, since halving subnormal values loses their last bits.
    whole = jnp.isfinite(hi - lo)
    offset = jnp.where(whole, flat - lo, flat / 2 - lo / 2)
    index = jnp.clip(jnp.floor(offset * (bins / jnp.where(whole, hi - lo, hi / 2 - lo / 2))), 0, bins - 1)
    index = jnp.where(finite, index, 0).astype(jnp.int32)
    index = index - (flat < edges[index])
    index = jnp.clip(index, 0, bins - 1)
    index = index + ((flat >= edges[index + 1]) & (index != bins - 1))
    counted = finite & (flat >= lo) & (flat <= hi)
    counts = jnp.zeros(bins, jax.dtypes.canonicalize_dtype(jnp.int64)).at[index].add(counted.astype(jnp.int32),
                                                                                       mode="drop")
    return Histogram(counts, edges)


def _check_range(range) -> tuple[float, float]:  # noqa: A002
    try:
        lo, hi = (float(v) for v in range)
    except (TypeError, ValueError):
        raise ValueError(f"`lox.histogram` takes range=(low, high) of two Python numbers, got {range!r}.") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"`lox.histogram` takes a finite range with low < high, got {range!r}.")
    return lo, hi


# --- kinds of series -----------------------------------------------------------------------
def is_text(value) -> bool:
    """Whether `value` (a leaf) holds strings: a `str`, or a NumPy array of them."""
    if isinstance(value, str):
        return True
    dtype = getattr(value, "dtype", None)
    return isinstance(value, (np.ndarray, np.generic)) and dtype is not None and dtype.kind in "UT"


def kind_of(value, extra_ndim: int = 0) -> str:
    """The kind of a series' value (with its event axis, and `extra_ndim` vmap
    axes after it): a `Media`'s kind, ``text`` for strings, ``scalar`` when
    every leaf holds one number per event, else ``array``."""
    if isinstance(value, Media):
        return value.kind
    leaves = jax.tree_util.tree_leaves(value)
    if any(is_text(leaf) for leaf in leaves):
        return "text"
    return "scalar" if all(np.ndim(leaf) <= 1 + extra_ndim for leaf in leaves) else "array"


def media_class(kind: str) -> type[Media]:
    """The class of a media kind (``image``...)."""
    return _CLASSES[kind]


def rebuild(kind: str, options: dict[str, Any], arrays: list) -> Media:
    """A `Media` of `kind` from its arrays (in field order) and options, as files store them."""
    return _CLASSES[kind](*arrays, **options)


_FLOATS = ("float16", "bfloat16", "float32", "float64")
MAX_CHANNELS = 8  # of a clip: more is channels-first samples, (C, L)


def check(key: str, value, where: str = "lox.log") -> None:
    """Refuse a logged value whose kind cannot show its shape or dtype, or a
    media value inside a pytree, naming `key`. `value` is one event (no event
    axis), as `lox.log` gets it."""
    if isinstance(value, (jax.Array, np.ndarray, np.generic, numbers.Number)):
        return  # the common case, an array or a number (tracers too): nothing to walk
    if not isinstance(value, Media):
        for path, leaf in jax.tree_util.tree_flatten_with_path(
                value, is_leaf=lambda x: isinstance(x, Media))[0]:
            if isinstance(leaf, Media):
                raise TypeError(
                    f"`{where}`: key {key!r} holds a lox.{leaf.kind}(...) inside a pytree "
                    f"({key}{jax.tree_util.keystr(path)}); a kind is the whole value of a key: "
                    f"log it under a key of its own, e.g. `{{\"{key}/...\": lox.{leaf.kind}(x)}}`."
                )
        return
    first = getattr(value, value.fields[0])
    shape = tuple(np.shape(first))
    dtype = np.dtype(first.dtype) if hasattr(first, "dtype") else np.asarray(first).dtype
    got = f"shape {shape} and dtype {dtype.name}"
    if isinstance(value, (Image, Video)):
        name, ndims, form = ("lox.image", (2, 3, 4), "(H, W), (H, W, C) or (N, H, W, C)") if isinstance(value, Image) \
            else ("lox.video", (4, 5), "(T, H, W, C) or (N, T, H, W, C)")
        channels_ok = len(shape) == 2 and isinstance(value, Image) or (len(shape) >= 3 and shape[-1] in (1, 3, 4))
        if len(shape) not in ndims or not channels_ok or 0 in shape:
            raise ValueError(
                f"`{where}`: key {key!r} got {name}(...) of {got}; it takes {form} with C = 1, 3 or 4 channels "
                f"(grey, RGB, RGBA) and no empty axis.{_layout_fix(shape, isinstance(value, Image))}"
            )
        if dtype != np.uint8 and dtype.name not in _FLOATS:
            raise TypeError(
                f"`{where}`: key {key!r} got {name}(...) of {got}; pixels are floats in [0, 1] or uint8. "
                "Cast them: `x.astype(jnp.float32) / 255` or `x.astype(jnp.uint8)`."
            )
    elif isinstance(value, Audio):
        if len(shape) not in (1, 2) or 0 in shape:
            raise ValueError(
                f"`{where}`: key {key!r} got lox.audio(...) of {got}; it takes mono (L,) or (L, C) samples "
                "(C channels, last). Log one clip per key, or each clip of a batch under a key of its own."
            )
        if len(shape) == 2 and shape[1] > MAX_CHANNELS:
            raise ValueError(
                f"`{where}`: key {key!r} got lox.audio(...) of {got}: {shape[1]} channels? It takes (L, C) with "
                f"the channels last, at most {MAX_CHANNELS} (7.1 sound); transpose channels-first samples: `x.T`."
            )
        if dtype != np.int16 and dtype.name not in _FLOATS:
            raise TypeError(
                f"`{where}`: key {key!r} got lox.audio(...) of {got}; samples are floats in [-1, 1] or int16."
            )
        channels = shape[1] if len(shape) == 2 else 1
        if value.rate * channels * 2 > 2**32 - 1:  # a WAV header's bytes per second: 32 bits
            raise ValueError(
                f"`{where}`: key {key!r} got lox.audio(...) at rate={value.rate} with {channels} channel(s); a WAV "
                f"file holds at most {(2**32 - 1) // (2 * channels):,} samples per second of {channels} channel(s). "
                "Pass the clip's real rate (e.g. 16000, 44100)."
            )
    elif isinstance(value, Histogram):
        counts, edges = np.shape(value.counts), np.shape(value.edges)
        if len(counts) != 1 or edges != (counts[0] + 1,):
            raise ValueError(
                f"`{where}`: key {key!r} holds a histogram with counts of shape {counts} and edges of shape "
                f"{edges}; make it with `lox.histogram(x, bins=N)` (counts (N,), edges (N + 1,))."
            )


def _layout_fix(shape: tuple, is_image: bool) -> str:
    """What to do about an image's or a video's shape: channels first, or grey without a channel axis."""
    if len(shape) < 3 or shape[-1] in (1, 3, 4):
        return ""
    fixes = []
    if shape[-3] in (1, 3, 4):  # (C, H, W) / (N, C, H, W) / (T, C, H, W) / (N, T, C, H, W)
        fixes.append(f"channels first: move them last, `jnp.moveaxis(x, {len(shape) - 3}, -1)`")
    if len(shape) in ((3,) if is_image else (3, 4)):
        fixes.append(f"{'a batch of grey images' if is_image else 'grey frames'}: add their channel axis, "
                     "`x[..., None]`")
    return "".join(f" For {fix}." for fix in fixes)


def event_nbytes(value, leading_ndim: int) -> int:
    """The bytes of one event of a series' `value` (its leading `leading_ndim`
    axes are events and runs): what a Logger's ``media_limit`` bounds."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(value):
        shape = np.shape(leaf)[leading_ndim:]
        total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
    return total


def _describe(x) -> str:
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return repr(x)
    return f"{np.dtype(dtype).name}{list(np.shape(x))}"


def as_text(key: str, value) -> np.ndarray | None:
    """`value` as an array of strings when it is text (a str, a list of them, a
    NumPy array of strings), else None. A str inside a pytree of arrays is
    refused: text is the whole value of a key."""
    if isinstance(value, str) or is_text(value):
        return np.asarray(value, dtype=np.dtypes.StringDType())
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (str, list, tuple)) for v in value):
        leaves = jax.tree_util.tree_leaves(value)
        if leaves and all(isinstance(v, str) for v in leaves):
            try:
                return np.array(value, dtype=np.dtypes.StringDType())
            except ValueError:
                raise ValueError(
                    f"key {key!r} holds lists of strings of different lengths; text is a str, or a "
                    "rectangular list of them (a table's rows)."
                ) from None
    return None
