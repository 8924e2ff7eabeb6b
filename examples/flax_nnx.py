"""flax.nnx: an ensemble of 4 seeds trained in place, one logger run per seed.

Each seed is a small `nnx.Module` (two `nnx.Linear` layers and dropout) with
its own `nnx.Optimizer`. The train step updates the model and the optimizer
in place, as nnx code does, and logs its loss and gradient norm; `nnx.vmap`
runs the 4 seeds in one compiled call, and `logger.spool` inside it sends
each seed's logs to its own run. lox writes the updated parameters, optimizer
state and RNG counts back into the modules, exactly as `nnx.jit` alone would.

    python examples/flax_nnx.py
"""

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import lox

SEEDS, STEPS = 4, 200


class MLP(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(1, 32, rngs=rngs)
        self.drop = nnx.Dropout(0.05, rngs=rngs)
        self.out = nnx.Linear(32, 1, rngs=rngs)

    def __call__(self, x):
        return self.out(self.drop(jax.nn.tanh(self.hidden(x))))


def train_step(model, opt, x, y):
    def loss_fn(model):
        return jnp.mean((model(x) - y) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    opt.update(model, grads)  # in place: the model's parameters and the optimizer's state
    lox.log({"loss": loss, "grad_norm": optax.tree.norm(grads)}, step=opt.step[...])
    return loss


def main():
    x = jnp.linspace(-2.0, 2.0, 64)[:, None]
    y = jnp.sin(2 * x)
    logger = lox.loggers.from_config("memory", name="sine")  # e.g. "console,parquet:runs"
    keys = jax.random.split(jax.random.key(0), SEEDS)
    runs = jax.vmap(lambda k: logger.init(k, lr=1e-2))(keys)  # one run per seed

    @nnx.vmap
    def create(key):
        model = MLP(nnx.Rngs(key))
        return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    @nnx.vmap(in_axes=(0, 0, 0, None, None))
    def step(model, opt, run, x, y):  # one seed's step; nnx.vmap runs them all
        return logger.spool(train_step, run)(model, opt, x, y)

    models, opts = create(keys)
    for _ in range(STEPS):
        losses = step(models, opts, runs, x, y)
    logger.finish(runs)

    print(f"optimizer steps per seed: {opts.step[...].tolist()}")
    print("run      first loss  last loss  last grad norm")
    for run in logger.runs():
        logs = logger.backends[0].logs(run.run_id)
        print(f"{run.name:8} {logs['loss'][0]:10.4f} {logs['loss'][-1]:10.4f} {logs['grad_norm'][-1]:15.4f}")
    print(f"logged {len(logs['loss'])} steps per run, the last at step {logs.step['loss'][-1]}; "
          f"final losses {[round(float(v), 4) for v in losses]}")


if __name__ == "__main__":
    main()
