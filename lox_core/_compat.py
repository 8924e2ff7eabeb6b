"""Everything lox needs from JAX's internals, in one place.

JAX's internal modules and the parameters of its higher-order primitives change
from release to release. lox reads them only here, by name, so that a change
fails loudly in this file instead of silently elsewhere. Supported: JAX 0.8,
0.9, 0.10 and 0.11 (0.11 read from its source and run on a GPU machine; CI
installs 0.8 to 0.10).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import config as _config
from jax._src import core, effects, linear_util, source_info_util
from jax._src import debugging as _debugging
from jax._src import distributed as _distributed
from jax._src.ad_checkpoint import remat_p as _remat_p
from jax._src.interpreters import batching as _batching
from jax._src.interpreters import partial_eval as pe
from jax._src.lax.control_flow import conditionals as _conditionals
from jax._src.shard_map import shard_map_p as _shard_map_p
from jax._src.state.types import AbstractRef as _AbstractRef
from jax.extend.core import primitives as _primitives
from jax.interpreters import mlir

Jaxpr = core.Jaxpr
Ref = getattr(jax, "Ref", None) or core.Ref  # the type of `jax.new_ref(x)`


def is_ref(x) -> bool:
    return isinstance(x, Ref)


ClosedJaxpr = core.ClosedJaxpr
Var = core.Var
Literal = core.Literal
DropVar = core.DropVar


def closed(jaxpr) -> ClosedJaxpr:
    """`jaxpr` as a closed jaxpr (`.jaxpr`, `.consts`). JAX 0.11 merged the
    two classes (`ClosedJaxpr` is `Jaxpr`, its consts attached): a jaxpr is
    then closed already, and wrapping it again would drop its consts."""
    return jaxpr if isinstance(jaxpr, ClosedJaxpr) else ClosedJaxpr(jaxpr, ())


def literal_operands(values: list) -> list:
    """A log's operands as arrays. JAX 0.10 hands a constant made in the
    traced function (``jnp.asarray(5)``, ``jnp.array(True)``) to an
    interpreter as a literal whose value is a typed Python scalar
    (`TypedInt`, `TypedFloat`, `TypedComplex`) or a `bool`, without a shape;
    earlier releases give NumPy arrays. (Eager `jax.grad` binds a log with
    Python scalars too.)"""
    return [x if hasattr(x, "shape") else np.asarray(x, x.dtype) if hasattr(x, "dtype") else jnp.asarray(x)
            for x in values]


# --- The effect that keeps `lox.log` alive -------------------------------------
# A log has no outputs, so without an effect JAX would remove it as dead code. It
# is allowed everywhere a debug callback is: control flow, custom derivatives,
# remat, and it is kept by partial evaluation (so under `grad` it stays with the
# primal computation, once per loop iteration).
class LogEffect(effects.Effect):
    __str__ = lambda self: "LoxLog"  # noqa: E731


log_effect = LogEffect()
for _set in (
    effects.lowerable_effects,
    effects.control_flow_allowed_effects,
    effects.custom_derivatives_allowed_effects,
    effects.remat_allowed_effects,
    effects.partial_eval_kept_effects,
):
    _set.add_type(LogEffect)


# --- What a trace of `lox.log` depends on ----------------------------------------
# A `lox.log` that nothing would see (no lox transform is tracing, the default
# is "off") binds nothing, so that a plain `jax.jit` of code that logs has no
# effect and keeps JAX's fast dispatch path. Both settings are JAX
# configuration states in the trace context, so JAX traces a function again
# when they change: a `jax.jit`ted function traced outside any transform is
# traced anew inside `lox.spool` (where its logs are bound), and every
# function after `lox.set_default` (in the jit key: compiled functions too).
def _defined(name: str, make: Callable[[], Any], value) -> Any:
    """The JAX configuration state `name`, made once per process (a module
    reload finds it as it is), set to `value` rather than to the environment
    variable JAX reads for it."""
    if name in _config.config_states:
        return _config.config_states[name]
    state = make()
    jax.config.update(name, value)
    return state


# How many lox transforms are tracing (0, 1, or 2 for more): what a transform
# leaves of an unselected log depends on whether another one is around it.
transform_depth_state = _defined("lox_transform_depth", lambda: _config.int_state(
    "lox_transform_depth", 0, "How many lox transforms are tracing (2: more than one).",
    include_in_trace_context=True), 0)
default_output_state = _defined("lox_default_output", lambda: _config.enum_state(
    "lox_default_output", ["console", "off"], "console", "What `lox.log` does with no lox transform around it.",
    include_in_jit_key=True, include_in_trace_context=True), "console")


# The destination (`lox_core.active`) of the keyed `logger.active` block open in
# this thread, or 0: in the jit key, so that a function run in such a block is
# traced and compiled for it (its logs bound even with the default "off").
active_run_state = _defined("lox_active_run", lambda: _config.int_state(
    "lox_active_run", 0, "The keyed `logger.active` block open in this thread (0: none).",
    include_in_jit_key=True, include_in_trace_context=True), 0)


def capturing():
    """Within: traces made belong to a lox transform, so every `lox.log`
    binds. With the default "console" every log binds anyway, and the trace
    context is left as it is (no second trace of the nested jits)."""
    if default_output_state.value == "console":
        return contextlib.nullcontext()
    return transform_depth_state(min(transform_depth_state.value + 1, 2))


def set_default_output(mode: str) -> None:
    jax.config.update("lox_default_output", mode)


def logs_seen(outside: bool = False) -> bool:
    """Whether a `lox.log` now would be seen: the default prints, a keyed
    `logger.active` block is open, or a lox transform is tracing (with
    `outside`: a transform around the one tracing)."""
    return (default_output_state.value == "console" or active_run_state.value != 0
            or transform_depth_state.value > (1 if outside else 0))


# The effects of `jax.debug.callback`, which lox's host calls share so that their
# lowering (through `jax.debug.callback`) threads the same ordering token.
debug_effect = _debugging.debug_effect
ordered_debug_effect = _debugging.ordered_debug_effect


# --- Walking and re-emitting equations -------------------------------------------
def subjaxprs_of(eqn) -> list[Jaxpr]:
    """The jaxprs in an equation's params (bodies, branches, rules)."""
    params = eqn.params
    return list(core.jaxprs_in_params(params)) if params else []


def current_trace():
    return core.trace_ctx.trace


def eager() -> bool:
    """Whether code runs eagerly now: no trace (jit, vmap, grad, a lox transform) around it."""
    return isinstance(current_trace(), core.EvalTrace)


def staging_trace():
    """The trace building the jaxpr that equations bound now end up in, seen
    through the transforms (`vmap`, `jvp`, `grad`) applied inside it; None
    when nothing is being staged (an eager call, or eager `vmap`)."""
    trace = current_trace()
    while trace is not None and not isinstance(trace, pe.DynamicJaxprTrace):
        trace = getattr(trace, "parent_trace", None)
    return trace


def register_staging_rule(primitive, rule) -> None:
    """Call ``rule(trace, tracers)`` when `primitive` is staged into a jaxpr
    (with the jaxpr's tracers), then stage it as usual."""

    def staging(trace, source_info, *tracers, **params):
        rule(trace, tracers)
        return trace.default_process_primitive(primitive, tracers, params, source_info)

    pe.custom_staging_rules[primitive] = staging


def bind_equation(eqn, invals: list) -> list:
    """Re-emit an unchanged equation on the current trace, as `eval_jaxpr` does."""
    got = eqn.primitive.get_bind_params(eqn.params)
    # JAX 0.8 returns (subfuns, params); later releases return params holding the subfuns.
    subfuns, params = got if isinstance(got, tuple) else ((), got)
    with source_info_util.user_context(eqn.source_info.traceback, name_stack=eqn.source_info.name_stack):
        with eqn.ctx.manager:
            out = eqn.primitive.bind(*subfuns, *invals, **params)
    return out if eqn.primitive.multiple_results else [out]


def is_staging(trace) -> bool:
    """Whether `trace` builds a jaxpr (as under `jit`), rather than running eagerly."""
    return isinstance(trace, pe.DynamicJaxprTrace)


def is_ref_aval(aval) -> bool:
    """Whether `aval` is the abstract value of a `jax.new_ref` Ref."""
    return isinstance(aval, _AbstractRef)


def jaxpr_of_equations(eqns: list, invars: list, outvars: list) -> Jaxpr:
    """A jaxpr made of `eqns` as they are, reading `invars` and returning `outvars`."""
    # The effects as a jaxpr's (relative to its inputs), not the union of its
    # equations' (a Ref's effects are relative to each equation's inputs).
    effs = pe.make_jaxpr_effects([], invars, outvars, eqns)
    debug_info = linear_util.DebugInfo("lox", "<lox segment>", tuple(f"x{i}" for i in range(len(invars))), None)
    return Jaxpr([], invars, outvars, eqns, effs, debug_info)


def inline_into_trace(trace, jaxpr: Jaxpr, args: list) -> list:
    """`jaxpr`'s equations copied into `trace` (a staging one) on `args`, as
    `jit` inlines a nested call: no re-tracing, no abstract evaluation."""
    src = source_info_util.current()
    in_tracers = [trace.to_jaxpr_tracer(x, src) for x in args]
    return pe.inline_jaxpr_into_trace(trace, src, jaxpr, [], *in_tracers)


_jit_template: dict | None = None


def bind_jit(closed: ClosedJaxpr, args: list) -> list:
    """`jit` of a jaxpr lox built, bound without tracing it again. The
    parameters are those JAX gives a plain `jax.jit` call (read from one,
    so that a parameter added by a release is there), sized to the jaxpr."""
    global _jit_template
    if _jit_template is None:
        with jax.disable_jit(False):  # under disable_jit the template would have no jit
            _jit_template = dict(jax.make_jaxpr(jax.jit(lambda x: x))(0.0).eqns[0].params)
    t = _jit_template
    n, m = len(closed.jaxpr.invars), len(closed.jaxpr.outvars)
    params = dict(
        t, jaxpr=closed, name="lox_segment",
        in_shardings=t["in_shardings"][:1] * n, out_shardings=t["out_shardings"][:1] * m,
        in_layouts=t["in_layouts"][:1] * n, out_layouts=t["out_layouts"][:1] * m,
        donated_invars=(False,) * n, ctx_mesh=jax.sharding.get_abstract_mesh(),
    )
    return jit_p.bind(*args, **params)


# --- The higher-order primitives lox rebuilds, and their parameters -------------
# lox compares primitives by object, never by name (names change between
# releases: `pjit` became `jit`). Each parameter reader takes only what lox
# needs and names it, so a renamed parameter raises a KeyError here rather
# than a wrong program elsewhere.
scan_p = _primitives.scan_p
while_p = _primitives.while_p
cond_p = _primitives.cond_p
jit_p = _primitives.jit_p
closed_call_p = _primitives.closed_call_p
remat_p = _remat_p  # `jax.checkpoint` (in `jax.extend` only from JAX 0.8.2)
custom_jvp_call_p = _primitives.custom_jvp_call_p
custom_vjp_call_p = _primitives.custom_vjp_call_p
shard_map_p = _shard_map_p

# Loops whose bodies run a number of times: a scan (known length) or a while loop.
LOOP_PRIMITIVES = frozenset({scan_p, while_p})


class ScanParams(NamedTuple):
    jaxpr: ClosedJaxpr
    length: int
    reverse: bool
    unroll: Any
    num_consts: int
    num_carry: int


def scan_params(params) -> ScanParams:
    if "ft_in" in params:
        # JAX 0.11: the operands' groups (consts, carry, xs) as a FlatTree.
        num_consts, num_carry, _ = map(len, params["ft_in"].unpack())
    else:
        num_consts, num_carry = params["num_consts"], params["num_carry"]
    return ScanParams(params["jaxpr"], params["length"], params["reverse"], params["unroll"], num_consts, num_carry)


class WhileParams(NamedTuple):
    cond_jaxpr: ClosedJaxpr
    body_jaxpr: ClosedJaxpr
    cond_nconsts: int
    body_nconsts: int


def while_params(params) -> WhileParams:
    return WhileParams(params["cond_jaxpr"], params["body_jaxpr"], params["cond_nconsts"], params["body_nconsts"])


def cond_branches(params) -> tuple:
    return tuple(params["branches"])


def call_jaxpr(params) -> ClosedJaxpr:
    """The body of `jit` (named `jit` or `pjit`) and `closed_call` equations."""
    return closed(params.get("jaxpr", params.get("call_jaxpr")))


class RematParams(NamedTuple):
    jaxpr: Jaxpr
    prevent_cse: bool
    policy: Any


def remat_params(params) -> RematParams:
    return RematParams(params["jaxpr"], params["prevent_cse"], params["policy"])


class CustomCallParams(NamedTuple):
    call_jaxpr: ClosedJaxpr
    num_consts: int


def custom_call_params(params) -> CustomCallParams:
    return CustomCallParams(closed(params["call_jaxpr"]), params["num_consts"])


class ShardMapParams(NamedTuple):
    jaxpr: ClosedJaxpr
    mesh: Any
    in_specs: tuple
    out_specs: tuple
    check_vma: bool
    manual_axes: frozenset


def shard_map_params(params) -> ShardMapParams:
    # `manual_axes` became `newly_manual_axes` in JAX 0.10.
    manual = params["newly_manual_axes"] if "newly_manual_axes" in params else params["manual_axes"]
    return ShardMapParams(
        closed(params["jaxpr"]), params["mesh"], tuple(params["in_specs"]), tuple(params["out_specs"]),
        params["check_vma"], frozenset(manual),
    )


# --- lowering ---------------------------------------------------------------------
def register_lowering(primitive, rule: Callable, cacheable: bool = True) -> None:
    """`mlir.register_lowering` of a rule that takes the primitive's parameters
    by name (JAX 0.8 and 0.9 type a rule as taking any keyword argument)."""
    mlir.register_lowering(primitive, rule, cacheable=cacheable)


# --- batching ---------------------------------------------------------------------
def register_batching_rule(primitive, rule) -> None:
    """`rule(axis_size, args, dims, **params)`, called under vmap even when no
    operand is batched (a log of a constant still gets the batch axis, and still
    learns whether it sits in a cond that vmap turned into a select). The
    compatibility table `batching.primitive_batchers` would skip it then."""

    def fancy(axis_data, args, dims, **params):
        return rule(axis_data.size, args, dims, **params)

    _batching.fancy_primitive_batchers[primitive] = fancy


# --- vmap of cond -----------------------------------------------------------------
_COND_BATCHING_CODE = _conditionals._cond_batching_rule.__code__


def is_cond_into_select_frame(frame) -> bool:
    """Whether `frame` is JAX's cond batching rule turning a `cond` with a
    batched predicate into a `select` (JAX offers no hook for this; if it
    renames the rule, nothing matches and the vmap-of-cond tests fail)."""
    return frame.f_code is _COND_BATCHING_CODE and frame.f_locals.get("index_dim") is not None


# --- host callbacks with a result -----------------------------------------------
from jax._src import callback as _callback  # noqa: E402


def lower_callback_with_results(ctx, fun, args):
    """Lower an unordered host call with side effects that returns
    `ctx.avals_out` (NumPy arrays from `fun(*numpy_args)`), placed as
    `jax.experimental.io_callback` places its calls (once on the first device
    of a sharded program, per device in a shard_map) but without io_callback's
    copy of every argument into a device array, which costs more than the call."""
    sharding = _callback._callback_op_sharding(ctx.module_context.axis_context, None, ctx.avals_out)
    results, _, _ = _callback.emit_python_callback(
        ctx, fun, None, list(args), ctx.avals_in, ctx.avals_out, has_side_effect=True, returns_token=False,
        sharding=sharding,
    )
    return results


def _leading_unsharded(spec):
    """`spec` with an unsharded axis in front (its unreduced and reduced axes
    kept, and JAX 0.11's kind of unreduced axes)."""
    names = ("unreduced", "reduced", "unreduced_kind")
    extra = {name: getattr(spec, name) for name in names if getattr(spec, name, None)}
    return jax.sharding.PartitionSpec(None, *spec._partitions, **extra)


def with_event_axis(aval):
    """`aval` with a leading event axis of 1, never sharded: on a mesh with
    explicit axes an aval carries its sharding, whose spec gets a `None` in
    front for the new axis."""
    shape = (1, *aval.shape)
    sharding = getattr(aval, "sharding", None)
    if sharding is None or getattr(sharding, "spec", None) is None:
        return aval.update(shape=shape)
    return aval.update(shape=shape, sharding=sharding.update(spec=_leading_unsharded(sharding.spec)))


def add_event_axis(x):
    """`x` with a leading event axis of 1 (never sharded): one `reshape`, the
    cheapest primitive to trace, with its sharding given on explicit mesh axes."""
    if not hasattr(x, "shape"):  # a Python scalar
        (x,) = literal_operands([x])
    return jax.lax.reshape(x, (1, *x.shape), out_sharding=events_sharding(x))


def events_sharding(x, series: bool = False):
    """The sharding of events of `x` (an array, tracer or aval) stacked along a
    new leading axis (`series`: `x` has that axis already) when `x` is sharded
    on explicit mesh axes; None otherwise (arrays made without a sharding
    then have the placement they need)."""
    aval = x if isinstance(x, core.AbstractValue) else jax.typeof(x)
    sharding = getattr(aval, "sharding", None)
    spec = getattr(sharding, "spec", None)
    if sharding is None or spec is None or all(p is None for p in spec._partitions):
        return None
    return sharding if series else sharding.update(spec=_leading_unsharded(spec))


def full(shape, fill, dtype, sharding=None):
    """`jnp.full`, placed with `sharding` (from `events_sharding`) if given."""
    return jax.lax.full(shape, fill, dtype, sharding=sharding)


def tangent_aval(x):
    """The abstract value of `x`'s tangent (float0 for integers)."""
    return jax.typeof(x).to_tangent_aval()


def varying_in_manual_axes(x):
    """`x` typed as varying over the manual axes of the enclosing `shard_map`
    (if any), so that a loop may carry it while values that differ per device
    are written into it."""
    axes = manual_axes()
    return jax.lax.pcast(x, axes, to="varying") if axes else x


# --- multi-process jobs ------------------------------------------------------------
def distributed_runtime() -> tuple[int, int, Any]:
    """(process index, process count, key-value client) of the job that
    `jax.distributed.initialize` joined, or (0, 1, None) outside one: read
    without initializing JAX's backends (which would make a later
    `jax.distributed.initialize` fail)."""
    state = _distributed.global_state
    client = getattr(state, "client", None)
    if client is None:
        return 0, 1, None
    return int(state.process_id), int(state.num_processes), client


def manual_axes() -> tuple:
    """The mesh axes of the enclosing `shard_map` or `pmap` (empty outside them)."""
    return tuple(jax.sharding.get_abstract_mesh().manual_axes)


# --- effects_barrier --------------------------------------------------------------
from jax._src import dispatch as _dispatch  # noqa: E402

# What `jax.effects_barrier()` runs: wait for the runtime tokens of every program dispatched.
_wait_for_effects = getattr(_dispatch.RuntimeTokenSet.block_until_ready, "__wrapped__",  # JAX's, on a reload too
                            _dispatch.RuntimeTokenSet.block_until_ready)


def check_after_effects_barrier(check: Callable[[], None]) -> None:
    """Make `jax.effects_barrier()` call `check()` once it has waited (JAX
    offers no hook: the method it calls is wrapped, once)."""

    def block_until_ready(self):
        _wait_for_effects(self)
        check()

    block_until_ready.__wrapped__ = _wait_for_effects  # type: ignore[attr-defined]
    _dispatch.RuntimeTokenSet.block_until_ready = block_until_ready


def wait_for_effects() -> None:
    """`jax.effects_barrier()` without the check."""
    _wait_for_effects(_dispatch.runtime_tokens)
