"""Deep nesting: scans inside jitted functions inside scans, with logs at every level.

`lox.tap` shows the order in which the events happen; `lox.spool` stacks each
key's events in that same order, nested loops multiplied out; `jax.vmap` outside
the spool puts the batch axis first.

    python examples/nested.py
"""

import jax
import jax.numpy as jnp

import lox


@jax.jit
def inner(x, epoch):
    """A jitted function with a scan of 3 steps: one `inner` event per step."""

    def step(x, i):
        x = 0.5 * x + i
        lox.log({"inner": x}, epoch=epoch, step=i)
        return x, None

    x, _ = jax.lax.scan(step, x, jnp.arange(3))
    lox.log({"middle": jnp.stack([x, -x])}, epoch=epoch)  # a (2,) vector per epoch
    return x


@jax.jit
def outer(x):
    """A jitted scan of 2 epochs around the jitted function, and one log at the top."""

    def epoch(x, e):
        return inner(x, e), None

    x, _ = jax.lax.scan(epoch, x, jnp.arange(2))
    lox.log({"outer": x})
    return x


def show(event):
    (key,) = event  # one key per event here
    steps = " ".join(f"{name}={step}" for name, step in event.steps.items())
    print(f"  {key:7} {steps:16} {event[key]}")


def main():
    print("events in the order they happen:")
    lox.tap(outer, show)(1.0)

    _, logs = lox.spool(outer)(1.0)
    print("spooled series (events first, in the same order):")
    for key, value in logs.items():
        steps = {name: per_key[key].tolist() for name, per_key in logs.steps.items() if key in per_key}
        print(f"  {key:7} {value.shape!s:7} {steps}")

    _, batched = jax.vmap(lox.spool(outer))(jnp.array([1.0, 2.0, 3.0, 4.0]))
    print("under vmap, 4 inputs:", {key: value.shape for key, value in batched.items()})


if __name__ == "__main__":
    main()
