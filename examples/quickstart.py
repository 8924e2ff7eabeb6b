"""Linear regression trained with SGD inside `jax.lax.scan`, logged with lox.

Every step logs its loss and parameters with `lox.log`; `lox.spool` returns them
as outputs of the one compiled training program, with their steps.

    python examples/quickstart.py
"""

import jax
import jax.numpy as jnp
import numpy as np

import lox

TRUE_W, TRUE_B = jnp.array([2.0, -3.0, 0.5]), 1.0


def make_data(key, n=256):
    kx, kn = jax.random.split(key)
    x = jax.random.normal(kx, (n, 3))
    y = x @ TRUE_W + TRUE_B + 0.1 * jax.random.normal(kn, (n,))
    return x, y


def loss_fn(params, x, y):
    w, b = params
    return jnp.mean((x @ w + b - y) ** 2)


def train(params, x, y, lr=0.05, steps=200, batch=32):
    def step(params, i):
        start = (i * batch) % x.shape[0]
        xb = jax.lax.dynamic_slice_in_dim(x, start, batch)
        yb = jax.lax.dynamic_slice_in_dim(y, start, batch)
        loss, grads = jax.value_and_grad(loss_fn)(params, xb, yb)
        params = jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)
        lox.log({"loss": loss, "w": params[0], "b": params[1]}, step=i, epoch=i * batch // x.shape[0])
        return params, None

    params, _ = jax.lax.scan(step, params, jnp.arange(steps))
    return params


def main():
    x, y = make_data(jax.random.key(0))
    params = (jnp.zeros(3), jnp.float32(0.0))
    (w, b), logs = lox.spool(train)(params, x, y)

    print(logs)
    print(f"{'step':>5} {'epoch':>5} {'loss':>10}   w")
    for i in range(0, logs["loss"].shape[0], 25):
        print(f"{int(logs.step['loss'][i]):>5} {int(logs.epoch['loss'][i]):>5} {float(logs['loss'][i]):>10.5f}   "
              f"{fmt(logs['w'][i])}")
    last_epoch = logs.epoch["loss"] == logs.epoch["loss"][-1]
    print(f"mean loss in the last epoch: {float(logs['loss'][last_epoch].mean()):.5f}")
    print(f"learned w={fmt(w)} b={float(b):.3f}   (true w={fmt(TRUE_W)} b={TRUE_B})")


def fmt(v):
    return np.array2string(np.asarray(v), precision=3, floatmode="fixed")


if __name__ == "__main__":
    main()
