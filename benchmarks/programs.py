"""The programs benchmarked, each with the hand-written equivalent lox is held to:
the same computation carrying the same values out as ordinary outputs."""

import re

import jax
import jax.numpy as jnp

import lox

STEPS = 10_000


def _step(carry, x):
    c, v = carry
    v = jnp.tanh(v * 0.99 + x)
    c = c * 0.9 + jnp.mean(v)
    return (c, v), c


def scan_logged(xs):
    def body(carry, ix):
        i, x = ix
        carry, loss = _step(carry, x)
        lox.log({"loss": loss, "h": carry[1]}, step=i)
        return carry, None

    return jax.lax.scan(body, (0.0, jnp.zeros(64)), (jnp.arange(xs.shape[0]), xs))[0]


def scan_by_hand(xs):
    def body(carry, ix):
        i, x = ix
        carry, loss = _step(carry, x)
        return carry, (loss, carry[1], i)

    return jax.lax.scan(body, (0.0, jnp.zeros(64)), (jnp.arange(xs.shape[0]), xs))


W = jnp.eye(64) * 0.5 + 0.01


def _layers(x, n, emit):
    """n equations in blocks of 10 (a matmul and 9 elementwise ops), logging
    each matmul's output, like the activations of a deep network."""
    for _ in range(n // 10):
        x = W @ x
        emit(x)
        for _ in range(4):
            x = jnp.sin(x) * 1.0001
        x = x + 1.0
    return x


def _sin_chain(x, n, emit):
    """n equations of elementwise ops only, logged every 10: XLA's worst case."""
    for i in range(n // 2):
        x = jnp.sin(x) * 1.0001
        if i % 5 == 4:
            emit(x)
    return x


def _logged(body, n):
    def f(x):
        return body(x, n, lambda v: lox.log({"x": v}))

    return f


def _by_hand(body, n):
    def f(x):
        outs = []
        x = body(x, n, outs.append)
        return x, jnp.stack(outs)

    return f


def chain_logged(n):
    return _logged(_layers, n)


def chain_by_hand(n):
    return _by_hand(_layers, n)


def sin_chain_logged(n):
    return _logged(_sin_chain, n)


def sin_chain_by_hand(n):
    return _by_hand(_sin_chain, n)


def scanned_chain_logged(n):
    def f(x):
        return jax.lax.scan(lambda c, _: (chain_logged(n)(c), None), x, None, length=4)[0]

    return f


def scanned_chain_by_hand(n):
    def f(x):
        return jax.lax.scan(lambda c, _: chain_by_hand(n)(c), x, None, length=4)

    return f


def scan_one_scalar(xs):
    def body(c, ix):
        i, x = ix
        c = c * 0.9 + x
        lox.log({"c": c}, step=i)
        return c, None

    return jax.lax.scan(body, 0.0, (jnp.arange(xs.shape[0]), xs))[0]


def scan_debug_callback(callback):
    def f(xs):
        def body(c, ix):
            i, x = ix
            c = c * 0.9 + x
            jax.debug.callback(callback, c, i, ordered=True)
            return c, None

        return jax.lax.scan(body, 0.0, (jnp.arange(xs.shape[0]), xs))[0]

    return f


def count_sines(compiled) -> int:
    return len(re.findall(r" sine\(", compiled.as_text()))


# --- a training step, for the loggers' throughput --------------------------------------
WIDTH, BATCH = 512, 512


def mlp_init(key):
    k1, k2, k3 = jax.random.split(key, 3)
    scale = 1.0 / WIDTH**0.5
    return {"w1": jax.random.normal(k1, (WIDTH, WIDTH)) * scale, "w2": jax.random.normal(k2, (WIDTH, WIDTH)) * scale,
            "w3": jax.random.normal(k3, (WIDTH, 1)) * scale}


def _mlp_step(params, x, y):
    def loss_fn(p):
        h = jnp.tanh(jnp.tanh(x @ p["w1"]) @ p["w2"])
        return jnp.mean((h @ p["w3"] - y) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    grad_norm = jnp.sqrt(sum(jnp.sum(g**2) for g in jax.tree_util.tree_leaves(grads)))
    return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads), loss, grad_norm


def train_step_logged(params, x, y, i):
    params, loss, grad_norm = _mlp_step(params, x, y)
    lox.log({"loss": loss, "grad_norm": grad_norm}, step=i)
    return params


def train_step_plain(params, x, y, i):
    return _mlp_step(params, x, y)[0]
