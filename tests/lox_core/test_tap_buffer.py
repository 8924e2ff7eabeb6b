"""`lox.tap(f, callback, buffer=K)`: events kept on device, delivered K at a time, none lost or repeated
(`TapBuffer`, `lox_core/buffer.py`; the blocks as `lox_core/delivery.py` hands them over)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from logs_testing import assert_logs_equal, logs_of_events, tapped

import lox


@pytest.fixture(autouse=True)
def quiet():
    lox.set_default("off")  # unselected logs would print
    yield
    lox.set_default("console")


def running_sum(xs):
    def step(c, x):
        c = c + x
        lox.log({"c": c, "v": jnp.stack([c, -c])}, step=x)
        return c, None

    return jax.lax.scan(step, 0, xs)[0]


def assert_same_logs(a, b):
    assert_logs_equal(a, b, ordered=False, dtypes=False)


def test_delivers_K_events_per_call_and_the_rest_when_the_loop_ends():
    blocks = []
    out = lox.tap(running_sum, blocks.append, buffer=4)(jnp.arange(10))
    assert int(out) == 45
    assert [b["c"].shape[0] for b in blocks] == [4, 4, 2]
    expected = np.cumsum(np.arange(10))
    np.testing.assert_array_equal(np.concatenate([b["c"] for b in blocks]), expected)
    np.testing.assert_array_equal(np.concatenate([b["v"] for b in blocks]), np.stack([expected, -expected], 1))
    np.testing.assert_array_equal(np.concatenate([b.step["c"] for b in blocks]), np.arange(10))
    np.testing.assert_array_equal(np.concatenate([b.step["v"] for b in blocks]), np.arange(10))


def test_a_buffer_that_divides_the_events_sends_nothing_empty():
    blocks = []
    lox.tap(running_sum, blocks.append, buffer=5)(jnp.arange(10))
    assert [b["c"].shape[0] for b in blocks] == [5, 5]


def program(xs, n):
    lox.log({"start": xs.sum()}, step=0)

    def step(c, x):
        c = c + x
        lox.log({"c": c}, step=x.astype(int))

        def inner(i, a):
            lox.log({"a": a * 1.0, "i": i}, step=i)
            return a + i

        a = jax.lax.fori_loop(0, n, inner, 0)  # traced bounds: a while loop
        jax.lax.cond(
            x > 2,
            lambda: lox.log({"big": x}, step=x.astype(int)) and None,
            lambda: lox.log({"c": -c, "z": x + a}, inner=1) and None,
        )
        c = jax.checkpoint(lambda c: (lox.log({"ck": c}, step=x.astype(int)), c * 1.0)[1])(c)
        return c, None

    c, _ = jax.lax.scan(step, 0.0, xs)
    lox.log({"end": c})
    return c


def program_by_hand(xs, n):
    """The events of `program`, in program order, in plain Python."""
    events = [({"start": sum(xs)}, {"step": 0})]
    c = 0.0
    for x in xs:
        c += x
        events.append(({"c": c}, {"step": int(x)}))
        a = 0
        for i in range(n):
            events.append(({"a": float(a), "i": i}, {"step": i}))
            a += i
        if x > 2:
            events.append(({"big": x}, {"step": int(x)}))
        else:
            events.append(({"c": -c, "z": x + a}, {"inner": 1}))
        events.append(({"ck": c}, {"step": int(x)}))
    events.append(({"end": c}, {}))
    return logs_of_events(events)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_nested_loops_conds_and_checkpoint_deliver_the_events_in_program_order(size):
    xs = jnp.arange(1.0, 6.0)
    want = program_by_hand(np.arange(1.0, 6.0).tolist(), 3)
    events, blocks = [], []
    lox.tap(program, events.append)(xs, 3)
    assert len(events) == 2 + 5 * (1 + 3 + 1 + 1)
    assert_same_logs(tapped(events), want)
    out = lox.tap(program, blocks.append, buffer=size)(xs, 3)
    assert float(out) == 15.0
    assert_same_logs(tapped(blocks), want)
    # Outside loops events go one by one, first and last.
    assert list(blocks[0]) == ["start"] and list(blocks[-1]) == ["end"]
    buffered = 5 * 6
    if size >= buffered:
        assert len(blocks) == 3  # start, the whole loop at once, end


def test_keys_logged_by_several_calls_keep_program_order():
    def f(xs):
        def step(c, x):
            lox.log({"k": x, "a": x}, step=x)
            lox.log({"k": 10 * x}, step=x)
            lox.log({"k": 100 * x, "b": x})  # another step name set
            return c, None

        return jax.lax.scan(step, 0, xs)[0]

    blocks = []
    lox.tap(f, blocks.append, buffer=4)(jnp.arange(3))
    logs = tapped(blocks)
    np.testing.assert_array_equal(logs["k"], [0, 0, 0, 1, 10, 100, 2, 20, 200])
    np.testing.assert_array_equal(logs.step["k"], [0, 0, lox.NO_STEP, 1, 1, lox.NO_STEP, 2, 2, lox.NO_STEP])


def test_while_loop_with_a_data_dependent_number_of_events():
    def collatz(n):
        def body(carry):
            n, i = carry
            lox.log({"n": n}, step=i)
            return jnp.where(n % 2 == 0, n // 2, 3 * n + 1), i + 1

        return jax.lax.while_loop(lambda c: c[0] != 1, body, (n, 0))[1]

    expected, n = [], 27
    while n != 1:
        expected.append(n)
        n = n // 2 if n % 2 == 0 else 3 * n + 1
    blocks = []
    steps = lox.tap(collatz, blocks.append, buffer=10)(27)
    assert int(steps) == len(expected) == 111
    assert [b["n"].shape[0] for b in blocks] == [10] * 11 + [1]
    np.testing.assert_array_equal(np.concatenate([b["n"] for b in blocks]), expected)
    np.testing.assert_array_equal(np.concatenate([b.step["n"] for b in blocks]), np.arange(111))


def test_under_vmap_each_element_gets_its_own_blocks():
    xs = jnp.arange(30).reshape(3, 10)
    blocks = []
    jax.vmap(lox.tap(running_sum, blocks.append, buffer=4))(xs)
    assert len(blocks) == 3 * 3  # three sends, one block per element each
    for e in range(3):
        mine = tapped(blocks[e::3])
        np.testing.assert_array_equal(mine["c"], np.cumsum(np.asarray(xs[e])))
        np.testing.assert_array_equal(mine.step["c"], np.asarray(xs[e]))


def test_under_vmap_elements_that_take_different_branches_get_their_own_events():
    def f(who, xs):
        def step(c, x):
            def small():
                lox.log({"small": x, "who": who}, step=x)
                return c + 1

            def large():
                lox.log({"large": x * 1.0, "twice": 2 * x, "who": who}, step=x)
                lox.log({"large": -x * 1.0, "who": who}, step=x)
                return c - 1

            return jax.lax.cond(x < 5, small, large), None

        return jax.lax.scan(step, 0, xs)[0]

    who, xs = jnp.arange(2), jnp.array([[1, 7, 2, 9, 3], [8, 8, 1, 6, 0]])
    blocks = []
    out = jax.vmap(lox.tap(f, blocks.append, buffer=3))(who, xs)
    np.testing.assert_array_equal(out, [lox.nolog(f)(0, xs[0]), lox.nolog(f)(1, xs[1])])
    for e in range(2):
        mine = [b for b in blocks if set(np.asarray(b["who"]).tolist()) == {e}]
        assert len(mine) + sum(set(np.asarray(b["who"]).tolist()) == {1 - e} for b in blocks) == len(blocks)
        reference = []
        lox.tap(f, reference.append)(e, xs[e])
        assert_same_logs(tapped(mine), tapped(reference))


def test_under_grad_events_fire_once_per_iteration_with_primal_values():
    def loss(w):
        def step(c, x):
            y = jnp.sin(w * x)
            lox.log({"y": y}, step=x.astype(int))
            return c + y, None

        return jax.lax.scan(step, 0.0, jnp.arange(6.0))[0]

    blocks = []
    g = jax.grad(lox.tap(loss, blocks.append, buffer=4))(0.7)
    np.testing.assert_allclose(g, jax.grad(lox.nolog(loss))(0.7), rtol=1e-6)
    np.testing.assert_allclose(np.concatenate([b["y"] for b in blocks]), np.sin(0.7 * np.arange(6.0)), rtol=1e-6)
    assert [b["y"].shape[0] for b in blocks] == [4, 2]


def test_custom_jvp_inside_a_buffered_loop():
    @jax.custom_jvp
    def act(x):
        lox.log({"act": x})
        return jnp.tanh(x)

    @act.defjvp
    def act_jvp(p, t):
        return act(p[0]), t[0] * (1 - jnp.tanh(p[0]) ** 2)

    def loss(w):
        def step(c, x):
            return c + act(w * x), None

        return jax.lax.scan(step, 0.0, jnp.arange(5.0))[0]

    blocks = []
    g = jax.grad(lox.tap(loss, blocks.append, buffer=2))(0.3)
    np.testing.assert_allclose(g, jax.grad(lox.nolog(loss))(0.3), rtol=1e-6)
    np.testing.assert_allclose(np.concatenate([b["act"] for b in blocks]), 0.3 * np.arange(5.0), rtol=1e-6)


def test_default_callback_prints_every_buffered_event(capsys):
    lox.tap(running_sum, argnames=["c"], buffer=2)(jnp.arange(3))
    assert capsys.readouterr().out.splitlines() == ["[step=0] c=0", "[step=1] c=1", "[step=2] c=3"]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "10"])
def test_buffer_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match=r"`lox.tap` buffer must be an integer >= 1 \(events per host call\), got"):
        lox.tap(running_sum, print, buffer=bad)


def test_buffer_and_batched_are_exclusive():
    with pytest.raises(TypeError, match="takes `buffer` or `batched=True`, not both"):
        lox.tap(running_sum, lambda e, t: None, buffer=4, batched=True)


def test_a_key_with_two_shapes_in_a_buffered_loop_is_refused():
    def f(xs):
        def step(c, x):
            lox.log({"k": x})
            lox.log({"k": jnp.stack([x, x])})
            return c, None

        return jax.lax.scan(step, 0, xs)[0]

    with pytest.raises(ValueError, match=r"key 'k' is logged as int32\[\] and as int32\[2\] in one loop"):
        lox.tap(f, print, buffer=4)(jnp.arange(3))
    events = []
    lox.tap(f, events.append)(jnp.arange(3))  # unbuffered, each event stands alone
    assert len(events) == 6


def test_logs_in_a_while_predicate_cannot_be_buffered():
    def f(n):
        def pred(i):
            lox.log({"i": i})
            return i < n

        def body(i):
            lox.log({"body": i})
            return i + 1

        return jax.lax.while_loop(pred, body, 0)

    with pytest.raises(NotImplementedError, match=r"keys 'i': it is logged in the predicate of a `jax.lax.while_loop`"):
        lox.tap(f, print, buffer=4)(3)
    events = []
    lox.tap(f, events.append)(3)  # unbuffered: the predicate runs 4 times, the body 3
    assert [list(e)[0] for e in events] == ["i", "body", "i", "body", "i", "body", "i"]


def test_a_while_loop_with_a_batched_predicate_inside_the_tap_is_refused():
    def f(n):
        def body(i):
            lox.log({"i": i})
            return i + 1

        return jax.lax.while_loop(lambda i: i < n, body, 0)

    with pytest.raises(
        NotImplementedError, match=r"batched by `jax.vmap`, so its elements stop at different iterations"
    ):
        lox.tap(jax.vmap(f), print, buffer=4)(jnp.array([2, 3]))
    blocks = []
    jax.vmap(lox.tap(f, blocks.append, buffer=4))(jnp.array([2, 3]))  # vmap outside works
    assert [b["i"].tolist() for b in blocks] == [[0, 1], [0, 1, 2]]


@pytest.mark.parametrize("loop", ["scan", "while"])
def test_logger_tap_with_a_buffer_writes_every_seed_s_events(tmp_path, loop):
    def f(xs):
        if loop == "scan":
            return running_sum(xs)

        def body(carry):  # a while loop: events kept in buffers carried by the loop
            c, i = carry
            c = c + xs[i]
            lox.log({"c": c, "v": jnp.stack([c, -c])}, step=xs[i])
            return c, i + 1

        return jax.lax.while_loop(lambda carry: carry[1] < xs.shape[0], body, (0, 0))[0]

    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    xs = jnp.arange(30).reshape(3, 10)
    runs = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), 3))
    out = jax.vmap(lambda run, x: logger.tap(f, run, buffer=4)(x))(runs, xs)
    np.testing.assert_array_equal(out, np.asarray(xs).sum(1))
    logger.finish(runs)
    logger.close()
    saved = lox.load(str(tmp_path))
    assert len(saved) == 3
    by_first_step = {int(logs.step["c"][0]): logs for logs in saved.values()}
    for e in range(3):
        logs = by_first_step[int(xs[e, 0])]
        expected = np.cumsum(np.asarray(xs[e]))
        np.testing.assert_array_equal(logs["c"], expected)
        np.testing.assert_array_equal(logs["v"], np.stack([expected, -expected], 1))
        np.testing.assert_array_equal(logs.step["v"], np.asarray(xs[e]))



def sums_to(who, n):
    def body(carry):
        i, s = carry
        s = s + i
        lox.log({"s": s, "who": who}, step=i)
        return i + 1, s

    return jax.lax.while_loop(lambda carry: carry[0] < n, body, (0, 0))[1]


def blocks_of(blocks, e):
    return [b for b in blocks if set(np.asarray(b["who"]).tolist()) == {e}]


@pytest.mark.parametrize("size", [1, 3, 100])
def test_vmap_of_a_buffered_while_loop_sends_each_element_s_events_once(size):
    # The loop runs until every element is done; the elements done earlier
    # compute iterations whose results vmap throws away, and send nothing.
    ns = [2, 7, 0, 5]
    blocks = []
    out = jax.vmap(lox.tap(sums_to, blocks.append, buffer=size))(jnp.arange(4), jnp.array(ns))
    np.testing.assert_array_equal(out, [sum(range(n)) for n in ns])
    assert sum(len(b["s"]) for b in blocks) == sum(ns)
    for e, n in enumerate(ns):
        mine = blocks_of(blocks, e)
        assert all(len(b["s"]) <= size for b in mine)
        if n:
            reference = []
            lox.tap(sums_to, reference.append)(e, n)
            assert_same_logs(tapped(mine), tapped(reference))


@pytest.mark.parametrize("loop", ["scan", "while"])
def test_under_vmap_a_branch_an_element_did_not_take_sends_nothing(loop):
    # A cond whose predicate vmap batches runs both branches for every element;
    # the loop in the branch an element did not take must not send its events.
    def f(who, n):
        def logged():
            if loop == "scan":
                def step(c, i):
                    lox.log({"s": c + i, "who": who}, step=i)
                    return c + i, None

                return jax.lax.scan(step, 0, jnp.arange(6))[0]
            return sums_to(who, n)

        return jax.lax.cond(n > 3, logged, lambda: -1)

    ns = [5, 2, 6, 1]
    blocks = []
    out = jax.vmap(lox.tap(f, blocks.append, buffer=4))(jnp.arange(4), jnp.array(ns))
    np.testing.assert_array_equal(out, [lox.nolog(f)(e, n) for e, n in enumerate(ns)])
    for e, n in enumerate(ns):
        mine = blocks_of(blocks, e)
        if n <= 3:
            assert mine == []
            continue
        reference = []
        lox.tap(f, reference.append)(e, n)
        assert_same_logs(tapped(mine), tapped(reference))


def test_a_scan_of_length_zero_sends_nothing():
    def f(xs):
        def step(c, x):
            lox.log({"x": x})
            return c + x, 2 * x

        return jax.lax.scan(step, 0.0, xs)

    blocks = []
    total, ys = lox.tap(f, blocks.append, buffer=4)(jnp.zeros(0))
    assert float(total) == 0.0 and ys.shape == (0,) and blocks == []


def test_logger_tap_with_a_buffer_writes_each_seed_s_while_loop_once(tmp_path):
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    ns = [3, 9, 1]
    runs = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), 3))
    jax.vmap(lambda run, who, n: logger.tap(sums_to, run, buffer=4)(who, n))(runs, jnp.arange(3), jnp.array(ns))
    logger.finish(runs)
    logger.close()
    saved = lox.load(str(tmp_path))
    assert len(saved) == 3
    for logs in saved.values():
        e = int(logs["who"][0])
        np.testing.assert_array_equal(logs["s"], np.cumsum(np.arange(ns[e])))
        np.testing.assert_array_equal(logs.step["s"], np.arange(ns[e]))


@pytest.mark.parametrize("size", [1, 2, 5])
def test_conds_nested_in_a_branch_and_checkpoints_in_a_branch_lose_no_event(size):
    # A branch whose inner cond or checkpoint moves the counters must still
    # mark only the slots it left empty.
    def f(n):
        def body(i):
            def branch():
                lox.log({"a": i})
                jax.lax.cond(i % 4 == 0, lambda: (lox.log({"b": i + 100}), None)[1], lambda: None)
                jax.checkpoint(lambda x: (lox.log({"r": x + 200}), x)[1])(i)

            jax.lax.cond(i % 2 == 0, branch, lambda: None)
            return i + 1

        return jax.lax.while_loop(lambda i: i < n, body, 0)

    events = []
    for i in range(7):
        if i % 2 == 0:
            events.append(({"a": i}, {}))
            if i % 4 == 0:
                events.append(({"b": i + 100}, {}))
            events.append(({"r": i + 200}, {}))
    blocks = []
    lox.tap(f, blocks.append, buffer=size)(7)
    assert_logs_equal(tapped(blocks), logs_of_events(events), dtypes=False)


def test_a_block_keeps_the_keys_in_the_order_they_are_logged():
    def f(n):
        def body(i):
            lox.log({"a": i, "b": i * 10, "c": i * 100})
            lox.log({"b": -i})
            return i + 1

        return jax.lax.while_loop(lambda i: i < n, body, 0)

    blocks = []
    lox.tap(f, blocks.append, buffer=3)(4)
    assert [list(b) for b in blocks] == [["a", "b", "c"]] * 2
    np.testing.assert_array_equal(tapped(blocks)["b"], [0, 0, 10, -1, 20, -2, 30, -3])
