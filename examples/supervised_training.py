"""Supervised training: a small MLP tells two rings of points apart.

Each epoch is one compiled call: `logger.spool` runs 100 SGD steps in a
`jax.lax.scan`, each logging its loss and accuracy, then logs the validation
accuracy; the logs go to a Parquet run, which `lox.load` reads back.

    python examples/supervised_training.py
"""

import tempfile

import jax
import jax.numpy as jnp

import lox

STEPS, BATCH, EPOCHS, LR = 100, 64, 4, 0.3


def rings(key, n):
    """Points on two noisy rings (radius 1 and 2); the label says which."""
    k1, k2, k3 = jax.random.split(key, 3)
    label = jax.random.bernoulli(k1, 0.5, (n,))
    angle = jax.random.uniform(k2, (n,), maxval=2 * jnp.pi)
    radius = 1.0 + label + 0.25 * jax.random.normal(k3, (n,))
    return jnp.stack([radius * jnp.cos(angle), radius * jnp.sin(angle)], 1), label


def init(key):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (2, 16)), "b1": jnp.zeros(16),
            "w2": jax.random.normal(k2, (16,)) / 4, "b2": jnp.zeros(())}


def loss_and_accuracy(params, x, y):
    logit = jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]
    loss = -jnp.mean(jnp.where(y, jax.nn.log_sigmoid(logit), jax.nn.log_sigmoid(-logit)))
    return loss, jnp.mean((logit > 0) == y)


def epoch(params, key, e, train, valid):
    def step(params, inputs):
        i, k = inputs
        batch = jax.random.choice(k, train[0].shape[0], (BATCH,))
        (loss, acc), grads = jax.value_and_grad(loss_and_accuracy, has_aux=True)(
            params, train[0][batch], train[1][batch])
        lox.log({"loss": loss, "accuracy": acc}, step=e * STEPS + i, epoch=e)
        return jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads), None

    params, _ = jax.lax.scan(step, params, (jnp.arange(STEPS), jax.random.split(key, STEPS)))
    lox.log({"val_accuracy": loss_and_accuracy(params, *valid)[1]}, step=(e + 1) * STEPS, epoch=e)
    return params


def main():
    key = jax.random.key(0)
    train, valid = rings(jax.random.key(1), 2048), rings(jax.random.key(2), 512)
    params = init(key)
    with tempfile.TemporaryDirectory() as folder:
        logger = lox.loggers.SaveLogger(folder)  # Parquet files; from_config("parquet:DIR") alike
        state = logger.init(key, lr=LR, batch=BATCH, name="rings")
        train_epoch = logger.spool(epoch, state)  # compiled once, on the first epoch
        for e in range(EPOCHS):
            params = train_epoch(params, jax.random.fold_in(key, e), e, train, valid)
        logger.finish(state)
        (logs,) = lox.load(folder).values()  # {run_id: logdict}

    print(logs)
    print("epoch  mean loss  accuracy  val_accuracy")
    for e in range(EPOCHS):
        mine = logs.epoch["loss"] == e
        print(f"{e:5d} {logs['loss'][mine].mean():10.4f} {logs['accuracy'][mine].mean():9.3f} "
              f"{logs['val_accuracy'][e]:13.3f}")


if __name__ == "__main__":
    main()
