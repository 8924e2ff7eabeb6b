"""Emitting the equations lox leaves alone, cheaply.

Most of a program has nothing for lox to handle. The interpreter hands each
run of such equations (between two that need a handler) to `emit_run`, which
puts them on the current trace without tracing them again: that is what keeps
a transform close to free on large programs.
"""

from __future__ import annotations

from lox_core import _compat

# A run at least this long becomes one nested `jit` equation instead of being
# copied equation by equation: one equation to add instead of thousands, and XLA
# inlines the call, so the compiled program is the same.
AS_CALL_MIN_EQNS = 32


def emit_run(eqns: list, read, write, exported) -> None:
    """Emit a run of equations that contain nothing for lox to handle.

    Inside a jaxpr trace (always the case under `spool`, which is jitted) a long
    run is emitted as one nested `jit` of a jaxpr made of the same equations,
    and a short one is copied into the trace the way `jit` inlines a nested
    call: neither re-traces nor re-runs abstract evaluation. Elsewhere the
    equations are bound one by one. `read`/`write` map variables to values;
    `exported(var)` says whether a variable the run defines is read after it.
    """
    trace = _compat.current_trace()
    if not _compat.is_staging(trace):
        for eqn in eqns:
            outs = _compat.bind_equation(eqn, [read(v) for v in eqn.invars])
            for v, x in zip(eqn.outvars, outs, strict=True):  # one value per output, as in `eval_jaxpr`
                write(v, x)
        return
    defined: set = set()
    free: dict = {}
    for eqn in eqns:
        for v in eqn.invars:
            if not isinstance(v, _compat.Literal) and v not in defined:
                free[v] = None
        defined.update(eqn.outvars)
    invars = list(free)
    outvars = [v for eqn in eqns for v in eqn.outvars if not isinstance(v, _compat.DropVar) and exported(v)]
    segment = _compat.jaxpr_of_equations(eqns, invars, outvars)
    args = [read(v) for v in invars]
    # A jit may not return a Ref (`jax.new_ref`): such runs are copied instead.
    if len(eqns) >= AS_CALL_MIN_EQNS and not any(_compat.is_ref_aval(v.aval) for v in outvars):
        outs = _compat.bind_jit(_compat.ClosedJaxpr(segment, ()), args)
    else:
        outs = _compat.inline_into_trace(trace, segment, args)
    for v, x in zip(outvars, outs, strict=True):
        write(v, x)
