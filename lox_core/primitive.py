"""The `lox_log` primitive and `lox.log`, the call that binds it.

A log is a primitive with one effect whose outputs are the event itself (each
operand with a leading event axis of 1), which `lox.log` returns. Transforms
(`spool`, `tap`, `nolog`) find it in the jaxpr and decide what it becomes; left
alone it prints the event through a host callback, like `jax.debug.print`.
"""

from __future__ import annotations

import functools
import numbers
from typing import Any, Iterable, Mapping, NamedTuple

import jax
import jax.core
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir

from lox_core import _compat, active, media, printing
from lox_core.host import batching_cond_into_select, host_call
from lox_core.logdict import logdict, trusted
from lox_core.series import check_own_series

log_p = Primitive("lox_log")
log_p.multiple_results = True


class Site(NamedTuple):
    """The static description of one `lox.log` call (the primitive's params).

    The operands are the leaves of every key's value, key after key, then one
    integer scalar per step name.
    """

    keys: tuple[str, ...]
    trees: tuple  # one pytree structure per key
    step_names: tuple[str, ...]
    tags: tuple[str, ...]
    explicit: bool
    batch_ndim: int  # leading axes added by vmap, on every operand
    in_select: bool  # logged in a cond that vmap turned into a select

    def split(self, operands) -> tuple[dict[str, Any], dict[str, Any]]:
        """Operands → (values by key, step scalars by name)."""
        operands = list(operands)
        values, i = {}, 0
        for key, tree in zip(self.keys, self.trees, strict=True):
            if tree == _LEAF:
                values[key] = operands[i]
                i += 1
            else:
                n = tree.num_leaves
                values[key] = jax.tree_util.tree_unflatten(tree, operands[i : i + n])
                i += n
        return values, dict(zip(self.step_names, operands[i:], strict=True))  # the rest: one per step name


_LEAF = jax.tree_util.tree_structure(0)


def site_of(params) -> Site:
    return Site(**params)


def log(
    data: Mapping[str, Any],
    *,
    tags: Iterable[str] | None = None,
    explicit: bool = False,
    prefix: str = "",
    **steps: Any,
) -> logdict:
    """Log the values in `data` from anywhere in JAX code.

    `data` maps string keys to arrays, scalars or pytrees of them, or to a
    kind that backends show as what it is (`lox.image`, `lox.video`,
    `lox.audio`, `lox.histogram`); outside any trace, also to text (a str).
    Keyword
    arguments are named integer steps (``step=i, episode=i // 2``). `tags` lets
    `spool`/`tap` select events; an `explicit` event is only collected by a
    transform that names its key (`argnames`) or one of its tags. `prefix` is
    prepended to every key.

    Inside `lox.spool` the event becomes an output of the compiled program,
    inside `lox.tap` a call of the tap's callback, inside `lox.nolog` nothing.
    With no transform around it the event goes to the run of the innermost
    ``with logger.active(state):`` block, or else is printed (see
    `lox.set_default`).
    Returns the event as a one-event logdict.

    >>> import jax, jax.numpy as jnp, lox
    >>> def f(x):
    ...     lox.log({"x": x}, step=3)
    ...     return 2 * x
    >>> y, logs = lox.spool(f)(jnp.ones(2))
    >>> logs["x"].shape, logs.step["x"].tolist()
    ((1, 2), [3])
    """
    if not isinstance(data, dict):
        raise TypeError(
            f"`lox.log` takes a dict from str keys to arrays, got {type(data).__name__}. "
            'Wrap the value: `lox.log({"name": value})`.'
        )
    tags = _check_tags(tags)
    values, trees, flat = {}, [], []
    texts: dict[str, np.ndarray] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise TypeError(f"`lox.log` keys must be strings, got {key!r} ({type(key).__name__}).")
        text = media.as_text(prefix + key, value)
        if text is not None:
            texts[prefix + key] = text
            continue
        media.check(prefix + key, value)  # a kind's shape and dtype, named by key
        leaves, tree = jax.tree_util.tree_flatten(value)
        if not leaves:  # None or an empty container: it would log nothing, silently
            raise TypeError(
                f"`lox.log` got no array for key {prefix + key!r} ({value!r}); log an array, a number or a "
                "pytree of them, or leave the key out."
            )
        _check_own_series(prefix + key, tree)  # its series names: none empty, none twice
        leaves = [_check_value(prefix + key, leaf) for leaf in leaves]
        values[prefix + key] = jax.tree_util.tree_unflatten(tree, leaves)
        trees.append(tree)
        flat.extend(leaves)
    step_values = [_check_step(name, v) for name, v in steps.items()]
    if texts:
        return _log_text(data, values, texts, dict(zip(steps, step_values, strict=True)), prefix)
    destination = active.current()
    if not _compat.logs_seen() and destination is None:
        # Nothing would see it (no lox transform is tracing, the default is
        # "off", no block is active): no primitive, so a `jax.jit` of this
        # code has no effect.
        return event_logdict(values, dict(zip(steps, step_values, strict=True)))
    if (destination is not None and active.keyed_elsewhere() and _compat.staging_trace() is not None
            and not _compat.transform_depth_state.value):
        raise RuntimeError(
            f"lox.log of {', '.join(map(repr, values))} is traced in a thread that did not open the "
            "`logger.active` block it runs in (its context was copied there: `asyncio.to_thread`, "
            "`contextvars.copy_context().run`). JAX's configuration belongs to the thread, so the function "
            "is compiled without the block and its logs would be lost. Open the block in that thread "
            "(`with logger.active(state):` inside the function you hand it), or call the function in the "
            "block's thread."
        )
    if destination is not None and destination.per_device_error is not None and _compat.manual_axes():
        raise ValueError(destination.per_device_error)
    site = Site(
        keys=tuple(values), trees=tuple(trees), step_names=tuple(steps), tags=tags,
        explicit=bool(explicit), batch_ndim=0, in_select=False,
    )
    outs = log_p.bind(*flat, *step_values, **site._asdict())
    # The outputs already carry the event axis.
    values, step_events = site.split(outs)
    per_name = {name: dict.fromkeys(values, s) for name, s in step_events.items()} if values else {}
    return trusted(values, per_name)


def _log_text(data: dict, values: dict, texts: dict, steps: dict, prefix: str) -> logdict:
    """An eager event that holds text: strings cannot enter a compiled program,
    so it is printed (the default ``console``) and returned, on the host."""
    if not _compat.eager():
        keys = ", ".join(map(repr, texts))
        raise TypeError(
            f"`lox.log` got text for {keys} inside a traced function (jit, spool, tap, vmap, scan...): strings "
            "cannot enter a compiled program. Log text from Python: eagerly, with `logger.log(state, "
            '{"sample": text}, step=i)`, or from a tap callback on the host.'
        )
    host = {k: jax.tree_util.tree_map(np.asarray, v) for k, v in values.items()}  # a kind stays a kind
    both = {prefix + k: texts.get(prefix + k, host.get(prefix + k)) for k in data}  # in the call's key order
    steps = {name: np.asarray(s) for name, s in steps.items()}
    event = event_logdict(both, steps, expand=lambda x: np.asarray(x)[None])
    destination = active.current()
    if destination is not None:
        destination.deliver(0, event, None)
    elif printing.default_enabled():
        printing.print_event(both, steps)
    return event


def event_logdict(values: dict, steps: dict, expand=_compat.add_event_axis) -> logdict:
    """One event as a logdict: every array gets an event axis of 1 (`expand`:
    in front by default)."""
    # An array as it is, the common value: no walk of a pytree (the active run's hot path).
    data = {k: expand(v) if isinstance(v, (np.ndarray, jax.Array)) else jax.tree_util.tree_map(expand, v)
            for k, v in values.items()}
    # The keys of one event share one step array (one output, not one per key).
    per_name = {name: dict.fromkeys(values, expand(s)) for name, s in steps.items()} if values else {}
    return trusted(data, per_name)


def _check_own_series(key: str, tree) -> None:
    """Refuse a key whose leaves' series names (``key/path``) have an empty
    part, or two of which are one name: no file or tracker could hold them
    (`lox_core.series.check_own_series`)."""
    try:
        _own_series_checked(key, tree)  # once per key and structure
    except TypeError:  # a node whose aux data does not hash
        _own_series_checked.__wrapped__(key, tree)


@functools.lru_cache(maxsize=4096)
def _own_series_checked(key: str, tree) -> None:
    check_own_series(key, jax.tree_util.tree_unflatten(tree, [0] * tree.num_leaves))


def _check_tags(tags) -> tuple[str, ...]:
    if tags is None:
        return ()
    if isinstance(tags, str):
        tags = [tags]
    tags = tuple(tags)
    for t in tags:
        if not isinstance(t, str):
            raise TypeError(f"`lox.log` tags must be strings, got {t!r}.")
    return tags


@functools.cache
def loggable(dtype) -> bool:
    """Whether arrays of `dtype` can be logged: numbers (bfloat16 and the other
    narrow floats JAX knows included) and booleans."""
    return bool(jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_))


@functools.cache
def _integer(dtype) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.integer))


def _weak(value) -> bool:
    return bool(getattr(getattr(value, "aval", None), "weak_type", getattr(value, "weak_type", False)))


def _step_dtype():
    # One integer dtype for every step, so steps of different events concatenate
    # (int64 under `jax_enable_x64`, which can change at run time: not cached).
    return jax.dtypes.canonicalize_dtype(np.int64)


def _check_value(key: str, leaf):
    if isinstance(leaf, (jax.core.Tracer, jax.Array, np.ndarray, np.generic)):
        dtype = leaf.dtype
    elif isinstance(leaf, (bool, numbers.Number)):
        # Through NumPy, so a Python scalar gets a fixed (not weak) dtype.
        return jnp.asarray(_fitting(f"key {key!r}", leaf))
    else:
        raise TypeError(
            f"`lox.log` got a {type(leaf).__name__} for key {key!r}; only numeric and boolean "
            "arrays (or pytrees of them), a kind (`lox.image(x)`...) or text (a str, as the whole value of "
            "a key) can be logged."
        )
    if not loggable(dtype):
        raise TypeError(
            f"`lox.log` got an array of dtype {dtype} for key {key!r}; only numeric and boolean "
            "arrays can be logged."
        )
    return leaf if isinstance(leaf, (jax.core.Tracer, jax.Array)) else jnp.asarray(_fitting(f"key {key!r}", leaf))


def _fitting(what: str, value, dtype=None, instead: str = "log a value that fits (a float, or a smaller unit)"):
    """`value` (on the host) as a NumPy array of `dtype` (by default JAX's for
    it) if that holds it exactly; with 64-bit types off JAX would silently make
    2**62 + 1 a 1 and 1e300 an inf: refused, naming `what` ("key 'x'")."""
    value = np.asarray(value)
    dtype = np.dtype(dtype or jax.dtypes.canonicalize_dtype(value.dtype))
    if dtype == value.dtype:
        return value
    with np.errstate(over="ignore", invalid="ignore"):
        held = value.astype(dtype)
        if np.issubdtype(value.dtype, np.inexact):
            lost = np.isfinite(value) & ~np.isfinite(held)  # precision is JAX's to lose; the magnitude is not
        else:
            lost = held.astype(value.dtype) != value
    if not lost.any():
        return held
    bad, becomes = value[lost].flat[0].item(), held[lost].flat[0].item()  # the first value lost, as Python numbers
    raise ValueError(
        f"`lox.log` got {bad!r} ({value.dtype.name}) for {what}, which JAX holds as {dtype.name} while 64-bit "
        f"types are off: it would be logged as {becomes!r}. Enable them with "
        f"`jax.config.update('jax_enable_x64', True)`, or {instead}; outside jit, `logger.log` writes a "
        "`lox.logdict` of NumPy arrays as it is."
    )


def _check_step(name: str, value):
    dtype = getattr(value, "dtype", None)
    if isinstance(value, bool) or not (
        isinstance(value, (numbers.Integral, np.integer)) or (dtype is not None and _integer(dtype))
    ):
        raise TypeError(
            f"`lox.log` step {name!r} must be an integer scalar, got {value!r}. "
            f"Pass a Python int or an integer array, e.g. `{name}=i`."
        )
    shape = getattr(value, "shape", ())
    if shape != ():
        raise ValueError(f"`lox.log` step {name!r} must be a scalar, got shape {tuple(shape)}.")
    if dtype == _step_dtype() and isinstance(value, (jax.core.Tracer, jax.Array)) and not _weak(value):
        return value
    if isinstance(value, (jax.core.Tracer, jax.Array)):
        return jnp.asarray(value, dtype=_step_dtype())
    return jnp.asarray(_fitting(f"step {name!r}", value, _step_dtype(), "count steps in a unit that fits"))


# --- rules -------------------------------------------------------------------------
@log_p.def_effectful_abstract_eval
def _abstract_eval(*avals, **params):
    return [_compat.with_event_axis(a) for a in avals], {_compat.log_effect}


def event_outputs(operands) -> list:
    """The primitive's outputs: every operand with a leading event axis of 1."""
    return [_compat.add_event_axis(x) for x in operands]


@log_p.def_impl
def _impl(*operands, **params):
    site = site_of(params)
    if site.in_select:
        raise ValueError(vmap_of_cond_message(site, "printed"))
    uncaptured(site, operands, active.current())  # eager: this thread's block, errors raised here
    return event_outputs(operands)


def _lowering(*operands, **params):
    site = site_of(params)
    if site.in_select:
        raise ValueError(vmap_of_cond_message(site, "printed"))
    key = active.compiled_key()  # a keyed `logger.active` block this program is compiled for, or 0
    # An unkeyed block whose default became "off" inside it (no key) still gets a host call (not a
    # keyed one's context copied to another thread, whose JAX key is 0: its events have nowhere to go).
    if printing.default_enabled() or key or active.current_unkeyed() is not None:
        # A host call as `logger.tap` makes them: a chain of its own (unordered, so any number of
        # devices), with the operands as they are (`jax.debug.callback` copies each into a device array).
        note = f"raised by lox while sending an event of keys {', '.join(map(repr, site.keys))} to the active run"
        host_call(functools.partial(_arrived, site, key), *operands, token=np.int32(0), note=note)
    return event_outputs(operands)


def _arrived(site: Site, key: int, batch_ndim: int, *operands) -> None:
    # Lowered, not batched: the operands carry the site's vmap axes already (`batch_ndim` is 0).
    # The destination is found now (a program compiled before an unkeyed block has no key).
    uncaptured(site, operands, active.for_host_call(key))


mlir.register_lowering(log_p, mlir.lower_fun(_lowering, multiple_results=True))


def uncaptured(site: Site, operands, destination: active.Destination | None) -> None:
    """An event that no transform captured, on the host: to `destination`
    (the active run), or else printed as the default says."""
    if destination is None:
        printing.default_output(site, operands)
        return
    values, steps = site.split([np.asarray(x) for x in operands])
    # The event axis after the vmap axes, in copies (XLA may reuse the host call's buffers).
    where = (slice(None),) * site.batch_ndim + (None,)  # indexing with None: cheaper than np.expand_dims
    event = event_logdict(values, steps, expand=lambda x: np.array(x)[where])
    destination.deliver(site.batch_ndim, event, None)


def _jvp(primals, tangents, **params):
    # The event is logged with primal values; the returned event's tangent is
    # the tangent with an event axis (computed without logging it again).
    tangents = [_compat.add_event_axis(ad.instantiate_zeros(t)) for t in tangents]
    return log_p.bind(*primals, **params), tangents


ad.primitive_jvps[log_p] = _jvp


def _batch(size, args, dims, **params):
    # Every operand gets the batch axis in front, so that a spooled series is
    # (events, *batch, *value_shape) and every step is (events, *batch).
    args = [
        jnp.broadcast_to(x, (size, *jnp.shape(x))) if d is None else jnp.moveaxis(x, d, 0)
        for x, d in zip(args, dims, strict=True)
    ]
    params = dict(params, batch_ndim=params["batch_ndim"] + 1)
    params["in_select"] = params["in_select"] or batching_cond_into_select()
    outs = log_p.bind(*args, **params)
    return outs, [1] * len(outs)  # (event, batch, ...)


_compat.register_batching_rule(log_p, _batch)


def vmap_of_cond_message(site: Site, what: str) -> str:
    keys = ", ".join(map(repr, site.keys))
    return (
        f"lox.log of {keys} sits in a `jax.lax.cond`/`switch` whose predicate is batched by `jax.vmap`. "
        "vmap runs both branches for every element there, so each element would log both branches' "
        f"events and the logs cannot be {what} correctly. Apply `vmap` outside the lox transform instead, "
        "e.g. `jax.vmap(lox.spool(f))` or `jax.vmap(lox.tap(f, callback))`, or remove the logs with `lox.nolog`."
    )
