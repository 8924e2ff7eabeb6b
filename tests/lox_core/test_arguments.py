"""How lox's transforms take arguments (lox_core/arguments.py): filtered
leaves, static arguments, objects held twice, returned arguments, and what a
function changes in place — each against plain Python or `jax.jit`."""

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lox


def test_a_dict_passed_twice_is_one_dict_inside_as_in_python():
    def bump(a, b):
        a["n"] = a["n"] + 1.0
        b["n"] = b["n"] + 1.0
        lox.log({"n": a["n"]})
        return a["n"]

    plain = {"n": 0.0}
    bump(plain, plain)
    for call in (lambda d: lox.spool(bump)(d, d)[0], lambda d: lox.spool(bump)(a=d, b=d)[0],
                 lambda d: lox.nolog(bump)(d, [d][0])):
        d = {"n": 0.0}
        assert float(call(d)) == plain["n"] == 2.0
        assert float(d["n"]) == 2.0


def test_static_arguments_of_equal_value_and_other_types_compile_apart_as_under_jax_jit():
    def f(x, flag):
        lox.log({"x": x})
        return x * 100.0 if flag is True else x * flag

    for transform in (jax.jit, lambda g, **k: (lambda *a: lox.spool(g, **k)(*a)[0])):
        g = transform(f, static_argnums=1)
        assert [g(jnp.int32(1), v).dtype for v in (1, 1.0)] == [jnp.int32, jnp.float32]
        assert [float(g(jnp.float32(1.0), v)) for v in (True, 1)] == [100.0, 1.0]


def test_an_unhashable_static_argument_is_refused_naming_it():
    def f(x, config):
        lox.log({"x": x})
        return x * config["scale"]

    with pytest.raises(ValueError, match=r"`lox.spool`: the static argument 1 .* is a dict, which cannot be hashed"):
        lox.spool(f, static_argnums=1)(1.0, {"scale": 2.0})
    with pytest.raises(ValueError, match=r"`lox.tap`: the static argument `config` .* is a dict"):
        lox.tap(f, static_argnames="config")(1.0, config={"scale": 2.0})


class Scaler:
    def __init__(self, scale):
        self.scale = scale

    @lox.spool
    def spooled(self, x):
        lox.log({"y": x * self.scale})
        return x * self.scale

    @lox.nolog
    def unlogged(self, x):
        lox.log({"y": x})
        return x + self.scale


def test_a_transform_decorates_a_method():
    scaler = Scaler(3.0)
    y, logs = scaler.spooled(jnp.float32(2.0))
    assert float(y) == 6.0 and logs["y"].tolist() == [6.0]
    assert float(scaler.unlogged(jnp.float32(2.0))) == 5.0
    assert float(Scaler.spooled(scaler, jnp.float32(1.0))[0]) == 3.0


def test_lower_and_trace_take_arguments_with_non_array_leaves():
    def f(params, x):
        y = params["activation"](params["w"] * x)
        lox.log({params["name"]: y})
        return y

    params = {"w": jnp.ones(2), "activation": jnp.tanh, "name": "hidden"}
    for transform in (lox.spool, lox.nolog, lambda g: lox.tap(g, lambda event: None)):
        lowered = transform(f).lower(params, jnp.float32(2.0))
        assert "tanh" in lowered.as_text()
        assert transform(f).trace(params, jnp.float32(2.0)).jaxpr is not None
    compiled = lox.nolog(f).lower(params, jnp.float32(2.0)).compile()
    np.testing.assert_allclose(compiled(params["w"], jnp.float32(2.0)), np.tanh(2.0 * np.ones(2)), rtol=1e-6)


@dataclasses.dataclass
class Result:  # not registered as a pytree
    loss: object


def test_returning_a_non_pytree_object_that_holds_a_traced_array_is_refused():
    def f(x):
        lox.log({"x": x})
        return Result(x * 2)

    with pytest.raises(
        TypeError, match=r"returned a `Result` whose attribute `loss` holds a traced array.*register_dataclass"
    ):
        lox.spool(f)(jnp.float32(1.0))


class Counter:  # not registered as a pytree: a static leaf
    def __init__(self):
        self.total = 0.0


def test_a_traced_value_stored_in_a_static_object_is_refused_and_undone():
    def f(counter, x):
        counter.total = counter.total + x
        lox.log({"x": x})
        return x

    counter = Counter()
    with pytest.raises(
        ValueError, match=r"stored a traced value in `.total` of the `Counter` `counter`.*Register its class"
    ):
        lox.spool(f)(counter, jnp.float32(1.0))
    assert counter.total == 0.0


class Accumulator:
    """A mutable pytree registered without keys (`register_pytree_node`)."""

    def __init__(self, count):
        self.count = count


jax.tree_util.register_pytree_node(
    Accumulator, lambda a: ((a.count,), None), lambda _, children: Accumulator(*children)
)


def test_a_mutable_node_without_keys_is_updated_in_place():
    def step(acc, state, x):
        acc.count = acc.count + x
        state["acc"].count = state["acc"].count + 2 * x
        lox.log({"count": acc.count})
        return x

    acc, inner = Accumulator(jnp.float32(0.0)), Accumulator(jnp.float32(0.0))
    state = {"acc": inner}
    for _ in range(3):
        lox.spool(step)(acc, state, jnp.float32(1.0))
    assert state["acc"] is inner  # the same object, updated: other references see the new count
    assert float(acc.count) == 3.0 and float(inner.count) == 6.0


@dataclasses.dataclass(frozen=True)
class Frozen:
    value: jax.Array


jax.tree_util.register_dataclass(Frozen, data_fields=["value"], meta_fields=[])


def test_a_change_inside_an_immutable_argument_is_refused_naming_it():
    def sneaky(frozen, x):
        object.__setattr__(frozen, "value", frozen.value + x)  # what a frozen dataclass forbids
        return x

    frozen = Frozen(jnp.float32(1.0))
    with pytest.raises(
        ValueError, match=r"changed at `frozen.value`: every object on the way from the argument `frozen`"
    ):
        lox.spool(sneaky)(frozen, jnp.float32(1.0))
    assert float(frozen.value) == 1.0


class Hyper(NamedTuple):
    lr: float


def test_python_numbers_in_named_tuples_are_traced_as_under_jax_jit():
    traces = []

    def f(w, hyper):
        traces.append(None)
        lox.log({"lr": hyper.lr})
        return w - hyper.lr

    for lr in (0.1, 0.2, 0.3):
        out, logs = lox.spool(f)(jnp.float32(1.0), Hyper(lr))
        np.testing.assert_allclose(logs["lr"], [lr], rtol=1e-6)
    assert len(traces) == 1


def test_a_function_that_changes_its_arguments_leaks_no_tracer():
    def step(state, x):
        state["total"] = state["total"] + x
        lox.log({"total": state["total"]})
        return x

    state = {"total": jnp.float32(0.0)}
    with jax.checking_leaks():
        lox.spool(step)(state, jnp.float32(1.0))
        lox.tap(step, lambda event: None)(state, jnp.float32(1.0))
    assert float(state["total"]) == 2.0
