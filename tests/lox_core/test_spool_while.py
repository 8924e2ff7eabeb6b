"""`lox.spool(f, max_events=N)`: logs of while loops in fixed-capacity buffers, padding masked out
(`SpoolBuffer`, `lox_core/buffer.py`).

References are the events a plain Python loop computes, and the events an
unbuffered `lox.tap` of the same function delivers.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from logs_testing import assert_logs_equal, logs_of_events
from logs_testing import tapped as shared_tapped

import lox
from lox_core.logdict import every


@pytest.fixture(autouse=True)
def quiet():
    lox.set_default("off")  # unselected logs would print
    yield
    lox.set_default("console")


def collatz(n):
    def body(carry):
        n, i = carry
        lox.log({"n": n, "odd": n % 2 == 1}, step=i)
        return jnp.where(n % 2 == 0, n // 2, 3 * n + 1), i + 1

    return jax.lax.while_loop(lambda c: c[0] != 1, body, (n, 0))[1]


def collatz_by_hand(n):
    seen = []
    while n != 1:
        seen.append(n)
        n = n // 2 if n % 2 == 0 else 3 * n + 1
    return np.array(seen)


def tapped(f, *args):
    events = []
    lox.tap(f, events.append)(*args)
    return shared_tapped(events)


def test_a_while_loop_returns_its_events_padded_to_max_events():
    steps, logs = lox.spool(collatz, max_events=200)(27)
    expected = collatz_by_hand(27)
    assert int(steps) == len(expected) == 111
    assert logs["n"].shape == (200,) and logs.valid["n"].shape == (200,)
    assert int(logs.count["n"]) == 111 and int(logs.dropped["n"]) == 0
    np.testing.assert_array_equal(logs.valid["n"], np.arange(200) < 111)
    np.testing.assert_array_equal(logs["n"][:111], expected)
    np.testing.assert_array_equal(logs.step["n"][:111], np.arange(111))
    # Padding: zeros, with no step.
    np.testing.assert_array_equal(logs["n"][111:], 0)
    np.testing.assert_array_equal(logs.step["n"][111:], lox.NO_STEP)
    trimmed = logs.trim()
    np.testing.assert_array_equal(trimmed["n"], expected)
    np.testing.assert_array_equal(trimmed["odd"], expected % 2 == 1)
    assert trimmed.valid == {} and int(trimmed.count["n"]) == 111


def test_a_full_buffer_keeps_the_first_events_and_counts_the_rest():
    _, logs = lox.spool(collatz, max_events=100)(27)
    assert int(logs.count["n"]) == 100 and int(logs.dropped["n"]) == 11
    np.testing.assert_array_equal(logs["n"], collatz_by_hand(27)[:100])
    np.testing.assert_array_equal(logs.step["n"], np.arange(100))
    assert bool(logs.valid["n"].all())


def test_fori_loop_with_traced_bounds():
    def f(n):
        def body(i, total):
            lox.log({"total": total}, step=i)
            return total + i

        return jax.lax.fori_loop(0, n, body, 0)

    with pytest.raises(
        ValueError, match=r"`lox.spool` cannot collect logs \(keys 'total'\) inside `jax.lax.while_loop`"
    ):
        lox.spool(f)(5)
    out, logs = lox.spool(f, max_events=8)(5)
    assert int(out) == 10
    np.testing.assert_array_equal(logs.trim()["total"], np.cumsum([0, 0, 1, 2, 3]))
    np.testing.assert_array_equal(logs.trim().step["total"], np.arange(5))


def test_the_error_without_max_events_says_how_to_spool_the_loop():
    with pytest.raises(ValueError, match=r"Give the spool a capacity \(`lox.spool\(f, max_events=N\)`"):
        lox.spool(collatz)(27)


def program(ns):
    """Events before, inside and after while loops run by a scan, with a cond,
    a nested loop, a checkpoint and a custom derivative inside."""

    @jax.custom_jvp
    def scaled(x):
        lox.log({"inner": x})
        return 2.0 * x

    scaled.defjvp(lambda p, t: (scaled(p[0]), 2.0 * t[0]))

    def one(c, n):
        lox.log({"start": n}, step=n)

        def body(carry):
            n, i = carry
            lox.log({"n": n}, step=i)
            jax.lax.cond(n % 2 == 0, lambda: lox.log({"even": n}, step=i) and None, lambda: None)

            def inner(j, a):
                lox.log({"inner": a * 1.0}, j=j)
                return a + j

            jax.lax.fori_loop(0, n % 3, inner, 0)  # traced bounds: a nested while loop
            jax.checkpoint(lambda x: scaled(x * 1.0))(n)
            return jnp.where(n % 2 == 0, n // 2, 3 * n + 1), i + 1

        steps = jax.lax.while_loop(lambda c: c[0] > 1, body, (n, 0))[1]
        lox.log({"n": -n}, step=steps)  # the same key outside the loop
        return c + steps, None

    total, _ = jax.lax.scan(one, 0, ns)
    lox.log({"total": total})
    return total


def program_by_hand(ns):
    """The events of `program`, in program order, in plain Python."""
    events, total = [], 0
    for n0 in np.asarray(ns).tolist():
        events.append(({"start": n0}, {"step": n0}))
        n, i = n0, 0
        while n > 1:
            events.append(({"n": n}, {"step": i}))
            if n % 2 == 0:
                events.append(({"even": n}, {"step": i}))
            a = 0
            for j in range(n % 3):
                events.append(({"inner": float(a)}, {"j": j}))
                a += j
            events.append(({"inner": float(n)}, {}))  # `scaled`, under the checkpoint
            n, i = (n // 2 if n % 2 == 0 else 3 * n + 1), i + 1
        events.append(({"n": -n0}, {"step": i}))
        total += i
    events.append(({"total": total}, {}))
    return logs_of_events(events)


def test_tapped_while_loops_deliver_the_events_by_hand():
    ns = jnp.array([27, 6, 1, 7])
    assert_logs_equal(tapped(program, ns), program_by_hand(ns), dtypes=False)


@pytest.mark.parametrize("max_events", [64, 1000])
def test_scanned_while_loops_with_conds_nested_loops_and_custom_rules_keep_the_events_by_hand(max_events):
    ns = jnp.array([27, 6, 1, 7])
    total, logs = lox.spool(program, max_events=max_events)(ns)
    assert int(total) == sum(len(collatz_by_hand(int(n))) for n in ns)
    reference = program_by_hand(ns)
    trimmed = logs.trim()
    assert sorted(trimmed) == sorted(reference)
    if max_events == 1000:
        for key in reference:
            np.testing.assert_array_equal(trimmed[key], reference[key], err_msg=key)
            for name in reference.step_names(key):
                np.testing.assert_array_equal(trimmed.steps[name][key], reference.steps[name][key], err_msg=key)
            assert int(np.sum(logs.dropped[key])) == 0
    # Per run of a while loop, `max_events` slots per key: the scan stacks four runs.
    assert logs["n"].shape == (4 * max_events + 4,)
    assert logs["start"].shape == (4,) and "start" not in logs.valid
    if max_events == 64:  # 27 takes 111 steps: its first 64 are kept
        kept = np.concatenate(
            [collatz_by_hand(27)[:64], [-27], collatz_by_hand(6), [-6], [-1], collatz_by_hand(7), [-7]]
        )
        np.testing.assert_array_equal(trimmed["n"], kept)
        assert int(logs.dropped["n"]) == 111 - 64
        assert int(logs.count["n"]) == len(kept)


def test_vmap_outside_a_scan_of_while_loops_with_conds_matches_each_element_alone():
    ns = jnp.array([[27, 6, 1, 7], [3, 12, 9, 2]])
    totals, logs = jax.vmap(lox.spool(program, max_events=64))(ns)
    for e in range(2):
        total, alone = lox.spool(program, max_events=64)(ns[e])
        assert int(totals[e]) == int(total)
        mine = jax.tree_util.tree_map(lambda x, e=e: x[e], logs)
        for key in alone:
            np.testing.assert_array_equal(mine.trim()[key], alone.trim()[key], err_msg=key)
            np.testing.assert_array_equal(mine.count[key], alone.count[key], err_msg=key)
            np.testing.assert_array_equal(mine.dropped[key], alone.dropped[key], err_msg=key)


def test_same_program_without_while_loops_spools_as_without_max_events():
    def f(xs):
        def step(c, x):
            lox.log({"c": c}, step=x)
            c = jax.lax.cond(x > 2, lambda: c * 2, lambda: c + 1)
            return c, None

        return jax.lax.scan(step, 1, xs)[0]

    xs = jnp.arange(6)
    a, plain = lox.spool(f)(xs)
    b, bounded = lox.spool(f, max_events=3)(xs)
    assert int(a) == int(b) and bounded.valid == {}
    np.testing.assert_array_equal(plain["c"], bounded["c"])
    np.testing.assert_array_equal(plain.step["c"], bounded.step["c"])


def test_vmap_outside_the_spool_counts_per_element():
    ns = jnp.array([27, 7, 6])
    steps, logs = jax.vmap(lox.spool(collatz, max_events=50))(ns)
    assert logs["n"].shape == (3, 50)
    np.testing.assert_array_equal(logs.count["n"], [50, 16, 8])
    np.testing.assert_array_equal(logs.dropped["n"], [61, 0, 0])
    for e, n in enumerate([27, 7, 6]):
        mask = np.asarray(logs.valid["n"][e])
        np.testing.assert_array_equal(np.asarray(logs["n"][e])[mask], collatz_by_hand(n)[:50])


def test_vmap_inside_the_spool_masks_each_element():
    # The loop runs while any element does; every element's events share slots.
    ns = jnp.array([27, 7, 6])
    steps, logs = lox.spool(jax.vmap(collatz), max_events=50)(ns)
    np.testing.assert_array_equal(steps, [111, 16, 8])
    assert logs["n"].shape == (50, 3) and logs.valid["n"].shape == (50, 3)
    np.testing.assert_array_equal(logs.count["n"], [50, 16, 8])
    np.testing.assert_array_equal(logs.dropped["n"], [61, 0, 0])
    for e, n in enumerate([27, 7, 6]):
        mask = np.asarray(logs.valid["n"][:, e])
        np.testing.assert_array_equal(np.asarray(logs["n"][:, e])[mask], collatz_by_hand(n)[:50])
    with pytest.raises(
        ValueError, match=r"logdict.trim: key 'n' has padding per `jax.vmap` element \(mask of shape \(50, 3\)\)"
    ):
        logs.trim()
    with pytest.raises(ValueError, match=r"to_arrow: key 'n' has padding per `jax.vmap` element"):
        logs.to_arrow()
    means = logs.reduce("mean")
    np.testing.assert_allclose(means["n"][0], [collatz_by_hand(n)[:50].mean() for n in (27, 7, 6)], rtol=1e-6)


@pytest.mark.parametrize("mode", ["mean", "sum", "min", "max", "first", "last"])
def test_reductions_leave_the_padding_out(mode):
    def solve(x):
        def body(carry):
            x, i = carry
            lox.log({"residual": x - 2.0, "it": i}, step=i)
            return 0.5 * (x + 4.0 / x), i + 1  # Newton's method for sqrt(4)

        return jax.lax.while_loop(lambda c: jnp.abs(c[0] - 2.0) > 1e-6, body, (x, 0))[0]

    _, logs = lox.spool(solve, max_events=32, reduce=mode)(9.0)
    _, full = lox.spool(solve, max_events=32)(9.0)
    recorded = full.trim()
    reference = {"mean": np.mean, "sum": np.sum, "min": np.min, "max": np.max,
                 "first": lambda x: x[0], "last": lambda x: x[-1]}[mode]
    for key in ("residual", "it"):
        assert logs[key].shape == (1,)
        np.testing.assert_allclose(logs[key][0], reference(recorded[key]), rtol=1e-6)
    expected_step = recorded.step["it"][0 if mode == "first" else -1]
    assert int(logs.step["it"][0]) == expected_step
    assert int(logs.count["it"]) == 1 and bool(logs.valid["it"][0])


def test_reducing_a_loop_that_never_ran_gives_a_padding_event():
    def f(n):
        def body(i):
            lox.log({"i": i * 1.0}, step=i)
            return i + 1

        return jax.lax.while_loop(lambda i: i < n, body, 0)

    _, logs = lox.spool(f, max_events=4, reduce="max")(0)
    assert int(logs.count["i"]) == 0 and not bool(logs.valid["i"][0])
    assert logs.trim()["i"].shape == (0,)


def test_interval_keeps_every_nth_recorded_event():
    _, logs = lox.spool(collatz, max_events=200, interval=10)(27)
    np.testing.assert_array_equal(logs.trim()["n"], collatz_by_hand(27)[::10])
    np.testing.assert_array_equal(logs.trim().step["n"], np.arange(111)[::10])
    assert int(logs.count["n"]) == 12


def test_arrow_and_parquet_hold_the_recorded_events_only(tmp_path):
    _, logs = lox.spool(collatz, max_events=150)(27)
    table = logs.to_arrow(run="a")
    assert table.num_rows == 2 * 111
    back = lox.logdict.from_arrow(table)
    np.testing.assert_array_equal(back["n"], collatz_by_hand(27))
    np.testing.assert_array_equal(back.step["odd"], np.arange(111))


def test_logger_writes_each_seed_s_recorded_events_and_warns_about_dropped_ones(tmp_path):
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    ns = jnp.array([27, 7, 6])
    runs = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), 3))
    with pytest.warns(  # from the logger's thread, as soon as it gets the batch (on a busy machine, before finish)
        RuntimeWarning,
        match=r"events did not fit in the buffer of a spooled `while_loop` and were dropped \(47 of .n., 47 of .odd.\)",
    ):
        jax.vmap(lambda run, n: logger.spool(collatz, run, max_events=64)(n))(runs, ns)
        logger.finish(runs)
    logger.close()
    saved = lox.load(str(tmp_path))
    assert len(saved) == 3
    got = sorted(tuple(logs["n"].tolist()) for logs in saved.values())
    assert got == sorted(tuple(collatz_by_hand(n)[:64].tolist()) for n in (27, 7, 6))


def test_logger_refuses_padding_per_vmap_element(tmp_path):
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    state = logger.init()
    with pytest.raises(ValueError, match=r"`logger.log`: key 'n' has padding per `jax.vmap` element"):
        logger.spool(jax.vmap(collatz), state, max_events=8)(jnp.array([3, 5]))
    logger.close()


def test_logdict_algebra_keeps_padding_and_totals():
    _, a = lox.spool(collatz, max_events=8)(7)  # 16 events: 8 kept, 8 dropped
    _, b = lox.spool(collatz, max_events=8)(6)  # 8 events
    both = a + b
    assert both["n"].shape == (16,)
    assert int(both.count["n"]) == 16 and int(both.dropped["n"]) == 8
    renamed = both.prefix("c/")
    assert int(renamed.count["c/n"]) == 16 and "c/n" in renamed.valid
    leaves, tree = jax.tree_util.tree_flatten(both)
    again = jax.tree_util.tree_unflatten(tree, leaves)
    assert int(again.dropped["n"]) == 8
    np.testing.assert_array_equal(again.trim()["n"], np.concatenate([collatz_by_hand(7)[:8], collatz_by_hand(6)]))
    import pickle

    np.testing.assert_array_equal(pickle.loads(pickle.dumps(both)).valid["n"], both.valid["n"])
    plain = lox.logdict(
        {"n": np.array([5], np.int32), "odd": np.array([True])}, {"step": {"n": np.array([0], np.int32)}}
    )
    mixed = plain + a
    np.testing.assert_array_equal(mixed.valid["n"], [True] * 9)
    assert int(mixed.count["n"]) == 9 and int(mixed.dropped["n"]) == 8


@pytest.mark.parametrize("bad", [0, -3, True, 2.5, "8"])
def test_max_events_must_be_a_positive_integer(bad):
    with pytest.raises(
        ValueError, match=r"`lox.spool` max_events must be an integer >= 1 \(events kept per key and loop\), got"
    ):
        lox.spool(collatz, max_events=bad)


def test_logs_in_a_while_predicate_are_refused():
    def f(n):
        def pred(i):
            lox.log({"p": i})
            return i < n

        def body(i):
            lox.log({"b": i})
            return i + 1

        return jax.lax.while_loop(pred, body, 0)

    with pytest.raises(NotImplementedError, match=r"cannot spool the keys 'p': they are logged in the predicate"):
        lox.spool(f, max_events=8)(3)
    out, logs = lox.spool(f, max_events=8, argnames=["b"])(3)  # the predicate's log left to the default
    np.testing.assert_array_equal(logs.trim()["b"], [0, 1, 2])


def test_a_key_with_two_shapes_in_a_loop_is_refused():
    def f(n):
        def body(i):
            lox.log({"k": i})
            lox.log({"k": jnp.stack([i, i])})
            return i + 1

        return jax.lax.while_loop(lambda i: i < n, body, 0)

    with pytest.raises(
        ValueError, match=r"max_events=N\)`: key 'k' is logged as int32\[\] and as int32\[2\] in a bounded loop"
    ):
        lox.spool(f, max_events=8)(3)


def test_under_jit_and_with_jvp():
    def f(x, n):
        def body(carry):
            x, i = carry
            lox.log({"x": x}, step=i)
            return jnp.sin(x), i + 1

        return jax.lax.while_loop(lambda c: c[1] < n, body, (x, 0))[0]

    spooled = lox.spool(f, max_events=6)
    (out, logs) = jax.jit(spooled)(0.5, 4)
    xs = [0.5]
    for _ in range(3):
        xs.append(np.sin(xs[-1]))
    np.testing.assert_allclose(logs.trim()["x"], xs, rtol=1e-6)
    (out, logs), (dout, _) = jax.jvp(lambda x: spooled(x, 4), (0.5,), (1.0,))
    np.testing.assert_allclose(dout, jax.jvp(lambda x: lox.nolog(f)(x, 4), (0.5,), (1.0,))[1], rtol=1e-6)
    np.testing.assert_allclose(logs.trim()["x"], xs, rtol=1e-6)


def test_a_cond_that_vmap_turns_into_a_select_is_refused_inside_a_bounded_loop():
    def f(x, n):
        def body(carry):
            i, s = carry
            jax.lax.cond(x > 0, lambda: (lox.log({"pos": s}), None)[1], lambda: None)
            return i + 1, s + x

        return jax.lax.while_loop(lambda carry: carry[0] < n, body, (0, 0.0))[1]

    with pytest.raises(
        ValueError, match=r"lox.log of 'pos' sits in a `jax.lax.cond`/`switch` whose predicate is batched"
    ):
        lox.spool(jax.vmap(f, (0, None)), max_events=5)(jnp.array([1.0, -1.0]), 3)
    # Applied outside, each element spools the branch it took.
    _, logs = jax.vmap(lox.spool(f, max_events=5), (0, None))(jnp.array([1.0, -1.0]), 3)
    np.testing.assert_array_equal(logs.count["pos"], [3, 0])
    np.testing.assert_array_equal(logs["pos"][0, :3], [0.0, 1.0, 2.0])


@pytest.mark.parametrize("x, n", [(1.0, 6), (-1.0, 2), (1.0, 0)])
def test_while_loops_in_cond_branches_keep_their_counts_and_padding(x, n):
    def f(x, n):
        def loop(sign):
            def run():
                def body(carry):
                    i, s = carry
                    lox.log({"s": sign * s}, step=i)
                    return i + 1, s + x

                return jax.lax.while_loop(lambda carry: carry[0] < n, body, (0, 0.0))[1]

            return run

        return jax.lax.cond(x > 0, loop(1.0), loop(-1.0))

    _, logs = lox.spool(f, max_events=4)(x, n)
    sign = 1.0 if x > 0 else -1.0
    expected = [sign * x * i for i in range(n)]
    assert int(logs.count["s"]) == min(n, 4) and int(logs.dropped["s"]) == max(n - 4, 0)
    np.testing.assert_array_equal(logs.trim()["s"], expected[:4])
    np.testing.assert_array_equal(logs.trim().step["s"], np.arange(min(n, 4)))


def test_keys_outside_a_vmapped_inner_loop_are_padded_by_count():
    # `outer` is logged by the scalar loop, `inner` by a loop vmapped inside it:
    # only `inner` has a mask per element, and both reduce over their own events.
    def f(ns):
        def body(carry):
            i, s = carry
            lox.log({"outer": s}, step=i)

            def inner(n):
                def inner_body(carry):
                    j, t = carry
                    lox.log({"inner": t}, step=j)
                    return j + 1, t + 1.0

                return jax.lax.while_loop(lambda carry: carry[0] < n, inner_body, (0, 0.0))[1]

            return i + 1, s + jax.vmap(inner)(ns).sum()

        return jax.lax.while_loop(lambda carry: carry[0] < 3, body, (0, 0.0))[1]

    out, logs = lox.spool(f, max_events=8)(jnp.array([1, 3]))
    assert float(out) == 12.0
    assert logs.valid["outer"].shape == (8,) and logs.valid["inner"].shape == (8, 2)
    np.testing.assert_array_equal(logs.filter(lambda k, _: k == "outer").trim()["outer"], [0.0, 4.0, 8.0])
    np.testing.assert_array_equal(logs.count["inner"], [3, 8])
    np.testing.assert_array_equal(logs.dropped["inner"], [0, 1])
    # Slots an element did not log hold padding: zeros, NO_STEP.
    mask = np.asarray(logs.valid["inner"])
    assert not np.asarray(logs["inner"])[~mask].any()
    assert (np.asarray(logs.step["inner"])[~mask] == lox.NO_STEP).all()
    np.testing.assert_array_equal(np.asarray(logs["inner"])[:, 0][mask[:, 0]], [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(np.asarray(logs["inner"])[:, 1][mask[:, 1]], [0.0, 1.0, 2.0] * 2 + [0.0, 1.0])
    means = logs.reduce("mean")
    assert list(means) == ["outer", "inner"]  # the keys keep their order
    np.testing.assert_allclose(means["outer"], [4.0])
    np.testing.assert_allclose(means["inner"], [[0.0, 7.0 / 8.0]])
    assert list(every(logs, 2)) == ["outer", "inner"]  # `lox.spool`'s interval
