"""The columns of lox's Arrow tables and the rules about their steps, in one place.

Every table lox hands a backend (and every Parquet file it writes) has the seven
columns of `COLUMNS` (tables of schema version 1, from files of earlier lox,
lack ``kind``: `REQUIRED` are the columns every version has); every other
column holds one step name (``lox_core.arrow`` documents the whole schema). Backends read the step columns with
`step_names`, pick the step a tracker plots against with `primary_step`, and
lox orders each table by it with `order_by_step` before handing it over.

>>> import numpy as np, lox
>>> logs = lox.logdict({"loss": np.array([0.3, 0.1, 0.2])},
...                    steps={"epoch": {"loss": np.array([0, 0, 0])}, "step": {"loss": np.array([3, 1, 2])}})
>>> table = order_by_step(logs.to_arrow(run="r"))
>>> step_names(table), primary_step(step_names(table))
(['epoch', 'step'], 'step')
>>> table.column("step").to_pylist(), table.column("value").to_pylist()
([1, 2, 3], [0.1, 0.2, 0.3])
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SCHEMA_VERSION = "2"
READS = ("1", "2")  # the schema versions this lox reads (version 1: no kind column)
REQUIRED = ("run", "key", "value", "dtype", "shape", "data")  # in every version
KIND = "kind"  # the column of each row's kind (version 2 on)
COLUMNS = (*REQUIRED, KIND)  # every other column is a step name
PRIMARY_STEP = "step"  # the step name rows are ordered by, and trackers plot against, when present


def step_names(table: pa.Table | pa.Schema) -> list[str]:
    """The step names of a table (or of its schema): its columns other than
    `COLUMNS`, in order."""
    names = table.column_names if isinstance(table, pa.Table) else table.names
    return [name for name in names if name not in COLUMNS]


def primary_step(names: Iterable[str]) -> str | None:
    """The step name rows are ordered by and trackers plot against: ``step``
    when present, else the first step name; None without step names."""
    names = list(names)
    return PRIMARY_STEP if PRIMARY_STEP in names else (names[0] if names else None)


def check_step_name(name: str) -> None:
    """Refuse a step name that is one of the table's own columns (``kind`` included)."""
    if name in COLUMNS:
        raise ValueError(
            f"the step name {name!r} is reserved for a column of lox's tables ({', '.join(COLUMNS)}); "
            f"rename the step, e.g. `lox.log(..., {name}_step=i)`."
        )


def order_by_step(table: pa.Table) -> pa.Table:
    """`table` with its rows ordered by the primary step, stably (events of one
    step keep their order; rows without that step come last)."""
    primary = primary_step(step_names(table))
    if primary is None or table.num_rows < 2:
        return table
    steps = table.column(primary)
    if steps.null_count == 0:
        values = steps.to_numpy()
        if bool(np.all(values[1:] >= values[:-1])):
            return table  # already in order: no copy
    return table.sort_by([(primary, "ascending")])  # stable; nulls last


def row_kinds(table: pa.Table) -> pa.ChunkedArray:
    """Each row's kind, as strings: the ``kind`` column; for a table of schema
    version 1 (without one), ``scalar`` where the row's shape is ``[]`` and
    ``array`` elsewhere (version 1 held nothing else).

    >>> import numpy as np, lox
    >>> table = lox.logdict({"loss": np.zeros(1), "w": np.zeros((1, 2)), "t": np.array(["hi"])}).to_arrow()
    >>> row_kinds(table).to_pylist(), row_kinds(table.drop_columns(["kind"])).to_pylist()[:2]
    (['scalar', 'array', 'text'], ['scalar', 'array'])
    """
    if KIND in table.column_names:
        return table.column(KIND).cast(pa.string())
    # pyarrow.compute defines its functions at import time, unseen by type checkers.
    empty = pc.equal(pc.list_value_length(table.column("shape")), 0)  # pyright: ignore[reportAttributeAccessIssue]
    kinds = pc.if_else(empty, pa.scalar("scalar"), pa.scalar("array"))  # pyright: ignore[reportAttributeAccessIssue]
    return kinds if isinstance(kinds, pa.ChunkedArray) else pa.chunked_array([kinds], pa.string())
