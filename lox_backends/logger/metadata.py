"""What `logger.init` takes: the run's PRNG key and its metadata, checked at the call.

A run's metadata is kept as JSON (the parquet backend's ``_run.json``, trackers'
params and configs), so `logger.init` takes what JSON holds: None, bool, int,
float, str, lists, tuples and dicts (str keys) of those, and NumPy and JAX
numbers and arrays (bool, integer, float; NumPy str arrays too). Anything else
is refused at the call with the key's path (``config['opt']['betas']``), rather
than stored as ``"<object object at 0x...>"``.

Values are stored as JSON has them: tuples as lists, NumPy and JAX values as
Python ones, and a float of fewer than 64 bits (float32, float16, bfloat16) as
the shortest decimal that is that float: ``np.float32(0.6)`` as ``0.6``, not
``0.6000000238418579``. NaN and infinities stay floats (the parquet backend
writes them as strings).

JAX arrays, tracers under `jax.jit` and `jax.vmap` included, are *dynamic*:
`split` leaves a place for each in a `Template`, and the host callback of
`logger.init` fills them in per run (`Template.fill`), so under vmap they may
differ per seed. The rest is converted once, at the call.

>>> import numpy as np
>>> template, arrays = split({"lr": np.float32(0.6), "opt": {"betas": (0.9, np.float32(0.999))}, "steps": 10})
>>> template.fill([], ()), arrays
({'lr': 0.6, 'opt': {'betas': [0.9, 0.999]}, 'steps': 10}, [])
>>> split({"lr": object()})
Traceback (most recent call last):
...
TypeError: `logger.init`: metadata 'lr' is an object, which a run's record (JSON) cannot hold. Metadata values \
are None, bool, int, float, str, NumPy or JAX numbers and arrays, and lists, tuples and dicts (with str keys) of \
those: pass it as one of these, e.g. str(value).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Template", "split", "key_data", "from_array"]

_ALLOWED = (
    "Metadata values are None, bool, int, float, str, NumPy or JAX numbers and arrays, and lists, tuples and "
    "dicts (with str keys) of those"
)
_KEY_EXAMPLE = (
    "pass e.g. `logger.init(jax.random.key(0))` (or the uint32 data of `jax.random.PRNGKey(0)`), or nothing; "
    "one run per seed: `jax.vmap(logger.init)(jax.random.split(jax.random.key(0), 4))`"
)

Path = tuple[Any, ...]  # a top-level name, then dict keys and list indices


@dataclasses.dataclass(frozen=True)
class Template:
    """A run's metadata as JSON values, with a place (a path of keys and
    indices, holding None) for each dynamic value that `fill` puts in."""

    static: dict[str, Any]
    places: tuple[Path, ...]

    def fill(self, values: Sequence[Any], index: tuple[int, ...]) -> dict[str, Any]:
        """One run's metadata: the static values, and at each place the
        element `index` (the run's batch index) of the matching host array of
        `values` (broadcast to the batch shape, as `jax.pure_callback` hands
        them over), converted by `from_array`."""
        meta = copy.deepcopy(self.static)  # each run its own: nested dicts and lists are not shared
        for path, value in zip(self.places, values, strict=True):
            holder = meta
            for part in path[:-1]:
                holder = holder[part]
            holder[path[-1]] = from_array(np.asarray(value)[index])
        return meta


def split(metadata: Mapping[str, Any]) -> tuple[Template, list[jax.Array]]:
    """`logger.init`'s metadata checked and split: a `Template` holding the
    values converted now, and the JAX arrays (tracers too) to pass to the host
    callback, in the order of `Template.places`. Raises `TypeError` naming the
    key's path for a value that is not JSON-like (see the module docstring)."""
    places: list[Path] = []
    arrays: list[jax.Array] = []

    def walk(value: Any, path: Path, containers: frozenset[int]) -> Any:
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, jax.Array):  # tracers too: per run, in the host callback
            _check_dtype(value.dtype, path)
            places.append(path)
            arrays.append(value)
            return None
        if isinstance(value, (np.ndarray, np.generic)):
            if value.dtype == object:
                return walk(np.asarray(value).tolist(), path, containers)
            _check_dtype(value.dtype, path)
            return from_array(np.asarray(value))
        if isinstance(value, complex):
            _check_dtype(np.dtype(complex), path)  # refused, with what to pass instead
        if isinstance(value, int):
            return int(value)  # an IntEnum's value, as JSON writes it
        if isinstance(value, float):
            return float(value)
        if isinstance(value, (Mapping, list, tuple)):
            if id(value) in containers:  # would recurse forever
                raise ValueError(f"`logger.init`: metadata {_where(path)} contains itself; JSON cannot hold it.")
            inside = containers | {id(value)}
            if isinstance(value, Mapping):
                for key in value:
                    if not isinstance(key, str):
                        raise TypeError(
                            f"`logger.init`: metadata {_where(path)} has the key {key!r} ({_a(type(key).__name__)}); "
                            f"the keys of metadata dicts are str, as in JSON: e.g. {str(key)!r}."
                        )
                return {key: walk(item, (*path, key), inside) for key, item in value.items()}
            return [walk(item, (*path, i), inside) for i, item in enumerate(value)]
        raise TypeError(
            f"`logger.init`: metadata {_where(path)} is {_a(type(value).__name__)}, which a run's record (JSON) "
            f"cannot hold. {_ALLOWED}: pass it as one of these, e.g. str(value)."
        )

    static = {name: walk(value, (name,), frozenset()) for name, value in metadata.items()}
    return Template(static, tuple(places)), arrays


def from_array(values: np.ndarray) -> Any:
    """A host array (or NumPy scalar) of metadata as Python values: lists of
    its elements, a float of fewer than 64 bits as its shortest decimal."""
    values = np.asarray(values)
    if jnp.issubdtype(values.dtype, jnp.floating) and values.dtype.itemsize < 8:
        shortest = [_shortest(x) for x in values.reshape(-1)]
        return np.array(shortest, np.float64).reshape(values.shape).tolist()
    return values.tolist()


def _shortest(x: Any) -> float:
    """The float with the fewest significant digits that rounds to `x` in
    `x`'s dtype (what ``repr`` shows for a float32; bfloat16's ``str`` is not
    the shortest): ``np.float32(0.6)`` -> 0.6."""
    value = float(x)
    if not math.isfinite(value):
        return value
    for digits in range(1, 18):
        short = float(f"{value:.{digits}g}")
        with np.errstate(over="ignore"):  # a rounding past the dtype's largest float: inf, not x
            same = np.asarray(short, dtype=x.dtype) == x
        if same:
            return short
    return value


def _check_dtype(dtype: Any, path: Path) -> None:
    """Refuse an array whose elements JSON has no value for."""
    if jnp.issubdtype(dtype, jax.dtypes.prng_key):
        raise TypeError(
            f"`logger.init`: metadata {_where(path)} is a PRNG key ({dtype}); a run's record holds numbers. Pass the "
            f"run's key as `key` (`logger.init(key)`, recorded as 'key'), or its data: `jax.random.key_data(k)`."
        )
    if jnp.issubdtype(dtype, jnp.complexfloating):
        raise TypeError(
            f"`logger.init`: metadata {_where(path)} is complex ({dtype}), which JSON cannot hold; pass its real "
            "and imaginary parts as two values (`z.real`, `z.imag`)."
        )
    if not (jnp.issubdtype(dtype, jnp.bool_) or jnp.issubdtype(dtype, jnp.integer)
            or jnp.issubdtype(dtype, jnp.floating) or np.dtype(dtype).kind == "U"):
        raise TypeError(
            f"`logger.init`: metadata {_where(path)} is an array of dtype {dtype}, which a run's record (JSON) "
            f"cannot hold. {_ALLOWED}: convert it, e.g. to str."
        )


def key_data(key: Any) -> jax.Array:
    """The uint32 data of `logger.init`'s `key` (a new-style PRNG key from
    `jax.random.key`, or the raw uint32 data of `jax.random.PRNGKey`; one per
    call, batched by `jax.vmap`), or an empty array for None. Anything else is
    refused: `TypeError` for what is not a key, `ValueError` for several keys
    (they open one run each under `jax.vmap`)."""
    if key is None:
        return jnp.zeros((0,), jnp.uint32)
    dtype = getattr(key, "dtype", None)
    if isinstance(key, (jax.Array, np.ndarray, np.generic)) and dtype is not None:
        if isinstance(key, jax.Array) and jnp.issubdtype(dtype, jax.dtypes.prng_key):
            if key.ndim:
                _several_keys(key.shape, key.shape)
            return jax.random.key_data(key)
        if dtype == np.uint32 and key.ndim >= 1:
            if key.ndim > 1:
                _several_keys(key.shape, key.shape[:-1])
            return jnp.asarray(key)
        shown = f"{_a(str(dtype))} array of shape {tuple(key.shape)}"
    else:
        shown = f"{_short_repr(key)} ({_a(type(key).__name__)})"
    raise TypeError(f"`logger.init`'s `key` is a PRNG key or None, got {shown}; {_KEY_EXAMPLE}.")


def _several_keys(shape: tuple[int, ...], batch: tuple[int, ...]) -> NoReturn:
    raise ValueError(
        f"`logger.init` got {math.prod(batch)} PRNG keys as `key` (shape {tuple(shape)}); it opens one run per "
        "call, and `jax.vmap` makes one call per key: `jax.vmap(logger.init)(keys)` opens a run per seed."
    )


def _where(path: Path) -> str:
    """A key's path as the user wrote it: ``'lr'``, ``config['opt']['betas'][1]``."""
    if len(path) == 1:
        return repr(path[0])
    return str(path[0]) + "".join(f"[{part!r}]" for part in path[1:])


def _a(noun: str) -> str:
    vowel = noun[:1].lower() in "aeio" or (noun[:1].lower() == "u" and not noun.lower().startswith(("uint", "uni")))
    return ("an " if vowel else "a ") + noun


def _short_repr(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
