"""Series, apart from any container or table: their names and their steps.

A series is the events of one key, or of one leaf of a pytree-valued key,
named ``key/path`` (`series_leaves`): the names of the Arrow ``key`` column
(``lox_core.arrow``), of trackers' metrics and of `lox plot --key`. Its steps
are one integer per event and step name, :data:`NO_STEP` where an event did
not carry that name (`steps_per_event`).

`lox.log` checks every key here (`check_own_series`), and `lox.logdict`,
`lox_core.arrow_codec` and `lox_core.arrow` share these rules. Neither pyarrow
nor the logdict is imported: what ``import lox`` loads stays light, and the
Arrow modules sit above the logdict without a cycle.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from lox_core.media import Media

# Written into a step where an event of a key did not carry that step name, so
# that every step array stays aligned with its values. The smallest int32: no
# real step is negative that far, and it fits every integer dtype JAX uses.
NO_STEP = -(2**31)


def steps_per_event(key: str, step_name: str, steps: np.ndarray, why: str) -> np.ndarray:
    """One step per event, ``(events,)``: steps logged under `jax.vmap` are
    ``(events, *batch axes)``, the same for every element; steps that differ
    along those axes are refused (`why` says what needs one per event)."""
    if steps.ndim <= 1:
        return steps
    flat = steps.reshape(steps.shape[0], -1)
    if flat.shape[1] == 0:
        return np.full(steps.shape[0], NO_STEP, steps.dtype)
    if not (flat == flat[:, :1]).all():
        raise ValueError(
            f"steps {step_name!r} of series {key!r} differ along the axes after the event axis (shape "
            f"{steps.shape}); {why}. If the leading axis is a vmap batch axis (`jax.vmap(lox.spool(f))`), "
            "take each batch element apart: `logs.map_series(lambda x: x[i])`."
        )
    return flat[:, 0]


def series_leaves(key: str, value) -> list[tuple[str, Any]]:
    """The series a key's value gives, as ``(name, leaf)``: the key itself for
    an array, ``key/path`` for each leaf of a pytree (dict keys, sequence
    indices and attribute names joined by ``/``), in the order of
    `jax.tree_util.tree_leaves`. These are the names of the Arrow ``key``
    column, trackers' metrics and `lox plot --key`.

    >>> import numpy as np
    >>> [name for name, _ in series_leaves("norms", {"l1": {"kernel": np.zeros(2)}, "b": [np.ones(2)]})]
    ['norms/b/0', 'norms/l1/kernel']

    Every key logged passes here (`lox.log`, and a logger's checks of what
    `logger.log` / `spool` / `tap` are given), so this is where an empty key,
    or an empty dict key inside a value, is refused: neither can name a
    series. (`to_arrow` and the readers convert whatever a logdict holds,
    `named_leaves`: files written before keep reading back.)
    """
    return named_leaves(key, value, check=True)


def named_leaves(key: str, value, check: bool = False) -> list[tuple[str, Any]]:
    """`series_leaves`, which refuses empty names only if `check`. A kind's
    value (`lox_core.media`) gives the key for its one array, ``key/field``
    for each of several (a histogram's ``key/counts`` and ``key/edges``)."""
    if isinstance(value, Media):
        if check and not key:
            raise ValueError(_empty_part_message(key, (), [key]))
        return value.series(key)
    leaves = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
        parts = [key, *(_path_part(p) for p in path)]
        if check and "" in parts:
            raise ValueError(_empty_part_message(key, path, parts))
        leaves.append(("/".join(parts), leaf))
    return leaves


def _empty_part_message(key: str, path, parts: list[str]) -> str:
    if not key:
        return (
            "a key is empty (''): an empty key cannot be a series name (its column in files, its metric in "
            'trackers). Give the value a name, e.g. `lox.log({"loss": x})`.'
        )
    where = key + jax.tree_util.keystr(tuple(path[: parts.index("", 1)]))
    return (
        f"key {key!r} holds an empty dict key ({where}): its leaves are named key/path, and an empty part "
        f"cannot name a series ({'/'.join(parts)!r}). Give the dict key a name."
    )


def claim_series_name(name: str, key: str, seen: dict[str, str], value=None) -> None:
    """Record that `key` gives the series `name` (`seen`: name -> its key),
    refusing a name an earlier leaf gave (`value`: the key's value, for naming
    its clashing leaves)."""
    if name in seen:
        if seen[name] == key:
            raise ValueError(own_clash_message(key, name, value))
        raise ValueError(
            f"key {key!r} and key {seen[name]!r} both give a series named {name!r} "
            "(pytree leaves are named key/path); rename one of the keys."
        )
    seen[name] = key


def check_own_series(key: str, value) -> None:
    """Refuse a key whose own pytree leaves give one series name twice
    (``{"c": {"d/e": x, "d": {"e": y}}}``: ``c/d/e`` both times)."""
    seen: dict[str, str] = {}
    for name, _ in series_leaves(key, value):
        claim_series_name(name, key, seen, value)


def own_clash_message(key: str, name: str, value=None) -> str:
    """The error for a key two of whose leaves give the series `name`."""
    paths = []
    if value is not None:
        for path, _ in jax.tree_util.tree_flatten_with_path(value)[0]:
            if "/".join([key, *(_path_part(p) for p in path)]) == name:
                paths.append(jax.tree_util.keystr(path))
    which = f" ({key}{paths[0]} and {key}{paths[1]})" if len(paths) > 1 else ""
    return (
        f"key {key!r} gives the series {name!r} from two of its leaves{which}: pytree leaves are named "
        "key/path, so one name would hold both. Rename a dict key inside its value (e.g. one without '/'), "
        "so that each leaf has a name of its own."
    )


def _path_part(entry) -> str:
    tu = jax.tree_util
    if isinstance(entry, tu.DictKey):
        return str(entry.key)
    if isinstance(entry, tu.SequenceKey):
        return str(entry.idx)
    if isinstance(entry, tu.GetAttrKey):
        return entry.name
    if isinstance(entry, tu.FlattenedIndexKey):
        return str(entry.key)
    return str(entry)
