"""`lox.tap`: one callback per event, in execution order, adding up to the spooled logs
(host calls through `lox_core/host.py`, delivered by `lox_core/delivery.py`)."""

import jax
import jax.numpy as jnp
import logs_testing as shared
import numpy as np
import pytest

import lox


def program(xs):
    lox.log({"start": xs.sum()}, step=0)

    def step(c, x):
        c = c + x
        lox.log({"c": c, "pair": {"a": c, "b": jnp.stack([x, x])}}, step=x.astype(int))
        lox.log({"c": -c}, step=x.astype(int), phase=1)
        return c, None

    c, _ = jax.lax.scan(step, 0.0, xs)
    lox.log({"end": c})
    return c


def program_by_hand(xs):
    """The events of `program`, in program order, in plain Python."""
    xs = np.asarray(xs).tolist()
    events = [({"start": sum(xs)}, {"step": 0})]
    c = 0.0
    for x in xs:
        c += x
        events.append(({"c": c, "pair": {"a": c, "b": np.array([x, x])}}, {"step": int(x)}))
        events.append(({"c": -c}, {"step": int(x), "phase": 1}))
    events.append(({"end": c}, {}))
    return shared.logs_of_events(events)


def assert_logs_equal(a, b):
    shared.assert_logs_equal(a, b, rtol=1e-6, dtypes=False)


def test_events_arrive_in_order_and_add_up_to_the_spooled_logs():
    xs = jnp.arange(1.0, 5.0)
    events = []
    out = lox.tap(program, events.append)(xs)
    assert float(out) == 10.0
    assert len(events) == 1 + 2 * 4 + 1  # delivered before tap returned
    assert all(isinstance(e, lox.Event) for e in events)
    # Each value in the shape it was logged with, each step an int.
    assert [(list(e), np.shape(e[list(e)[0]]), e.steps) for e in events[:3]] == [
        (["start"], (), {"step": 0}), (["c", "pair"], (), {"step": 1}), (["c"], (), {"step": 1, "phase": 1})]
    assert events[1]["pair"]["b"].shape == (2,) and isinstance(events[1].step, int)
    assert_logs_equal(shared.tapped(events), program_by_hand(xs))
    _, spooled = lox.spool(program)(xs)
    assert_logs_equal(spooled, program_by_hand(xs))


def test_default_callback_prints_each_event(capsys):
    lox.tap(program)(jnp.arange(1.0, 3.0))
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "[step=0] start=3"
    assert lines[1].startswith("[step=1] c=1 pair={a: 1, b: [1. 1.]}")
    assert lines[2] == "[step=1 phase=1] c=-1"
    assert lines[-1] == "end=3"


def test_tap_streams_events_from_a_while_loop():
    def f(n):
        def body(c):
            lox.log({"c": c}, step=c)
            return c + 1

        return jax.lax.while_loop(lambda c: c < n, body, 0)

    events = []
    assert int(lox.tap(f, events.append)(4)) == 4
    assert [int(e["c"]) for e in events] == [0, 1, 2, 3]
    assert [e.step for e in events] == [0, 1, 2, 3]


def test_selection_and_prefix():
    def f(x):
        lox.log({"loss": x, "acc": 2 * x}, tags=["metric"])
        lox.log({"dbg": 3 * x})
        return x

    events = []
    lox.set_default("off")
    try:
        lox.tap(f, events.append, tags=["metric"], argnames=["loss"], prefix="train/")(1.0)
    finally:
        lox.set_default("console")
    assert [list(e) for e in events] == [["train/loss"]]


def test_vmap_of_tap_delivers_only_the_branch_each_element_took():
    def f(x):
        return jax.lax.cond(x > 0, lambda x: (lox.log({"v": x}), x)[1], lambda x: (lox.log({"v": -100 * x}), x)[1], x)

    events = []
    jax.vmap(lox.tap(f, events.append))(jnp.array([-1.0, 2.0, -3.0]))
    jax.effects_barrier()
    assert sorted(float(e["v"]) for e in events) == [2.0, 100.0, 300.0]


def test_vmap_of_tap_delivers_each_elements_events_from_one_host_call_per_event():
    from lox_core import host

    calls = []
    original = host._Callback.__call__

    def counting(self, *args):
        calls.append(1)
        return original(self, *args)

    seeds = jnp.arange(64.0)
    events = []
    host._Callback.__call__ = counting
    try:
        jax.vmap(lox.tap(program, events.append))(jnp.stack([seeds, seeds + 1.0], axis=1))
        jax.effects_barrier()
    finally:
        host._Callback.__call__ = original
    # program logs 1 + 2 * 2 + 1 events; each is one host call for all 64 seeds.
    assert len(calls) == 6
    assert len(events) == 6 * 64
    # Each element's events, in order, are that element's events by hand.
    for i in (0, 17, 63):
        xs = jnp.stack([seeds, seeds + 1.0], axis=1)[i]
        assert_logs_equal(shared.tapped(events[i::64]), program_by_hand(xs))


def test_tap_of_vmap_of_cond_with_batched_predicate_raises():
    def f(x):
        return jax.lax.cond(x > 0, lambda x: (lox.log({"v": x}), x)[1], lambda x: (lox.log({"v": -x}), x)[1], x)

    with pytest.raises(ValueError, match=r"'v'.*batched by `jax.vmap`.*tapped"):
        lox.tap(jax.vmap(f), print)(jnp.array([-1.0, 2.0]))


def test_tap_of_vmap_delivers_one_batched_event_per_log():
    def f(x):
        lox.log({"x": x}, step=2)
        return x

    events = []
    lox.tap(jax.vmap(f), events.append)(jnp.arange(3.0))
    assert len(events) == 1
    # The event of the whole batch: the values and steps as vmap logged them.
    assert events[0]["x"].shape == (3,) and events[0].step.tolist() == [2, 2, 2]


def sin_loss(w):
    def step(c, x):
        c = jnp.sin(c * w + x)
        lox.log({"c": c}, step=x.astype(int))
        return c, None

    return jax.lax.scan(step, 0.0, jnp.arange(4.0))[0]


def sin_series_by_hand(w):
    return jax.lax.scan(lambda c, x: (jnp.sin(c * w + x),) * 2, 0.0, jnp.arange(4.0))[1]


def test_tap_under_grad_fires_once_per_iteration_with_primal_values():
    loss, by_hand = sin_loss, sin_series_by_hand
    events = []
    g = jax.grad(lox.tap(loss, events.append))(0.7)
    jax.effects_barrier()
    np.testing.assert_allclose(g, jax.grad(lox.nolog(loss))(0.7), rtol=1e-6)
    assert [e.step for e in events] == [0, 1, 2, 3]
    np.testing.assert_allclose([float(e["c"]) for e in events], by_hand(0.7), rtol=1e-6)


@pytest.mark.parametrize("buffer", [None, 3])
def test_tap_of_a_gradient_fires_once_per_forward_iteration(buffer):
    events = []
    g = lox.tap(jax.grad(sin_loss), events.append, buffer=buffer)(0.7)
    np.testing.assert_allclose(g, jax.grad(lox.nolog(sin_loss))(0.7), rtol=1e-6)
    logs = shared.tapped(events)
    np.testing.assert_array_equal(logs.step["c"], [0, 1, 2, 3])
    np.testing.assert_allclose(logs["c"], sin_series_by_hand(0.7), rtol=1e-6)


def test_tap_inside_an_outer_jit_delivers_after_an_effects_barrier():
    events = []

    @jax.jit
    def outer(x):
        return lox.tap(lambda x: (lox.log({"x": x}), x * 2)[1], events.append)(x)

    outer(1.0)
    jax.effects_barrier()
    assert [float(e["x"]) for e in events] == [1.0]


def test_taps_called_in_one_traced_function_deliver_in_the_order_they_are_called():
    # Their host calls share no data, so only the chain that each traced
    # function keeps across the taps it calls puts them in order.
    order = []
    first = lox.tap(lambda x: (lox.log({"a": x}), x + 1)[1], lambda e: order.append("a"))
    second = lox.tap(lambda x: (lox.log({"b": x}), x * 2)[1], lambda e: order.append("b"))
    buffered = lox.tap(running_sum_of, lambda e: order.append("c"), buffer=2)

    @jax.jit
    def outer(x, y, xs):
        for _ in range(10):
            first(x)
            second(y)
            buffered(xs)
        return x

    outer(1.0, 2.0, jnp.ones(4))
    jax.effects_barrier()
    assert "".join(order) == "abcc" * 10
    # Under vmap too: each event is one host call, delivered per element.
    order.clear()
    jax.jit(jax.vmap(lambda x: (first(x), second(x), first(x))))(jnp.ones(3))
    jax.effects_barrier()
    assert "".join(order) == "aaabbbaaa"


def test_taps_in_a_traced_function_keep_their_order_under_grad_and_leak_nothing():
    order = []
    first = lox.tap(lambda x: (lox.log({"a": x}), x + 1)[1], lambda e: order.append("a"))
    second = lox.tap(lambda x: (lox.log({"b": x}), x * 2)[1], lambda e: order.append("b"))
    # The leak checker fails the trace if anything lox keeps per traced function outlives it.
    with jax.checking_leaks():
        grad = jax.jit(jax.grad(lambda x: first(x) * second(x) + first(x)))(3.0)
        jax.effects_barrier()
        jax.jit(jax.vmap(lambda x: (first(x), second(x))))(jnp.ones(2))
        jax.effects_barrier()
    # d/dx [(x + 1) * 2x + x + 1] = 4x + 2 + 1
    assert grad == 4 * 3.0 + 3
    assert "".join(order) == "aba" + "aabb"  # under vmap, each element's event in turn


@pytest.mark.parametrize("buffer", [None, 2])
def test_tapping_loops_and_branches_leaves_no_tracer_behind(buffer):
    def f(xs, n):
        def step(c, x):
            c = jax.lax.cond(x > 1, lambda: c + x, lambda: c - x)
            lox.log({"c": c}, step=x.astype(int))
            return c, None

        c = jax.lax.scan(step, 0.0, xs)[0]

        def body(carry):
            i, s = carry
            lox.log({"s": s}, step=i)
            return i + 1, s + c

        return jax.lax.while_loop(lambda carry: carry[0] < n, body, (0, 0.0))[1]

    blocks = []
    # The leak checker fails a loop body's or branch's trace if lox keeps any
    # of its tracers once JAX has built it.
    with jax.checking_leaks():
        out = lox.tap(f, blocks.append, buffer=buffer)(jnp.arange(4.0), 3)
        spooled, logs = lox.spool(f, max_events=5)(jnp.arange(4.0), 3)
    assert out == spooled
    tapped = shared.tapped(blocks)
    assert_logs_equal(tapped.filter(lambda key, _: key != "s"), logs.filter(lambda key, _: key != "s"))
    np.testing.assert_array_equal(tapped["s"], logs.trim()["s"])


def test_a_tapped_function_lowers_and_traces_with_the_user_s_signature():
    events = []
    tapped = lox.tap(lambda x, n: (lox.log({"x": x * n}), x + n)[1], events.append, static_argnums=1)
    compiled = tapped.lower(jnp.float32(1.0), 3).compile()
    assert compiled(jnp.float32(2.0)) == 5.0
    jax.effects_barrier()
    assert [e["x"].tolist() for e in events] == [6.0]
    assert tapped.trace(jnp.float32(1.0), 3).out_info.shape == ()


def running_sum_of(xs):
    def step(c, x):
        lox.log({"c": c + x})
        return c + x, None

    return jax.lax.scan(step, 0.0, xs)[0]


def _doubling_while(x, n):
    def body(c):
        i, y = c
        lox.log({"y": y}, step=i)
        return i + 1, y * 2

    return jax.lax.while_loop(lambda c: c[0] < n, body, (0, x))[1]


def test_vmap_of_tap_of_a_while_loop_with_a_batched_predicate_delivers_only_running_elements():
    events = []
    out = jax.vmap(lox.tap(_doubling_while, events.append))(jnp.array([1.0, 10.0]), jnp.array([1, 3]))
    np.testing.assert_allclose(out, [2.0, 80.0])
    # Element 0 runs once, element 1 three times; JAX runs the body 3 times for both.
    got = sorted((float(e["y"]), e.step) for e in events)
    assert got == [(1.0, 0), (10.0, 0), (20.0, 1), (40.0, 2)]


def test_tap_and_nolog_of_a_vmapped_while_loop_with_a_batched_predicate():
    events = []
    xs, ns = jnp.array([1.0, 10.0]), jnp.array([1, 3])
    np.testing.assert_allclose(lox.tap(jax.vmap(_doubling_while), events.append)(xs, ns), [2.0, 80.0])
    np.testing.assert_allclose(lox.nolog(jax.vmap(_doubling_while))(xs, ns), [2.0, 80.0])
    assert len(events) == 3  # one batched event per iteration of the batched loop


def test_batched_tap_under_vmap_is_one_callback_per_event_holding_every_element():
    """`batched=True`: the per-element events of the default delivery, stacked
    along the vmap axis, in one call per event."""
    xs = jnp.stack([jnp.arange(8.0), jnp.arange(8.0) + 1.0], axis=1)
    single, batched = [], []
    jax.vmap(lox.tap(program, single.append))(xs)
    jax.vmap(lox.tap(program, lambda event, took: batched.append((event, took)), batched=True))(xs)
    jax.effects_barrier()
    assert len(batched) == 6 and len(single) == 6 * 8  # program logs 6 events
    for n, (event, took) in enumerate(batched):
        assert took.shape == (8,) and took.all()
        per_element = single[n * 8 : (n + 1) * 8]
        for key in event:
            per_element_leaves = (jax.tree_util.tree_leaves(e[key]) for e in per_element)
            for leaves in zip(jax.tree_util.tree_leaves(event[key]), *per_element_leaves, strict=True):
                np.testing.assert_array_equal(leaves[0], np.stack(leaves[1:])[:, None])  # vmap axis, event axis
            for name in event.step_names(key):
                np.testing.assert_array_equal(
                    event.steps[name][key], np.stack([e.steps[name] for e in per_element])[:, None]
                )


def test_batched_tap_says_which_elements_took_the_branch():
    def f(x):
        return jax.lax.cond(x > 0, lambda x: (lox.log({"pos": x}), x)[1], lambda x: (lox.log({"neg": x}), x)[1], x)

    got = {}
    xs = jnp.array([-1.0, 2.0, -3.0, 4.0])
    jax.vmap(lox.tap(f, lambda event, took: got.update({k: (event[k][:, 0], took) for k in event}), batched=True))(xs)
    jax.effects_barrier()
    np.testing.assert_array_equal(got["pos"][1], [False, True, False, True])
    np.testing.assert_array_equal(got["neg"][1], [True, False, True, False])
    np.testing.assert_array_equal(got["pos"][0][got["pos"][1]], [2.0, 4.0])  # the elements that took it


def test_batched_tap_without_vmap_and_its_errors():
    events = []
    lox.tap(program, lambda event, took: events.append((event, took)), batched=True)(jnp.arange(3.0))
    assert all(took.shape == () and took for _, took in events)
    assert_logs_equal(shared.tapped([e for e, _ in events]), program_by_hand(np.arange(3.0)))
    with pytest.raises(TypeError, match=r"`lox.tap\(f, batched=True\)` needs a callback that takes \(event, took\)"):
        lox.tap(program, batched=True)


def test_a_per_event_callback_gets_the_values_as_logged_and_prints_them(capsys):
    # The seeds' quick start: a callback that prints each event, and one that reads plain numbers.
    def f(xs):
        lox.log({"xs": xs})

        def step(carry, x):
            carry += x
            lox.log({"carry": carry}, step=x)
            return carry, x

        return jax.lax.scan(step, 0, xs)[0]

    lox.tap(f, lambda event: print("Logging:", event))(jnp.arange(3))
    assert capsys.readouterr().out.splitlines() == [
        "Logging: Event({'xs': [0, 1, 2]})",
        "Logging: Event({'carry': 0}, step=0)",
        "Logging: Event({'carry': 1}, step=1)",
        "Logging: Event({'carry': 3}, step=2)",
    ]
    seen = []
    lox.tap(f, lambda event: seen.append((float(event.get("carry", -1)), event.steps)))(jnp.arange(3))
    assert seen == [(-1.0, {}), (0.0, {"step": 0}), (1.0, {"step": 1}), (3.0, {"step": 2})]


def test_a_per_event_callback_serves_a_buffered_tap_through_events():
    def two_calls(xs):
        lox.log({"start": xs.sum()})

        def step(c, x):
            c = c + x
            lox.log({"loss": c, "acc": -c}, step=x.astype(int))
            lox.log({"w": jnp.stack([c, x])}, step=x.astype(int), epoch=x.astype(int) // 2)
            return c, None

        c = jax.lax.scan(step, 0.0, xs)[0]
        lox.log({"end": c})
        return c

    xs = jnp.arange(1.0, 8.0)
    by_hand, c = [lox.Event({"start": np.float32(28.0)})], 0.0
    for x in range(1, 8):
        c += x
        by_hand.append(lox.Event({"loss": np.float32(c), "acc": np.float32(-c)}, step=x))
        by_hand.append(lox.Event({"w": np.array([c, x], np.float32)}, step=x, epoch=x // 2))
    by_hand.append(lox.Event({"end": np.float32(c)}))

    def same(got, want):
        assert [(list(e), e.steps) for e in got] == [(list(e), e.steps) for e in want]
        for g, w in zip(got, want, strict=True):
            for key in w:
                assert np.shape(g[key]) == np.shape(w[key]) and np.asarray(g[key]).dtype == np.asarray(w[key]).dtype
                np.testing.assert_array_equal(g[key], w[key])

    single = []
    lox.tap(two_calls, single.append)(xs)
    same(single, by_hand)
    for buffer in (1, 3, 100):
        split = []
        lox.tap(two_calls, lambda block, split=split: split.extend(block.events()), buffer=buffer)(xs)
        # Each call's events in program order; the calls of a block one after the other.
        for keys in (["start"], ["loss", "acc"], ["w"], ["end"]):
            same([e for e in split if list(e) == keys], [e for e in by_hand if list(e) == keys])
        assert len(split) == len(by_hand)


# --- events add, with `+`, to what `lox.spool` returns (the earlier lox's pattern) -------
def _in_cond(xs):
    def taken(xs):
        lox.log({"big": xs.max()}, step=1)
        return xs * 2

    def other(xs):
        lox.log({"big": xs.min()}, step=2)
        return xs

    return jax.lax.cond(xs.sum() > 0, taken, other, xs).sum()


def _under_grad(xs):
    def loss(w):
        lox.log({"w": w, "loss": jnp.sum((xs * w) ** 2)}, step=3)
        return jnp.sum((xs * w) ** 2)

    return jax.grad(loss)(1.5)


def _in_nested_jit(xs):
    return jax.jit(program)(xs) + jax.jit(lambda x: (lox.log({"inner": x * 3}, epoch=7), x)[1])(xs).sum()


PROGRAMS = {  # each function, with its events by hand
    "top level and scan": (program, program_by_hand),
    "cond": (_in_cond, lambda xs: shared.logs_of_events([({"big": np.max(xs)}, {"step": 1})])),
    "nested jit": (_in_nested_jit, lambda xs: program_by_hand(xs) + shared.logs_of_events(
        [({"inner": np.asarray(xs) * 3}, {"epoch": 7})])),
    "grad": (_under_grad, lambda xs: shared.logs_of_events(
        [({"w": 1.5, "loss": np.sum((np.asarray(xs) * 1.5) ** 2)}, {"step": 3})])),
    # Each element's events by hand, the vmap axis after the event axis (as `spool` of a vmap puts it).
    "vmap": (jax.vmap(program), lambda xs: jax.tree_util.tree_map(lambda *a: np.stack(a, axis=1),
                                                                  *[program_by_hand(row) for row in xs])),
}


@pytest.mark.parametrize("buffer", [None, 3])
@pytest.mark.parametrize("name", PROGRAMS)
def test_events_accumulated_with_plus_equal_the_spooled_logs(name, buffer):
    fun, by_hand = PROGRAMS[name]
    xs = np.arange(1.0, 5.0, dtype=np.float32) if name != "vmap" else np.array([[1, 2, 3, 4], [2, 2, 1, 5]], np.float32)
    total = lox.logdict({})

    def callback(event):
        nonlocal total
        total = total + event

    lox.tap(fun, callback=callback, buffer=buffer)(jnp.asarray(xs))  # Events, or blocks (logdicts)
    _, spooled = lox.spool(fun)(jnp.asarray(xs))
    # Key by key, steps and dtypes included; and both equal the events by hand.
    shared.assert_logs_equal(total, spooled)
    assert_logs_equal(total, by_hand(xs))


def test_events_add_like_the_one_event_logdicts_they_stand_for():
    events = []
    lox.tap(program, events.append)(jnp.arange(1.0, 4.0))
    want = shared.tapped(events)
    shared.assert_logs_equal(sum(events, lox.logdict()), want)
    shared.assert_logs_equal(sum(events), want)
    shared.assert_logs_equal(events[0] + events[1], events[0].to_logdict() + events[1].to_logdict())
    shared.assert_logs_equal(events[0] + shared.tapped(events[1:]), want)
    shared.assert_logs_equal(shared.tapped(events[:-1]) + events[-1], want)
    with pytest.raises(TypeError, match="unsupported operand"):
        events[0] + {"c": 1.0}  # a plain dict has no steps: not a logdict
    with pytest.raises(TypeError, match="unsupported operand"):
        events[0] + 1
