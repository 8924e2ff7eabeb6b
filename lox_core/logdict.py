"""`logdict`: logged series with their step metadata."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

# Written into a step where an event of a key did not carry that step name, so
# that every step array stays aligned with its values. The smallest int32: no
# real step is negative that far, and it fits every integer dtype JAX uses.
NO_STEP = -(2**31)
# The columns of a logdict as an Arrow table (`to_arrow`) besides one per step name.
ARROW_COLUMNS = ("run", "key", "value", "dtype", "shape", "data")

REDUCTIONS = ("mean", "sum", "min", "max", "first", "last")


def event_count(value) -> int:
    """The number of events in a series (its leading axis)."""
    leaves = jax.tree_util.tree_leaves(value)
    return leaves[0].shape[0] if leaves else 0


def _numpy_or_jax(*arrays):
    """NumPy for host-side logs (tapped events, files), jax.numpy otherwise."""
    return np if all(isinstance(x, (np.ndarray, np.generic)) for x in arrays) else jnp


def _concat(parts: list):
    if len(parts) == 1:
        return parts[0]
    return jax.tree_util.tree_map(lambda *xs: _numpy_or_jax(*xs).concatenate(xs, axis=0), *parts)


class logdict(dict):
    """A `dict` from log keys to series, with the steps each event was logged at.

    Every value is a series: its leading axis counts events, in program order.
    ``logs.step["loss"]`` (one attribute per step name, or ``logs.steps["step"]``)
    holds the integer steps aligned with ``logs["loss"]``; an event that did not
    carry that step name holds :data:`lox.NO_STEP` there.

    A logdict is a JAX pytree, so it can be returned from `jax.jit`, mapped with
    `jax.tree_util.tree_map`, or carried through `jax.lax.scan`.

    >>> import jax.numpy as jnp, lox
    >>> a = lox.logdict({"loss": jnp.array([3.0, 2.0])}, steps={"step": {"loss": jnp.array([0, 1])}})
    >>> b = lox.logdict({"loss": jnp.array([1.0])}, steps={"step": {"loss": jnp.array([2])}})
    >>> logs = a + b
    >>> logs["loss"].tolist(), logs.step["loss"].tolist()
    ([3.0, 2.0, 1.0], [0, 1, 2])
    >>> logs.reduce("mean")["loss"].tolist()
    [2.0]
    """

    __slots__ = ("_steps",)

    def __init__(self, data: Mapping[str, Any] = (), steps: Mapping[str, Mapping[str, Any]] | None = None):
        super().__init__(data)
        self._steps = {name: dict(per_key) for name, per_key in (steps or {}).items() if per_key}

    @classmethod
    def _trusted(cls, data: dict, steps: dict) -> "logdict":
        """A logdict that takes `data` and `steps` as they are (fresh dicts, no
        empty step names): for hot paths that build many small logdicts."""
        logs = cls.__new__(cls)
        dict.update(logs, data)
        logs._steps = steps
        return logs

    # --- steps ------------------------------------------------------------------
    @property
    def steps(self) -> dict[str, dict[str, Any]]:
        """Step arrays by step name, then by key: ``logs.steps["step"]["loss"]``."""
        return self._steps

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        steps = object.__getattribute__(self, "_steps")
        if name in steps:
            return steps[name]
        raise AttributeError(
            f"logdict has no step named {name!r}; its step names are {sorted(steps)}. "
            "Pass steps to `lox.log` as keyword arguments, e.g. `lox.log(data, step=i)`."
        )

    def step_names(self, key: str) -> list[str]:
        return [name for name, per_key in self._steps.items() if key in per_key]

    # --- algebra -----------------------------------------------------------------
    def __add__(self, other: logdict) -> logdict:
        """Concatenate series key by key (events of `self` first), with their steps."""
        if not isinstance(other, logdict):
            return NotImplemented
        return concat([self, other])

    def __or__(self, other: logdict) -> logdict:
        """Merge: keys of `other` replace those of `self`, with their steps."""
        if not isinstance(other, logdict):
            return NotImplemented
        steps: dict[str, dict[str, Any]] = {}
        for src, keys in ((self, [k for k in self if k not in other]), (other, list(other))):
            for name, per_key in src._steps.items():
                for key in keys:
                    if key in per_key:
                        steps.setdefault(name, {})[key] = per_key[key]
        return logdict({**self, **other}, steps)

    def filter(self, pred: Callable[[str, Any], bool]) -> logdict:
        """Keep the keys for which ``pred(key, value)`` is true."""
        keep = [k for k, v in self.items() if pred(k, v)]
        return self._select(keep, {k: k for k in keep})

    def prefix(self, prefix: str) -> logdict:
        """Rename every key to ``prefix + key``."""
        return self._select(list(self), {k: prefix + k for k in self})

    def _select(self, keys: list[str], rename: Mapping[str, str]) -> logdict:
        steps = {
            name: {rename[k]: per_key[k] for k in keys if k in per_key} for name, per_key in self._steps.items()
        }
        return logdict({rename[k]: self[k] for k in keys}, steps)

    @property
    def slice(self) -> _Slicer:
        """Slice every series along its event axis: ``logs.slice[::10]``."""
        return _Slicer(self)

    def map_series(self, fn: Callable[[Any], Any]) -> logdict:
        """Apply `fn` to every array of every series and step (along the event axis)."""
        data = {k: jax.tree_util.tree_map(fn, v) for k, v in self.items()}
        steps = {name: {k: fn(s) for k, s in per_key.items()} for name, per_key in self._steps.items()}
        return logdict(data, steps)

    def reduce(self, mode: str) -> logdict:
        """Reduce every series over its events to a series of one event.

        `mode` is one of ``mean, sum, min, max, first, last``. The reduced event
        keeps the steps of the first event for ``first`` and of the last event
        otherwise.
        """
        if mode not in REDUCTIONS:
            raise ValueError(f"unknown reduce mode {mode!r}: use one of {', '.join(REDUCTIONS)}.")
        if mode in ("first", "last"):
            return self.slice[:1] if mode == "first" else self.slice[-1:]
        op = {"mean": jnp.mean, "sum": jnp.sum, "min": jnp.min, "max": jnp.max}[mode]
        data = {k: jax.tree_util.tree_map(lambda x: op(x, axis=0, keepdims=True), v) for k, v in self.items()}
        steps = {name: {k: s[-1:] for k, s in per_key.items()} for name, per_key in self._steps.items()}
        return logdict(data, steps)

    # --- Arrow -------------------------------------------------------------------------
    def to_arrow(self, run: str | None = None):
        """One `pyarrow.Table`, one row per event of a key (schema in `lox_core.arrow`).

        >>> import numpy as np, lox
        >>> logs = lox.logdict({"loss": np.array([0.5, 0.25])}, steps={"step": {"loss": np.array([0, 1])}})
        >>> table = logs.to_arrow(run="seed0")
        >>> table.column_names
        ['run', 'key', 'step', 'value', 'dtype', 'shape', 'data']
        >>> table.column("value").to_pylist(), table.column("step").to_pylist()
        ([0.5, 0.25], [0, 1])
        """
        from lox_core.arrow import to_arrow  # pyarrow only when asked for

        return to_arrow(self, run)

    @staticmethod
    def from_arrow(table, run: str | None = None) -> logdict:
        """The logdict of NumPy arrays a `to_arrow` table holds (also read back from Parquet).

        Pass ``run=`` to choose one run of a table that holds several.

        >>> import numpy as np, lox
        >>> logs = lox.logdict({"loss": np.array([0.5, 0.25])}, steps={"step": {"loss": np.array([0, 1])}})
        >>> back = lox.logdict.from_arrow(logs.to_arrow(run="seed0"), run="seed0")
        >>> back["loss"].tolist(), back.step["loss"].tolist()
        ([0.5, 0.25], [0, 1])
        """
        from lox_core.arrow import from_arrow

        return from_arrow(table, run)

    # --- display ---------------------------------------------------------------------
    def __repr__(self) -> str:
        if not self:
            return "logdict({})"
        lines = []
        for key, value in self.items():
            shapes = jax.tree_util.tree_map(_describe, value)
            names = self.step_names(key)
            lines.append(f"  {key!r}: {shapes}" + (f"  steps: {', '.join(names)}" if names else ""))
        return "logdict({\n" + ",\n".join(lines) + "\n})"

    __str__ = __repr__

    def __reduce__(self):
        return (logdict, (dict(self), self._steps))


def _describe(x) -> str:
    dtype = getattr(x, "dtype", None)
    shape = getattr(x, "shape", None)
    if dtype is None or shape is None:
        return repr(x)
    return f"{np.dtype(dtype).name}[{','.join(map(str, shape))}]"


class _Slicer:
    def __init__(self, logs: logdict):
        self._logs = logs

    def __getitem__(self, index: slice) -> logdict:
        if not isinstance(index, slice):
            raise TypeError(f"`logdict.slice` takes a slice such as `logs.slice[::10]`, got {index!r}.")
        return self._logs.map_series(lambda x: x[index])


def concat(parts: Iterable[logdict]) -> logdict:
    """Concatenate logdicts event-wise, key by key, in the order given.

    A key that carries a step name in some parts but not others gets
    :data:`NO_STEP` for the events that lacked it.
    """
    parts = list(parts)
    keys: dict[str, None] = {}
    for p in parts:
        keys.update(dict.fromkeys(p))
    names: dict[str, None] = {}
    for p in parts:
        names.update(dict.fromkeys(p._steps))
    data, steps = {}, {name: {} for name in names}
    for key in keys:
        holders = [p for p in parts if key in p]
        _check_same_structure(key, [p[key] for p in holders])
        data[key] = _concat([p[key] for p in holders])
        for name in names:
            have = [p._steps.get(name, {}).get(key) for p in holders]
            if all(h is None for h in have):
                continue
            like = next(h for h in have if h is not None)
            filled = [
                h if h is not None else _numpy_or_jax(like).full((event_count(p[key]),) + like.shape[1:], NO_STEP, like.dtype)
                for h, p in zip(have, holders)
            ]
            steps[name][key] = _concat(filled)
    return logdict(data, steps)


def _check_same_structure(key: str, values: list) -> None:
    first = values[0]
    for other in values[1:]:
        a, b = jax.tree_util.tree_structure(first), jax.tree_util.tree_structure(other)
        if a != b:
            raise ValueError(f"key {key!r} was logged with different structures: {a} and {b}.")
        for x, y in zip(jax.tree_util.tree_leaves(first), jax.tree_util.tree_leaves(other)):
            if x.shape[1:] != y.shape[1:] or x.dtype != y.dtype:
                raise ValueError(
                    f"key {key!r} was logged with different shapes or dtypes: "
                    f"{_describe_event(x)} and {_describe_event(y)}. A key must keep one shape and "
                    "dtype within one spool; log differently shaped values under different keys."
                )


def _describe_event(x) -> str:
    return f"{np.dtype(x.dtype).name}{list(x.shape[1:])}"


def _flatten(logs: logdict):
    keys = tuple(logs)
    step_index = tuple((name, key) for name, per_key in logs._steps.items() for key in per_key)
    children = [logs[k] for k in keys] + [logs._steps[name][key] for name, key in step_index]
    return children, (keys, step_index)


def _unflatten(aux, children) -> logdict:
    keys, step_index = aux
    children = list(children)
    data = dict(zip(keys, children[: len(keys)]))
    steps: dict[str, dict[str, Any]] = {}
    for (name, key), value in zip(step_index, children[len(keys) :]):
        steps.setdefault(name, {})[key] = value
    out = logdict.__new__(logdict)
    dict.__init__(out, data)
    out._steps = steps
    return out


jax.tree_util.register_pytree_node(logdict, _flatten, _unflatten)
