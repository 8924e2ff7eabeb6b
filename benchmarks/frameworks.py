"""lox on flax.nnx and equinox train steps, against each library's own jit.

    python -m benchmarks frameworks

The reference is the same step under `nnx.jit` (or `eqx.filter_jit`) that
returns the logged values by hand; lox's step logs them and runs under
`lox.spool`. Both update the same kind of model, so both pay for flattening
it: the ratios show what lox adds on top (or saves).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from flax import nnx

import lox
from benchmarks.timing import block, row, side_by_side

LAYERS = 10  # 20 parameter arrays


class MLP(nnx.Module):
    def __init__(self, width: int, rngs: nnx.Rngs):
        self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(LAYERS)])

    def __call__(self, x):
        for layer in self.layers:
            x = jnp.tanh(layer(x))
        return x


def nnx_step_by_hand(model, opt, x, y):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
    opt.update(model, grads)
    return loss, optax.tree.norm(grads)


def nnx_step_logged(model, opt, x, y):
    loss, grad_norm = nnx_step_by_hand(model, opt, x, y)
    lox.log({"loss": loss, "grad_norm": grad_norm}, step=opt.step[...])
    return loss


def nnx_setup(width: int, batch: int):
    model = MLP(width, nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (batch, width))
    return model, nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param), x, jnp.sin(x)


def eqx_setup(width: int, batch: int):
    model = eqx.nn.MLP(width, width, width, LAYERS - 1, activation=jnp.tanh, key=jax.random.key(0))
    optimizer = optax.adam(1e-3)
    x = jax.random.normal(jax.random.key(1), (batch, width))

    def by_hand(model, opt_state, x, y):
        loss, grads = eqx.filter_value_and_grad(lambda m: jnp.mean((jax.vmap(m)(x) - y) ** 2))(model)
        updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
        return eqx.apply_updates(model, updates), opt_state, loss, optax.tree.norm(grads)

    def logged(model, opt_state, x, y):
        model, opt_state, loss, grad_norm = by_hand(model, opt_state, x, y)
        lox.log({"loss": loss, "grad_norm": grad_norm})
        return model, opt_state

    return model, optimizer.init(eqx.filter(model, eqx.is_array)), x, jnp.sin(x), by_hand, logged


def frameworks():
    print(f"flax.nnx and equinox train steps ({LAYERS} layers, {2 * LAYERS} parameter arrays), called from Python")
    for width, batch, what in (
        (256, 256, "steady state, 256 units, batch 256"),
        (4, 1, "per-call overhead, 4 units, batch 1"),
    ):
        _nnx_rows(width, batch, what)
        _eqx_rows(width, batch, what)

    traces = []

    def counted(model, opt, x, y):
        traces.append(None)
        return nnx_step_logged(model, opt, x, y)

    model, opt, x, y = nnx_setup(4, 1)
    spooled = lox.spool(counted)
    for _ in range(100):
        spooled(model, opt, x, y)
    row("nnx step called 100 times under lox.spool: traces", f"{len(traces)}", None, "target 1")


# One size each (the timed lambdas close over the function's own variables, not a loop's).
def _nnx_rows(width: int, batch: int, what: str) -> None:
    model, opt, x, y = nnx_setup(width, batch)
    by_hand, spooled = nnx.jit(nnx_step_by_hand), lox.spool(nnx_step_logged)
    for f in (by_hand, spooled):
        block(f(model, opt, x, y))
    t = side_by_side(
        {"hand": lambda: block(by_hand(model, opt, x, y)),
         "spool": lambda: block(spooled(model, opt, x, y)),
         "fresh": lambda: block(lox.spool(nnx_step_logged)(model, opt, x, y))},
        reps=20, rounds=9,
    )
    row(f"nnx, {what}: nnx.jit, values returned", f"{t['hand'] * 1e6:.0f} us")
    row(f"nnx, {what}: lox.spool(step)", f"{t['spool'] * 1e6:.0f} us", t["spool"] / t["hand"], "target <= 1.05")
    row(f"nnx, {what}: lox.spool(step) made every call", f"{t['fresh'] * 1e6:.0f} us", t["fresh"] / t["hand"])


def _eqx_rows(width: int, batch: int, what: str) -> None:
    model, opt_state, x, y, eqx_by_hand, eqx_logged = eqx_setup(width, batch)
    by_hand, spooled = eqx.filter_jit(eqx_by_hand), lox.spool(eqx_logged)
    for f in (by_hand, spooled):
        block(f(model, opt_state, x, y))
    t = side_by_side(
        {"hand": lambda: block(by_hand(model, opt_state, x, y)),
         "spool": lambda: block(spooled(model, opt_state, x, y))},
        reps=20, rounds=9,
    )
    row(f"equinox, {what}: eqx.filter_jit, values returned", f"{t['hand'] * 1e6:.0f} us")
    row(f"equinox, {what}: lox.spool(step)", f"{t['spool'] * 1e6:.0f} us", t["spool"] / t["hand"], "target <= 1.05")
