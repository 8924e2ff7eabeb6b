"""Parameter estimation: recover a damped oscillator's frequency and damping.

The oscillator x'' = -omega**2 x - 2 zeta omega x' is integrated with a
`jax.lax.scan`; gradient descent (Adam) through the integrator fits omega and
zeta to noisy observations. Every optimisation step logs the loss and both
parameters, and `lox.spool` returns them with the fitted parameters.

    python examples/parameter_estimation.py
"""

import jax
import jax.numpy as jnp

import lox

DT, T, STEPS, LR = 0.05, 200, 300, 0.02
TRUE = {"omega": 2.0, "zeta": 0.15}


def trajectory(params):
    """x(t) at T times, from x=1, x'=0 (semi-implicit Euler)."""
    omega, zeta = params["omega"], params["zeta"]

    def step(state, _):
        x, v = state
        v = v + DT * (-(omega**2) * x - 2 * zeta * omega * v)
        x = x + DT * v
        return (x, v), x

    return jax.lax.scan(step, (1.0, 0.0), None, length=T)[1]


def loss_fn(params, observed):
    return jnp.mean((trajectory(params) - observed) ** 2)


def fit(params, observed):
    def step(carry, i):
        params, m, v = carry
        loss, grads = jax.value_and_grad(loss_fn)(params, observed)
        lox.log({"loss": loss, **params}, step=i)
        m = jax.tree_util.tree_map(lambda m, g: 0.9 * m + 0.1 * g, m, grads)
        v = jax.tree_util.tree_map(lambda v, g: 0.999 * v + 0.001 * g**2, v, grads)
        t = i + 1
        params = jax.tree_util.tree_map(
            lambda p, m, v: p - LR * (m / (1 - 0.9**t)) / (jnp.sqrt(v / (1 - 0.999**t)) + 1e-8), params, m, v)
        return (params, m, v), None

    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    return jax.lax.scan(step, (params, zeros, zeros), jnp.arange(STEPS))[0][0]


def main():
    observed = trajectory(TRUE) + 0.02 * jax.random.normal(jax.random.key(0), (T,))
    start = {"omega": jnp.float32(1.5), "zeta": jnp.float32(0.4)}
    fitted, logs = lox.spool(fit)(start, observed)

    print(logs)
    print(" step      loss   omega    zeta")
    for i in range(0, STEPS, 50):
        print(f"{int(logs.step['loss'][i]):5d} {logs['loss'][i]:9.5f} {logs['omega'][i]:7.3f} {logs['zeta'][i]:7.3f}")
    print(f"fitted: omega={fitted['omega']:.3f} zeta={fitted['zeta']:.3f}   "
          f"(true: omega={TRUE['omega']} zeta={TRUE['zeta']})")


if __name__ == "__main__":
    main()
