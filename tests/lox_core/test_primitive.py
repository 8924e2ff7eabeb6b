"""`lox.log`: what it accepts, what it returns, and its default console output
(`lox_core/printing.py`)."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lox


def test_log_returns_the_event_as_a_one_event_logdict():
    event = lox.log({"x": jnp.arange(3.0), "tree": {"a": 1.0}}, step=4, episode=2)
    assert isinstance(event, lox.logdict)
    assert event["x"].shape == (1, 3) and event["tree"]["a"].shape == (1,)
    assert event.step["x"].tolist() == [4] and event.episode["tree"].tolist() == [2]


def test_prefix_renames_keys():
    _, logs = lox.spool(lambda x: lox.log({"loss": x}, prefix="val/") and x)(1.0)
    assert list(logs) == ["val/loss"]


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: lox.log([1.0]), TypeError, r"takes a dict from str keys to arrays, got list"),
        (lambda: lox.log({3: 1.0}), TypeError, r"keys must be strings, got 3 \(int\)"),
        (lambda: lox.log({"name": {"opt": "adam", "lr": 0.1}}), TypeError,
         r"got a str for key 'name'.*text \(a str, as"),
        (lambda: lox.log({"obj": object()}), TypeError, r"got a object for key 'obj'"),
        (lambda: lox.log({"x": None}), TypeError, r"got no array for key 'x' \(None\); log an array, a number"),
        (lambda: lox.log({"s": {}}, prefix="p/"), TypeError, r"got no array for key 'p/s' \(\{\}\)"),
        (lambda: lox.log({"deep": {"a": [1.0, None, "x"]}}), TypeError, r"got a str for key 'deep'"),
        (lambda: lox.log({"s": np.array([b"a", b"b"])}), TypeError, r"dtype \|S1 for key 's'"),
        (lambda: lox.log({"x": 1.0}, step=1.5), TypeError, r"step 'step' must be an integer scalar, got 1.5"),
        (lambda: lox.log({"x": 1.0}, step=True), TypeError, r"step 'step' must be an integer scalar"),
        (
            lambda: lox.log({"x": 1.0}, epoch=jnp.arange(2)),
            ValueError,
            r"step 'epoch' must be a scalar, got shape \(2,\)",
        ),
        (lambda: lox.log({"x": 1.0}, tags=["a", 2]), TypeError, r"tags must be strings, got 2"),
    ],
)
def test_bad_input_raises_a_clear_error(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_bad_input_raises_inside_jit_too():
    with pytest.raises(TypeError, match=r"got text for 'name' inside a traced function"):
        lox.spool(lambda x: lox.log({"name": "adam"}))(1.0)


def test_default_prints_eagerly_and_under_jit(capsys):
    lox.log({"x": 1.5, "v": jnp.arange(2)}, step=3)
    jax.jit(lambda x: lox.log({"y": x * 2}))(2.0)
    jax.effects_barrier()
    assert capsys.readouterr().out.splitlines() == ["[step=3] x=1.5 v=[0 1]", "y=4"]


def test_set_default_off_silences_the_default(capsys):
    lox.set_default("off")
    try:
        lox.log({"x": 1.0})
        jax.jit(lambda x: lox.log({"y": x}))(2.0)
        jax.effects_barrier()
    finally:
        lox.set_default("console")
    assert capsys.readouterr().out == ""
    with pytest.raises(ValueError, match=r"unknown default 'file': use one of console, off"):
        lox.set_default("file")


def _step(x):
    lox.log({"x": x.sum()}, step=1)
    jax.lax.scan(lambda c, i: (lox.log({"c": c}, step=i), (c + 1.0, None))[1], x[0], jnp.arange(3))
    return x * 2


def _step_events(x):
    return lox.logdict({"x": np.array([x.sum()]), "c": x[0] + np.arange(3, dtype=np.float32)},
                       steps={"step": {"x": np.array([1], np.int32), "c": np.arange(3, dtype=np.int32)}})


def test_with_the_default_off_a_plain_jit_has_no_log_left_and_transforms_still_see_every_log(capsys):
    from logs_testing import assert_logs_equal, tapped

    x = jnp.arange(1.0, 4.0)
    lox.set_default("off")
    try:
        # What `jax.jit` compiles: no effect, so JAX's fast dispatch path; the returned event is still computed.
        closed = jax.make_jaxpr(_step)(x)
        assert not closed.effects and "lox_log" not in str(closed)
        assert jax.jit(lambda x: lox.log({"x": x}, step=2).step["x"][0] + 1)(x).tolist() == 3
        step = jax.jit(_step)
        np.testing.assert_array_equal(step(x), 2 * x)
        # Already traced and compiled without its logs, it is traced anew inside every transform.
        for spooled in (lox.spool(step), jax.jit(lox.spool(step))):
            _, logs = spooled(x)
            assert_logs_equal(logs, _step_events(np.asarray(x)))
        events = []
        lox.tap(step, events.append)(x)
        assert_logs_equal(tapped(events), _step_events(np.asarray(x)))
        assert "lox_log" not in str(jax.make_jaxpr(lox.nolog(step))(x))
        # `set_default` applies to functions compiled before it: the next call compiles them again.
        lox.set_default("console")
        step(x)
        jax.effects_barrier()
        assert capsys.readouterr().out.splitlines() == ["[step=1] x=6", "[step=0] c=1", "[step=1] c=2",
                                                        "[step=2] c=3"]
        lox.set_default("off")
        step(x)
        jax.effects_barrier()
        assert capsys.readouterr().out == ""
    finally:
        lox.set_default("console")
    assert jax.make_jaxpr(_step)(x).effects  # with the console default the log is in the program


def test_with_the_default_off_what_a_selective_transform_leaves_costs_nothing_and_an_outer_one_sees_it():
    def f(x):
        lox.log({"a": x.sum()}, step=1)
        lox.log({"b": x.mean(), "c": x.max()}, step=2)
        return x * 2

    x = jnp.arange(1.0, 4.0)
    lox.set_default("off")
    try:
        for spooled in (lox.spool(f, argnames=["a", "c"]), lox.spool(f, keep_logs=True)):
            # Alone, the keys it does not return are left out of the program: no effect, fast dispatch.
            assert not jax.make_jaxpr(spooled)(x).effects
            _, logs = spooled(x)
            assert {k: logs[k].tolist() for k in logs} == (
                {"a": [6.0], "c": [3.0]} if "b" not in logs else {"a": [6.0], "b": [2.0], "c": [3.0]})
        # Inside another transform, the keys it does not return stay for that one.
        events = []
        lox.tap(jax.jit(lox.spool(f, argnames=["a", "c"])), events.append)(x)
        assert [(dict(e), e.steps) for e in events] == [({"b": np.float32(2.0)}, {"step": 2})]
        _, outer = lox.spool(lambda x: lox.spool(f, keep_logs=True)(x)[0])(x)
        assert {k: outer[k].tolist() for k in outer} == {"a": [6.0], "b": [2.0], "c": [3.0]}
    finally:
        lox.set_default("console")


def test_eager_derivatives_of_a_function_that_logs_a_python_number(capsys):
    def loss(w):
        lox.log({"w": w}, step=0)
        return w**2

    assert float(jax.grad(loss)(1.5)) == 3.0
    primal, tangent = jax.jvp(loss, (2.0,), (1.0,))
    assert (float(primal), float(tangent)) == (4.0, 4.0)
    assert [float(v) for v in jax.value_and_grad(loss)(3.0)] == [9.0, 6.0]
    jax.effects_barrier()
    assert capsys.readouterr().out.splitlines() == ["[step=0] w=1.5", "[step=0] w=2", "[step=0] w=3"]


def run_python(code: str, **env):
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, timeout=120
    )


def test_lox_default_environment_variable():
    code = "import jax, lox; lox.log({'x': 1.0}); jax.jit(lambda x: lox.log({'y': x}))(2.0); jax.effects_barrier()"
    assert run_python(code, LOX_DEFAULT="off").stdout == ""
    assert run_python(code, LOX_DEFAULT="console").stdout.splitlines() == ["x=1", "y=2"]
    bad = run_python(code, LOX_DEFAULT="loud")
    assert bad.returncode != 0 and "LOX_DEFAULT='loud' is not a valid setting: use one of console, off" in bad.stderr


def test_default_output_refuses_vmap_of_cond_instead_of_printing_twice():
    def f(x):
        return jax.lax.cond(x > 0, lambda x: lox.log({"v": x}) and x, lambda x: lox.log({"v": -x}) and x, x)

    with pytest.raises(ValueError, match=r"'v'.*batched by `jax.vmap`.*printed"):
        jax.jit(jax.vmap(f))(jnp.array([-1.0, 1.0]))


def test_the_returned_event_can_be_used_under_every_transform():
    lox.set_default("off")
    try:
        def f(x):
            event = lox.log({"x": x * 2}, step=5)
            return event["x"][0] + event.step["x"][0]

        assert float(jax.jit(f)(1.0)) == 7.0
        assert float(jax.grad(f)(1.0)) == 2.0
        np.testing.assert_allclose(jax.vmap(f)(jnp.arange(3.0)), [5.0, 7.0, 9.0])
        out, logs = lox.spool(f)(1.0)
        assert float(out) == 7.0 and logs["x"].tolist() == [2.0]
        assert jax.vmap(lambda x: lox.log({"x": x})["x"])(jnp.arange(3.0)).shape == (3, 1)
        assert float(lox.nolog(f)(1.0)) == 7.0
    finally:
        lox.set_default("console")


@pytest.mark.parametrize("value, becomes", [
    (np.int64(2**62 + 1), "1"),                    # JAX would keep the low 32 bits
    (np.uint64(2**64 - 1), "4294967295"),
    (np.array([5, 2**40], np.int64), "0"),         # an array: the first value lost is named
    (2**40, "0"),                                   # a Python int goes through int64
    (np.float64(1e300), "inf"),                     # a finite float would become infinite
])
def test_a_value_that_64_bit_types_off_would_change_is_refused_naming_the_key(value, becomes):
    def f(x):
        lox.log({"seed": value}, step=1)
        return x

    for transform in (lox.spool, lambda f: jax.jit(lox.spool(f)), lambda f: lox.tap(f, lambda e: None)):
        with pytest.raises(ValueError, match=rf"`lox.log` got .* for key 'seed', which JAX holds as (int|uint|float)32 "
                                             rf"while 64-bit types are off: it would be logged as {becomes}\. Enable "
                                             r"them with `jax.config.update\('jax_enable_x64', True\)`"):
            transform(f)(1.0)


def test_a_step_that_64_bit_types_off_would_change_is_refused_naming_it():
    def f(x):
        lox.log({"x": x}, step=np.int64(2**40 + 3))
        return x

    with pytest.raises(ValueError, match=r"got 1099511627779 \(int64\) for step 'step', .* it would be logged as 3\. "
                                         r"Enable them with .*, or count steps in a unit that fits; outside jit"):
        lox.spool(f)(1.0)


def test_values_that_fit_are_logged_exactly_and_with_64_bit_types_on_large_ones_too():
    def f(x):
        lox.log({"small": np.int64(-(2**31)), "u": np.uint64(7), "tenth": np.float64(0.1)}, step=np.int64(2**31 - 1))
        return x

    _, logs = lox.spool(f)(1.0)
    assert [logs["small"].tolist(), logs["u"].tolist(), logs.step["small"].tolist()] == [[-(2**31)], [7], [2**31 - 1]]
    assert logs["tenth"].tolist() == [np.float32(0.1)]  # float64 held as float32: the usual precision, not refused
    jax.config.update("jax_enable_x64", True)
    try:
        def g(x):
            lox.log({"big": np.int64(2**62 + 1), "u": np.uint64(2**64 - 1)}, step=2**40)
            return x

        _, logs = jax.jit(lox.spool(g))(1.0)
        assert [logs["big"].tolist(), logs["u"].tolist(), logs.step["big"].tolist()] == [[2**62 + 1], [2**64 - 1],
                                                                                          [2**40]]
    finally:
        jax.config.update("jax_enable_x64", False)
