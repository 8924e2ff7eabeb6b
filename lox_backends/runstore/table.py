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

from collections.abc import Collection, Iterator, Mapping
from typing import Any

RUN_COLUMNS = ("run_id", "group", "name", "status", "start", "end", "duration")
STATISTICS = ("last", "min", "max", "count")  # of each series of scalars: column <series>.<statistic>


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
                         f"(`lox.runs`); give the value another name, e.g. 'best_{name.replace('.', '_')}'.")
