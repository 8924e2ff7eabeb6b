"""The lox Arrow schema (version 2, specified in `lox_core.arrow`'s docstring),
encoded from and decoded to plain dicts of series: ``data`` (key -> value, a
pytree of arrays with a leading event axis) and ``steps`` (step name -> key ->
steps), as a logdict holds them.

`encode` makes one table, `to_arrow_runs` one table of several vmapped runs;
`decode` reads one run of a table, and `Header` and `Columns` read a table's
metadata and columns for the readers of several runs (``lox_core.arrow``).
This module does not import the logdict: `logdict.to_arrow` and
`logdict.from_arrow` call it, and `lox_core.arrow` gives its results as
logdicts, so that the dependencies go one way (logdict -> arrow_codec <-
arrow -> logdict).
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import jax
import ml_dtypes
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lox_core import media, schema
from lox_core.dtypes import common_dtype
from lox_core.series import NO_STEP, claim_series_name, named_leaves, steps_per_event

if TYPE_CHECKING:
    from collections.abc import Mapping

    from lox_core.logdict import logdict  # for annotations only: logdict imports this module


_DICT = pa.dictionary(pa.int32(), pa.string())
TREES_METADATA = "lox.trees"  # key -> its pytree structure, for the keys that hold pytrees
KINDS_METADATA = "lox.kinds"  # key -> {"kind": ..., **options}, for the keys that hold a kind's value (images...)
TEXT_DTYPE = "str"  # the dtype column of text rows
FLAT = "flat"  # the lox.trees entry of a key logged with several structures: read its series flat
_INT64_MAX = np.iinfo(np.int64).max


# --- series -> Arrow ----------------------------------------------------------------------
def check_run(run: str | None) -> None:
    """Refuse a run name that is not a string (None: no run)."""
    if run is not None and not isinstance(run, str):
        raise TypeError(f"`run` must be a string or None, got {type(run).__name__}.")


def encode(data: Mapping[str, Any], steps: dict[str, dict[str, Any]], run: str | None
           ) -> tuple[pa.Table, np.ndarray]:
    """The table of the series `data` and `steps` hold (no padding: a logdict
    trims its padded keys first), with `run` on every row (`check_run`); and
    the rows of each series (they lie together, in series order)."""
    step_names = list(steps)
    for name in step_names:
        if name in schema.COLUMNS:
            raise ValueError(
                f"step name {name!r} is a column of the lox Arrow schema ({', '.join(schema.COLUMNS)}); "
                f"rename the step, e.g. `lox.log(..., {name}_step=...)`."
            )
    series = _series(data, steps)
    counts = np.array([len(s.values) for s in series], np.int64)
    bounds = np.concatenate([[0], np.cumsum(counts)])  # each series' rows
    total = int(bounds[-1])
    step_dtypes = _step_dtypes(series, step_names)

    columns: dict[str, Any] = {
        "run": _run_column(run, total),
        "key": _dict_column([s.name for s in series], list(range(len(series))), bounds),
    }
    for name in step_names:
        columns[name] = _step_column(series, name, bounds)
    columns["value"] = _value_column(series, bounds)
    dtype_names = list(dict.fromkeys(s.dtype for s in series))
    columns["dtype"] = _dict_column(dtype_names, [dtype_names.index(s.dtype) for s in series], bounds)
    columns["shape"] = _shape_column(series, bounds)
    columns["data"] = _data_column(series)
    kind_names = list(dict.fromkeys(s.kind for s in series))
    columns[schema.KIND] = _dict_column(kind_names, [kind_names.index(s.kind) for s in series], bounds)

    metadata = {
        "lox.schema": schema.SCHEMA_VERSION,
        "lox.step_dtypes": json.dumps(step_dtypes),
        "lox.step_batch_ndim": json.dumps({s.name: s.batch_ndim for s in series if s.batch_ndim}),
        "lox.empty_series": json.dumps(
            {
                s.name: {"position": i, "dtype": s.dtype, "shape": list(s.values.shape[1:]),
                         "steps": list(s.steps)}
                for i, s in enumerate(series) if len(s.values) == 0
            }
        ),
    }
    trees = {key: tree for key, value in data.items() if (tree := _tree(value)) is not None}
    if trees:  # only where a key holds a pytree: other tables stay as earlier lox wrote them
        metadata[TREES_METADATA] = json.dumps(trees)
    kinds = {key: {"kind": value.kind, **value.options}
             for key, value in data.items() if isinstance(value, media.Media)}
    if kinds:  # only where a key holds an image, a video...
        metadata[KINDS_METADATA] = json.dumps(kinds)
    types = {"run": _DICT, "key": _DICT, "value": pa.float64(), "dtype": _DICT,
             "shape": pa.list_(pa.int32()), "data": pa.large_binary(), schema.KIND: _DICT}
    fields = pa.schema([pa.field(n, types.get(n, pa.int64()), nullable=n not in ("key", schema.KIND)) for n in columns],
                       metadata=metadata)
    return pa.Table.from_arrays(list(columns.values()), schema=fields), counts


def to_arrow_runs(logs: logdict, runs: list[str], batch_ndim: int) -> tuple[pa.Table, np.ndarray]:
    """The logs of several runs at once, logged under `jax.vmap` (the leading
    `batch_ndim` axes of every array are the runs, `runs` naming them in C
    order), as one table: each run's rows together, in the order of `runs`,
    ordered by the primary step within a run as `lox_core.schema.order_by_step`
    orders one run's table. Returns the table and where each run's rows start
    (``len(runs) + 1`` offsets), so that ``table.slice(start, stop - start)``
    is the table `to_arrow` makes of that run's logs, ordered by step.

    Far cheaper than one `to_arrow` per run when the runs are many (vmapped
    seeds): the arrays are converted once. Padded logs (``logs.valid``) have a
    different number of events per run: convert them run by run.

    >>> import numpy as np, lox
    >>> logs = lox.logdict({"x": np.array([[1.0, 2.0], [3.0, 4.0]])}, {"step": {"x": np.array([[1, 0], [0, 1]])}})
    >>> table, offsets = to_arrow_runs(logs, ["a", "b"], batch_ndim=1)
    >>> table.column("run").to_pylist(), table.column("value").to_pylist(), offsets.tolist()
    (['a', 'a', 'b', 'b'], [2.0, 1.0, 3.0, 4.0], [0, 2, 4])
    """
    if logs.valid:
        raise ValueError("to_arrow_runs: padded logs (logs.valid) differ in events per run; convert each run apart.")
    leaves = jax.tree_util.tree_leaves((dict(logs), logs.steps))
    batch = np.shape(leaves[0])[:batch_ndim] if leaves else (len(runs),)
    count = math.prod(batch)
    if count != len(runs) or any(np.shape(x)[:batch_ndim] != batch for x in leaves):
        raise ValueError(f"to_arrow_runs: {len(runs)} runs, but the arrays' batch axes are {batch}.")
    # Each run's events one after the other: (runs * events, ...), run-major.
    flat = lambda x: np.asarray(x).reshape(count * np.shape(x)[batch_ndim], *np.shape(x)[batch_ndim + 1 :])  # noqa: E731
    # Dicts rebuilt by hand: tree_map would sort their keys, and the key order is the logdict's.
    data = {key: jax.tree_util.tree_map(flat, value) for key, value in logs.items()}
    steps = {name: {key: flat(s) for key, s in per_key.items()} for name, per_key in logs.steps.items()}
    table, sizes = encode(data, {name: per_key for name, per_key in steps.items() if per_key}, None)
    # A series of n rows holds n / count events per run, run after run.
    run_of_row = np.concatenate([np.repeat(np.arange(count), size // count) for size in sizes] + [np.zeros(0, int)])
    primary = schema.primary_step(schema.step_names(table))
    if primary is None:
        order = np.argsort(run_of_row, kind="stable")
    else:  # nulls last within a run, as pyarrow's sort orders them
        steps = table.column(primary)
        filled = pc.fill_null(steps, _INT64_MAX).to_numpy() if steps.null_count else steps.to_numpy()
        order = np.lexsort((filled, run_of_row))  # stable: equal steps keep their order
    run_indices = pa.array(run_of_row[order].astype(np.int32))
    run_column = pa.DictionaryArray.from_arrays(run_indices, pa.array(runs, pa.string()))
    table = table.take(pa.array(order)).set_column(0, "run", run_column)
    offsets = np.concatenate([[0], np.cumsum(np.bincount(run_of_row, minlength=count))])
    return table, offsets


class _Series:
    """One array leaf of a key, on the host, with the key's steps (one per
    event), its kind (`lox_core.media.KINDS`) and its dtype column's name."""

    __slots__ = ("name", "values", "steps", "batch_ndim", "kind", "dtype")

    def __init__(self, name: str, values: np.ndarray, steps: dict[str, np.ndarray], batch_ndim: int,
                 kind: str | None):
        self.name, self.values, self.steps, self.batch_ndim = name, values, steps, batch_ndim
        text = values.dtype.kind in "UT"
        self.dtype = TEXT_DTYPE if text else values.dtype.name
        # A row's own kind where the key has none: text, one number (shape []) or an array.
        self.kind = kind or ("text" if text else "scalar" if values.ndim == 1 else "array")


def _series(data: Mapping[str, Any], steps: dict[str, dict[str, Any]]) -> list[_Series]:
    out: list[_Series] = []
    seen: dict[str, str] = {}
    for key, value in data.items():
        own = {name: np.asarray(per_key[key]) for name, per_key in steps.items() if key in per_key}
        kind = value.kind if isinstance(value, media.Media) else None
        for name, leaf in named_leaves(key, value):
            claim_series_name(name, key, seen, value)
            values = _host(name, leaf)
            batch_ndim = _batch_ndim(name, values, own)
            out.append(_Series(name, values, {n: _step_per_event(name, n, s) for n, s in own.items()}, batch_ndim,
                               kind))
    return out


def flat_keys(table: pa.Table) -> set[str]:
    """The keys that `table`'s ``lox.trees`` lists as :data:`FLAT` (logged with
    several structures in its tables): to pass to `concat_read`, so that they
    come back flat from the run's other tables too."""
    return {key for key, tree in _json(_metadata(table), TREES_METADATA).items() if tree == FLAT}


# --- pytree structures as JSON (the lox.trees metadata) ------------------------------------
_OPAQUE = object()  # a pytree node that JSON does not describe (a custom class, a namedtuple)


def _tree(value) -> Any:
    """The ``lox.trees`` description of a key's value (see `lox_core.arrow`'s
    docstring); None for an array, or for a pytree without leaves or with a
    node other than a dict of string keys, a list, a tuple or None."""
    if isinstance(value, (np.ndarray, jax.Array)):
        return None  # the usual key: one series, no structure
    tree = _describe(value)
    if tree is _OPAQUE or tree is None or not jax.tree_util.tree_leaves(value):
        return None
    return tree


def _describe(value) -> Any:
    kind = type(value)
    if kind is dict:
        if not all(isinstance(k, str) for k in value):
            return _OPAQUE
        children = {k: _describe(v) for k, v in value.items()}
        return _OPAQUE if any(c is _OPAQUE for c in children.values()) else {"dict": children}
    if kind is list or kind is tuple:
        items = [_describe(v) for v in value]
        return _OPAQUE if any(c is _OPAQUE for c in items) else {kind.__name__: items}
    if value is None:
        return {"none": None}
    if jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(value)):
        return None  # an array: one series
    return _OPAQUE


def _tree_leaves(key: str, tree, top: str) -> list[str]:
    """The series names of a ``lox.trees`` description (of the key `top`), as `series_leaves` names them."""
    if tree is None:
        return [key]
    if isinstance(tree, dict) and len(tree) == 1:
        ((kind, children),) = tree.items()
        if kind == "dict" and isinstance(children, dict):
            return [name for k, child in children.items() for name in _tree_leaves(f"{key}/{k}", child, top)]
        if kind in ("list", "tuple") and isinstance(children, list):
            return [name for i, child in enumerate(children) for name in _tree_leaves(f"{key}/{i}", child, top)]
        if kind == "none":
            return []
    raise ValueError(
        f"the lox.trees metadata describes key {top!r} with {json.dumps(tree)}, which is not a pytree "
        f"description (null, {json.dumps(FLAT)}, or an object of one of dict, list, tuple, none); remove that "
        "entry to read its series flat."
    )


def _build(key: str, tree, series: Mapping[str, Any]) -> Any:
    """The value of a key, its leaves taken from `series` by name."""
    if tree is None:
        return series[key]
    ((kind, children),) = tree.items()
    if kind == "dict":
        return {k: _build(f"{key}/{k}", child, series) for k, child in children.items()}
    if kind == "none":
        return None
    items = [_build(f"{key}/{i}", child, series) for i, child in enumerate(children)]
    return items if kind == "list" else tuple(items)


def _nest(trees: dict[str, Any], data: dict, steps: dict) -> tuple[dict, dict]:
    """`data` and `steps` with the series of each key in `trees` put back into
    the key's pytree, where all of them are there, with the same steps."""
    owner: dict[str, str] = {}  # series name -> the key whose pytree takes it
    whole: list[tuple[str, list[str]]] = []  # the keys whose series are all there, with the same steps
    for key, tree in trees.items():
        if tree == FLAT:  # several structures: its series stay flat
            continue
        names = _tree_leaves(key, tree, key)
        if names and all(n in data for n in names) and _same_steps(names, data, steps):
            whole.append((key, names))
    leaves = {name for _, names in whole for name in names}
    for key, names in whole:
        # A series named like the key is kept as it is, unless it is a leaf of another
        # key's pytree (the key "a/b" holding a list beside "a" holding {"b": x}).
        if key not in data or key in leaves:
            owner.update((name, key) for name in names)
    return _gathered(owner, data, steps, lambda key: _build(key, trees[key], data))


def _gathered(owner: dict[str, str], data: dict, steps: dict, value_of) -> tuple[dict, dict]:
    """`data` and `steps` with the series that `owner` gives a key (series name
    -> key) replaced by the key's `value_of(key)`, where its first series was;
    the key takes their steps (they are the same)."""
    if not owner:
        return data, steps
    gathered: dict[str, Any] = {}
    for name, value in data.items():
        key = owner.get(name)
        if key is None:
            gathered[name] = value
        elif key not in gathered:  # where its first series was
            gathered[key] = value_of(key)
    by_key: dict[str, dict] = {name: {} for name in steps}
    for step_name, per_key in steps.items():
        for name, s in per_key.items():
            by_key[step_name].setdefault(owner.get(name, name), s)  # a key's series share its steps
    return gathered, by_key


def _same_steps(names: list[str], data: dict, steps: dict) -> bool:
    first = names[0]
    if any(len(data[n]) != len(data[first]) for n in names[1:]):
        return False
    for per_key in steps.values():
        if first in per_key:
            if not all(n in per_key and np.array_equal(per_key[n], per_key[first]) for n in names[1:]):
                return False
        elif any(n in per_key for n in names[1:]):
            return False
    return True


def _host(name: str, leaf) -> np.ndarray:
    values = np.asarray(leaf)  # once per series: a device array comes over in one transfer
    if values.ndim == 0:
        raise ValueError(f"series {name!r} has no event axis (shape ()); a logdict series is (events, ...).")
    if values.dtype.kind == "U":  # NumPy's fixed-width strings: text, held as StringDType
        values = values.astype(np.dtypes.StringDType())
    if values.dtype.kind != "T" and not _storable(values.dtype):
        raise TypeError(f"series {name!r} has dtype {values.dtype}, which the lox Arrow schema cannot store.")
    if not values.dtype.isnative:
        values = values.astype(values.dtype.newbyteorder("="))
    return values


def _batch_ndim(name: str, values: np.ndarray, steps: dict[str, np.ndarray]) -> int:
    ndims = {s.ndim - 1 for s in steps.values()}
    if len(ndims) > 1:
        raise ValueError(f"the step arrays of series {name!r} have different numbers of axes: {sorted(ndims)}.")
    k = ndims.pop() if ndims else 0
    for step_name, s in steps.items():
        if s.shape[:1] != values.shape[:1] or s.shape[1:] != values.shape[1 : 1 + k]:
            raise ValueError(
                f"steps {step_name!r} of series {name!r} have shape {s.shape}, which does not match the "
                f"series' shape {values.shape}: steps are (events,) or (events, *batch axes)."
            )
    return k


def _step_per_event(name: str, step_name: str, s: np.ndarray) -> np.ndarray:
    if s.dtype.kind not in "iu":
        raise TypeError(f"steps {step_name!r} of series {name!r} have dtype {s.dtype}; steps must be integers.")
    s = steps_per_event(name, step_name, s, "the Arrow schema holds one step per event")
    if s.dtype == np.uint64 and s.size and s.max() > _INT64_MAX:
        raise ValueError(f"steps {step_name!r} of series {name!r} exceed the int64 range of the step column.")
    return s


def _step_dtypes(series: list[_Series], step_names: list[str]) -> dict[str, str]:
    out = {}
    for name in step_names:
        dtypes = {s.steps[name].dtype for s in series if name in s.steps}
        if dtypes:
            common = np.result_type(*dtypes)  # uint64 with a signed dtype has none among the integers
            out[name] = common.name if common.kind in "iu" else "int64"
    return out


def _run_column(run: str | None, total: int) -> pa.Array:
    if run is None:
        return pa.DictionaryArray.from_arrays(pa.nulls(total, pa.int32()), pa.array([], pa.string()))
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(total, np.int32)), pa.array([run], pa.string()))


def _dict_column(names: list[str], index: list[int], bounds: np.ndarray) -> pa.Array:
    """A dictionary column whose rows of series i all hold ``names[index[i]]``."""
    indices = np.zeros(bounds[-1], np.int32)  # fresh zero pages: nearly free when one name fills the column
    for i, a, b in zip(index, bounds[:-1], bounds[1:], strict=True):
        if i:
            indices[a:b] = i  # a fill per series: cheaper than np.repeat
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array(names, pa.string()))


def _step_column(series: list[_Series], name: str, bounds: np.ndarray) -> pa.Array:
    # Written in place, series by series: no per-series temporaries to concatenate.
    values = np.zeros(bounds[-1], np.int64)
    nulls = np.ones(bounds[-1], bool)
    for s, a, b in zip(series, bounds[:-1], bounds[1:], strict=True):
        if name in s.steps:
            values[a:b] = s.steps[name]
            np.equal(s.steps[name], NO_STEP, out=nulls[a:b])
    return _nullable(values, nulls, pa.int64())


def _value_column(series: list[_Series], bounds: np.ndarray) -> pa.Array:
    values = np.zeros(bounds[-1], np.float64)
    nulls = np.zeros(bounds[-1], bool)
    with np.errstate(invalid="ignore"):  # signalling NaNs become quiet: documented
        for s, a, b in zip(series, bounds[:-1], bounds[1:], strict=True):
            if _has_value(s):
                values[a:b] = s.values
            else:
                nulls[a:b] = True
    return _nullable(values, nulls, pa.float64())


def _has_value(s: _Series) -> bool:
    return s.values.ndim == 1 and _exact_in_float64(s.values.dtype)


def _nullable(values: np.ndarray, nulls: np.ndarray, type: pa.DataType) -> pa.Array:
    # No validity bitmap at all when nothing is null: consumers skip the null checks.
    return pa.array(values, type, mask=nulls if nulls.any() else None)


def _shape_column(series: list[_Series], bounds: np.ndarray) -> pa.Array:
    if sum((s.values.ndim - 1) * len(s.values) for s in series) > np.iinfo(np.int32).max:
        raise ValueError("the events' shapes hold more than 2**31 - 1 dimensions in all; convert fewer events at once.")
    offsets = np.zeros(bounds[-1] + 1, np.int32)
    dims, used = [], 0
    for s, a, b in zip(series, bounds[:-1], bounds[1:], strict=True):
        ndim = s.values.ndim - 1
        if ndim:
            offsets[a + 1 : b + 1] = used + ndim * np.arange(1, b - a + 1, dtype=np.int64)
            dims.append(np.tile(np.array(s.values.shape[1:], np.int32), b - a))
            used += ndim * (b - a)
        else:  # scalars: empty lists, flat offsets
            offsets[a + 1 : b + 1] = used
    return pa.ListArray.from_arrays(
        pa.array(offsets, pa.int32()), pa.array(np.concatenate(dims) if dims else np.zeros(0, np.int32), pa.int32())
    )


def _data_column(series: list[_Series]) -> pa.ChunkedArray:
    # One chunk per array-valued series, zero-copy; one null chunk per run of scalar series.
    chunks, nulls = [], 0
    for s in series:
        if _has_value(s):
            nulls += len(s.values)
            continue
        if nulls:
            chunks.append(pa.nulls(nulls, pa.large_binary()))
            nulls = 0
        chunks.append(_text_chunk(s.values) if s.kind == "text" else _data_chunk(s.values))
    if nulls:
        chunks.append(pa.nulls(nulls, pa.large_binary()))
    return pa.chunked_array(chunks, pa.large_binary())


def _data_chunk(values: np.ndarray) -> pa.Array:
    # The series' own buffer, cut into events by offsets.
    n = len(values)
    contiguous = np.ascontiguousarray(values)
    nbytes = contiguous.nbytes // n if n else 0
    offsets = np.arange(n + 1, dtype=np.int64) * nbytes
    return pa.Array.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(contiguous.reshape(-1).view(np.uint8))],
        null_count=0,
    )


def _text_chunk(values: np.ndarray) -> pa.Array:
    # UTF-8 per event: the string itself for shape (), else a JSON list of the strings, C order.
    if values.ndim == 1:
        return pa.array([str(v).encode() for v in values], pa.large_binary())
    flat = values.reshape(len(values), math.prod(values.shape[1:]))
    return pa.array([json.dumps(row.tolist(), ensure_ascii=False).encode() for row in flat], pa.large_binary())


def _exact_in_float64(dtype: np.dtype) -> bool:
    if dtype == np.bool_:
        return True
    if dtype.kind in "iu":
        return dtype.itemsize <= 4
    if dtype.kind == "f":
        return dtype.itemsize <= 8  # not long double
    if dtype.kind != "V":
        return False  # complex, datetime...
    # bfloat16, float8_*, int4... are opaque ("V") to NumPy; all are at most 16 bits wide.
    for info in (ml_dtypes.finfo, ml_dtypes.iinfo):
        try:
            return info(dtype).bits <= 32
        except (ValueError, TypeError):
            pass
    return False


def _storable(dtype: np.dtype) -> bool:
    """Whether the dtype's name alone gives the dtype back (not objects, strings, records)."""
    if dtype.kind == "O":
        return False
    try:
        return numpy_dtype(dtype.name) == dtype.newbyteorder("=")
    except TypeError:
        return False


def numpy_dtype(name: str) -> np.dtype:
    if name == TEXT_DTYPE:
        return np.dtype(np.dtypes.StringDType())
    try:
        return np.dtype(name)
    except TypeError:
        pass
    dtype = getattr(ml_dtypes, name, None)
    if dtype is None:
        raise TypeError(f"unknown dtype {name!r} in the dtype column; NumPy and ml_dtypes do not define it.")
    return np.dtype(dtype)


# --- Arrow -> series ----------------------------------------------------------------------
def decode(table: pa.Table, run: str | None = None, *, flat: bool = False) -> tuple[dict, dict]:
    """The series (``data``, ``steps``) of one run of a table of schema
    version 2 or 1, as NumPy arrays (a kind's value rebuilt, text as
    StringDType arrays); `run` and `flat` as in `lox_core.arrow.from_arrow`."""
    header = Header(table, flat)
    table = _select_run(table, run)
    keys, starts, counts, table = _group_by_key(table)
    return header.series(Columns(table, header.step_names), keys, starts, counts)


class Header:
    """What a table's schema says: its step columns and the lox metadata."""

    def __init__(self, table: pa.Table, flat: bool = False):
        missing = [c for c in schema.REQUIRED if c not in table.column_names]
        if missing:
            raise ValueError(
                f"the table lacks the column(s) {', '.join(map(repr, missing))} of the lox Arrow schema; "
                "it must have run, key, value, dtype, shape and data (see lox_core.arrow)."
            )
        meta = _metadata(table)
        if meta.get("lox.schema", schema.SCHEMA_VERSION) not in schema.READS:
            raise ValueError(
                f"the table has lox schema version {meta['lox.schema']!r}; this lox reads versions "
                f"{' and '.join(schema.READS)}. Upgrade lox."
            )
        self.step_dtypes = _json(meta, "lox.step_dtypes")
        self.batch_ndims = _json(meta, "lox.step_batch_ndim")
        self.empty_series = _json(meta, "lox.empty_series")
        self.trees = {} if flat else _json(meta, TREES_METADATA)  # key -> its pytree structure
        self.kinds = {} if flat else _kinds(_json(meta, KINDS_METADATA))  # key -> (kind, options)
        self.step_names = schema.step_names(table)
        for name in self.step_names:
            if not pa.types.is_integer(table.schema.field(name).type):
                raise TypeError(
                    f"step column {name!r} has type {table.schema.field(name).type}; steps must be integers."
                )

    def series(self, columns: Columns, keys: list[str], starts, counts) -> tuple[dict, dict]:
        """The series (``data``, ``steps``) of the keys whose rows lie at `starts`, `counts` in `columns`."""
        data: dict[str, np.ndarray] = {}
        steps: dict[str, dict[str, np.ndarray]] = {name: {} for name in self.step_names}
        for key, start, count in zip(keys, map(int, starts), map(int, counts), strict=True):
            dtype, shape = columns.dtype_and_shape(key, start, count)
            data[key] = columns.values(key, start, count, dtype, shape)
            k = int(self.batch_ndims.get(key, 0))
            for name in self.step_names:
                s = columns.steps(name, start, count)
                if s is not None:
                    steps[name][key] = _broadcast(s.astype(self.step_dtypes.get(name, "int64")), shape[:k])
        return self.complete(data, steps)

    def complete(self, data: dict[str, np.ndarray], steps: dict[str, dict[str, np.ndarray]]) -> tuple[dict, dict]:
        """The series read (``data``, ``steps``), with the series without events put back in place."""
        for key, info in sorted(self.empty_series.items(), key=lambda kv: kv[1]["position"]):
            if key in data:
                continue
            shape = tuple(info["shape"])
            k = int(self.batch_ndims.get(key, 0))
            data = _insert(data, int(info["position"]), key, np.zeros((0, *shape), numpy_dtype(info["dtype"])))
            for name in info["steps"]:
                steps.setdefault(name, {})[key] = np.zeros((0, *shape[:k]), self.step_dtypes.get(name, "int64"))
        if self.trees:
            data, steps = _nest(self.trees, data, steps)
        if self.kinds:
            data, steps = _rebuild(self.kinds, data, steps)
        # Step dicts follow the key order, as in a logdict built by lox.
        order = {key: i for i, key in enumerate(data)}
        steps = {name: dict(sorted(per_key.items(), key=lambda kv: order[kv[0]]))
                 for name, per_key in steps.items() if per_key}
        # Consistent by construction (each key's values and steps come from the same rows): a trusted logdict.
        return data, steps


def _kinds(described: dict) -> dict[str, tuple[str, dict[str, Any]]]:
    """The ``lox.kinds`` metadata checked: key -> (kind, options)."""
    out = {}
    for key, spec in described.items():
        kind = spec.get("kind") if isinstance(spec, dict) else None
        if kind not in media.MEDIA_KINDS:
            raise ValueError(
                f"the lox.kinds metadata describes key {key!r} with {json.dumps(spec)}; this lox knows the kinds "
                f"{', '.join(media.MEDIA_KINDS)} (written by a newer lox? upgrade lox), or remove that entry to "
                "read the key's arrays as they are."
            )
        out[key] = (kind, {name: option for name, option in spec.items() if name != "kind"})
    return out


def _rebuild(kinds: dict[str, tuple[str, dict[str, Any]]], data: dict, steps: dict) -> tuple[dict, dict]:
    """`data` and `steps` with the series of each key in `kinds` made into its
    kind's value again (`lox_core.media.rebuild`), where all of them are there,
    with the same steps; in place of its first series."""
    owner: dict[str, str] = {}  # series name -> the key whose value takes it
    names_of = {key: media.media_class(kind).series_names(key) for key, (kind, _) in kinds.items()}
    for key, names in names_of.items():
        if all(n in data for n in names) and (len(names) == 1 or key not in data) and _same_steps(names, data, steps):
            owner.update((name, key) for name in names)

    def value_of(key: str):
        kind, options = kinds[key]
        try:
            return media.rebuild(kind, options, [data[name] for name in names_of[key]])
        except TypeError as e:
            raise ValueError(
                f"the lox.kinds metadata gives key {key!r} the options {options} ({e}); remove that entry "
                "to read the key's arrays as they are."
            ) from None

    return _gathered(owner, data, steps, value_of)


def _metadata(table: pa.Table) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}


def _json(meta: Mapping[str, str], name: str) -> dict:
    return json.loads(meta[name]) if name in meta else {}


def dictionary_codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
    """Integer codes (-1 for null) and the names they index, for a string or dictionary column."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_dictionary(array.type):
        array = array.dictionary_encode()  # Parquet readers may hand back plain strings
    names = array.dictionary.to_pylist()
    # A dictionary may repeat a name (chunks concatenated): one code per distinct name.
    canon: dict[str, int] = {}
    remap = np.array([canon.setdefault(n, len(canon)) for n in names] + [-1], np.int64)
    if array.null_count == 0 and len(canon) == len(names):
        return array.indices.to_numpy(), names  # the indices are the codes: zero-copy
    indices = pc.fill_null(array.indices.cast(pa.int64()), -1).to_numpy(zero_copy_only=False)  # uint32 from polars
    return remap[indices], list(canon)


def _select_run(table: pa.Table, run: str | None) -> pa.Table:
    if table.num_rows == 0:
        return table  # no rows to choose from: any run of it has no events
    if table.column("run").null_count == table.num_rows:
        codes, names, runs = None, [], [None]
    else:
        codes, names = dictionary_codes(table.column("run"))
        present = np.flatnonzero(np.bincount(codes + 1, minlength=len(names) + 1)) - 1  # O(rows), no sort
        runs = [names[c] if c >= 0 else None for c in present]
    if run is None:
        if len(runs) > 1:
            shown = ", ".join(map(repr, runs[:5])) + (", ..." if len(runs) > 5 else "")
            raise ValueError(
                f"the table holds {len(runs)} runs ({shown}); pass run= to choose one, "
                f"e.g. from_arrow(table, run={next(r for r in runs if r is not None)!r})."
            )
        return table
    if run not in runs:
        known = ", ".join(repr(r) for r in runs[:5]) + (", ..." if len(runs) > 5 else "")
        raise ValueError(f"no run {run!r} in the table; its runs are: {known}.")
    if len(runs) == 1:
        return table
    return table.filter(pa.array(codes == names.index(run)))


def _group_by_key(table: pa.Table):
    """Keys in order of first appearance, and where each one's rows lie once grouped."""
    if table.column("key").null_count:
        raise ValueError("the key column has nulls; every row of the lox Arrow schema names its key.")
    codes, names = dictionary_codes(table.column("key"))
    n = len(codes)
    if n == 0:
        return [], [], [], table
    run_starts = np.flatnonzero(np.concatenate([[True], codes[1:] != codes[:-1]]))
    run_codes = codes[run_starts]
    present, first = np.unique(run_codes, return_index=True)
    order = present[np.argsort(first)]
    if len(run_codes) == len(present):
        # Every key's rows are contiguous already (as to_arrow writes them): slice in place.
        ends = np.append(run_starts[1:], n)
        return [names[c] for c in run_codes], run_starts, ends - run_starts, table
    # Interleaved keys: one stable sort groups them and keeps table order within a key.
    perm = np.argsort(codes, kind="stable")
    table = table.take(pa.array(perm))
    counts = np.bincount(codes, minlength=len(names))
    offsets = np.concatenate([[0], np.cumsum(counts)])
    return [names[c] for c in order], offsets[order], counts[order], table


class Columns:
    """The columns of a table, decoded once and read key by key; with `order`,
    as if the table's rows had been taken in that order (only the columns
    that hold something are reordered: arrays' shapes and bytes are not
    touched when every row is a scalar)."""

    def __init__(self, table: pa.Table, step_names: list[str], order: np.ndarray | None = None):
        take = (lambda x: x) if order is None else (lambda x: x[order])  # noqa: E731
        self.dtype_codes, self.dtype_names = dictionary_codes(table.column("dtype"))
        self.dtype_codes = take(self.dtype_codes)
        shape = table.column("shape").combine_chunks()
        if shape.null_count:
            raise ValueError("the shape column has nulls; every row of the lox Arrow schema has a shape.")
        self.scalars_only = len(shape.values) == 0  # no dimension on any row
        if order is not None and not self.scalars_only:
            shape = shape.take(pa.array(order))
        self.shape_offsets = shape.offsets.to_numpy()
        self.shape_dims = shape.values.to_numpy(zero_copy_only=False)
        value = table.column("value").combine_chunks()
        self.value = take(value.to_numpy(zero_copy_only=False))
        valid = _validity(value)
        self.value_valid = valid if isinstance(valid, bool) else take(valid)
        self.data = table.column("data")
        if order is not None and self.data.null_count < len(self.data):
            self.data = self.data.take(pa.array(order))
        self.step = {}
        for name in step_names:
            column = table.column(name).combine_chunks().cast(pa.int64())
            filled = pc.fill_null(column, NO_STEP) if column.null_count else column
            valid = _validity(column)
            self.step[name] = (take(filled.to_numpy()), valid if isinstance(valid, bool) else take(valid))

    def dtype_and_shape(self, key: str, start: int, count: int) -> tuple[np.dtype, tuple[int, ...]]:
        codes = self.dtype_codes[start : start + count]
        if (codes < 0).any():
            raise ValueError(f"rows of key {key!r} have no dtype; every row of the lox Arrow schema has one.")
        dtype = self._dtype_of(key, codes)
        if self.scalars_only:
            return dtype, ()
        offsets = self.shape_offsets[start : start + count + 1]
        if offsets[0] == offsets[-1]:  # scalars: no dimension on any row
            return dtype, ()
        ndim = offsets[1] - offsets[0]
        dims = self.shape_dims[offsets[0] : offsets[-1]]
        if (np.diff(offsets) != ndim).any() or (dims.reshape(count, ndim) != dims[:ndim]).any():
            raise ValueError(f"the rows of key {key!r} have different shapes; a key keeps one shape.")
        return dtype, tuple(int(d) for d in dims[:ndim])

    def _dtype_of(self, key: str, codes: np.ndarray) -> np.dtype:
        """The dtype of a key's series: its rows', or the dtype that holds all of
        theirs exactly (int32 and float32 rows: float64; see `lox_core.dtypes`)."""
        dtype = numpy_dtype(self.dtype_names[codes[0]])
        if (codes == codes[0]).all():
            return dtype
        for code in np.unique(codes):
            other = numpy_dtype(self.dtype_names[code])
            common = common_dtype(dtype, other)
            if common is None:
                raise ValueError(
                    f"the rows of key {key!r} have dtypes {dtype.name} and {other.name}, which no dtype holds "
                    "exactly; a key keeps one dtype, or dtypes that one holds exactly (see lox_core.dtypes)."
                )
            dtype = common
        return dtype

    def values(self, key: str, start: int, count: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        codes = self.dtype_codes[start : start + count]
        if count and (codes != codes[0]).any():
            # Rows of several dtypes (`_dtype_of`): each run of them as stored, then in the common dtype.
            cuts = [0, *(np.flatnonzero(codes[1:] != codes[:-1]) + 1).tolist(), count]
            return np.concatenate([
                self.values(key, start + a, b - a, numpy_dtype(self.dtype_names[codes[a]]), shape).astype(dtype)
                for a, b in zip(cuts[:-1], cuts[1:], strict=True)
            ])
        valid = self.value_valid
        if _all(valid, start, count):
            if math.prod(shape) != 1:
                raise ValueError(f"key {key!r} has a value column for events of shape {shape}; only scalars do.")
            with np.errstate(invalid="ignore"):
                return self.value[start : start + count].astype(dtype).reshape(count, *shape)
        if _any(valid, start, count):
            raise ValueError(f"the rows of key {key!r} mix value and data; a key uses one of them on all its rows.")
        data = self.data.slice(start, count).combine_chunks()  # zero-copy within one chunk
        if data.null_count:
            raise ValueError(f"rows of key {key!r} have neither value nor data.")
        if dtype.kind == "T":
            return _text(key, data, shape)
        if not pa.types.is_large_binary(data.type):
            data = data.cast(pa.large_binary())  # binary from other writers
        _, offsets_buf, bytes_buf = data.buffers()
        offsets = np.frombuffer(offsets_buf, np.int64, count + 1, data.offset * 8)
        nbytes = math.prod(shape) * dtype.itemsize
        if (np.diff(offsets) != nbytes).any():
            raise ValueError(
                f"the data of key {key!r} does not hold {nbytes} bytes per event ({dtype.name}{list(shape)})."
            )
        if nbytes == 0 or count == 0:
            return np.zeros((count, *shape), dtype)
        raw = np.frombuffer(bytes_buf, np.uint8, count * nbytes, int(offsets[0]))
        # A copy: writable, aligned, and it does not keep the whole table alive.
        return raw.copy().view(dtype).reshape(count, *shape)

    def steps(self, name: str, start: int, count: int) -> np.ndarray | None:
        values, valid = self.step[name]
        if not _any(valid, start, count):
            return None
        return values[start : start + count]


def _text(key: str, data: pa.Array, shape: tuple[int, ...]) -> np.ndarray:
    """Text rows' data as a StringDType array ``(events, *shape)``: UTF-8, a
    JSON list of the strings (C order) where the shape is not ``()``."""
    rows = [bytes(b).decode() for b in data.to_pylist()]
    out = np.empty((len(rows), *shape), np.dtypes.StringDType())
    if not shape:
        out[:] = rows
        return out
    size = math.prod(shape)
    for i, row in enumerate(rows):
        strings = json.loads(row) if size else []
        if not isinstance(strings, list) or len(strings) != size or not all(isinstance(t, str) for t in strings):
            raise ValueError(
                f"the data of text key {key!r} does not hold a JSON list of {size} strings per event "
                f"(shape {list(shape)}) on row {i} of the key."
            )
        out[i] = np.array(strings, np.dtypes.StringDType()).reshape(shape)
    return out


def _validity(array: pa.Array) -> np.ndarray | bool:
    """Which rows are valid: one bool when all rows agree (the usual case), else an array."""
    if array.null_count in (0, len(array)):
        return array.null_count == 0
    return array.is_valid().to_numpy(zero_copy_only=False)


def _all(valid: np.ndarray | bool, start: int, count: int) -> bool:
    return valid if isinstance(valid, bool) else bool(valid[start : start + count].all())


def _any(valid: np.ndarray | bool, start: int, count: int) -> bool:
    return valid if isinstance(valid, bool) else bool(valid[start : start + count].any())


def _broadcast(steps: np.ndarray, batch: tuple[int, ...]) -> np.ndarray:
    if not batch:
        return steps
    return np.ascontiguousarray(np.broadcast_to(steps.reshape(-1, *(1,) * len(batch)), (len(steps), *batch)))


def _insert(data: dict, position: int, key: str, value) -> dict:
    items = list(data.items())
    items.insert(min(position, len(items)), (key, value))
    return dict(items)
