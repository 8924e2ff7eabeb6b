"""optax: a gradient transformation that logs, inside optax's own wrappers.

`log_norm(key)` is an ordinary `optax.GradientTransformation` that logs the
norm of the updates passing through it. Chained before and after gradient
clipping and wrapped in `optax.apply_if_finite`, it runs inside a cond that
optax writes: a step whose gradient is not finite is skipped, and so are its
logs. `lox.spool` returns such keys as padded series: `logs.valid` says which
events the branch that ran logged, and loggers write only those.

    python examples/optax_logging.py
"""

import jax
import jax.numpy as jnp
import optax

import lox

STEPS = 8


def log_norm(key: str) -> optax.GradientTransformation:
    """Logs the global norm of the updates, and passes them on unchanged."""

    def update(updates, state, params=None):
        lox.log({key: optax.tree.norm(updates)})
        return updates, state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


optimizer = optax.apply_if_finite(
    optax.chain(log_norm("grad_norm"), optax.clip_by_global_norm(1.0), log_norm("clipped_norm"), optax.sgd(0.2)),
    max_consecutive_errors=3,
)


def step(params, opt_state, x, y):
    def loss_fn(params):
        return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    lox.log({"loss": loss})
    return optax.apply_updates(params, updates), opt_state


def main():
    x = jax.random.normal(jax.random.key(0), (STEPS, 32, 2))
    y = x @ jnp.array([2.0, -1.0]) + 0.5
    y = y.at[3, 0].set(jnp.nan)  # a corrupted batch: its gradient is NaN, and optax skips the update
    params = {"w": jnp.zeros(2), "b": jnp.zeros(())}
    opt_state = optimizer.init(params)
    spooled = lox.spool(step)
    print("step    loss  grad_norm  clipped  (- : skipped, padding in the logs)")
    for i in range(STEPS):
        (params, opt_state), logs = spooled(params, opt_state, x[i], y[i])
        norms = [f"{logs[k][0]:9.3f}" if logs.valid[k][0] else f"{'-':>9}" for k in ("grad_norm", "clipped_norm")]
        print(f"{i:4d} {logs['loss'][0]:7.3f} {norms[0]} {norms[1]}")
    print(logs)
    w = ", ".join(f"{v:.3f}" for v in params["w"])
    print(f"w=[{w}] b={params['b']:.3f} (true w=[2, -1] b=0.5); updates skipped: {int(opt_state.total_notfinite)}")


if __name__ == "__main__":
    main()
