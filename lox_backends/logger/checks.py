"""What a Logger checks about the logs it is given.

`LogChecks.check` runs in the user's thread, when `logger.log` / `spool` is
called (also while tracing), and refuses what no run could hold, naming the
key. `LogChecks.warn_steps` and `warn_dropped` run in the router thread, on
the host values, and warn once per run and key.
"""

from __future__ import annotations

import warnings

import jax
import numpy as np

from lox_backends.plugin.hooks import RunInfo
from lox_core import media, schema
from lox_core.arrow import own_clash_message, series_leaves
from lox_core.dtypes import common_dtype
from lox_core.logdict import NO_STEP, logdict

_NONE = np.iinfo(np.int64).min  # no step yet


class LogChecks:
    """The checks of one Logger, which remembers each key's dtype and shape and
    the last step sent per run and key."""

    def __init__(self, media_limit: dict[str, int] | None = None) -> None:
        self._media_limit = media_limit or {"*": 2**63 - 1}  # key -> bytes of one event ("*": any other key)
        self._kinds: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}  # series → (dtype, event shape)
        self._key_kinds: dict[str, tuple] = {}  # key → its kind and options (lox_core.media)
        self._owners: dict[str, str] = {}  # series → the key that gives it (key/path names)
        self._last_steps: dict[str, np.ndarray] = {}  # key → highest step sent, by run number
        self._warned: set[tuple[int, str]] = set()

    # --- in the user's thread -------------------------------------------------------------
    def check(self, logs: logdict, runs_shape: tuple[int, ...]) -> None:
        """Refuse logs that the runs of shape `runs_shape` cannot take (their
        leading axes must be the runs'; under `jax.vmap` both are per element)."""
        for name in logs.steps:
            schema.check_step_name(name)
        key_kinds = self._check_media(logs, len(runs_shape))
        owners, kinds = self._check_kinds(logs, len(runs_shape))
        for key, mask in logs.valid.items():
            if np.ndim(mask) != len(runs_shape) + 1:
                raise ValueError(
                    f"`logger.log`: key {key!r} has padding per `jax.vmap` element (a `while_loop` vmapped inside "
                    "`lox.spool(..., max_events=N)`), which a run's table cannot hold. Apply `jax.vmap` outside "
                    "the spool, with one run per element (`jax.vmap(logger.init)`)."
                )
        _check_batch_axes(logs, runs_shape)
        # The call is accepted: only now are its series names and kinds the logger's.
        self._owners.update(owners)
        self._kinds.update(kinds)
        self._key_kinds.update(key_kinds)

    def _check_media(self, logs: logdict, batch_ndim: int) -> dict[str, tuple]:
        """A key keeps one kind, with the same options (a video's fps, a clip's
        rate), in a logger's runs; one event of a key of a rendered kind holds
        at most the logger's ``media_limit`` bytes. Returns each key's kind."""
        kinds: dict[str, tuple] = {}
        for key, value in logs.items():
            kind = media.kind_of(value, batch_ndim)
            if kind not in media.RENDERED_KINDS:
                kind = "scalar or array"  # told apart by shape, in `_check_kinds`
            # uint8 pixels and float ones mean different things: a key keeps one (as it keeps its fps)
            signature = (kind, (*value.options.items(), ("dtype", value.dtype_class()))
                         if isinstance(value, media.Media) else ())
            known = self._key_kinds.get(key, signature)
            if known != signature:
                raise ValueError(
                    f"lox logger: key {key!r} was logged as {_kind_words(known)} and now as "
                    f"{_kind_words(signature)}; a key keeps one kind and its options in a logger's runs. Log the "
                    "new values under another key."
                )
            kinds[key] = signature
            if kind in media.RENDERED_KINDS:
                limit = self._media_limit.get(key, self._media_limit["*"])
                size = _event_bytes(value, batch_ndim + 1)
                if size > limit:
                    raise ValueError(
                        f"lox logger: one event of key {key!r} ({kind}) holds {size:,} bytes, above the logger's "
                        f"media_limit of {limit:,} bytes per event of a key. Log fewer or smaller ones (a few "
                        f"samples, a lower resolution, uint8 pixels), or raise the limit for this key: "
                        f"`lox.loggers.from_config(..., media_limit={{{key!r}: {size}}})`."
                    )
        return kinds

    def _check_kinds(self, logs: logdict, batch_ndim: int) -> tuple[dict[str, str], dict[str, tuple]]:
        """A key keeps one event shape in all of a logger's runs (so that its
        series stay one array), and dtypes that one dtype holds exactly (int32
        then float32 events: a float64 series; see `lox_core.dtypes`); no two
        keys give one series name (the ``key/path`` of a pytree's leaves, what
        trackers name the metrics), nor two leaves of one key. Returns the
        series' owners and kinds that the call adds or changes, for `check` to
        keep once the whole call is accepted."""
        owners: dict[str, str] = {}
        kinds: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
        for key, value in logs.items():
            for name, leaf in series_leaves(key, value):
                if owners.get(name) == key:
                    raise ValueError("lox logger: " + own_clash_message(key, name, value))
                owner = owners.get(name) or self._owners.get(name, key)
                if owner != key:
                    raise ValueError(
                        f"lox logger: key {key!r} gives the series {name!r}, which key {owner!r} gave before "
                        "(a pytree's leaves are named key/path, in files and trackers); rename one of the keys."
                    )
                owners[name] = key
                dtype = np.dtype(leaf.dtype) if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
                kind = (dtype, tuple(np.shape(leaf)[batch_ndim + 1 :]))
                known = self._kinds.get(name, kind)
                kinds[name] = known
                if known == kind:
                    continue
                was, now = f"{known[0]}{list(known[1])}", f"{kind[0]}{list(kind[1])}"
                if known[1] != kind[1] and known[0].kind in "UT":
                    raise ValueError(
                        f"lox logger: {name!r} was logged as text of shape {known[1]} and now of shape {kind[1]}; "
                        "a key of text keeps one shape in a logger's runs (a str, or tables of one shape). Log "
                        "the new text under another key."
                    )
                if known[1] != kind[1]:
                    raise ValueError(
                        f"lox logger: {name!r} was logged as {was} and now as {now}; a key keeps one event shape "
                        "in a logger's runs. Log the new values under another key (e.g. pad a smaller last batch, "
                        "or log its mean)."
                    )
                common = common_dtype(known[0], kind[0])
                if common is None:
                    raise ValueError(
                        f"lox logger: {name!r} was logged as {was} and now as {now}, and no dtype holds the values "
                        "of both exactly (a key mixes bool, integers and floats only, and int64 not with floats). "
                        "Cast the values to one dtype before logging them, or log the new ones under another key."
                    )
                kinds[name] = (common, kind[1])
        return owners, kinds

    # --- in the router thread ---------------------------------------------------------------
    def warn_steps(self, runs: list[RunInfo], logs: logdict, batch_ndim: int = 0) -> None:
        """Warn (once per run and key) of a primary step that goes backwards, in
        `logs` or from the last one sent. With `batch_ndim`, the leading axes of
        every array are `runs` (a vmapped batch): checked for all runs at once."""
        primary = schema.primary_step(logs.steps)
        if primary is None:
            return
        numbers = np.array([run.index for run in runs])
        for key, steps in logs.steps[primary].items():
            steps = np.asarray(steps, np.int64).reshape(len(runs), -1)  # the runs' steps, in order
            valid = steps != NO_STEP
            if not valid.any():
                continue
            last = self._last_steps.setdefault(key, np.zeros(0, np.int64))
            if len(last) <= numbers.max():
                last = self._last_steps[key] = np.append(last, np.full(numbers.max() + 1 - len(last), _NONE))
            filled = np.where(valid, steps, _NONE)
            highest = np.maximum.accumulate(np.concatenate([last[numbers][:, None], filled], axis=1), axis=1)
            backwards = valid & (filled < highest[:, :-1])  # below a step sent or logged before it
            for i in np.flatnonzero(backwards.any(axis=1)):
                run = runs[i]
                if (run.index, key) in self._warned:
                    continue
                self._warned.add((run.index, key))
                j = int(np.argmax(backwards[i]))
                warnings.warn(
                    f"lox: in run {run.name!r} the {primary} of {key!r} goes backwards ({highest[i, j]} then "
                    f"{filled[i, j]}). lox sends each batch ordered by step, but trackers such as W&B drop rows "
                    "whose step is below one already sent: log in step order, or use another step name for this key.",
                    RuntimeWarning,
                    stacklevel=2,
                )
            last[numbers] = highest[:, -1]

    def warn_dropped(self, run: RunInfo, logs: logdict) -> None:
        """Warn (once per run and key) of events a spooled while loop had no room for."""
        lost = {key: int(np.sum(n)) for key, n in logs.dropped.items()}
        lost = {key: n for key, n in lost.items() if n and (run.index, "dropped " + key) not in self._warned}
        if not lost:
            return
        self._warned.update((run.index, "dropped " + key) for key in lost)
        counts = ", ".join(f"{n} of {key!r}" for key, n in lost.items())
        warnings.warn(
            f"lox: in run {run.name!r}, events did not fit in the buffer of a spooled `while_loop` and were "
            f"dropped ({counts}); the first `max_events` of each run of the loop are kept. Raise `max_events` "
            "of `lox.spool`/`logger.spool`.",
            RuntimeWarning,
            stacklevel=2,
        )


def _kind_words(signature: tuple) -> str:
    kind, options = signature
    words = [f"{value} numbers" if name == "dtype" else f"{name}={value:g}" if isinstance(value, float)
             else f"{name}={value!r}" for name, value in options]
    return kind + (f" ({', '.join(words)})" if words else "")


def _event_bytes(value, leading_ndim: int) -> int:
    """Bytes of one event of a key; text by its UTF-8 length (the most of any event)."""
    leaves = jax.tree_util.tree_leaves(value)
    if any(media.is_text(leaf) for leaf in leaves):
        most = 0
        for leaf in leaves:
            text = np.asarray(leaf)
            events = text.reshape(-1, *text.shape[leading_ndim:]) if text.ndim >= leading_ndim else text[None]
            for event in events:
                most = max(most, sum(len(str(s).encode()) for s in np.asarray(event).reshape(-1)))
        return most
    return media.event_nbytes(value, leading_ndim)


def _check_batch_axes(logs: logdict, runs_shape: tuple[int, ...]) -> None:
    """Every value and step array starts with the runs' axes."""
    steps = [(f"the steps {n!r} of {k!r}", s) for n, per_key in logs.steps.items() for k, s in per_key.items()]
    for what, value in [*((repr(k), v) for k, v in logs.items()), *steps]:
        for leaf in jax.tree_util.tree_leaves(value):
            if np.shape(leaf)[: len(runs_shape)] != runs_shape:
                raise ValueError(
                    f"`logger.log`: the state holds runs of shape {runs_shape} (one per seed), but "
                    f"{what} has shape {np.shape(leaf)}; its leading axes must be the runs' "
                    "(call `logger.log` inside the vmapped function, or vmap the spooled function)."
                )
