"""`lox.spool`: the logs it returns equal what the same function returns when it
carries the values out by hand. Also the padded layout of a key that a cond's
branches log differently (`lox_core/branches.py`), the options checked once
(`lox_core/options.py`) and the compiled programs cached per signature
(`lox_core/transform.py`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lox
from lox import NO_STEP


def assert_series(logs, key, expected, steps=None):
    np.testing.assert_allclose(np.asarray(logs[key]), np.asarray(expected), rtol=1e-6)
    for name, want in (steps or {}).items():
        np.testing.assert_array_equal(np.asarray(logs.steps[name][key]), np.asarray(want))


# --- shapes and order --------------------------------------------------------------
def test_single_event_gets_a_leading_event_axis():
    def f(x):
        lox.log({"x": x})
        return x * 2

    out, logs = lox.spool(f)(jnp.arange(3.0))
    assert logs["x"].shape == (1, 3)
    assert_series(logs, "x", [[0.0, 1.0, 2.0]])
    np.testing.assert_allclose(out, jnp.arange(3.0) * 2)


def test_scan_stacks_events_in_iteration_order_like_hand_written_ys():
    def f(xs):
        def step(c, x):
            c = c + x
            lox.log({"c": c, "v": jnp.stack([c, -c])}, step=x.astype(int))
            return c, None

        return jax.lax.scan(step, 0.0, xs)[0]

    def by_hand(xs):
        def step(c, x):
            c = c + x
            return c, (c, jnp.stack([c, -c]), x)

        return jax.lax.scan(step, 0.0, xs)

    xs = jnp.arange(5.0)
    out, logs = lox.spool(f)(xs)
    ref_out, (c, v, steps) = by_hand(xs)
    np.testing.assert_allclose(out, ref_out)
    assert_series(logs, "c", c, {"step": steps.astype(int)})
    assert_series(logs, "v", v)


def test_events_of_one_key_follow_program_order_across_levels():
    def f(xs):
        lox.log({"x": xs[0]}, step=-1)

        def step(c, x):
            lox.log({"x": x}, step=x.astype(int))
            return c, None

        jax.lax.scan(step, 0, xs)
        lox.log({"x": xs[-1] * 10}, step=100)
        return 0

    _, logs = lox.spool(f)(jnp.arange(3.0))
    assert_series(logs, "x", [0.0, 0.0, 1.0, 2.0, 20.0], {"step": [-1, 0, 1, 2, 100]})


def test_nested_scans_compose_in_iteration_order():
    def f(xss):
        def outer(c, xs):
            def inner(c2, x):
                lox.log({"x": x})
                return c2, None

            jax.lax.scan(inner, 0, xs)
            lox.log({"row_sum": xs.sum()})
            return c, None

        jax.lax.scan(outer, 0, xss)
        return 0

    xss = jnp.arange(12.0).reshape(3, 4)
    _, logs = lox.spool(f)(xss)
    assert_series(logs, "x", xss.reshape(-1))
    assert_series(logs, "row_sum", xss.sum(1))


def test_several_events_per_iteration_interleave_in_execution_order():
    def f(xs):
        def step(c, x):
            lox.log({"x": x})
            lox.log({"x": -x})
            return c, None

        jax.lax.scan(step, 0, xs)
        return 0

    _, logs = lox.spool(f)(jnp.arange(1.0, 4.0))
    assert_series(logs, "x", [1.0, -1.0, 2.0, -2.0, 3.0, -3.0])


def test_reverse_scan_logs_in_execution_order():
    def f(xs):
        def step(c, x):
            lox.log({"x": x})
            return c, None

        jax.lax.scan(step, 0, xs, reverse=True)
        return 0

    _, logs = lox.spool(f)(jnp.arange(4.0))
    assert_series(logs, "x", [3.0, 2.0, 1.0, 0.0])


def test_static_fori_loop_and_lax_map():
    def f(xs):
        def body(i, c):
            c = c + xs[i]
            lox.log({"c": c}, step=i, episode=i // 2)
            return c

        return jax.lax.fori_loop(0, xs.shape[0], body, 0.0)

    xs = jnp.arange(4.0)
    _, logs = lox.spool(f)(xs)
    assert_series(logs, "c", jnp.cumsum(xs), {"step": [0, 1, 2, 3], "episode": [0, 0, 1, 1]})
    assert_series(logs, "c", jnp.cumsum(xs), {"step": logs.step["c"], "episode": logs.episode["c"]})

    def g(xs):
        return jax.lax.map(lambda x: (lox.log({"sq": x * x}), x)[1], xs)

    _, logs = lox.spool(g)(xs)
    assert_series(logs, "sq", xs * xs)


def test_pytree_values_of_any_depth():
    def f(w, b):
        lox.log({"params": {"w": w, "layers": [b, (b * 2, {"deep": w.sum()})]}})
        return w

    w, b = jnp.ones((2, 3)), jnp.arange(3.0)
    _, logs = lox.spool(f)(w, b)
    p = logs["params"]
    assert p["w"].shape == (1, 2, 3)
    np.testing.assert_allclose(p["layers"][1][0][0], b * 2)
    np.testing.assert_allclose(p["layers"][1][1]["deep"], [6.0])


def test_python_and_numpy_scalars_can_be_logged():
    def f(x):
        lox.log({"py": 3, "np": np.float32(2.5), "flag": True})
        return x

    _, logs = lox.spool(f)(1.0)
    assert logs["py"].tolist() == [3] and logs["np"].tolist() == [2.5] and logs["flag"].tolist() == [True]


def test_missing_step_names_are_filled_with_the_sentinel():
    def f(x):
        lox.log({"x": x}, step=1)
        lox.log({"x": x + 1})
        lox.log({"x": x + 2}, step=3, episode=7)
        return x

    _, logs = lox.spool(f)(0.0)
    assert_series(logs, "x", [0.0, 1.0, 2.0], {"step": [1, lox.NO_STEP, 3], "episode": [lox.NO_STEP, lox.NO_STEP, 7]})


# --- selection and post-processing -----------------------------------------------------
def test_argnames_tags_and_explicit():
    def f(x):
        lox.log({"loss": x, "acc": -x}, tags=["metric"])
        lox.log({"grad": 2 * x}, tags=["debug"])
        lox.log({"secret": 3 * x}, explicit=True)
        return x

    with lox_default_off():
        assert set(lox.spool(f)(1.0)[1]) == {"loss", "acc", "grad"}
        assert set(lox.spool(f, argnames=["loss"])(1.0)[1]) == {"loss"}
        assert set(lox.spool(f, tags=["debug"])(1.0)[1]) == {"grad"}
        assert set(lox.spool(f, tags="metric", argnames=["acc", "grad"])(1.0)[1]) == {"acc"}
        assert set(lox.spool(f, argnames=["secret"])(1.0)[1]) == {"secret"}


def test_unselected_events_stay_for_an_outer_spool():
    def f(x):
        lox.log({"loss": x}, tags=["metric"])
        lox.log({"grad": 2 * x})
        return x

    def outer(x):
        y, inner_logs = lox.spool(f, tags=["metric"])(x)
        return inner_logs["loss"]

    loss, logs = lox.spool(outer)(3.0)
    np.testing.assert_allclose(loss, [3.0])
    assert list(logs) == ["grad"]
    assert_series(logs, "grad", [6.0])


def test_keep_logs_lets_an_outer_spool_see_them_again():
    def f(x):
        lox.log({"x": x})
        return x + 1

    def consumed(x):
        return lox.spool(f)(x)[0]

    def kept(x):
        return lox.spool(f, keep_logs=True)(x)[0]

    assert dict(lox.spool(consumed)(1.0)[1]) == {}
    assert_series(lox.spool(kept)(1.0)[1], "x", [1.0])


def test_interval_reduce_and_prefix():
    def f(xs):
        def step(c, x):
            lox.log({"x": x}, step=x.astype(int))
            return c, None

        jax.lax.scan(step, 0, xs)
        return 0

    xs = jnp.arange(10.0)
    _, logs = lox.spool(f, interval=3)(xs)
    assert_series(logs, "x", xs[::3], {"step": [0, 3, 6, 9]})
    for mode, ref in [
        ("mean", xs.mean()), ("sum", xs.sum()), ("min", 0.0), ("max", 9.0), ("first", 0.0), ("last", 9.0)
    ]:
        _, logs = lox.spool(f, reduce=mode)(xs)
        assert_series(logs, "x", [ref])
    _, logs = lox.spool(f, prefix="train/", reduce="last")(xs)
    assert list(logs) == ["train/x"] and logs.step["train/x"].tolist() == [9]


# --- jit ------------------------------------------------------------------------------
def test_spool_of_jitted_function_and_jit_of_spool():
    @jax.jit
    def f(x):
        lox.log({"x": x})
        return jnp.sin(x)

    with lox_default_off():
        f(1.0)  # compiled once without spool
    out, logs = lox.spool(f)(1.0)
    out2, logs2 = jax.jit(lox.spool(f))(1.0)
    np.testing.assert_allclose(out, np.sin(1.0), rtol=1e-6)
    assert_series(logs, "x", [1.0])
    assert_series(logs2, "x", [1.0])


def test_logs_inside_nested_jits():
    inner = jax.jit(lambda x: (lox.log({"inner": x}), x * 2)[1])

    @jax.jit
    def middle(x):
        lox.log({"middle": x})
        return inner(x) + inner(x + 1)

    _, logs = lox.spool(lambda x: middle(x))(1.0)
    assert_series(logs, "inner", [1.0, 2.0])
    assert_series(logs, "middle", [1.0])


def test_spool_traces_once_per_signature_even_with_a_fresh_wrapper():
    traces = []

    def f(x):
        traces.append(1)
        lox.log({"x": x})
        return x

    lox.spool(f)(jnp.ones(3))
    spooled = lox.spool(f)
    spooled(jnp.ones(3))
    spooled(jnp.zeros(3))
    assert len(traces) == 1
    lox.spool(f)(jnp.ones(4))  # a new shape is a new signature
    assert len(traces) == 2
    lox.spool(f, argnames=["x"])(jnp.ones(3))  # a new configuration is a new program
    assert len(traces) == 3


def test_lower_and_trace_keep_a_temporary_function_alive():
    import gc

    def make():
        def f(x):
            lox.log({"x": x})
            return x

        return f

    lowered = lox.spool(make()).lower(jnp.ones(3))
    gc.collect()
    traced = lox.spool(make()).trace(jnp.ones(3))
    gc.collect()
    assert lowered.compile()(jnp.ones(3))[1]["x"].shape == (1, 3)
    assert traced.jaxpr is not None


def test_a_function_without_logs_gives_empty_logs():
    out, logs = lox.spool(lambda x: x * 2)(3.0)
    assert float(out) == 6.0 and isinstance(logs, lox.logdict) and dict(logs) == {}


def test_static_argnums_and_argnames():
    def f(x, n, *, scale):
        for i in range(n):
            lox.log({"x": x * scale}, step=i)
        return x

    _, logs = lox.spool(f, static_argnums=1, static_argnames="scale")(1.0, 3, scale=2.0)
    assert_series(logs, "x", [2.0, 2.0, 2.0], {"step": [0, 1, 2]})



def _logs_n_times(x, n):
    for i in range(n):  # `n` must be static
        lox.log({"x": x * i}, step=i)
    return x * n


@pytest.mark.parametrize(
    "static, call",
    [({"static_argnums": 1}, lambda g, x: g(x, n=3)), ({"static_argnames": "n"}, lambda g, x: g(x, 3))],
    ids=["by-number-passed-by-keyword", "by-name-passed-by-position"],
)
def test_a_static_argument_is_static_however_it_is_passed_as_under_jit(static, call):
    x = jnp.float32(2.0)
    # The reference: jax.jit with the same options finds `n` through the signature too.
    assert call(jax.jit(_logs_n_times, **static), x) == 6.0
    assert call(lox.nolog(_logs_n_times, **static), x) == 6.0
    out, logs = call(lox.spool(_logs_n_times, **static), x)
    assert out == 6.0
    assert_series(logs, "x", [0.0, 2.0, 4.0], {"step": [0, 1, 2]})
    events = []
    assert call(lox.tap(_logs_n_times, events.append, **static), x) == 6.0
    assert [e["x"].tolist() for e in events] == [0.0, 2.0, 4.0]
    events.clear()
    lowered = call(lox.tap(_logs_n_times, events.append, **static).lower, x)
    assert lowered.compile()(jnp.float32(1.0)) == 3.0
    jax.effects_barrier()
    assert [e["x"].tolist() for e in events] == [0.0, 1.0, 2.0]

def test_spool_inside_an_outer_jit_closing_over_tracers():
    @jax.jit
    def outer(x, y):
        def f(z):
            lox.log({"sum": z + y})
            return z * y

        return lox.spool(f)(x)

    out, logs = outer(2.0, 3.0)
    assert float(out) == 6.0
    assert_series(logs, "sum", [5.0])


# --- cond and switch ---------------------------------------------------------------------
def test_cond_and_switch_log_the_branch_taken():
    def f(x):
        return jax.lax.cond(x > 0, lambda x: (lox.log({"v": x}), x)[1], lambda x: (lox.log({"v": -x}), x)[1], x)

    assert_series(lox.spool(f)(3.0)[1], "v", [3.0])
    assert_series(lox.spool(f)(-2.0)[1], "v", [2.0])

    def g(i, x):
        branches = [lambda x, k=k: (lox.log({"v": x * k}, step=k), x)[1] for k in range(3)]
        return jax.lax.switch(i, branches, x)

    for i in range(3):
        assert_series(lox.spool(g)(i, 1.0)[1], "v", [float(i)], {"step": [i]})


def test_a_key_logged_in_one_branch_is_a_padded_series_valid_where_that_branch_ran():
    def clip(xs):
        def step(c, x):
            def big(x):
                lox.log({"clipped": x, "x": x}, step=x.astype(int))
                return jnp.float32(1.0)

            def small(x):
                lox.log({"x": x}, step=x.astype(int))
                return x

            return c, jax.lax.cond(x > 1, big, small, x)

        return jax.lax.scan(step, 0, xs)[1]

    def by_hand(xs):  # the same values, and whether the branch that logs them ran
        return xs, jnp.where(xs > 1, xs, 0.0), xs > 1

    xs = jnp.array([0.5, 3.0, 1.0, 2.0])
    out, logs = lox.spool(clip)(xs)
    x, clipped, ran = by_hand(xs)
    np.testing.assert_array_equal(out, jnp.minimum(xs, 1.0))
    # Logged in every branch alike: as it is, no padding.
    assert "x" not in logs.valid and logs["x"].tolist() == x.tolist()
    assert logs.valid["clipped"].tolist() == ran.tolist() and int(logs.count["clipped"]) == 2
    assert logs["clipped"].tolist() == clipped.tolist()
    assert logs.step["clipped"].tolist() == [NO_STEP, 3, NO_STEP, 2]
    assert logs.trim()["clipped"].tolist() == [3.0, 2.0] and logs.trim().step["clipped"].tolist() == [3, 2]
    assert logs.reduce("mean")["clipped"].tolist() == [2.5]


def test_a_key_logged_more_times_in_one_branch_is_padded_to_the_most():
    def f(x):
        def twice(x):
            lox.log({"a": x}, step=1)
            lox.log({"a": 2 * x}, epoch=2)
            return x

        def once(x):
            lox.log({"a": -x}, step=3)
            return x

        return jax.lax.cond(x > 0, twice, once, x)

    _, logs = lox.spool(f)(1.0)
    assert logs["a"].tolist() == [1.0, 2.0] and logs.valid["a"].tolist() == [True, True]
    assert logs.step["a"].tolist() == [1, NO_STEP] and logs.epoch["a"].tolist() == [NO_STEP, 2]
    _, logs = lox.spool(f)(-1.0)
    assert logs.valid["a"].tolist() == [True, False] and logs.trim()["a"].tolist() == [1.0]
    assert logs.step["a"].tolist() == [3, NO_STEP] and int(logs.count["a"]) == 1


def test_a_logger_writes_only_the_events_of_the_branch_that_ran():
    def f(xs):
        def step(c, i):
            jax.lax.cond(i % 3 == 0, lambda: (lox.log({"every_third": i}, step=i), None)[1], lambda: None)
            return c, None

        return jax.lax.scan(step, 0, xs)[0]

    logger = lox.loggers.MemoryLogger()
    run = logger.init(name="branches")
    logger.spool(f, run)(jnp.arange(10))
    logger.finish(run)
    written = logger.backends[0].logs()
    assert written["every_third"].tolist() == [0, 3, 6, 9] and written.step["every_third"].tolist() == [0, 3, 6, 9]


def test_branches_that_log_a_key_with_different_shapes_raise_naming_key_and_branch():
    def g(x):
        return jax.lax.cond(
            x > 0, lambda x: (lox.log({"a": x}), x)[1], lambda x: (lox.log({"a": jnp.stack([x, x])}), x)[1], x
        )

    with pytest.raises(
        ValueError, match=r"log key 'a' differently: branch 0 logs float32\[2\], branch 1 logs float32\[\]"
    ):
        lox.spool(g)(1.0)


def test_cond_inside_scan():
    def f(xs):
        def step(c, x):
            jax.lax.cond(x % 2 == 0, lambda: lox.log({"x": x}), lambda: lox.log({"x": -x}))
            return c, None

        jax.lax.scan(step, 0, xs)
        return 0

    _, logs = lox.spool(f)(jnp.arange(4.0))
    assert_series(logs, "x", [0.0, -1.0, 2.0, -3.0])


# --- while loops -----------------------------------------------------------------------------
def test_while_loop_raises_naming_the_loop_and_keys():
    def f(x):
        return jax.lax.while_loop(lambda c: c < 3, lambda c: (lox.log({"c": c, "d": c}), c + 1)[1], x)

    with pytest.raises(ValueError, match=r"keys 'c', 'd'.*while_loop.*jax.lax.scan.*lox.tap.*lox.nolog"):
        lox.spool(f)(0)

    def g(n):
        return jax.lax.fori_loop(0, n, lambda i, c: (lox.log({"i": i}), c + i)[1], 0)

    with pytest.raises(ValueError, match=r"keys 'i'.*fori_loop"):
        lox.spool(g)(3)


def test_while_loop_without_selected_logs_is_fine():
    def f(x):
        lox.log({"before": x})
        y = jax.lax.while_loop(lambda c: c < 3, lambda c: (lox.log({"inside": c}, tags=["dbg"]), c + 1)[1], x)
        return y

    with lox_default_off():
        out, logs = lox.spool(f, argnames=["before"])(0)
    assert int(out) == 3 and list(logs) == ["before"]


# --- vmap ------------------------------------------------------------------------------------
def f_vmap(x):
    lox.log({"x": x, "sq": x * x}, step=7)
    return x + 1


def test_spool_of_vmap_puts_events_first_and_batch_after():
    xs = jnp.arange(4.0)
    _, logs = lox.spool(jax.vmap(f_vmap))(xs)
    assert logs["x"].shape == (1, 4)
    assert_series(logs, "sq", [xs * xs])
    assert logs.step["x"].shape == (1, 4) and (logs.step["x"] == 7).all()


def test_vmap_of_spool_puts_batch_first():
    xs = jnp.arange(4.0)
    _, logs = jax.vmap(lox.spool(f_vmap))(xs)
    assert logs["x"].shape == (4, 1)
    assert_series(logs, "sq", (xs * xs)[:, None])


def test_vmap_of_scan_with_unbatched_values():
    def f(x):
        def step(c, i):
            lox.log({"x": x, "i": i}, step=i)
            return c, None

        jax.lax.scan(step, 0, jnp.arange(3))
        return x

    _, logs = lox.spool(jax.vmap(f))(jnp.arange(2.0))
    assert logs["x"].shape == (3, 2) and logs["i"].shape == (3, 2)
    assert_series(logs, "i", [[0, 0], [1, 1], [2, 2]], {"step": [[0, 0], [1, 1], [2, 2]]})


def branchy(x):
    return jax.lax.cond(x > 0, lambda x: (lox.log({"v": x}), x)[1], lambda x: (lox.log({"v": -10 * x}), x)[1], x)


def test_vmap_of_spool_gives_each_element_the_branch_it_took():
    xs = jnp.array([-1.0, 2.0, -3.0])
    _, logs = jax.vmap(lox.spool(branchy))(xs)
    assert logs["v"].shape == (3, 1)
    assert_series(logs, "v", [[10.0], [2.0], [30.0]])


def test_spool_of_vmap_of_cond_with_batched_predicate_raises():
    with pytest.raises(ValueError, match=r"'v'.*batched by `jax.vmap`.*jax.vmap\(lox.spool\(f\)\)"):
        lox.spool(jax.vmap(branchy))(jnp.array([-1.0, 2.0]))


def test_vmap_of_cond_with_unbatched_predicate_is_spooled():
    def f(x, p):
        return jax.lax.cond(p, lambda x: (lox.log({"v": x}), x)[1], lambda x: (lox.log({"v": -x}), x)[1], x)

    _, logs = lox.spool(jax.vmap(f, in_axes=(0, None)))(jnp.arange(3.0), False)
    assert_series(logs, "v", [[-0.0, -1.0, -2.0]])


# --- autodiff --------------------------------------------------------------------------------
def loss_fn(w):
    def step(c, x):
        c = jnp.tanh(c * w + x)
        lox.log({"c": c}, step=x.astype(int))
        return c, None

    return jax.lax.scan(step, 0.0, jnp.arange(5.0))[0]


def by_hand_cs(w):
    def step(c, x):
        c = jnp.tanh(c * w + x)
        return c, c

    return jax.lax.scan(step, 0.0, jnp.arange(5.0))[1]


def test_grad_of_spool_with_has_aux():
    g, logs = jax.grad(lambda w: lox.spool(loss_fn)(w), has_aux=True)(0.5)
    np.testing.assert_allclose(g, jax.grad(lox.nolog(loss_fn))(0.5), rtol=1e-6)
    assert_series(logs, "c", by_hand_cs(0.5), {"step": [0, 1, 2, 3, 4]})


def test_spool_of_grad_logs_primal_values_once_per_iteration():
    for transformed in (jax.grad, jax.value_and_grad):
        out, logs = lox.spool(transformed(loss_fn))(0.5)
        assert_series(logs, "c", by_hand_cs(0.5), {"step": [0, 1, 2, 3, 4]})
    ref = jax.grad(lox.nolog(loss_fn))(0.5)
    np.testing.assert_allclose(lox.spool(jax.grad(loss_fn))(0.5)[0], ref, rtol=1e-6)


def test_jvp_and_vjp_inside_spool():
    (y, t), logs = lox.spool(lambda w: jax.jvp(loss_fn, (w,), (1.0,)))(0.5)
    assert_series(logs, "c", by_hand_cs(0.5))
    np.testing.assert_allclose(t, jax.grad(lox.nolog(loss_fn))(0.5), rtol=1e-6)

    def pullback(w):
        y, vjp = jax.vjp(loss_fn, w)
        return vjp(1.0)[0]

    g, logs = lox.spool(pullback)(0.5)
    assert_series(logs, "c", by_hand_cs(0.5))


def test_checkpoint_under_grad_both_orders():
    ckpt = jax.checkpoint(loss_fn)
    g1, logs1 = lox.spool(jax.grad(ckpt))(0.5)
    g2, logs2 = jax.grad(lambda w: lox.spool(ckpt)(w), has_aux=True)(0.5)
    ref = jax.grad(lox.nolog(loss_fn))(0.5)
    np.testing.assert_allclose(g1, ref, rtol=1e-6)
    np.testing.assert_allclose(g2, ref, rtol=1e-6)
    assert_series(logs1, "c", by_hand_cs(0.5))
    assert_series(logs2, "c", by_hand_cs(0.5))


def test_checkpointed_scan_body_logs_once_per_iteration_under_grad():
    def f(w):
        @jax.checkpoint
        def step(c, x):
            c = jnp.sin(c * w + x)
            lox.log({"c": c})
            return c, None

        return jax.lax.scan(step, 0.0, jnp.arange(4.0))[0]

    g, logs = lox.spool(jax.grad(f))(0.3)
    assert logs["c"].shape == (4,)
    np.testing.assert_allclose(g, jax.grad(lox.nolog(f))(0.3), rtol=1e-6)


@jax.custom_jvp
def soft(x):
    lox.log({"soft_in": x})
    return jnp.log1p(jnp.exp(x))


@soft.defjvp
def soft_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return soft(x), 2.0 * t  # a deliberately unusual rule, so that we can see it is used


def test_custom_jvp_logs_of_the_primal_and_rule_is_kept():
    out, logs = lox.spool(soft)(1.0)
    assert_series(logs, "soft_in", [1.0])
    g, logs = jax.grad(lambda x: lox.spool(soft)(x), has_aux=True)(1.0)
    assert float(g) == 2.0
    assert_series(logs, "soft_in", [1.0])
    g, logs = lox.spool(jax.grad(soft))(1.0)
    assert float(g) == 2.0
    assert_series(logs, "soft_in", [1.0])


def test_logs_inside_a_custom_rule_reach_an_enclosing_transform():
    @jax.custom_jvp
    def f(x):
        lox.log({"primal": x})
        return x * 3

    @f.defjvp
    def f_jvp(p, t):
        lox.log({"in_rule": p[0] + 1})
        return f(p[0]), 3 * t[0]

    def grad_of_inner_spool(x):
        g, inner = jax.grad(lambda x: lox.spool(f)(x), has_aux=True)(x)
        return inner["primal"]

    inner_primal, outer = lox.spool(grad_of_inner_spool)(1.0)
    np.testing.assert_allclose(inner_primal, [1.0])
    assert list(outer) == ["in_rule"]  # the primal's event is not seen twice
    assert_series(outer, "in_rule", [2.0])
    _, logs = lox.spool(jax.grad(f))(1.0)  # lox outside grad: the rule is the program
    assert_series(logs, "in_rule", [2.0])
    assert_series(logs, "primal", [1.0])


@jax.custom_vjp
def clip_grad(x):
    lox.log({"clip_in": x})
    return jnp.sin(x)


clip_grad.defvjp(lambda x: (clip_grad(x), x), lambda x, g: (jnp.clip(g * jnp.cos(x), -0.1, 0.1),))


def test_custom_vjp_keeps_its_rule_and_logs_its_primal():
    ref = jnp.clip(jnp.cos(1.0), -0.1, 0.1)
    g, logs = jax.grad(lambda x: lox.spool(clip_grad)(x), has_aux=True)(1.0)
    np.testing.assert_allclose(g, ref)
    assert_series(logs, "clip_in", [1.0])
    g, logs = lox.spool(jax.grad(clip_grad))(1.0)
    np.testing.assert_allclose(g, ref)
    assert_series(logs, "clip_in", [1.0])


# --- errors ----------------------------------------------------------------------------------
def test_same_key_with_different_shapes_raises_naming_key_and_shapes():
    def f(x):
        lox.log({"k": x})
        lox.log({"k": jnp.stack([x, x])})
        return x

    with pytest.raises(ValueError, match=r"key 'k'.*float32\[\] and float32\[2\]"):
        lox.spool(f)(1.0)

    def g(x):
        lox.log({"k": x})
        lox.log({"k": x.astype(jnp.int32)})
        return x

    with pytest.raises(ValueError, match=r"key 'k'.*float32\[\] and int32\[\]"):
        lox.spool(g)(1.0)


def test_bad_spool_options_raise():
    f = lambda x: x  # noqa: E731
    with pytest.raises(ValueError, match=r"unknown reduce mode 'median'.*mean, sum, min, max, first, last"):
        lox.spool(f, reduce="median")
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError, match=r"interval must be an integer >= 1, got"):
            lox.spool(f, interval=bad)
    with pytest.raises(TypeError, match=r"`argnames` must be strings, got 3"):
        lox.spool(f, argnames=["a", 3])


def test_unknown_higher_order_primitive_with_logs_raises_naming_it():
    def f(b):
        def matvec(x):
            lox.log({"mv": x})
            return 2.0 * x

        return jax.lax.custom_linear_solve(matvec, b, lambda mv, b: b / 2.0)

    with pytest.raises(
        NotImplementedError, match=r"`custom_linear_solve` contains lox.log calls \(keys 'mv'\).*lox.nolog"
    ):
        lox.spool(f)(jnp.ones(2))


class lox_default_off:
    def __enter__(self):
        lox.set_default("off")

    def __exit__(self, *exc):
        lox.set_default("console")


# --- regressions found in review ------------------------------------------------------------
def test_custom_jvp_with_integer_logs_under_grad():
    @jax.custom_jvp
    def f(x):
        lox.log({"x": x, "n": 3}, step=1)
        return x * 2

    f.defjvp(lambda p, t: (f(p[0]), 2 * t[0]))
    g, logs = jax.grad(lambda x: lox.spool(f)(x), has_aux=True)(1.0)
    assert float(g) == 2.0 and logs["n"].tolist() == [3] and logs.step["x"].tolist() == [1]


def test_rules_that_call_the_primal_do_not_repeat_its_events(capsys):
    events = []
    g = jax.grad(lox.tap(soft, events.append))(1.0)
    jax.effects_barrier()
    assert float(g) == 2.0 and [list(e) for e in events] == [["soft_in"]]
    assert float(jax.grad(lox.nolog(soft))(1.0)) == 2.0
    jax.effects_barrier()
    assert capsys.readouterr().out == ""  # nolog: nothing reached the console default
    text = jax.jit(jax.grad(lox.nolog(soft))).lower(1.0).compile().as_text()
    assert "callback" not in text.lower()


def test_spool_of_vmap_gives_unbatched_logs_the_batch_axis_too():
    def f(x):
        lox.log({"k": 1.0})
        lox.log({"k": x})
        return x

    _, logs = lox.spool(jax.vmap(f))(jnp.arange(3.0))
    assert logs["k"].shape == (2, 3)
    assert_series(logs, "k", [[1.0, 1.0, 1.0], [0.0, 1.0, 2.0]])


def test_vmap_of_cond_is_detected_even_when_the_logged_values_are_constants():
    def f(x):
        return jax.lax.cond(x > 0, lambda: lox.log({"branch": 1}), lambda: lox.log({"branch": 0}))

    with pytest.raises(ValueError, match=r"'branch'.*batched by `jax.vmap`"):
        lox.spool(jax.vmap(f))(jnp.array([-1.0, 1.0]))
    _, logs = jax.vmap(lox.spool(f))(jnp.array([-1.0, 1.0]))
    assert logs["branch"].tolist() == [[0], [1]]


def test_branches_may_log_the_same_keys_in_another_order():
    def f(x):
        return jax.lax.cond(
            x > 0,
            lambda x: (lox.log({"a": x, "b": -x}, step=1, epoch=2), x)[1],
            lambda x: (lox.log({"b": x, "a": -x}, epoch=3, step=4), x)[1],
            x,
        )

    _, logs = lox.spool(f)(1.0)
    assert logs["a"].tolist() == [1.0] and logs["b"].tolist() == [-1.0]
    assert logs.step["a"].tolist() == [1] and logs.epoch["b"].tolist() == [2]


def test_distinct_callables_that_compare_equal_do_not_share_a_cache_entry():
    import dataclasses
    import gc

    @dataclasses.dataclass(frozen=True)
    class Scaled:
        k: float

        def __call__(self, x):
            lox.log({"x": x * self.k})
            return x

    first = Scaled(2.0)
    lox.spool(first)(1.0)
    del first
    gc.collect()
    second = Scaled(2.0)  # equal to the dead one
    assert lox.spool(second)(jnp.ones(2))[1]["x"].tolist() == [[2.0, 2.0]]


def test_vmap_of_cond_detection_survives_jax_batching_caches():
    # The same jitted cond batched with an unbatched and then a batched predicate
    # (and the other way round) must be told apart every time.
    xs, ps = jnp.arange(3.0), jnp.array([1.0, -1.0, 1.0])
    for order in (("unbatched", "batched"), ("batched", "unbatched")):
        @jax.jit
        def inner(x, p):
            return jax.lax.cond(p > 0, lambda x: (lox.log({"v": x}), x)[1], lambda x: (lox.log({"v": -x}), x)[1], x)

        for which in order:
            if which == "unbatched":
                assert_series(lox.spool(jax.vmap(inner, in_axes=(0, None)))(xs, 1.0)[1], "v", [xs])
            else:
                with pytest.raises(ValueError, match="batched by `jax.vmap`"):
                    lox.spool(jax.vmap(inner, in_axes=(0, 0)))(xs, ps)


def _long_program(x, emit):
    """Long runs of equations between logs (lox emits such runs as one nested
    call), with values defined in one run and read several runs later."""
    early = jnp.cos(x)
    for i in range(120):
        x = jnp.sin(x) * 1.01 + 0.1
        if i % 40 == 39:
            emit(x, i)
    # Callbacks inside a run keep their order with the logs around them.
    jax.debug.callback(lambda v: None, x, ordered=True)
    return x + early


def test_long_runs_of_equations_between_logs_match_hand_written():
    def logged(x):
        return _long_program(x, lambda v, i: lox.log({"x": v}, step=i))

    def by_hand(x):
        outs = []
        y = _long_program(x, lambda v, i: outs.append((v, i)))
        return y, jnp.stack([v for v, _ in outs]), jnp.array([i for _, i in outs])

    x = jnp.linspace(0.0, 1.0, 5)
    assert "lox_segment" in lox.spool(logged).lower(x).as_text()  # the path under test is taken
    out, logs = lox.spool(logged)(x)
    ref_out, ref_x, ref_steps = jax.jit(by_hand)(x)
    np.testing.assert_allclose(out, ref_out, rtol=1e-6)
    np.testing.assert_allclose(logs["x"], ref_x, rtol=1e-6)
    assert logs.step["x"].tolist() == ref_steps.tolist()
    # The same inside a scan body, under vmap and under grad.
    xs = jnp.stack([x, x + 1.0])
    (_, scanned) = lox.spool(lambda xs: jax.lax.scan(lambda c, x: (c, logged(x)), 0.0, xs))(xs)
    np.testing.assert_allclose(scanned["x"], jnp.concatenate([jax.jit(by_hand)(x)[1] for x in xs]), rtol=1e-6)
    batched, blogs = jax.vmap(lox.spool(logged))(xs)
    np.testing.assert_allclose(blogs["x"][1], jax.jit(by_hand)(xs[1])[1], rtol=1e-6)
    g = jax.grad(lambda x: lox.spool(logged)(x)[0].sum())(x)
    np.testing.assert_allclose(g, jax.grad(lambda x: by_hand(x)[0].sum())(x), rtol=1e-5)


def test_spool_compiles_to_the_kernels_of_the_hand_written_scan():
    """Same kernels and copies as returning the values by hand: in particular the
    step array that the keys of an event share leaves the program once."""
    from logs_testing import kernels

    def logged(xs):
        def body(c, ix):
            i, x = ix
            c = jnp.tanh(c * 0.9 + x)
            lox.log({"loss": jnp.mean(c), "h": c}, step=i)
            return c, None

        return jax.lax.scan(body, jnp.zeros(16), (jnp.arange(xs.shape[0]), xs))[0]

    def by_hand(xs):
        def body(c, ix):
            i, x = ix
            c = jnp.tanh(c * 0.9 + x)
            return c, (jnp.mean(c), c, i)

        return jax.lax.scan(body, jnp.zeros(16), (jnp.arange(xs.shape[0]), xs))

    xs = jnp.linspace(0.0, 1.0, 100)
    ours = lox.spool(logged).lower(xs).compile().as_text()
    ref = jax.jit(by_hand).lower(xs).compile().as_text()
    assert kernels(ours) == kernels(ref)
    out, logs = lox.spool(logged)(xs)
    assert type(logs) is lox.logdict and logs.steps["step"]["loss"] is logs.steps["step"]["h"]


def test_a_ref_that_crosses_a_long_run_of_equations():
    def long_run(y, r, n=40):  # more equations than lox emits one by one
        for _ in range(n):
            y = y + 0.1 * jnp.cos(y)
            r[...] = r[...] + y
        return y

    def f(x):
        y = x * 2
        r = jax.new_ref(jnp.zeros(()))
        y = long_run(y, r)
        jax.lax.scan(lambda c, _: (lox.log({"c": c}), (c, None))[1], y, length=2)
        return y, r[...]

    def by_hand(x):
        r = jax.new_ref(jnp.zeros(()))
        y = long_run(x * 2, r)
        return y, r[...]

    (y, total), logs = lox.spool(f)(jnp.float32(0.3))
    ref_y, ref_total = jax.jit(by_hand)(jnp.float32(0.3))
    np.testing.assert_allclose([y, total], [ref_y, ref_total], rtol=1e-6)
    np.testing.assert_allclose(logs["c"], [ref_y, ref_y], rtol=1e-6)


def test_spool_under_disable_jit_in_a_fresh_process():
    import subprocess
    import sys

    code = (
        "import jax, jax.numpy as jnp, lox\n"
        "def f(x):\n"
        "    for _ in range(40): x = jnp.sin(x)\n"
        "    y = jax.checkpoint(lambda x: (lox.log({'x': x}), x * 2)[1])(x)\n"
        "    return y\n"
        "with jax.disable_jit():\n"
        "    out, logs = lox.spool(f)(jnp.float32(1.0))\n"
        "print(logs['x'].shape)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(1,)"


def test_spooled_programs_outputs_keep_a_stable_structure():
    def f(x):
        lox.log({"a": x, "b": 2 * x}, step=1)
        return x

    compiled = lox.spool(f).lower(jnp.ones(2)).compile()
    _, logs = compiled(jnp.ones(2))
    assert isinstance(logs, lox.logdict)
    zeros = jax.tree_util.tree_map(lambda v: 0, logs)  # leaves that are all the same object
    assert jax.tree_util.tree_structure(zeros) == jax.tree_util.tree_structure(logs)
    assert jax.tree_util.tree_map(lambda a, b: a + b, logs, logs)["b"].tolist() == [[4.0, 4.0]]


def test_steps_from_python_ints_through_jit_are_not_weakly_typed():
    out, logs = jax.jit(lambda x, i: lox.spool(lambda x: (lox.log({"x": x}, step=i), x)[1])(x))(1.0, 3)
    assert logs.step["x"].tolist() == [3] and not logs.step["x"].weak_type


# --- jax.export -----------------------------------------------------------------------------
def test_an_exported_spooled_function_serializes_and_calls_back_to_the_same_logs():
    from jax import export

    def f(xs):
        def step(c, x):
            c = c + x
            lox.log({"c": c, "x": x}, step=x)
            return c, None

        c = jax.lax.scan(step, 0, xs)[0]
        jax.lax.cond(c > 3, lambda: (lox.log({"big": c}, epoch=1), None)[1], lambda: None)
        return c

    def by_hand(xs):
        return xs.sum(), jnp.cumsum(xs), xs, xs.sum() > 3

    xs = jnp.arange(4)
    want_out, want_c, want_x, big = by_hand(xs)
    for exportable in (jax.jit(lox.spool(f)), lox.spool(f)):
        exported = export.export(exportable)(jax.ShapeDtypeStruct(xs.shape, xs.dtype))
        out, logs = export.deserialize(exported.serialize()).call(xs)
        assert int(out) == int(want_out)
        assert isinstance(logs, lox.logdict) and list(logs) == ["c", "x", "big"]
        assert logs["c"].tolist() == want_c.tolist() and logs["x"].tolist() == want_x.tolist()
        assert logs.step["c"].tolist() == logs.step["x"].tolist() == xs.tolist()
        assert logs.valid["big"].tolist() == [bool(big)] and logs.epoch["big"].tolist() == [1]


def test_a_spooled_scan_exports_with_a_symbolic_length():
    from jax import export

    def running(xs):
        def body(c, x):
            c = c + x
            lox.log({"c": c})
            return c, None

        return jax.lax.scan(body, 0.0, xs)[0]

    (n,) = export.symbolic_shape("n")
    exported = export.export(jax.jit(lox.spool(running)))(jax.ShapeDtypeStruct((n,), jnp.float32))
    restored = export.deserialize(exported.serialize())
    for length in (3, 5):
        xs = jnp.arange(float(length))
        out, logs = restored.call(xs)
        assert float(out) == float(xs.sum()) and logs["c"].tolist() == np.cumsum(np.arange(length)).tolist()
