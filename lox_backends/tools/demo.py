"""``lox demo``: a small real training run with several seeds, logged end to end.

A two-layer network learns ``y = sin(3x)`` from noisy samples with minibatch
SGD. Seeds run side by side under `jax.vmap`, each epoch is one compiled call:
the per-step loss and gradient norm are spooled (one batch per epoch per seed),
the validation loss is tapped (streamed as soon as the epoch computes it). Every
seed is its own run in ``console,parquet:DIR``; at the end the training and
validation loss curves (smoothed, the raw ones faint behind) are plotted into
``DIR/loss.png``.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from lox_backends.logger.logger import from_config
from lox_backends.runstore.layout import DEFAULT_DIR
from lox_backends.runstore.reader import load
from lox_backends.tools.plot import plot_runs
from lox_core.logdict import logdict
from lox_core.primitive import log

HIDDEN = 32
BATCH = 32
LEARNING_RATE = 0.1
SMOOTHING = 0.6  # of the plotted curves: minibatch losses are noisy


def init_params(key):
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (1, HIDDEN)) * 1.0,
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(k2, (HIDDEN, 1)) / jnp.sqrt(HIDDEN),
        "b2": jnp.zeros(1),
    }


def predict(params, x):
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def mse(params, x, y):
    return jnp.mean((predict(params, x) - y) ** 2)


def dataset(key, n=512):
    kx, kn = jax.random.split(key)
    x = jax.random.uniform(kx, (n, 1), minval=-1.0, maxval=1.0)
    return x, jnp.sin(3.0 * x) + 0.05 * jax.random.normal(kn, (n, 1))


def epoch(params, key, epoch_index, steps, data, validation):
    """One epoch of SGD; logs every step's loss and the epoch's validation loss."""
    x, y = data

    def sgd_step(params, inputs):
        i, k = inputs
        batch = jax.random.choice(k, x.shape[0], (BATCH,), replace=False)
        loss, grads = jax.value_and_grad(mse)(params, x[batch], y[batch])
        grad_norm = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree_util.tree_leaves(grads)))
        log({"loss": loss, "grad_norm": grad_norm}, step=epoch_index * steps + i)
        params = jax.tree_util.tree_map(lambda p, g: p - LEARNING_RATE * g, params, grads)
        return params, None

    params, _ = jax.lax.scan(sgd_step, params, (jnp.arange(steps), jax.random.split(key, steps)))
    log({"val_loss": mse(params, *validation)}, step=(epoch_index + 1) * steps, tags=["progress"])
    return params


def run_demo(directory: str = DEFAULT_DIR, seeds: int = 4, epochs: int = 20, steps: int = 100) -> str:
    """Train `seeds` models for `epochs` epochs, log to ``console,parquet:DIR``,
    plot the loss curves; returns the path of the plot."""
    logger = from_config(f"console,parquet:{directory}", name="demo")
    data = dataset(jax.random.key(1234))
    validation = dataset(jax.random.key(4321), n=256)
    keys = jax.random.split(jax.random.key(0), seeds)
    def init(key):
        return logger.init(key, name="demo", lr=LEARNING_RATE, hidden=HIDDEN, steps_per_epoch=steps)

    states = jax.vmap(init)(keys)
    params = jax.vmap(init_params)(keys)

    train_epoch = functools.partial(epoch, steps=steps, data=data, validation=validation)

    def one_epoch(state, params, key, e):
        spooled = logger.spool(train_epoch, state, argnames=["loss", "grad_norm"])  # per step, one batch per epoch
        return logger.tap(spooled, state)(params, key, e)  # val_loss as soon as it is computed

    train = jax.jit(jax.vmap(one_epoch, in_axes=(0, 0, 0, None)))
    for e in range(epochs):
        params = train(states, params, jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, e), e)
    logger.finish(states)
    logger.close()

    ours = {run.run_id for run in logger.runs()}
    saved = {run_id: load(os.path.join(directory, run_id)) for run_id in ours}  # not older runs in DIR
    print(f"\nlox demo: {len(ours)} runs ({seeds} seeds) saved under {os.path.abspath(directory)}")
    for run in logger.runs():
        logs = saved[run.run_id]
        assert isinstance(logs, logdict)  # a run's folder reads back as one logdict
        print(f"  {run.name}: {logs['loss'].shape[0]} steps, final loss {float(np.asarray(logs['loss'])[-1]):.4f}, "
              f"final val_loss {float(np.asarray(logs['val_loss'])[-1]):.4f}  ({os.path.join(directory, run.run_id)})")

    title = f"lox demo: a {HIDDEN}-unit MLP learns sin(3x), {seeds} seeds"
    png = plot_runs(directory, key=["loss", "val_loss"], output=os.path.join(directory, "loss.png"), run_ids=ours,
                    smoothing=SMOOTHING, title=title)
    print(f"  loss curves: {png}  (again with: lox plot {directory} --key loss --key val_loss --smooth {SMOOTHING} "
          "-o loss.png)")
    return png
