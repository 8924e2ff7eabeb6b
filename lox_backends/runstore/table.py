"""The table of runs: one row per run, to compare runs (`lox.runs`).

Columns, in this order:

``run_id``, ``group``, ``name``, ``status``
    strings: the run, as ``_run.json`` names it; its status as `reader.run_status` resolves it.
``start``, ``end``
    ``timestamp[ms, UTC]``: when it was created, and when it ended (null while it runs).
``duration``
    ``float64`` seconds from start to end (null while it runs).
one column per metadata key
    nested keys flattened with dots (``config.lr``), as `flatten` does.
``<key>.last``, ``<key>.min``, ``<key>.max``, ``<key>.count``
    for each series of scalars (`lox_backends.runstore.layout`, ``summary``).
one column per summary value
    the values given by ``logger.summary``, under their names.

A name that the user could give twice (a summary value ``loss.min``, or
one named like a column above) is refused where it is given (`check_summary_name`).
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
import re
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lox_backends.runstore import filesystems, layout
from lox_backends.runstore.reader import EXPECTED, Writers, open_folder, read_run_json
from lox_backends.runstore.summary import STATISTICS, Summary

RUN_COLUMNS = ("run_id", "group", "name", "status", "start", "end", "duration")


def flatten(metadata: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """`metadata`'s values under their dotted names: nested dicts flattened.

    >>> dict(flatten({"lr": 0.1, "config": {"model": {"width": 64}}, "tags": ["a"]}))
    {'lr': 0.1, 'config.model.width': 64, 'tags': ['a']}
    """
    for key, value in metadata.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flatten(value, prefix=f"{name}.")
        else:
            yield name, value


def check_summary_name(name: Any, metadata_columns: Collection[str]) -> None:
    """Refuse a summary value's name that would clash with a column of the
    table of runs: a run's own columns, a metadata column (`metadata_columns`),
    or one a series' statistic is named (``<key>.min``...)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"`logger.summary` takes names that are non-empty strings, got {name!r}.")
    statistic = name.rpartition(".")[2]
    clash = (
        "a column of every run" if name in RUN_COLUMNS
        else "a metadata key of a run of this logger" if name in metadata_columns
        else f"the column of a key's {statistic} (lox keeps the last, min, max and count of every scalar key)"
        if "." in name and statistic in STATISTICS else None
    )
    if clash is not None:
        raise ValueError(f"`logger.summary` got the name {name!r}, which is {clash} in the table of runs "
                         f"(`lox.runs()`); give the value another name, e.g. 'best_{name.replace('.', '_')}'.")


# --- rows --------------------------------------------------------------------------------
def run_row(info: Mapping[str, Any], summary: Summary | None = None) -> dict[str, Any]:
    """A run's row, from its ``_run.json`` (`info`) and its summary (`summary`;
    else the one ``_run.json`` holds, if any): its stored status, not resolved."""
    start, end = _time(info.get("created")), _time(info.get("ended"))
    row: dict[str, Any] = {
        "run_id": info.get("run_id"), "group": info.get("group"), "name": info.get("name"),
        "status": info.get("status", "running"), "start": start, "end": end,
        "duration": (end - start).total_seconds() if start is not None and end is not None else None,
    }
    metadata = info.get("metadata")
    for name, value in flatten(metadata if isinstance(metadata, Mapping) else {}):
        row.setdefault(name, value)  # a metadata `name` is the run's name: its column has it
    summary = summary if summary is not None else Summary.from_json(info.get("summary"))
    for name, value in summary.columns().items():
        row.setdefault(name, value)
    return row


def to_table(rows: list[dict[str, Any]], values: Collection[str] = ()) -> pa.Table:
    """The table of `rows` (`run_row`s), its columns in the documented order
    (`values`: the names of user summary values). A column whose values have no
    common Arrow type holds them as strings (JSON for what is not a string)."""
    names = _ordered(list(dict.fromkeys(name for row in rows for name in row)), values)
    return pa.table({name: _column(name, [row.get(name) for row in rows]) for name in names})


def _ordered(names: list[str], values: Collection[str]) -> list[str]:
    """The table's column order: the run's columns, metadata, statistics, values."""
    present = set(names)
    statistics = [name for name in names if name not in values and _statistic(name, present)]
    rest = [name for name in names if name not in RUN_COLUMNS and name not in values and name not in statistics]
    return [*(n for n in RUN_COLUMNS if n in present), *rest, *statistics, *(n for n in names if n in values)]


def _statistic(name: str, present: Collection[str]) -> bool:
    series, _, statistic = name.rpartition(".")
    return bool(series) and statistic in STATISTICS and all(f"{series}.{s}" in present for s in STATISTICS)


_TYPES = {"start": pa.timestamp("ms", tz="UTC"), "end": pa.timestamp("ms", tz="UTC"), "duration": pa.float64(),
          "run_id": pa.string(), "group": pa.string(), "name": pa.string(), "status": pa.string()}


def _column(name: str, values: list[Any]) -> pa.Array:
    kind = _TYPES.get(name)
    if kind is None and name.endswith((".last", ".min", ".max")) and all(
            v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values):
        kind = pa.float64()
    if kind is not None:
        return pa.array(values, kind)
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return pa.array([None if v is None else v if isinstance(v, str) else json.dumps(v, default=str)
                         for v in values], pa.string())


def _time(text: Any) -> datetime.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=datetime.timezone.utc)


# --- the runs index of a group -------------------------------------------------------------
def index_table(rows: list[dict[str, Any]], values: Mapping[str, list[str]], writer: Mapping[str, Any]) -> pa.Table:
    """A group's runs index (`layout.RUNS_INDEX`): `rows`, with the writer's
    ``host``, ``pid`` and ``heartbeat`` (`writer`) and the names of each run's
    user summary values (`values`, run id -> names) in its schema metadata."""
    table = to_table(rows, {name for names in values.values() for name in names})
    return table.replace_schema_metadata({layout.INDEX_WRITER_METADATA: json.dumps(writer).encode(),
                                          layout.INDEX_VALUES_METADATA: json.dumps(values).encode()})


def read_index(path: str) -> tuple[list[dict[str, Any]], dict[str, list[str]], dict[str, Any]] | None:
    """A runs index's rows, user value names per run and writer (`index_table`);
    None where there is none, or it cannot be read (its runs are then read
    from their ``_run.json``)."""
    table = _index(path)
    if table is None:
        return None
    metadata = table.schema.metadata or {}
    return (table.to_pylist(), json.loads(metadata.get(layout.INDEX_VALUES_METADATA, b"{}")),
            json.loads(metadata.get(layout.INDEX_WRITER_METADATA, b"{}")))


def _index(path: str) -> pa.Table | None:
    try:
        source = pa.BufferReader(filesystems.read_buffer(path)) if filesystems.is_uri(path) else path
    except FileNotFoundError:
        return None
    try:
        return pq.read_table(source)
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowException):  # not lox's: the runs' own files say the same, more slowly
        return None


# --- the table of runs ---------------------------------------------------------------------
def run_table(path: str | os.PathLike[str]) -> pa.Table:
    """The table of the runs at `path` (a folder of runs, local or a bucket URI
    such as ``s3://bucket/runs``, or one run's folder): one row per run, oldest
    first, with the columns this module's docstring lists. This is `lox.runs`.

    Read from the runs index of each group (one file per group, however many
    runs it has), and from ``_run.json`` for a run with no row in an index
    (written by lox before 0.3, or killed before its group's first index);
    runs without a summary have nulls there. A column whose types differ
    between groups takes their common type, else strings.

    >>> import tempfile, lox, pyarrow.compute as pc
    >>> folder = tempfile.mkdtemp()
    >>> logger = lox.loggers.from_config(f"parquet:{folder}")
    >>> def train(lr):
    ...     for step in range(3):
    ...         lox.log({"loss": 1.0 / (1.0 + lr * step)}, step=step)
    >>> for lr in (0.1, 1.0):
    ...     state = logger.init(name=f"lr{lr}", lr=lr)
    ...     logger.spool(train, state)(lr)
    ...     logger.summary(state, {"final_lr": lr})
    ...     logger.finish(state)
    >>> table = lox.runs(folder)
    >>> table.column_names[7:]
    ['lr', 'loss.last', 'loss.min', 'loss.max', 'loss.count', 'final_lr']
    >>> table.filter(pc.field("lr") > 0.5).column("loss.last").to_pylist()  # float32: 1 / 3
    [0.3333333432674408]
    >>> table.column("status").to_pylist()
    ['finished', 'finished']
    >>> logger.close()
    """
    path, remote, single, entries = open_folder(path)
    writers = Writers()  # each writer's heartbeat read once
    if single is not None:
        root = filesystems.parent(path)
        run_id = single.get("run_id", filesystems.basename(path))
        batches = single.get("batches")
        found = read_index(filesystems.join(root, batches, layout.RUNS_INDEX)) if isinstance(batches, str) else None
        rows = [_resolved(writers, root, row, found[2]) for row in found[0] if row["run_id"] == run_id] if found else []
        names = set(found[1].get(run_id, [])) if found else set()
        if not rows:
            rows, names = [_resolved(writers, root, run_row(single), None, single)], set(Summary.from_json(
                single.get("summary")).values)
        return to_table(rows, names)
    folders = {name: entry for name, is_dir, entry in entries if is_dir and not name.startswith(".")}
    groups = [entry for name, entry in folders.items() if name.endswith(layout.BATCHES_SUFFIX)]
    indexes = _map(lambda group: read_index(filesystems.join(group, layout.RUNS_INDEX)), groups, remote)
    tables, rows, names = [], [], set()
    seen: set[str] = set()
    for found in indexes:
        if found is None:
            continue
        here = [_resolved(writers, path, row, found[2]) for row in found[0]
                if row.get("run_id") in folders and row["run_id"] not in seen]
        seen.update(row["run_id"] for row in here)
        if here:
            values = {name for run_values in found[1].values() for name in run_values}
            tables.append(to_table(here, values))
            names |= values
    rest = [name for name in folders if name not in seen and not name.endswith(layout.BATCHES_SUFFIX)]
    infos = _map(lambda name: read_run_json(folders[name], missing_ok=True), rest, remote)
    for info in infos:
        if info is not None:
            rows.append(_resolved(writers, path, run_row(info), None, info))
            names |= set(Summary.from_json(info.get("summary")).values)
    if rows:
        tables.append(to_table(rows, names))
    if not tables:
        raise ValueError(f"no lox runs in {path!r}: {EXPECTED}.")
    table = _concat(tables)
    table = table.select(_ordered(table.column_names, names))
    return table.sort_by([("start", "ascending"), ("run_id", "ascending")])


def _resolved(writers: Writers, root: str, row: dict[str, Any], writer: Mapping[str, Any] | None,
              info: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`row` with its status as `reader.run_status` resolves it (a "running" run
    whose writer is gone is "killed"): from ``_run.json`` (`info`), or from the
    index's `writer`."""
    if row.get("status") != "running":
        return row
    if info is None:
        start = row.get("start")
        info = {**(writer or {}), "status": "running",
                "created": start.isoformat() if isinstance(start, datetime.datetime) else None}
    row["status"] = writers.status(filesystems.join(root, str(row.get("run_id"))), dict(info))
    return row


def _map(function, items: list, remote: bool) -> list:
    if remote and len(items) > 1:  # a request each: many at once
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            return list(pool.map(function, items))
    return [function(item) for item in items]


def _concat(tables: list[pa.Table]) -> pa.Table:
    """Tables of different groups as one: columns of differing types take their
    common type, else strings."""
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    kinds: dict[str, set[pa.DataType]] = {}
    for table in tables:
        for field in table.schema:
            if not pa.types.is_null(field.type):
                kinds.setdefault(field.name, set()).add(field.type)
    mixed = {name for name, types in kinds.items() if len(types) > 1}
    return pa.concat_tables([_as_strings(table, mixed) for table in tables], promote_options="permissive")


def _as_strings(table: pa.Table, names: Collection[str]) -> pa.Table:
    for name in names:
        if name in table.column_names:
            index = table.column_names.index(name)
            values = [None if v is None else v if isinstance(v, str) else json.dumps(v, default=str)
                      for v in table.column(name).to_pylist()]
            table = table.set_column(index, name, pa.array(values, pa.string()))
    return table


# --- choosing runs -------------------------------------------------------------------------
STATUSES = ("running", "finished", "failed", "killed")
_CLAUSE = re.compile(r"""\s*(?P<column>[^\s<>=!'"]+)\s*(?P<op><=|>=|==|!=|<|>)\s*"""
                     r"""(?P<value>'[^']*'|"[^"]*"|[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|true|false)\s*""")
_OPERATORS = {"<": "less", "<=": "less_equal", ">": "greater", ">=": "greater_equal", "==": "equal",
              "!=": "not_equal"}  # pyarrow.compute's functions


def select(table: pa.Table, where: str | None = None, sort: str | None = None,
           best: tuple[int, str] | None = None, status: str | None = None) -> pa.Table:
    """The rows of a table of runs (`run_table`) that `lox runs` and `lox plot` choose:

    `status`
        runs of that status (``running``, ``finished``, ``failed``, ``killed``);
    `where`
        comparisons (``<``, ``<=``, ``>``, ``>=``, ``==``, ``!=``) of a column with a
        number, ``true``/``false`` or a quoted string, joined by ``and``: ``"lr < 0.1 and
        status == 'finished'"``. A name that is no column names the metadata column
        ending in ``.name`` if exactly one does (``lr`` for ``config.lr``); a run
        whose value is null is left out;
    `best`
        ``(n, column)``: the `n` runs with the least values of `column`, least first
        (runs without a value last);
    `sort`
        a column to order by, descending with a leading ``-`` (``-acc.max``), nulls last.

    >>> import pyarrow as pa
    >>> runs = pa.table({"name": ["a", "b", "c"], "config.lr": [0.1, 0.01, 1.0], "loss.min": [0.5, 0.2, None]})
    >>> select(runs, where="lr < 0.5").column("name").to_pylist()
    ['a', 'b']
    >>> select(runs, best=(2, "loss.min")).column("name").to_pylist()
    ['b', 'a']
    >>> select(runs, sort="-config.lr").column("name").to_pylist()
    ['c', 'a', 'b']
    """
    if status is not None:
        if status not in STATUSES:
            raise ValueError(f"no status {status!r}: a run's status is one of {', '.join(STATUSES)}.")
        if "status" in table.column_names:
            table = table.filter(pc.call_function("equal", [table["status"], pa.scalar(status)]))
    if where is not None:
        table = table.filter(_condition(table, where))
    if best is not None:
        count, column = best
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"best=({count!r}, {column!r}): the number of runs to keep is a positive integer.")
        name = column_named(table, column, "best")
        table = table.sort_by([(name, "ascending")]).slice(0, count)
    if sort is not None:
        descending = sort.startswith("-")
        name = column_named(table, sort.removeprefix("-"), "sort")
        table = table.sort_by([(name, "descending" if descending else "ascending")])
    return table


def _condition(table: pa.Table, where: str) -> pa.ChunkedArray | pa.Array:
    clauses = re.split(r"\s+and\s+", where.strip(), flags=re.IGNORECASE)
    mask = None
    for clause in clauses:
        match = _CLAUSE.fullmatch(clause)
        if match is None:
            raise ValueError(
                f"cannot read the condition {clause.strip()!r} in {where!r}: write comparisons of a column with a "
                "number, true/false or a quoted string, joined by 'and', e.g. \"lr < 0.1 and status == 'finished'\".")
        name = column_named(table, match["column"], "where")
        text = match["value"]
        value: Any = (text[1:-1] if text[0] in "'\"" else text == "true" if text in ("true", "false")
                      else float(text) if any(c in text for c in ".eE") else int(text))
        column = table[name]
        kind = column.type
        numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_null(kind)
        if isinstance(value, bool) and not (pa.types.is_boolean(kind) or pa.types.is_null(kind)) or \
                isinstance(value, str) and not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
                                                or pa.types.is_null(kind)) or \
                isinstance(value, (int, float)) and not isinstance(value, bool) and not numeric:
            raise ValueError(f"the condition {clause.strip()!r} compares the column {name!r}, of {kind}, with "
                             f"{value!r}; compare it with a {_literal(kind)}.")
        if pa.types.is_null(kind):
            found = pa.nulls(table.num_rows, pa.bool_())
        else:
            found = pc.call_function(_OPERATORS[match["op"]], [column, pa.scalar(value, kind if not numeric else None)])
        mask = found if mask is None else pc.call_function("and_kleene", [mask, found])
    assert mask is not None  # noqa: S101 - re.split gives at least one clause
    return pc.fill_null(mask, False)


def _literal(kind: pa.DataType) -> str:
    if pa.types.is_boolean(kind):
        return "true or false"
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return "number"
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return "quoted string, e.g. 'adam'"
    return "value of its type (lists and timestamps cannot be compared here: filter the table of `lox.runs()`)"


def column_named(table: pa.Table, name: str, what: str) -> str:
    """The column of a table of runs that `name` names: itself, else the one
    column ending in ``.name``; else a ValueError naming `what` asked for it
    and the columns there are."""
    if name in table.column_names:
        return name
    ending = [column for column in table.column_names if column.endswith(f".{name}")]
    if len(ending) == 1:
        return ending[0]
    if ending:
        raise ValueError(f"{what}: {name!r} could be any of the columns {', '.join(map(repr, ending))}; "
                         "name one of them.")
    raise ValueError(f"{what}: the runs have no column {name!r}; their columns are "
                     f"{', '.join(table.column_names)}.")
