"""Live monitoring: follow a run while it runs, with `lox.tap`.

Gradient descent runs in a `jax.lax.while_loop` until the gradient is small: the
number of steps is not known in advance, so `lox.spool` could collect its logs only
into a buffer of fixed size (`max_events`); `lox.tap` streams them to the host as
they happen. A `jax.lax.cond` logs
only every 50th step, so the loop makes few host calls. First a callback prints
the progress; then `logger.tap` streams the same events to the console backend.

    python examples/live_monitoring.py
"""

import jax
import jax.numpy as jnp

import lox

A, B = jnp.array([[3.0, 1.0], [1.0, 2.0]]), jnp.array([1.0, -1.0])


def loss_fn(w):
    return 0.5 * w @ A @ w - B @ w


def train(w, lr):
    def keep_going(carry):
        w, i = carry
        return (i < 10_000) & (jnp.linalg.norm(jax.grad(loss_fn)(w)) > 1e-4)

    def step(carry):
        w, i = carry
        loss, grad = jax.value_and_grad(loss_fn)(w)

        def report():
            lox.log({"loss": loss, "grad_norm": jnp.linalg.norm(grad)}, step=i)

        jax.lax.cond(i % 50 == 0, report, lambda: None)  # a host call every 50th step only
        return w - lr * grad, i + 1

    w, steps = jax.lax.while_loop(keep_going, step, (w, 0))
    lox.log({"final_loss": loss_fn(w)}, step=steps)
    return w


def progress(event):
    """The tap's callback: one line per event (a `lox.Event`: values as logged, steps as ints)."""
    print(f"step {event.step:4d}: " + ", ".join(f"{key} {float(value):.5f}" for key, value in event.items()))


def main():
    w = lox.tap(train, progress)(jnp.zeros(2), 0.02)  # returns after the last callback
    print(f"w = [{w[0]:.4f}, {w[1]:.4f}]")

    logger = lox.loggers.from_config("console", name="quadratic")  # plain lines unless a terminal
    state = logger.init(lr=0.02)
    logger.tap(train, state)(jnp.zeros(2), 0.02)
    logger.finish(state)  # shows the final values


if __name__ == "__main__":
    main()
