"""The options of lox's transforms: checked once, then frozen.

Each transform gathers its options in a frozen dataclass, which is also the
key of the compiled-program cache (`lox_core.transform.jitted`): a new option
is a new field, and so part of the key, with nothing to remember. One checker
per kind of option gives every transform the same messages.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar, Iterable

import numpy as np

from lox_core.interpreter import Selection


def positive_int(what: str, value, meaning: str = "") -> int | None:
    """`value` as an int >= 1 (None stays None); `what` names the option in
    the error (e.g. "`lox.tap` buffer") and `meaning` says what it counts."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{what} must be an integer >= 1{f' ({meaning})' if meaning else ''}, got {value!r}.")
    return int(value)


def names(what: str, value: Iterable[str] | str | None) -> frozenset[str] | None:
    """A set of strings (one string is a set of one)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    value = frozenset(value)
    bad = [n for n in value if not isinstance(n, str)]
    if bad:
        raise TypeError(f"`{what}` must be strings, got {bad[0]!r}.")
    return value


def string(what: str, value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, got {value!r}.")
    return value


def selection(argnames, tags) -> Selection:
    """The events a transform takes, from its `argnames` and `tags` options."""
    return Selection(names("argnames", argnames), names("tags", tags))


@dataclasses.dataclass(frozen=True)
class SpoolOptions:
    transform: ClassVar[str] = "lox.spool"
    selection: Selection
    keep_logs: bool = False
    interval: int | None = None
    reduce: str | None = None
    prefix: str = ""
    max_events: int | None = None


@dataclasses.dataclass(frozen=True)
class TapOptions:
    """`lox.tap`'s options; with `with_context`, the Logger's routed tap
    (`tap_with_context`)."""

    selection: Selection
    callback: Callable
    prefix: str = ""
    batched: bool = False
    buffer: int | None = None
    with_context: bool = False
    block_callback: Callable | None = None
    per_device_error: str | None = None  # why host calls per device (in shard_map / pmap) are refused
    check: Callable | None = None  # check(event, context_shape), while traced: what the receiver refuses

    @property
    def transform(self) -> str:
        return "logger.tap" if self.with_context else "lox.tap"


@dataclasses.dataclass(frozen=True)
class NologOptions:
    transform: ClassVar[str] = "lox.nolog"
