"""equinox: a model with functions among its leaves, its step under `eqx.filter_jit`.

An `eqx.nn.MLP` holds its activation functions as pytree leaves; lox takes
such pytrees as `eqx.filter_jit` does (arrays traced, everything else static,
returned as they are). The step is an ordinary `eqx.filter_jit` function that
logs its loss and gradient norm; the training loop hands it to
`logger.spool`, which writes a Parquet run that `lox.load` reads back, and
`lox.tap` streams the events of a few more steps to a callback.

    python examples/equinox_filter_jit.py
"""

import tempfile

import equinox as eqx
import jax
import jax.numpy as jnp
import optax

import lox

STEPS = 300
optimizer = optax.adam(3e-3)


@eqx.filter_jit
def step(model, opt_state, x, y, i):
    def loss_fn(model):
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
    updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    lox.log({"loss": loss, "grad_norm": optax.tree.norm(grads)}, step=i)
    return eqx.apply_updates(model, updates), opt_state


def main():
    x = jnp.linspace(-1.0, 1.0, 128)[:, None]
    y = jnp.abs(x) - 0.5
    model = eqx.nn.MLP(1, 1, 16, 2, activation=jax.nn.softplus, key=jax.random.key(0))
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))
    with tempfile.TemporaryDirectory() as folder:
        logger = lox.loggers.SaveLogger(folder)  # Parquet files; from_config("parquet:DIR") alike
        run = logger.init(name="abs", lr=3e-3)
        logged_step = logger.spool(step, run)
        for i in range(STEPS):
            model, opt_state = logged_step(model, opt_state, x, y, i)
        logger.finish(run)
        (logs,) = lox.load(folder).values()  # {run_id: logdict}

    print(logs)
    for i in (0, 100, 200, 299):
        print(f"step {logs.step['loss'][i]:3d}  loss {logs['loss'][i]:.5f}  grad norm {logs['grad_norm'][i]:.5f}")
    print(f"the activation is still {model.activation.__name__}: non-array leaves pass through unchanged")

    events = []
    tapped = lox.tap(step, events.append)  # every event to a callback, as it happens
    for i in range(STEPS, STEPS + 3):
        model, opt_state = tapped(model, opt_state, x, y, i)
    print("tapped:", [(e.step, round(float(e["loss"]), 5)) for e in events])


if __name__ == "__main__":
    main()
