"""`logdict`: logged series with their step metadata; `Event`: one event of
them on the host, with the values as they were logged.

The functions at the end of the module are the rest of lox_core's access to a
logdict, the one place that reads and writes its fields: building one without
checks (`trusted`, `trusted_event`, `padded_logdict`), the event counts of
bounded loops (`event_totals`), spool's ``interval`` (`every`), key order
(`in_key_order`), and the form spool's compiled program returns
(`shared_once`, `plain`). They are not `lox.logdict`'s API.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Self

import jax
import jax.core
import jax.export
import jax.numpy as jnp
import numpy as np

from lox_core import printing
from lox_core.dtypes import common_dtype
from lox_core.media import RENDERED_KINDS, Media, kind_of
from lox_core.series import NO_STEP as NO_STEP  # `lox.NO_STEP`: defined with the other rules about steps
from lox_core.series import steps_per_event

if TYPE_CHECKING:  # pyarrow is imported with lox_core.arrow_codec, when tables are made
    import pyarrow as pa

REDUCTIONS = ("mean", "sum", "min", "max", "first", "last")


def event_count(value) -> int:
    """The number of events in a series (its leading axis)."""
    leaves = jax.tree_util.tree_leaves(value)
    return leaves[0].shape[0] if leaves else 0


def _numpy_or_jax(*arrays) -> Any:
    """NumPy for host-side logs (tapped events, files), jax.numpy otherwise.
    (Typed `Any`: callers use the API the two modules share.)"""
    return np if all(isinstance(x, (np.ndarray, np.generic)) for x in arrays) else jnp


def _concat(parts: list):
    if len(parts) == 1:
        return parts[0]
    return jax.tree_util.tree_map(lambda *xs: _numpy_or_jax(*xs).concatenate(xs, axis=0), *parts)


class logdict(dict[str, Any]):
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

    *Padded series.* A loop whose length is known only at run time
    (`lox.spool(f, max_events=N)`) returns its events in a buffer of fixed
    size: such a key has a boolean mask ``logs.valid[key]`` (events, or
    events × vmap axes) that is false on the padding, and ``logs.dropped[key]``
    counts the events that did not fit. ``logs.count[key]`` is the number of
    recorded events of any key. Reductions and `to_arrow` leave the padding
    out, and `trim` removes it on the host:

    >>> import numpy as np
    >>> padded = lox.logdict({"r": np.array([0.5, 0.25, 0.0])}, valid={"r": np.array([True, True, False])},
    ...                      dropped={"r": np.array(0)})
    >>> int(padded.count["r"]), padded.trim()["r"].tolist(), padded.reduce("mean")["r"].tolist()
    (2, [0.5, 0.25], [0.375])
    """

    # `_valid`: key -> mask, for padded keys. `_totals`: key -> (recorded,
    # dropped) event counts, for keys that had a limit: leaves of the pytree,
    # so that they stay right under `jax.vmap` and through scans.
    __slots__ = ("_steps", "_valid", "_totals")
    _steps: dict[str, dict[str, Any]]
    _valid: dict[str, Any]
    _totals: dict[str, tuple]

    def __init__(
        self,
        data: Mapping[str, Any] | Iterable[tuple[str, Any]] = (),  # what `dict()` takes
        steps: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        valid: Mapping[str, Any] | None = None,
        dropped: Mapping[str, Any] | None = None,
    ):
        super().__init__(data)
        self._steps = {name: dict(per_key) for name, per_key in (steps or {}).items() if per_key}
        valid, dropped = dict(valid or {}), dict(dropped or {})
        for what, extra in (("valid", valid), ("dropped", dropped)):
            unknown = [k for k in extra if k not in self]
            if unknown:
                raise ValueError(f"logdict: `{what}` names key {unknown[0]!r}, which the logdict does not hold.")
        self._valid = valid
        self._totals = {k: (valid[k].sum(axis=0) if k in valid else event_count(self[k]), dropped.get(k, 0))
                        for k in self if k in valid or k in dropped}

    @classmethod
    def _trusted(cls, data: dict, steps: dict) -> Self:
        """A logdict that takes `data` and `steps` as they are (fresh dicts, no
        empty step names, no padding): for hot paths that build many small logdicts."""
        logs = cls.__new__(cls)
        dict.update(logs, data)
        logs._steps = steps
        logs._valid = {}
        logs._totals = {}
        return logs

    def _like(self, data: dict, steps: dict, valid: dict | None = None, totals: dict | None = None) -> "logdict":
        """A plain logdict of `data` and `steps` with this one's padding and
        totals (or the given), for the keys it holds."""
        out = logdict._trusted(data, {name: per_key for name, per_key in steps.items() if per_key})
        out._valid = {k: m for k, m in (self._valid if valid is None else valid).items() if k in data}
        out._totals = {k: t for k, t in (self._totals if totals is None else totals).items() if k in data}
        return out

    def _recounted(self) -> "logdict":
        """The same logdict with its recorded counts taken from its masks
        again, after an operation that changed the events."""
        self._totals = {
            k: (self._valid[k].sum(axis=0) if k in self._valid else event_count(self[k]), dropped)
            for k, (_, dropped) in self._totals.items()
        }
        return self

    # --- padding ----------------------------------------------------------------
    @property
    def valid(self) -> dict[str, Any]:
        """Masks of the recorded events, by key, for the keys with padding only
        (shape ``(events,)``, or ``(events, *vmap axes)`` for a loop vmapped
        inside `spool`)."""
        return self._valid

    @property
    def count(self) -> dict[str, Any]:
        """The number of recorded events of each key (padding left out)."""
        return {k: self._totals[k][0] if k in self._totals else event_count(v) for k, v in self.items()}

    @property
    def dropped(self) -> dict[str, Any]:
        """The number of events of each key that a full buffer dropped (0 for
        keys that never had a limit; see `lox.spool`'s ``max_events``)."""
        return {k: self._totals[k][1] if k in self._totals else 0 for k in self}

    def trim(self) -> logdict:
        """On the host: the logdict without padding, as NumPy arrays (each key's
        recorded events only; `dropped` stays).

        A mask with vmap axes (a `while_loop` vmapped *inside* `spool`) keeps a
        different number of events per element, which one array cannot hold:
        index ``logs.valid[key][:, i]`` per element, or apply `jax.vmap`
        outside `spool`.
        """
        return self._trimmed("logdict.trim")

    def _trimmed(self, what: str) -> logdict:
        for key, mask in self._valid.items():
            if np.ndim(mask) != 1:
                raise ValueError(
                    f"{what}: key {key!r} has padding per `jax.vmap` element (mask of shape "
                    f"{tuple(np.shape(mask))}), so its elements keep different numbers of events. Apply "
                    "`jax.vmap` outside `lox.spool` (one logdict per element), or select one element's events "
                    f"with `logs.valid[{key!r}][:, i]`."
                )
        keep = {k: np.asarray(m) for k, m in self._valid.items()}
        cut = lambda key, x: np.asarray(x)[keep[key]] if key in keep else np.asarray(x)  # noqa: E731
        data = {k: jax.tree_util.tree_map(lambda x, k=k: cut(k, x), v) for k, v in self.items()}
        steps = {name: {k: cut(k, s) for k, s in per_key.items()} for name, per_key in self._steps.items()}
        totals = {
            k: (np.asarray(event_count(data[k])), np.asarray(dropped)) for k, (_, dropped) in self._totals.items()
        }
        return self._like(data, steps, valid={}, totals=totals)

    # --- steps ------------------------------------------------------------------
    @property
    def steps(self) -> dict[str, dict[str, Any]]:
        """Step arrays by step name, then by key: ``logs.steps["step"]["loss"]``."""
        return self._steps

    def __getattr__(self, name: str) -> dict[str, Any]:
        return _step_named(object.__getattribute__(self, "_steps"), name, "logdict")

    @property
    def kind(self) -> dict[str, str]:
        """Each key's kind: ``scalar`` (one number per event) or ``array`` for
        plain values, ``text`` for strings, ``image``, ``video``, ``audio`` or
        ``histogram`` for the values logged as them (`lox.image`...).

        >>> import numpy as np, lox
        >>> lox.logdict({"loss": np.zeros(2), "w": np.zeros((2, 3)), "s": lox.image(np.zeros((2, 4, 4)))}).kind
        {'loss': 'scalar', 'w': 'array', 's': 'image'}
        """
        return {key: kind_of(value, self._vmap_ndim(key)) for key, value in self.items()}

    def _vmap_ndim(self, key: str) -> int:
        """The axes `jax.vmap` put after a key's event axis, as its steps show them."""
        for per_key in self._steps.values():
            if key in per_key:
                return max(np.ndim(per_key[key]) - 1, 0)
        return 0

    def step_names(self, key: str) -> list[str]:
        return [name for name, per_key in self._steps.items() if key in per_key]

    # --- algebra -----------------------------------------------------------------
    def __add__(self, other: logdict | Event) -> logdict:
        """Concatenate series key by key (events of `self` first), with their
        steps; an `Event` adds as the one-event logdict it stands for."""
        if isinstance(other, Event):
            other = other.to_logdict()
        if not isinstance(other, logdict):
            return NotImplemented
        return concat([self, other])

    def __radd__(self, other: int) -> logdict:
        """``0 + logs``, so that ``sum`` of logdicts (and events) needs no start value."""
        return self if _is_zero(other) else NotImplemented

    def __or__(self, other: dict[Any, Any]) -> logdict:  # `dict` as in dict.__or__; other dicts: NotImplemented
        """Merge: keys of `other` replace those of `self`, with their steps."""
        if not isinstance(other, logdict):
            return NotImplemented
        steps: dict[str, dict[str, Any]] = {}
        valid, totals = {}, {}
        for src, keys in ((self, [k for k in self if k not in other]), (other, list(other))):
            for name, per_key in src._steps.items():
                for key in keys:
                    if key in per_key:
                        steps.setdefault(name, {})[key] = per_key[key]
            valid.update((k, src._valid[k]) for k in keys if k in src._valid)
            totals.update((k, src._totals[k]) for k in keys if k in src._totals)
        return self._like({**self, **other}, steps, valid, totals)

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
        valid = {rename[k]: self._valid[k] for k in keys if k in self._valid}
        totals = {rename[k]: self._totals[k] for k in keys if k in self._totals}
        return self._like({rename[k]: self[k] for k in keys}, steps, valid, totals)

    def _in_my_order(self, other: logdict) -> logdict:
        """`other` (this one's keys, transformed) with the keys in this one's order."""
        return other._select(list(self), {k: k for k in self})

    @property
    def slice(self) -> _Slicer:
        """Slice every series along its event axis: ``logs.slice[::10]``."""
        return _Slicer(self)

    def map_series(self, fn: Callable[[Any], Any]) -> logdict:
        """Apply `fn` to every array of every series, step and mask (along the event axis)."""
        data = {k: jax.tree_util.tree_map(fn, v) for k, v in self.items()}
        steps = {name: {k: fn(s) for k, s in per_key.items()} for name, per_key in self._steps.items()}
        return self._like(data, steps, {k: fn(m) for k, m in self._valid.items()})._recounted()

    def reduce(self, mode: str) -> logdict:
        """Reduce every series over its events to a series of one event.

        `mode` is one of ``mean, sum, min, max, first, last``. The reduced event
        keeps the steps of the first event for ``first`` and of the last event
        otherwise.
        """
        if mode not in REDUCTIONS:
            raise ValueError(f"unknown reduce mode {mode!r}: use one of {', '.join(REDUCTIONS)}.")
        if mode not in ("first", "last"):
            rendered = {k: kind for k, kind in self.kind.items() if kind in RENDERED_KINDS}
            if rendered:
                key, kind = next(iter(rendered.items()))
                raise ValueError(
                    f"logdict.reduce({mode!r}): key {key!r} holds {kind}, which has no {mode}; reduce it with "
                    "'first' or 'last', or leave it out: "
                    "`logs.filter(lambda k, v: logs.kind[k] in ('scalar', 'array')).reduce(...)`."
                )
        if self._valid:  # padded keys: the recorded events only
            plain = self.filter(lambda k, _: k not in self._valid).reduce(mode)
            return self._in_my_order(plain | _reduce_padded(self.filter(lambda k, _: k in self._valid), mode))
        if mode in ("first", "last"):
            return self.slice[:1] if mode == "first" else self.slice[-1:]
        op = {"mean": jnp.mean, "sum": jnp.sum, "min": jnp.min, "max": jnp.max}[mode]
        data = {k: jax.tree_util.tree_map(lambda x: op(x, axis=0, keepdims=True), v) for k, v in self.items()}
        steps = {name: {k: s[-1:] for k, s in per_key.items()} for name, per_key in self._steps.items()}
        return self._like(data, steps)._recounted()

    # --- events ------------------------------------------------------------------------
    def events(self) -> Iterator[Event]:
        """The events this logdict holds, as NumPy `lox.Event`\\ s: the values in
        the shape they were logged with and the steps as ints, as a per-event
        `lox.tap` callback gets them. A block of a buffered tap
        (``buffer=K``), spooled logs and loaded runs split alike, so a callback
        written for single events serves blocks too:
        ``lox.tap(f, lambda block: [callback(e) for e in block.events()], buffer=K)``.

        Keys with the same number of events at the same steps (the keys of one
        `lox.log` call) come together in one event; each key's events keep
        their order, and the keys of different calls come one call after the
        other. Padding (``max_events``) is left out; a step an event did not
        carry (:data:`lox.NO_STEP`) is not among its steps.

        >>> import numpy as np, lox
        >>> logs = lox.logdict({"loss": np.array([0.5, 0.25]), "acc": np.array([0.75, 1.0])},
        ...                    steps={"step": {"loss": np.array([0, 1]), "acc": np.array([0, 1])}})
        >>> list(logs.events())
        [Event({'loss': 0.5, 'acc': 0.75}, step=0), Event({'loss': 0.25, 'acc': 1.0}, step=1)]
        """
        logs = self._trimmed("logdict.events") if self._valid else self
        host = {k: jax.tree_util.tree_map(np.asarray, v) for k, v in logs.items()}  # in the logdict's key order
        steps = {name: {k: steps_per_event(k, name, np.asarray(s), "an event has one step of each name")
                        for k, s in per_key.items()} for name, per_key in logs._steps.items()}
        calls: dict[tuple, list[str]] = {}  # keys with the same events and steps, as one call logs them
        for key, value in host.items():
            own = [(name, per_key[key]) for name, per_key in steps.items() if key in per_key]
            signature = (event_count(value), tuple(name for name, _ in own), tuple(s.tobytes() for _, s in own))
            calls.setdefault(signature, []).append(key)
        for (count, names, _), keys in calls.items():
            for i in range(count):
                data = {k: jax.tree_util.tree_map(lambda x, i=i: x[i], host[k]) for k in keys}
                at = {name: steps[name][keys[0]][i] for name in names}
                yield Event._trusted(data, {n: int(s) for n, s in at.items() if s != NO_STEP})

    # --- Arrow -------------------------------------------------------------------------
    def to_arrow(self, run: str | None = None) -> pa.Table:
        """One `pyarrow.Table`, one row per event of a key (schema in `lox_core.arrow`).

        >>> import numpy as np, lox
        >>> logs = lox.logdict({"loss": np.array([0.5, 0.25])}, steps={"step": {"loss": np.array([0, 1])}})
        >>> table = logs.to_arrow(run="seed0")
        >>> table.column_names
        ['run', 'key', 'step', 'value', 'dtype', 'shape', 'data', 'kind']
        >>> table.column("value").to_pylist(), table.column("step").to_pylist()
        ([0.5, 0.25], [0, 1])
        """
        from lox_core import arrow_codec  # pyarrow only when asked for (and no import cycle: it takes plain dicts)

        arrow_codec.check_run(run)
        logs = self._trimmed("to_arrow") if self._valid else self  # padded series: the recorded events only
        return arrow_codec.encode(logs, logs._steps, run)[0]

    @staticmethod
    def from_arrow(table: pa.Table, run: str | None = None) -> logdict:
        """The logdict of NumPy arrays a `to_arrow` table holds (also read back from Parquet).

        Pass ``run=`` to choose one run of a table that holds several.

        >>> import numpy as np, lox
        >>> logs = lox.logdict({"loss": np.array([0.5, 0.25])}, steps={"step": {"loss": np.array([0, 1])}})
        >>> back = lox.logdict.from_arrow(logs.to_arrow(run="seed0"), run="seed0")
        >>> back["loss"].tolist(), back.step["loss"].tolist()
        ([0.5, 0.25], [0, 1])
        """
        from lox_core import arrow_codec

        return logdict._trusted(*arrow_codec.decode(table, run))

    # --- display ---------------------------------------------------------------------
    def __repr__(self) -> str:
        """Each key's dtype and shape, and for concrete logs (not while traced)
        its values and steps, rounded and abbreviated as `print(event)` shows them."""
        if not self:
            return "logdict({})"
        lines = []
        for key, value in self.items():
            names = self.step_names(key)
            padded = "  padded" if key in self._valid else ""
            if isinstance(value, Media):  # a few words per kind, not its pixels
                steps = "".join(f"  {name}={_show_steps(self._steps[name][key])}" for name in names
                                if _concrete(self._steps[name][key]))
                lines.append(f"  {key!r}: {event_count(value)} × {printing.media_summary(value, 1)}{steps}{padded}")
            elif _concrete(value, self._valid.get(key), *(self._steps[name][key] for name in names)):
                shown = printing.show(jax.tree_util.tree_map(_shown, value))
                steps = "".join(f"  {name}={_show_steps(self._steps[name][key])}" for name in names)
                valid = f"  valid={printing.show(self._valid[key])}" if key in self._valid else ""
                lines.append(f"  {key!r}: {shown}{steps}{valid}")
            else:
                shapes = jax.tree_util.tree_map(_describe, value)
                lines.append(f"  {key!r}: {shapes}" + (f"  steps: {', '.join(names)}" if names else "") + padded)
        return "logdict({\n" + ",\n".join(lines) + "\n})"

    __str__ = __repr__

    def __reduce__(self) -> tuple[Callable[..., logdict], tuple[Any, ...]]:
        return (_rebuild, (dict(self), self._steps, self._valid, self._totals))


def _rebuild(data, steps, valid, totals) -> logdict:
    return logdict(data, steps)._like(data, steps, valid, totals)


def _reduce_padded(logs: logdict, mode: str) -> logdict:
    """`logs.reduce(mode)` of padded keys: over recorded events only. The
    result is one event, itself padding (``valid`` false) where none was
    recorded; its steps are those of the first or last recorded event."""
    data, steps, valid = {}, {name: {} for name in logs.steps}, {}
    for key, value in logs.items():
        mask = logs._valid[key]
        xp = _numpy_or_jax(mask, *jax.tree_util.tree_leaves(value))
        events = mask.shape[0]
        count = mask.sum(axis=0)
        # The event whose steps the result keeps (and whose values first/last take), per vmap element.
        if mode == "first":
            at = xp.argmax(mask, axis=0)
        else:
            at = events - 1 - xp.argmax(mask[::-1], axis=0)

        # This iteration's values bound as defaults (the closures run within the iteration anyway).
        def pick(x, at=at, xp=xp):
            index = xp.reshape(at, (1, *at.shape) + (1,) * (x.ndim - 1 - at.ndim))
            return xp.take_along_axis(x, xp.broadcast_to(index, (1, *x.shape[1:])), axis=0)

        def padded_mask(x, mask=mask, xp=xp):
            return xp.reshape(mask, mask.shape + (1,) * (x.ndim - mask.ndim))

        def reduce_leaf(x, xp=xp, count=count):
            if mode in ("first", "last"):
                return pick(x)
            m = padded_mask(x)
            if mode in ("mean", "sum"):
                total = xp.sum(xp.where(m, x, xp.zeros((), x.dtype)), axis=0, keepdims=True)
                if mode == "sum":
                    return total
                return total / xp.reshape(count, count.shape + (1,) * (x.ndim - 1 - count.ndim))
            fill = _identity(x.dtype, mode)
            op = xp.min if mode == "min" else xp.max
            return op(xp.where(m, x, fill), axis=0, keepdims=True)

        data[key] = jax.tree_util.tree_map(reduce_leaf, value)
        for name in logs.step_names(key):
            s = logs.steps[name][key]
            if s.ndim < mask.ndim:  # one step per event for every element
                s = xp.broadcast_to(xp.reshape(s, s.shape + (1,) * (mask.ndim - s.ndim)), mask.shape)
            steps[name][key] = pick(s)
        valid[key] = (count > 0)[None]
    return logs._like(data, steps, valid)._recounted()


def _identity(dtype, mode: str):
    """The value that `min` (or `max`) ignores: what padding becomes."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return mode == "min"
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return info.max if mode == "min" else info.min
    return np.inf if mode == "min" else -np.inf


def _step_named(steps: dict[str, Any], name: str, holder: str) -> Any:
    """``steps[name]``, for a step name read as an attribute (``logs.step``,
    ``event.epoch``); else an AttributeError that lists the step names."""
    if name.startswith("__"):
        raise AttributeError(name)
    if name in steps:
        return steps[name]
    raise AttributeError(
        f"{holder} has no step named {name!r}; its step names are {sorted(steps)}. "
        # No final period: Python may append ". Did you mean: ...?"
        "Pass steps to `lox.log` as keyword arguments, e.g. `lox.log(data, step=i)`"
    )


def _concrete(*trees) -> bool:
    """Whether the arrays can be shown: not traced, and all on this process."""
    return all(not isinstance(x, jax.core.Tracer) and getattr(x, "is_fully_addressable", True)
               for x in jax.tree_util.tree_leaves(trees))


def _show_steps(steps) -> str:
    """Steps as `print(logs)` shows them: `-` where an event did not carry the step name."""
    steps = np.asarray(steps)
    return printing.show(np.where(steps == NO_STEP, "-", steps.astype(object)) if (steps == NO_STEP).any() else steps)


def _shown(x) -> str:
    """An array as `print(logs)` shows it: dtype, shape and values (a string,
    which `printing.show` shows as it is)."""
    return f"{_describe(x)} {printing.show(x)}"


def _describe(x) -> str:
    dtype = getattr(x, "dtype", None)
    shape = getattr(x, "shape", None)
    if dtype is None or shape is None:
        return repr(x)
    name = "str" if np.dtype(dtype).kind in "UT" else np.dtype(dtype).name  # not StringDType128
    return f"{name}[{','.join(map(str, shape))}]"


class Event(dict[str, Any]):
    """One logged event: each key's value with the shape it was logged with
    (NumPy arrays; a scalar is a NumPy scalar), and its steps by name as ints.

    ``event.step`` (or any step name as an attribute) is the step the event
    was logged at; ``event.steps`` holds them all. `to_logdict` gives the
    event as a one-event `lox.logdict`, the form spooled logs take, and an
    event adds (``+``) as that logdict: events collected from a tap add up to
    what `lox.spool` returns (``sum(events, lox.logdict())``).

    >>> import numpy as np, lox
    >>> event = lox.Event({"loss": np.float32(0.5)}, step=3)
    >>> event
    Event({'loss': 0.5}, step=3)
    >>> float(event["loss"]), event.step, event.steps
    (0.5, 3, {'step': 3})
    >>> event.to_logdict()["loss"].shape
    (1,)
    >>> logs = sum([event, lox.Event({"loss": np.float32(0.25)}, step=4)], lox.logdict())
    >>> logs["loss"].tolist(), logs.step["loss"].tolist()
    ([0.5, 0.25], [3, 4])
    """

    __slots__ = ("steps",)
    steps: dict[str, Any]

    def __init__(self, data: Mapping[str, Any] | Iterable[tuple[str, Any]] = (), /, **steps: Any):
        super().__init__(data)
        self.steps = steps

    @classmethod
    def _trusted(cls, data: dict, steps: dict) -> Event:
        """An event that takes `data` and `steps` as they are (the hot path of a tap)."""
        event = cls.__new__(cls)
        dict.update(event, data)
        event.steps = steps
        return event

    def __getattr__(self, name: str) -> Any:
        return _step_named(object.__getattribute__(self, "steps"), name, "this event")

    # --- algebra: an event adds as the one-event logdict it stands for ---------------
    def __add__(self, other: logdict | Event) -> logdict:
        """``event + other``: the logdict of this event's series followed by
        `other`'s (an `Event` or a `lox.logdict`), with their steps."""
        if not isinstance(other, (logdict, Event)):
            return NotImplemented
        return self.to_logdict() + other

    def __radd__(self, other: int) -> logdict:
        """``0 + event``, so that ``sum(events)`` adds up too (``logs + event``
        is `logdict.__add__`'s)."""
        return self.to_logdict() if _is_zero(other) else NotImplemented

    def to_logdict(self) -> logdict:
        """The event as a one-event `lox.logdict`: every value and step with a
        leading event axis of 1."""
        data = {k: jax.tree_util.tree_map(lambda x: _value_array(x)[None], v) for k, v in self.items()}
        steps = {name: dict.fromkeys(data, _step_array(s)) for name, s in self.steps.items()} if data else {}
        return logdict._trusted(data, steps)

    def __repr__(self) -> str:
        values = ", ".join(f"{k!r}: {printing.show(v)}" for k, v in self.items())
        steps = "".join(f", {name}={printing.show(s)}" for name, s in self.steps.items())
        return f"Event({{{values}}}{steps})"

    __str__ = __repr__

    def __reduce__(self) -> tuple[Callable[..., Event], tuple[Any, ...]]:
        return (_rebuild_event, (dict(self), self.steps))


def _is_zero(x) -> bool:
    """Whether `x` is the int 0 that `sum` starts from."""
    return isinstance(x, int) and not isinstance(x, bool) and x == 0


def _value_array(x) -> np.ndarray:
    """A value of an event as NumPy: a Python number in the dtype JAX gives
    it (`lox.log` logs ``0.5`` as float32 unless 64-bit types are on)."""
    if isinstance(x, (bool, int, float, complex)):
        return np.asarray(x, jax.dtypes.canonicalize_dtype(np.asarray(x).dtype))
    return np.asarray(x)


def _step_array(step) -> np.ndarray:
    """An event's step with an event axis: a Python int in JAX's step dtype
    (int32 unless 64-bit types are on) where it fits, as `spool` returns steps."""
    if isinstance(step, int):
        dtype = jax.dtypes.canonicalize_dtype(np.int64)
        if np.iinfo(dtype).min <= step <= np.iinfo(dtype).max:
            return np.array([step], dtype)
    return np.asarray(step)[None]


def _rebuild_event(data: dict, steps: dict) -> Event:
    return Event._trusted(data, steps)


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
    :data:`NO_STEP` for the events that lacked it. Linear in the number of
    parts and keys: one pass groups the parts by key.
    """
    holders: dict[str, list[logdict]] = {}  # key -> the parts holding it, in order
    names: dict[str, dict[str, None]] = {}  # key -> its step names, in order of appearance
    order: dict[str, None] = {}  # every step name, in order of appearance
    for p in parts:
        for key in p:
            holders.setdefault(key, []).append(p)
        for name, per_key in p._steps.items():
            order[name] = None
            for key in per_key:
                if key in p:  # a step of a key the part does not hold is ignored
                    names.setdefault(key, {})[name] = None
    data: dict = {}
    steps: dict[str, dict] = {}
    valid, totals = {}, {}
    for key, held in holders.items():
        values = [p[key] for p in held]
        if len(held) == 1:  # the common case of distinct keys: nothing to join
            p = held[0]
            data[key] = values[0]
            for name in names.get(key, ()):
                steps.setdefault(name, {})[key] = p._steps[name][key]
            if key in p._valid:
                valid[key] = p._valid[key]
            if key in p._totals:
                totals[key] = p._totals[key]
            continue
        _check_same_structure(key, values)
        data[key] = _concat(values)
        masks = [p._valid.get(key) for p in held]
        if any(m is not None for m in masks):
            like = next(m for m in masks if m is not None)
            xp = _numpy_or_jax(like)
            masks = [
                m if m is not None else xp.ones((event_count(p[key]), *like.shape[1:]), bool)
                for m, p in zip(masks, held, strict=True)
            ]
            valid[key] = _concat(masks)
        if any(key in p._totals for p in held):
            recorded = [p.count[key] for p in held]
            dropped = [p.dropped[key] for p in held]
            totals[key] = (sum(recorded[1:], recorded[0]), sum(dropped[1:], dropped[0]))
        for name in names.get(key, ()):
            have = [p._steps.get(name, {}).get(key) for p in held]
            like = next(h for h in have if h is not None)
            filled = [
                h if h is not None
                else _numpy_or_jax(like).full((event_count(p[key]),) + like.shape[1:], NO_STEP, like.dtype)
                for h, p in zip(have, held, strict=True)
            ]
            steps.setdefault(name, {})[key] = _concat(filled)
    steps = {name: steps[name] for name in order if name in steps}
    return padded_logdict(data, steps, valid, totals)


def _check_same_structure(key: str, values: list) -> None:
    """One structure and event shape; one dtype, or on the host dtypes that one
    holds exactly (`lox_core.dtypes`: int32 and float32 give float64, which is
    what NumPy's concatenation gives them). Device arrays keep one dtype (JAX
    would round int32 to float32)."""
    first = jax.tree_util.tree_structure(values[0])
    if isinstance(values[0], Media):  # uint8 pixels and float ones (in [0, 1]) do not mix
        classes = {v.dtype_class() for v in values if isinstance(v, Media)}
        if len(classes) > 1:
            raise ValueError(
                f"key {key!r} holds {values[0].kind}s of integer and of float numbers (uint8 pixels or int16 "
                "samples, and floats in [0, 1] or [-1, 1]), which mean different things; convert them to one."
            )
    for other in values[1:]:
        if jax.tree_util.tree_structure(other) != first:
            raise ValueError(
                f"key {key!r} was logged with different structures: {first} and {jax.tree_util.tree_structure(other)}."
            )
    # Same structure (checked above): as many leaves.
    for leaves in zip(*(jax.tree_util.tree_leaves(v) for v in values), strict=True):
        host = _numpy_or_jax(*leaves) is np
        dtype = np.dtype(leaves[0].dtype)
        for x in leaves[1:]:
            common = dtype if x.dtype == dtype else common_dtype(dtype, x.dtype) if host else None
            if x.shape[1:] != leaves[0].shape[1:] or common is None:
                raise ValueError(
                    f"key {key!r} was logged with different shapes or dtypes: "
                    f"{_describe_event(leaves[0], dtype)} and {_describe_event(x)}. A key must keep one shape, "
                    "and dtypes one dtype holds exactly (see lox_core.dtypes); cast the values to one dtype, "
                    "and log differently shaped values under different keys."
                )
            dtype = common


def _describe_event(x, dtype=None) -> str:
    return f"{np.dtype(x.dtype if dtype is None else dtype).name}{list(x.shape[1:])}"


def _flatten(logs: logdict):
    keys = tuple(logs)
    step_index = tuple((name, key) for name, per_key in logs._steps.items() for key in per_key)
    valid, totals = tuple(logs._valid), tuple(logs._totals)
    children = [logs[k] for k in keys] + [logs._steps[name][key] for name, key in step_index]
    children += [logs._valid[k] for k in valid] + [t for k in totals for t in logs._totals[k]]
    return children, (keys, step_index, valid, totals)


def _unflatten(aux, children) -> logdict:
    keys, step_index, valid, totals = aux
    children = iter(children)
    data = {k: next(children) for k in keys}
    steps: dict[str, dict[str, Any]] = {}
    for name, key in step_index:
        steps.setdefault(name, {})[key] = next(children)
    out = logdict.__new__(logdict)
    dict.__init__(out, data)
    out._steps = steps
    out._valid = {k: next(children) for k in valid}
    out._totals = {k: (next(children), next(children)) for k in totals}
    return out


jax.tree_util.register_pytree_node(logdict, _flatten, _unflatten)
# An Event too, so that `jax.tree_util` maps its values and steps, and it passes through `jax.jit`.
jax.tree_util.register_pytree_node(
    Event,
    lambda e: ([*e.values(), *e.steps.values()], (tuple(e), tuple(e.steps))),
    lambda aux, children: Event._trusted(dict(zip(aux[0], children[: len(aux[0])], strict=True)),
                                         dict(zip(aux[1], children[len(aux[0]) :], strict=True))),
)


# `jax.export` serializes a program's output pytree: a logdict's static part
# (keys, step names, padded keys) as JSON. (Parameters named as JAX 0.8 types them.)
def _serialize_aux(aux_data) -> bytes:
    return json.dumps(aux_data).encode()


def _deserialize_aux(serialized_aux_data: bytes):
    keys, step_index, valid, totals = json.loads(serialized_aux_data)
    return tuple(keys), tuple(tuple(pair) for pair in step_index), tuple(valid), tuple(totals)


jax.export.register_pytree_node_serialization(
    logdict, serialized_name="lox.logdict", serialize_auxdata=_serialize_aux, deserialize_auxdata=_deserialize_aux
)


# --- the core's access to a logdict --------------------------------------------------------
# Not `lox.logdict`'s API: what the transforms, buffers and readers of lox_core use to
# build logdicts without the checks of `logdict(...)` and to carry the padding and event
# counts of bounded loops (`lox.spool(f, max_events=N)`). No module but this one touches
# a logdict's fields.


def trusted(data: dict, steps: dict) -> logdict:
    """A logdict that takes `data` and `steps` as they are (fresh dicts, no
    empty step names, no padding): for hot paths that build many small logdicts."""
    return logdict._trusted(data, steps)


def trusted_event(data: dict, steps: dict) -> Event:
    """An `Event` that takes `data` and `steps` as they are (the hot path of a tap)."""
    return Event._trusted(data, steps)


def padded_logdict(data: dict, steps: dict, valid: dict, totals: dict) -> logdict:
    """A logdict of `data` and `steps` with the masks of its padded keys
    (`valid`, as `logdict.valid` holds them) and the ``(recorded, dropped)``
    event counts of its keys that had a limit (`totals`, as `event_totals`
    gives them), each for the keys `data` holds; step names without keys are
    left out. Nothing is checked."""
    return logdict._trusted({}, {})._like(data, steps, valid, totals)


def event_totals(logs: logdict) -> dict[str, tuple]:
    """The ``(recorded, dropped)`` event counts of the keys of `logs` that had
    a limit, by key (a key without one is in neither `logs.valid` nor here).
    They are leaves of the logdict's pytree, so that they stay right under
    `jax.vmap` and through scans (where the interpreter sums them). Read only."""
    return logs._totals


def every(logs: logdict, n: int) -> logdict:
    """Every `n`-th event of each key (`lox.spool`'s ``interval``): a slice, or
    for a padded key a mask that keeps every `n`-th recorded event (its shape
    cannot change)."""
    if not logs._valid:
        return logs.slice[::n]
    unpadded = logs.filter(lambda k, _: k not in logs._valid).slice[::n]
    masked = logs.filter(lambda k, _: k in logs._valid)
    ranks = {k: jnp.cumsum(m, axis=0) - 1 for k, m in masked._valid.items()}
    masked._valid = {k: m & (ranks[k] % n == 0) for k, m in masked._valid.items()}
    return logs._in_my_order(unpadded | masked._recounted())


def in_key_order(logs: logdict, keys: list[str]) -> logdict:
    """`logs` with its keys (all of them) in the order of `keys`."""
    return logs._select(list(keys), {k: k for k in keys})


def shared_once(logs: logdict) -> logdict:
    """`logs` as the output of spool's compiled program: a logdict whose pytree
    holds each distinct array once (`plain` gives the user's logdict back)."""
    return _SharedOnce.of(logs)


def plain(logs: logdict) -> logdict:
    """A plain logdict of what `logs` holds (one made by `shared_once`, for
    instance), with its padding and event counts."""
    return logs._like(dict(logs), logs.steps)


class _SharedOnce(logdict):
    """Spooled logs as the output of spool's compiled program: a logdict whose
    pytree holds each distinct array once. The keys of one event share one step
    array, which would otherwise be an output per key (and XLA copies an array
    output twice). Which arrays are the same is fixed when the object is built
    (from the traced arrays), so its pytree structure never depends on the
    identity of whatever it holds later. `lox.spool` hands users a plain
    logdict made from it.

    Its one child is the plain logdict with each repeated array replaced by
    None; the pytree's static part names those places and where their array
    is, in strings and numbers, so that `jax.export` can serialize it."""

    __slots__ = ("_holes",)

    @classmethod
    def of(cls, logs: logdict, holes=None) -> "_SharedOnce":
        shared = cls._trusted(dict(logs), logs.steps)
        shared._valid, shared._totals = dict(logs._valid), dict(logs._totals)
        if holes is None:  # each array held again: (its place, the place it is first held)
            first: dict = {}
            repeated = []
            for place, x in _places(logs):
                source = first.setdefault(id(x), place)
                if source != place:
                    repeated.append((place, source))
            holes = tuple(repeated)
        shared._holes = holes
        return shared

    def _flatten(self):
        holey = plain(self)  # fresh dicts, but for the steps' per-key ones
        holey._steps = {name: dict(per_key) for name, per_key in holey._steps.items()}
        for place, _ in self._holes:
            _put(holey, place, None)
        return [holey], self._holes

    @classmethod
    def _unflatten(cls, holes, children):
        logs = children[0]
        for place, source in holes:
            _put(logs, place, _at(logs, source))
        return cls.of(logs, holes)


def _places(logs: logdict):
    """Each array a logdict holds directly, with its place: ("data", key),
    ("steps", name, key), ("valid", key) or ("totals", key, 0 or 1)."""
    for key, value in logs.items():
        if hasattr(value, "shape"):  # not a pytree of arrays
            yield ("data", key), value
    for name, per_key in logs._steps.items():
        for key, s in per_key.items():
            yield ("steps", name, key), s
    for key, mask in logs._valid.items():
        yield ("valid", key), mask
    for key, counts in logs._totals.items():
        for i, count in enumerate(counts):
            yield ("totals", key, i), count


def _at(logs: logdict, place):
    what, *where = place
    if what == "data":
        return logs[where[0]]
    if what == "steps":
        return logs._steps[where[0]][where[1]]
    if what == "valid":
        return logs._valid[where[0]]
    return logs._totals[where[0]][where[1]]


def _put(logs: logdict, place, value) -> None:
    what, *where = place
    if what == "data":
        dict.__setitem__(logs, where[0], value)
    elif what == "steps":
        logs._steps[where[0]][where[1]] = value
    elif what == "valid":
        logs._valid[where[0]] = value
    else:  # a (recorded, dropped) pair
        counts = list(logs._totals[where[0]])
        counts[where[1]] = value
        logs._totals[where[0]] = tuple(counts)


def _serialize_holes(aux_data) -> bytes:  # (parameters named as JAX 0.8 types them)
    return json.dumps(aux_data).encode()


def _deserialize_holes(serialized_aux_data: bytes):
    return tuple((tuple(place), tuple(source)) for place, source in json.loads(serialized_aux_data))


jax.tree_util.register_pytree_node(_SharedOnce, _SharedOnce._flatten, _SharedOnce._unflatten)
jax.export.register_pytree_node_serialization(
    _SharedOnce, serialized_name="lox.spooled_logdict",
    serialize_auxdata=_serialize_holes, deserialize_auxdata=_deserialize_holes,
)
