"""`lox.nolog`: the function with every log removed, in every nested program."""


import jax
import jax.numpy as jnp
import numpy as np
from logs_testing import kernels

import lox

inner = jax.jit(lambda x: (lox.log({"inner": x}), jnp.sin(x))[1])


def with_logs(xs):
    lox.log({"xs": xs}, step=0)

    def step(c, x):
        c = c + inner(x)
        lox.log({"c": c})
        return c, None

    c, _ = jax.lax.scan(step, 0.0, xs)
    c = jax.lax.cond(c > 0, lambda c: (lox.log({"pos": c}), c)[1], lambda c: (lox.log({"pos": c}), -c)[1], c)
    return jax.lax.while_loop(lambda c: c < 100, lambda c: (lox.log({"w": c}), c * 2)[1], c + 1)


def without_logs(xs):
    def step(c, x):
        return c + jnp.sin(x), None

    c, _ = jax.lax.scan(step, 0.0, xs)
    c = jax.lax.cond(c > 0, lambda c: c, lambda c: -c, c)
    return jax.lax.while_loop(lambda c: c < 100, lambda c: c * 2, c + 1)


def test_nolog_computes_the_same_and_compiles_to_the_same_program():
    xs = jnp.arange(4.0)
    np.testing.assert_allclose(lox.nolog(with_logs)(xs), jax.jit(without_logs)(xs))
    ours = jax.jit(lox.nolog(with_logs)).lower(xs).compile().as_text()
    ref = jax.jit(without_logs).lower(xs).compile().as_text()
    assert "callback" not in ours.lower()
    assert kernels(ours) == kernels(ref)


def test_the_default_output_is_a_host_callback_that_nolog_removes():
    text = jax.jit(with_logs).lower(jnp.arange(4.0)).compile().as_text()
    assert "callback" in text.lower()


def test_nolog_under_grad_and_vmap():
    def f(w):
        lox.log({"w": w})
        return jnp.sum(jnp.sin(w))

    w = jnp.arange(3.0)
    np.testing.assert_allclose(jax.grad(lox.nolog(f))(w), jnp.cos(w), rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(lox.nolog(f))(w), jnp.sin(w), rtol=1e-6)
