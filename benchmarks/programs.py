"""The programs benchmarked, each with the hand-written equivalent lox is held to:
the same computation carrying the same values out as ordinary outputs."""

import re

import jax
import jax.numpy as jnp

import lox

# On an accelerator a step of the CPU sizes is pure launch overhead, and the
# host calls of tap stall the device far more than a CPU: the sections run there
# (steady, buffer, logger) take heavier steps and fewer of them. The CPU sizes
# stay as they were, so that CPU figures remain comparable.
GPU = jax.devices()[0].platform != "cpu"
STEPS = 2_000 if GPU else 10_000
GPU_HIDDEN = 4096  # the recurrent cell of the GPU sections: a 64 MB matrix-vector product per step


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


HIDDEN = 256
W_RNN = jax.random.normal(jax.random.key(0), (HIDDEN, HIDDEN)) / HIDDEN**0.5


def _rnn_weights(hidden: int):
    return jax.random.normal(jax.random.key(0), (hidden, hidden)) / hidden**0.5


def _cell(w, h, x):
    h = jnp.tanh(w @ h + x)
    return h, jnp.mean(h**2)


def _weights_of(hidden: int):
    """The cell's weights as the programs read them: a constant of the program
    on CPU (as measured there); made by the program itself on a GPU, where a
    64 MB constant would be embedded in the compiled program."""
    if GPU:
        return lambda: _rnn_weights(hidden)
    w = _rnn_weights(hidden)
    return lambda: w


def rnn(hidden: int):
    """A heavier step than `_step`: a recurrent cell of `hidden` units (256:
    ~2.5 us per step on 2 CPU cores, 1024: ~27 us), logging its
    loss and a 64-value slice of the state. Returns the logged scan and the
    same scan buffering by hand (as `scan_buffered_by_hand`)."""
    weights = _weights_of(hidden)

    def logged(xs):
        w = weights()

        def body(h, ix):
            i, x = ix
            h, loss = _cell(w, h, x)
            lox.log({"loss": loss, "h": h[:64]}, step=i)
            return h, None

        return jax.lax.scan(body, jnp.zeros(hidden), (jnp.arange(xs.shape[0]), xs))[0]

    def buffered_by_hand(callback, size):
        def f(xs):
            w = weights()

            def body(carry, ix):
                h, buf, count = carry
                i, x = ix
                h, loss = _cell(w, h, x)
                buf = tuple(jax.lax.dynamic_update_index_in_dim(b, v, count, 0)
                            for b, v in zip(buf, (loss, h[:64], i), strict=True))
                count = count + 1
                count = jax.lax.cond(
                    count == size, lambda: (jax.debug.callback(callback, *buf, count, ordered=True), 0)[1],
                    lambda: count,
                )
                return (h, buf, count), None

            empty = (jnp.zeros(size), jnp.zeros((size, 64)), jnp.zeros(size, jnp.int32))
            (h, buf, count), _ = jax.lax.scan(body, (jnp.zeros(hidden), empty, 0), (jnp.arange(xs.shape[0]), xs))
            jax.lax.cond(count > 0, lambda: jax.debug.callback(callback, *buf, count, ordered=True), lambda: None)
            return h

        return f

    return logged, buffered_by_hand


def rnn_by_hand(hidden: int):
    """`rnn(hidden)`'s logged scan written by hand: the logged values carried
    out as ys (as `scan_by_hand`)."""
    weights = _weights_of(hidden)

    def f(xs):
        w = weights()

        def body(h, ix):
            i, x = ix
            h, loss = _cell(w, h, x)
            return h, (loss, h[:64], i)

        return jax.lax.scan(body, jnp.zeros(hidden), (jnp.arange(xs.shape[0]), xs))

    return f


def scan_logged_callback(callback):
    """`scan_logged` with a hand-written `jax.debug.callback` per step, handing
    the same values and step to `callback` (which raw JAX must order)."""

    def f(xs):
        def body(carry, ix):
            i, x = ix
            carry, loss = _step(carry, x)
            jax.debug.callback(callback, loss, carry[1], i, ordered=True)
            return carry, None

        return jax.lax.scan(body, (0.0, jnp.zeros(64)), (jnp.arange(xs.shape[0]), xs))[0]

    return f


def scan_buffered_by_hand(callback, size):
    """`scan_logged` buffering by hand: the carry holds `size` steps of values,
    sent with one `jax.debug.callback` when full, and the rest after the loop."""

    def send(buf, count):
        jax.debug.callback(callback, *buf, count, ordered=True)

    def f(xs):
        def body(carry, ix):
            (state, buf, count) = carry
            i, x = ix
            state, loss = _step(state, x)
            buf = tuple(jax.lax.dynamic_update_index_in_dim(b, v, count, 0)
                        for b, v in zip(buf, (loss, state[1], i), strict=True))
            count = count + 1
            count = jax.lax.cond(count == size, lambda: (send(buf, count), 0)[1], lambda: count)
            return (state, buf, count), None

        empty = (jnp.zeros(size), jnp.zeros((size, 64)), jnp.zeros(size, jnp.int32))
        (state, buf, count), _ = jax.lax.scan(body, ((0.0, jnp.zeros(64)), empty, 0), (jnp.arange(xs.shape[0]), xs))
        jax.lax.cond(count > 0, lambda: send(buf, count), lambda: None)
        return state

    return f


def while_logged(step):
    """A while loop running `n` steps (a number XLA cannot know) of `step`,
    logging its loss and a 64-value state per step: what `lox.spool(f,
    max_events=N)` spools."""

    def f(xs, n):
        def body(carry):
            state, i = carry
            state, loss = step(state, xs[i])
            lox.log({"loss": loss, "h": state[1][:64]}, step=i)
            return state, i + 1

        return jax.lax.while_loop(lambda c: c[1] < n, body, (_init(step), 0))[0]

    return f


def while_by_hand(step, capacity):
    """`while_logged` keeping the first `capacity` events by hand: buffers in
    the loop's carry, written at the event count (a spare last slot takes the
    events that do not fit), returned with the count."""

    def f(xs, n):
        def body(carry):
            state, i, buffers = carry
            state, loss = step(state, xs[i])
            at = jnp.minimum(i, capacity)
            buffers = tuple(jax.lax.dynamic_update_index_in_dim(b, v, at, 0)
                            for b, v in zip(buffers, (loss, state[1][:64], i), strict=True))
            return state, i + 1, buffers

        empty = (jnp.zeros(capacity + 1), jnp.zeros((capacity + 1, 64)), jnp.zeros(capacity + 1, jnp.int32))
        state, count, buffers = jax.lax.while_loop(lambda c: c[1] < n, body, (_init(step), 0, empty))
        return state, tuple(b[:capacity] for b in buffers), count

    return f


def _init(step):
    return (0.0, jnp.zeros(64)) if step is _step else (0.0, jnp.zeros(HIDDEN))


def rnn_step(carry, x):
    """`_step` with a 256-unit recurrent cell (~2.5 us on 2 CPU cores)."""
    _, h = carry
    h = jnp.tanh(W_RNN @ h + x)
    loss = jnp.mean(h**2)
    return (loss, h), loss


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


def named_layers_logged(calls):
    """`calls` separate `lox.log` calls, each under a key of its own (the
    activations of every layer of a deep network, by name)."""

    def f(x):
        return _named_layers(x, calls, lambda name, v: lox.log({name: v}))

    return f


def named_layers_by_hand(calls):
    def f(x):
        outs = {}
        x = _named_layers(x, calls, outs.__setitem__)
        return x, outs

    return f


def _named_layers(x, calls, emit):
    for i in range(calls):  # blocks of 10 equations, as in `_layers`
        x = W @ x
        emit(f"layer{i}", x)
        for _ in range(4):
            x = jnp.sin(x) * 1.0001
        x = x + 1.0
    return x


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
# On a GPU a 512-wide step is launch overhead: there the MLP is 4096 wide, on a batch of 1024.
WIDTH, BATCH = (4096, 1024) if GPU else (512, 512)


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
