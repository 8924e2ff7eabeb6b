"""Conversion between `logdict` and Apache Arrow tables (schema version 2).

`to_arrow` turns a logdict into one long-form `pyarrow.Table` with one row per
event of a key; `from_arrow` turns such a table (also one read back from a
Parquet file, or several runs' tables concatenated) into a logdict again.

Schema, version 2
-----------------
Columns, in this order:

``run``: ``dictionary<int32, string>``
    The ``run`` argument of `to_arrow` on every row; null when it is None.
``key``: ``dictionary<int32, string>``, never null
    The series the event belongs to: the key, or ``key/path`` for the leaves of
    a pytree-valued key (below). The dictionary holds the series names in
    logdict order. `to_arrow` writes the rows of one series contiguously, in
    event order; tables a Logger hands to backends are then sorted by step
    (stably: each series keeps its event order, series interleave), and
    `from_arrow` reads either layout.
one column per step name: ``int64``, nullable
    In the order the step names first appear in ``logs.steps``. The event's
    step, or null where the event did not carry that step name
    (:data:`lox.NO_STEP` on the logdict side, or the key has no steps of that
    name at all).
``value``: ``float64``, nullable
    The event's value when it is a scalar of a dtype that float64 represents
    exactly: bool, integers of at most 32 bits, floating types of at most 64
    bits (float16, bfloat16 and the other narrow ``ml_dtypes`` types
    included). Null otherwise.
``dtype``: ``dictionary<int32, string>``
    ``numpy.dtype(...).name`` of the series: ``"float32"``, ``"bfloat16"``,
    ``"int64"``, ``"bool"``...; ``"str"`` for text.
``shape``: ``list<int32>``
    The shape of one event: an empty list for scalars. Axes added by
    `jax.vmap` come right after the event axis, so they are part of it.
``data``: ``large_binary``, nullable
    Exactly on the rows whose ``value`` is null (array-valued events, 64-bit
    integer and complex scalars): the event's raw bytes, C order, native byte
    order, ``prod(shape) * itemsize`` of them. Null on the rows with a
    ``value``. `to_arrow` shares each series' own buffer (no copy), so this
    column comes in one chunk per array-valued series. On text rows: the
    text's UTF-8 bytes where its shape is ``[]``, else a JSON list of its
    strings in C order (``["a", "b", "c", "d"]`` for shape ``[2, 2]``).
``kind``: ``dictionary<int32, string>``, never null
    What the row holds (`lox_core.media.KINDS`): ``scalar`` (shape ``[]``) or
    ``array`` for plain numbers; ``text`` (dtype ``str``, value null); or the
    kind the key was logged as: ``image``, ``video``, ``audio``,
    ``histogram`` (both series of a histogram, ``key/counts`` and
    ``key/edges``). Filter on it to take the rows a tool shows, e.g.
    ``SELECT key, step, value FROM 'DIR/*/*.parquet' WHERE kind = 'scalar'``.

Schema metadata, JSON values:

``lox.schema``
    ``"2"``.
``lox.step_dtypes``
    Step name -> NumPy dtype name of those steps on the logdict side, so that
    int32 steps come back int32.
``lox.step_batch_ndim``
    Series name -> k, for the series whose steps have the shape
    ``(events, *shape[:k])`` (steps logged under `jax.vmap`). Such steps must
    be equal along those k axes; they come back broadcast over them.
``lox.empty_series``
    Series name -> ``{"position": int, "dtype": str, "shape": [int],
    "steps": [str]}`` for the series with no events, which have no rows: they
    come back with zero events, at that position among the series, with those
    step names.
``lox.trees``
    Only in tables with a pytree-valued key (files of earlier lox lack it;
    readers that ignore it read such keys flat). Key -> the structure of its
    pytree, so that `from_arrow` rebuilds it from the key's ``key/path``
    series: a leaf (one series) is ``null``; a dict (string keys) is
    ``{"dict": {k: tree, ...}}``, in the logdict's key order; a list
    ``{"list": [tree, ...]}``; a tuple ``{"tuple": [tree, ...]}``; None
    ``{"none": null}``. E.g. ``{"norms": {"dict": {"l1": {"dict": {"kernel":
    null}}}}}`` for ``lox.log({"norms": {"l1": {"kernel": x}}})``. A key whose
    pytree has another node (a custom class, a namedtuple, a dict with
    non-string keys) or no leaf is not listed. A batch file that holds
    several tables lists the keys of all of them; a key's series that are not
    all there, or not at the same steps, are read flat. A key that the tables
    of one file give different structures (``{"m": {"loss": x}}`` in the
    training steps, ``{"m": {"acc": y}}`` in the evaluation steps) is listed
    with the string ``"flat"`` (:data:`FLAT`): several structures, so its
    series are read flat, in that file and in the run's other files (as for a
    key whose structure differs between files: `concat_read`).
``lox.kinds``
    Only in tables with a key logged as an image, video, audio clip or
    histogram (`lox_core.media`). Key -> ``{"kind": kind, **options}``, the
    kind's static options included: ``{"samples": {"kind": "image"}, "v":
    {"kind": "video", "fps": 10}, "clip": {"kind": "audio", "rate": 16000},
    "w": {"kind": "histogram"}}``. `from_arrow` rebuilds each such key from
    its series (`lox_core.media.rebuild`): an image's, video's or audio's
    one series is named as the key (its pixels, frames or samples), a
    histogram's two ``key/counts`` and ``key/edges``. A batch file that
    holds several tables lists the keys of all of them (lox writes tables of
    one key with different kinds or options into different files). A kind
    this lox does not know is an error naming the key.

Text
----
Strings (logged from Python: ``logger.log(state, {"sample": "..."})``) are
held in logdicts as NumPy ``StringDType`` arrays, ``(events, *shape)``;
fixed-width ``<U`` arrays are written the same way. Their rows have dtype
``str``, kind ``text``, a null value and the UTF-8 bytes (or a JSON list) in
``data``; `from_arrow` gives them back as ``StringDType`` arrays.

Version 1
---------
Tables and files of lox before kinds (``lox.schema`` ``"1"``) lack the
``kind`` column and ``lox.kinds``; they hold scalars and arrays only and read
as before. Readers that need a row's kind there derive it from the shape:
``scalar`` for ``[]``, else ``array`` (`lox_core.schema.row_kinds`). A
version above 2 is refused (upgrade lox).

Reading
-------
`from_arrow` reads any table with the six columns ``run``, ``key``,
``value``, ``dtype``, ``shape`` and ``data`` (``kind`` is optional, and not
needed to decode: ``lox.kinds`` and the ``str`` dtype say what to rebuild);
every other column is a step column (any integer type). String columns may be dictionaries with any index
type or plain strings, ``data`` binary or large_binary, ``shape`` list or
large_list, every column in any number of chunks, as other tools and Parquet
readers hand them back. Keys come back in order of first appearance and the
rows of one key in table order, also when keys are interleaved. A key whose
step column is null on all of its rows has no steps of that name; elsewhere a
null step becomes :data:`lox.NO_STEP`. Without the metadata (a file written
by another tool), steps come back int64 and one per event, and series
without events do not come back.

What round-trips: everything, exactly, but for these.

* A pytree-valued key becomes one series per leaf, named ``key/path``: dict
  keys, sequence indices and attribute names joined by ``/``, e.g.
  ``{"grad": {"w": ..., "b": [...]}}`` gives ``grad/b/0`` and ``grad/w``
  (`series_leaves`). A key ``"grad/w"`` beside it would give the same name:
  `to_arrow` refuses that, naming both keys, and a key two of whose own
  leaves give one name (``{"d/e": x, "d": {"e": y}}``), naming the key and
  the name (`check_own_series`). The key comes back as the
  pytree it was (``logs["grad"]["b"][0]``, its steps ``logs.step["grad"]``)
  through ``lox.trees``; with ``flat=True`` (trackers), and where a node is
  not a dict, list, tuple or None (a namedtuple, a registered class), or in
  a table without ``lox.trees`` (earlier lox), as its series
  (``logs["grad/b/0"]``), each with the key's steps.
* A kind's value (``lox.image(x)``...) comes back as that kind
  (``logs["samples"].pixels``, ``logs.kind["samples"] == "image"``), its
  options included; with ``flat=True``, or in a table without ``lox.kinds``,
  as its series: NumPy arrays named ``key`` (an image's pixels) or
  ``key/counts`` and ``key/edges`` (a histogram).
* A NaN in the ``value`` column comes back a NaN of the same sign, but not
  always with its payload bits (bfloat16 NaNs come back canonical, signalling
  NaNs quiet). Values in ``data`` come back bit for bit.
* A key whose steps of a name are all :data:`lox.NO_STEP` comes back without
  that step name. Steps of one name with different integer dtypes for
  different keys come back with their common dtype.

>>> import numpy as np, lox
>>> logs = lox.logdict(
...     {"loss": np.array([0.5, 0.25], np.float32), "w": np.zeros((2, 3), np.int8)},
...     steps={"step": {"loss": np.array([10, 20])}},
... )
>>> table = to_arrow(logs, run="seed0")
>>> table.column_names
['run', 'key', 'step', 'value', 'dtype', 'shape', 'data', 'kind']
>>> table.column("step").to_pylist(), table.column("value").to_pylist()
([10, 20, None, None], [0.5, 0.25, None, None])
>>> table.column("shape").to_pylist(), table.column("data").to_pylist()[2]
([[], [], [3], [3]], b'\\x00\\x00\\x00')
>>> back = from_arrow(table)
>>> back["w"].shape, back.step["loss"].tolist(), "w" in back.step
((2, 3), [10, 20], False)
>>> nested = lox.logdict({"norms": {"l1": {"kernel": np.ones(2)}}}, {"step": {"norms": np.array([0, 1])}})
>>> table = to_arrow(nested)
>>> table.column("key").to_pylist(), table.schema.metadata[b"lox.trees"]
(['norms/l1/kernel', 'norms/l1/kernel'], b'{"norms": {"dict": {"l1": {"dict": {"kernel": null}}}}}')
>>> from_arrow(table)["norms"]["l1"]["kernel"].tolist(), list(from_arrow(table, flat=True))
([1.0, 1.0], ['norms/l1/kernel'])
>>> one = lox.histogram(np.array([0.0, 1.0, 1.0]), bins=2)  # one event; [None] adds the event axis
>>> kinds = lox.logdict({"h": one[None], "note": np.array(["hi"])})
>>> table = to_arrow(kinds)
>>> table.select(["key", "kind", "dtype", "data"]).to_pylist()[2]
{'key': 'note', 'kind': 'text', 'dtype': 'str', 'data': b'hi'}
>>> back = from_arrow(table)
>>> back.kind, back["h"].counts.tolist(), back["note"].tolist(), list(from_arrow(table, flat=True))
({'h': 'histogram', 'note': 'text'}, [[1, 2]], ['hi'], ['h/counts', 'h/edges', 'note'])
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
import pyarrow as pa

from lox_core import arrow_codec
from lox_core.arrow_codec import FLAT as FLAT
from lox_core.arrow_codec import KINDS_METADATA as KINDS_METADATA
from lox_core.arrow_codec import TREES_METADATA as TREES_METADATA
from lox_core.arrow_codec import dictionary_codes as dictionary_codes
from lox_core.arrow_codec import flat_keys as flat_keys
from lox_core.arrow_codec import numpy_dtype
from lox_core.arrow_codec import to_arrow_runs as to_arrow_runs
from lox_core.logdict import concat, logdict, trusted
from lox_core.media import Media
from lox_core.series import claim_series_name, named_leaves
from lox_core.series import own_clash_message as own_clash_message
from lox_core.series import series_leaves as series_leaves

if TYPE_CHECKING:
    from collections.abc import Iterable

# The encoding itself is `lox_core.arrow_codec`'s (on plain dicts: `logdict.to_arrow`
# and `logdict.from_arrow` call it); this module gives tables and runs as logdicts.


# --- logdict -> Arrow ---------------------------------------------------------------------
def to_arrow(logs: logdict, run: str | None = None) -> pa.Table:
    """`logs` as an Arrow table of schema version 2 (see the module docstring).

    `run` names the run on every row (null when None), so that the tables of
    several runs can be concatenated and told apart by `from_arrow`.
    """
    return logs.to_arrow(run)


def flatten_keys(logs: logdict, keys=None) -> logdict:
    """`logs` with each pytree-valued key (of `keys`, or every key) replaced by
    its ``key/path`` series (`series_leaves`), each with the key's steps: the
    flat names the Arrow ``key`` column and trackers use, as
    ``from_arrow(table, flat=True)`` gives them.

    >>> import numpy as np, lox
    >>> logs = lox.logdict({"norms": {"l1": np.array([1.0, 2.0])}}, {"step": {"norms": np.array([0, 1])}})
    >>> flat = flatten_keys(logs)
    >>> list(flat), flat.step["norms/l1"].tolist()
    (['norms/l1'], [0, 1])
    """
    data: dict[str, Any] = {}
    steps: dict[str, dict[str, Any]] = {name: {} for name in logs.steps}
    valid: dict[str, Any] = {}
    seen: dict[str, str] = {}
    for key, value in logs.items():
        leaves = named_leaves(key, value) if keys is None or key in keys else [(key, value)]
        for name, leaf in leaves:
            claim_series_name(name, key, seen, value)
            data[name] = leaf
            for step_name, per_key in logs.steps.items():
                if key in per_key:
                    steps[step_name][name] = per_key[key]
            if key in logs.valid:
                valid[name] = logs.valid[key]
    return logdict(data, steps, valid=valid, dropped={name: logs.dropped[seen[name]] for name in valid})


def concat_read(parts: list[logdict], flat: Iterable[str] = (), run: str | None = None) -> logdict:
    """One run's logdicts read from its tables (files, batches), concatenated
    in order. A key that comes back with different pytree structures from
    different tables (logged with different structures, or read from files
    without ``lox.trees``), and a key of `flat` (one that a table's
    ``lox.trees`` lists as :data:`FLAT`, see `flat_keys`: read flat there),
    is flattened to its ``key/path`` series in all of them; a key of
    different kinds or options (a run resumed by a program that logged it
    otherwise) likewise, with a warning naming it and `run`."""
    if len(parts) == 1:
        return parts[0]
    structures: dict[str, set] = {}
    for part in parts:
        for key, value in part.items():
            structures.setdefault(key, set()).add(jax.tree_util.tree_structure(value))
    mixed = {key for key, found in structures.items() if len(found) > 1 or key in flat}
    _warn_of_kinds_lost(parts, mixed, run)
    if mixed:
        parts = [flatten_keys(part, mixed) for part in parts]
    return concat(parts) if parts else logdict()


def _warn_of_kinds_lost(parts: list[logdict], mixed: set[str], run: str | None) -> None:
    for key in sorted(mixed):
        found = list(dict.fromkeys(_kind_words(part[key]) for part in parts if key in part))
        if len(found) > 1 and any(isinstance(part.get(key), Media) for part in parts):
            of_run = "" if run is None else f" of run {run!r}"
            warnings.warn(
                f"lox: key {key!r} holds {found[0]} in some tables{of_run} and {' or '.join(found[1:])} in others "
                "(a resumed run logged it otherwise): it is read as its arrays, without a kind. Log a key of "
                "another kind, fps or rate under a new key.",
                RuntimeWarning, stacklevel=3,
            )


def _kind_words(value) -> str:
    if not isinstance(value, Media):
        return "an array"
    return value.kind + "".join(f" ({name}={option!r})" for name, option in value.options.items())


# --- Arrow -> logdict ---------------------------------------------------------------------
def from_arrow(table: pa.Table, run: str | None = None, *, flat: bool = False) -> logdict:
    """The logdict of NumPy arrays that a table of schema version 2 (or 1) holds.

    The table may come from `to_arrow`, a Parquet file, or several runs'
    tables concatenated: then pass ``run=`` to choose one run (or use
    `from_arrow_runs` for all of them). A key logged as a pytree comes back
    as that pytree (``lox.trees``), a kind's value as that kind
    (``lox.kinds``), text as StringDType arrays; with ``flat=True``, as its
    series, NumPy arrays named as the ``key`` column names them.
    """
    return trusted(*arrow_codec.decode(table, run, flat=flat))


def from_arrow_runs(table: pa.Table, *, flat: bool = False) -> dict[str | None, logdict]:
    """Every run of a table that holds several (tables of runs concatenated,
    e.g. a batch file shared by vmapped seeds), as ``{run: logdict}`` in order
    of first appearance: the columns are decoded once for all runs. `flat`:
    as in `from_arrow`.

    >>> import numpy as np, lox, pyarrow as pa
    >>> a = lox.logdict({"x": np.array([1.0, 2.0])}, {"step": {"x": np.array([0, 1])}})
    >>> b = lox.logdict({"x": np.array([5.0])}, {"step": {"x": np.array([0])}})
    >>> runs = from_arrow_runs(pa.concat_tables([to_arrow(a, run="a"), to_arrow(b, run="b")]))
    >>> {run: logs["x"].tolist() for run, logs in runs.items()}
    {'a': [1.0, 2.0], 'b': [5.0]}
    """
    header = arrow_codec.Header(table, flat)
    if table.num_rows == 0:
        return {}
    by_step = StepRows.of(table, header)
    joined = StepRows.join([by_step]) if by_step is not None else None
    if joined is not None:
        return joined
    if table.column("run").null_count == table.num_rows:
        run_codes, run_names = np.zeros(table.num_rows, np.int64), [None]
    else:
        run_codes, run_names = dictionary_codes(table.column("run"))
        if (run_codes < 0).any():
            raise ValueError("the run column has nulls on some rows only; every row of a run names it.")
    if table.column("key").null_count:
        raise ValueError("the key column has nulls; every row of the lox Arrow schema names its key.")
    key_codes, key_names = dictionary_codes(table.column("key"))
    groups = run_codes * len(key_names) + key_codes
    order: np.ndarray | None = None
    if not bool(np.all(groups[1:] >= groups[:-1])):
        # A stable grouping by (run, key); NumPy sorts 16-bit integers in linear time (radix sort).
        narrow = groups.astype(np.uint16) if len(run_names) * len(key_names) <= 2**16 else groups
        order = np.argsort(narrow, kind="stable")
        groups = groups[order]
    starts = np.flatnonzero(np.concatenate([[True], groups[1:] != groups[:-1]]))
    counts = np.diff(np.append(starts, len(groups)))
    first_row = starts if order is None else order[starts]  # where each (run, key) first appears
    columns = arrow_codec.Columns(table, header.step_names, order)
    by_run: dict[int, list[int]] = {}
    for g in np.argsort(first_row, kind="stable"):  # runs, and keys within a run, in order of first appearance
        by_run.setdefault(int(groups[starts[g]]) // len(key_names), []).append(int(g))
    out: dict[str | None, logdict] = {}
    for run, members in by_run.items():
        keys = [key_names[int(groups[starts[g]]) % len(key_names)] for g in members]
        out[run_names[run]] = trusted(*header.series(columns, keys, starts[members], counts[members]))
    return out


def scalars_only(table: pa.Table) -> bool:
    """Whether every row holds a scalar in its value column: no dimension in
    ``shape``, nothing in ``data``."""
    return (table.column("value").null_count == 0 and table.column("data").null_count == table.num_rows
            and not any(len(chunk.flatten()) for chunk in table.column("shape").chunks))


class StepRows:
    """The rows of a table in the form lox writes most, read without a sort:
    scalars only, no nulls, and rows in groups of P (one step of one run) that
    hold the same P keys in the same order (one `lox.log` of P scalars per
    step). A key's rows are then every P-th row, and a run's rows a few blocks
    of such groups. `of` gives None for a table of another form.

    `of` converts one table (a batch file, in a thread as it is read) and
    `join` puts several together (a group's files, in order).
    """

    __slots__ = ("header", "keys", "runs", "starts", "ends", "values", "steps")

    def __init__(self, header: arrow_codec.Header, keys: list[str], runs: list, starts: np.ndarray, ends: np.ndarray,
                 values: list[np.ndarray], steps: dict[str, list[np.ndarray]]):
        self.header, self.keys, self.runs = header, keys, runs
        self.starts, self.ends = starts, ends  # blocks of steps, each of one run (runs[i]), in table order
        self.values, self.steps = values, steps  # per key: its events, in table order

    @staticmethod
    def of(table: pa.Table, header: arrow_codec.Header | None = None) -> StepRows | None:
        header = arrow_codec.Header(table) if header is None else header
        rows = table.num_rows
        if rows == 0 or not scalars_only(table):
            return None
        if table.column("key").null_count or any(table.column(n).null_count for n in header.step_names):
            return None
        key_codes, key_names = dictionary_codes(table.column("key"))
        again = np.flatnonzero(key_codes[1 : len(key_names) + 1] == key_codes[0])
        width = int(again[0]) + 1 if len(again) else len(key_names)
        pattern = key_codes[:width]
        if rows % width or len(np.unique(pattern)) != width:
            return None
        dtype_codes, dtype_names = dictionary_codes(table.column("dtype"))
        if table.column("run").null_count == rows:
            run_codes, run_names = np.zeros(rows, np.int64), [None]
        else:
            run_codes, run_names = dictionary_codes(table.column("run"))
        if (dtype_codes[:width] < 0).any() or not (key_codes.reshape(-1, width) == pattern).all():
            return None
        if len(set(dtype_names)) > 1 and not (dtype_codes.reshape(-1, width) == dtype_codes[:width]).all():
            return None
        # Where the run changes: only between steps (multiples of P), never to null.
        changes = np.flatnonzero(run_codes[1:] != run_codes[:-1]) + 1
        if (changes % width).any() or (run_codes[np.append(0, changes)] < 0).any():
            return None
        starts = np.append(0, changes // width)
        ends = np.append(starts[1:], rows // width)
        value = table.column("value").combine_chunks().to_numpy().reshape(-1, width)
        with np.errstate(invalid="ignore"):  # NaN to an integer or bool dtype, as astype does
            values = [value[:, p].astype(numpy_dtype(dtype_names[int(c)])) for p, c in enumerate(dtype_codes[:width])]
        steps = {}
        for name in header.step_names:
            column = table.column(name).combine_chunks().cast(pa.int64()).to_numpy().reshape(-1, width)
            steps[name] = [column[:, p].astype(header.step_dtypes.get(name, "int64")) for p in range(width)]
        return StepRows(header, [key_names[int(c)] for c in pattern],
                        [run_names[int(c)] for c in run_codes[starts * width]], starts, ends, values, steps)

    @staticmethod
    def join(parts: list[StepRows]) -> dict[str | None, logdict] | None:
        """Every run of `parts` (tables of one schema, in order) as ``{run: logdict}``
        in order of first appearance; None where the parts hold different keys."""
        first = parts[0]
        if any(p.keys != first.keys or p.steps.keys() != first.steps.keys()
               or [v.dtype for v in p.values] != [v.dtype for v in first.values] for p in parts):
            return None
        ids: dict = {}  # run -> its index, in order of first appearance
        block_runs = np.array([ids.setdefault(run, len(ids)) for p in parts for run in p.runs], np.int64)
        offsets = np.cumsum([0] + [len(p.values[0]) for p in parts])[:-1]
        block_starts = np.concatenate([p.starts + o for p, o in zip(parts, offsets, strict=True)])
        block_sizes = np.concatenate([p.ends - p.starts for p in parts])
        order = np.argsort(block_runs, kind="stable")
        if len(block_runs) == len(ids) and bool(np.all(order[1:] > order[:-1])):
            gather = None  # one block per run, in run order: the events are in place
        else:  # where each event comes from, run by run: +1 within a block, a jump between blocks
            sizes, starts = block_sizes[order], block_starts[order]
            total = int(sizes.sum())
            gather = np.ones(total, np.intp)
            kept = sizes > 0
            firsts = (np.cumsum(sizes) - sizes)[kept]  # where each block lands
            starts, sizes = starts[kept], sizes[kept]
            if total:
                gather[firsts[1:]] = starts[1:] - (starts[:-1] + sizes[:-1] - 1)
                gather[0] = starts[0]
            np.cumsum(gather, out=gather)

        def joined(pieces: list[np.ndarray]) -> np.ndarray:
            events = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
            return events if gather is None else events[gather]

        values = [joined([p.values[k] for p in parts]) for k in range(len(first.keys))]
        steps = {name: [joined([p.steps[name][k] for p in parts]) for k in range(len(first.keys))]
                 for name in first.steps}
        bounds = np.concatenate([[0], np.cumsum(np.bincount(block_runs, weights=block_sizes, minlength=len(ids)))])
        bounds = bounds.astype(np.int64).tolist()
        header, out = first.header, {}
        for run, i in ids.items():
            a, b = bounds[i], bounds[i + 1]
            out[run] = trusted(*header.complete(
                {key: v[a:b] for key, v in zip(first.keys, values, strict=True)},
                {name: {key: s[a:b] for key, s in zip(first.keys, per_key, strict=True)}
                 for name, per_key in steps.items()},
            ))
        return out
