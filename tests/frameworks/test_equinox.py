"""lox on equinox: models whose pytrees hold functions and other non-array leaves.

lox's transforms take such pytrees as `eqx.filter_jit` does (arrays traced,
everything else static); each test compares a training run under lox with
the same run under `eqx.filter_jit`, the logged values returned by hand.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lox

STEPS = 4
optimizer = optax.adam(1e-2)


def make():
    model = eqx.nn.MLP(3, 1, 16, 2, activation=jax.nn.gelu, key=jax.random.key(0))
    return model, optimizer.init(eqx.filter(model, eqx.is_array))


def data():
    x = jax.random.normal(jax.random.key(1), (32, 3))
    return x, x @ jnp.array([[1.0], [-2.0], [0.5]])


def step_by_hand(model, opt_state, x, y):
    """One step: the new model and optimizer state, the loss, and the values a logging step logs."""

    def loss_fn(model):
        return jnp.mean((jax.vmap(model)(x) - y) ** 2)

    loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
    updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    model = eqx.apply_updates(model, updates)
    return model, opt_state, loss, {"loss": loss, "grad_norm": optax.tree.norm(grads)}


def logged_step(model, opt_state, x, y):
    model, opt_state, loss, values = step_by_hand(model, opt_state, x, y)
    lox.log(values, step=opt_state[0].count)
    return model, opt_state, loss


def reference():
    model, opt_state = make()
    x, y = data()
    values = []
    for _ in range(STEPS):
        model, opt_state, _, logged = eqx.filter_jit(step_by_hand)(model, opt_state, x, y)
        values.append({k: float(v) for k, v in logged.items()})
    return model, opt_state, values


def assert_same_arrays(got, want):
    got, want = eqx.filter(got, eqx.is_array), eqx.filter(want, eqx.is_array)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def assert_same_values(got, want):
    np.testing.assert_allclose(
        [(g["loss"], g["grad_norm"]) for g in got], [(w["loss"], w["grad_norm"]) for w in want], rtol=1e-6
    )


FORMS = {
    "lox.spool(step)": lambda: lox.spool(logged_step),
    "lox.spool(eqx.filter_jit(step))": lambda: lox.spool(eqx.filter_jit(logged_step)),
    "eqx.filter_jit(lox.spool(step))": lambda: eqx.filter_jit(lox.spool(logged_step)),
}


@pytest.mark.parametrize("form", FORMS)
def test_a_spooled_equinox_step_trains_as_filter_jit_does(form):
    want_model, want_opt_state, want_values = reference()
    model, opt_state = make()
    x, y = data()
    step = FORMS[form]()
    values = []
    for _ in range(STEPS):
        (model, opt_state, loss), logs = step(model, opt_state, x, y)
        values.append({"loss": float(logs["loss"][0]), "grad_norm": float(logs["grad_norm"][0])})
    assert_same_arrays((model, opt_state), (want_model, want_opt_state))
    # The model's functions come back as the very objects it holds.
    assert model.activation is jax.nn.gelu and model.final_activation is want_model.final_activation
    assert_same_values(values, want_values)
    assert logs.step["loss"].tolist() == [STEPS]


@pytest.mark.parametrize("form", ["lox.tap", "lox.nolog", "logger.spool", "logger.tap"])
def test_tapped_unlogged_and_logged_equinox_steps_train_as_filter_jit_does(form):
    want_model, want_opt_state, want_values = reference()
    events = []
    logger = lox.loggers.MemoryLogger()
    run = logger.init(name="equinox")
    step = {
        "lox.tap": lambda: lox.tap(logged_step, events.append),
        "lox.nolog": lambda: lox.nolog(logged_step),
        "logger.spool": lambda: logger.spool(logged_step, run),
        "logger.tap": lambda: logger.tap(logged_step, run),
    }[form]()
    model, opt_state = make()
    x, y = data()
    for _ in range(STEPS):
        model, opt_state, loss = step(model, opt_state, x, y)
    logger.finish(run)
    assert_same_arrays((model, opt_state), (want_model, want_opt_state))
    if form == "lox.tap":
        got = [{"loss": float(e["loss"]), "grad_norm": float(e["grad_norm"])} for e in events]
        assert_same_values(got, want_values)
    elif form.startswith("logger"):
        written = logger.backends[0].logs()
        np.testing.assert_allclose(written["loss"], [v["loss"] for v in want_values], rtol=1e-6)
        assert written.step["loss"].tolist() == list(range(1, STEPS + 1))
    else:
        assert events == []


class Scaled(eqx.Module):
    """A module with a string and a function among its leaves."""

    weight: jax.Array
    name: str
    fn: object


def test_non_array_leaves_are_static_and_part_of_the_cache_key():
    traces = []

    def f(module, x):
        traces.append(module.name)
        lox.log({module.name: module.fn(module.weight * x)})
        return module.weight * x, module.name

    spooled = lox.spool(f)
    module = Scaled(jnp.ones(2), "a", jnp.sin)
    (y, name), logs = spooled(module, 2.0)
    assert name == "a" and list(logs) == ["a"]
    np.testing.assert_allclose(logs["a"][0], np.sin(2.0 * np.ones(2)), rtol=1e-6)
    spooled(Scaled(3 * jnp.ones(2), "a", jnp.sin), 5.0)  # new arrays, new float: no new trace
    assert traces == ["a"]
    (_, name), logs = spooled(Scaled(jnp.ones(2), "b", jnp.cos), 2.0)  # new static leaves: traced again
    assert traces == ["a", "b"] and name == "b"
    np.testing.assert_allclose(logs["b"][0], np.cos(2.0 * np.ones(2)), rtol=1e-6)


class Unhashable:
    """A leaf that cannot be hashed: lox keys the cache on its identity."""

    __hash__ = None

    def __init__(self, scale):
        self.scale = scale

    def __eq__(self, other):
        return isinstance(other, Unhashable) and other.scale == self.scale


def test_an_unhashable_leaf_is_static_by_identity():
    traces = []

    def f(config, x):
        traces.append(config)
        lox.log({"x": x * config.scale})
        return x

    spooled = lox.tap(f, lambda event: None)
    config = Unhashable(2.0)
    spooled({"config": config}["config"], 1.0)
    spooled(config, 2.0)
    assert traces == [config]
    spooled(Unhashable(2.0), 1.0)  # equal, but another object: another key
    assert len(traces) == 2


def test_static_argnums_stay_static_beside_filtered_leaves():
    def f(module, n):
        lox.log({"y": module.fn(module.weight) * n})
        return module.weight * n

    module = Scaled(jnp.ones(2), "m", jnp.exp)
    y, logs = lox.spool(f, static_argnums=1)(module, 3)
    np.testing.assert_allclose(y, 3.0 * np.ones(2))
    np.testing.assert_allclose(logs["y"][0], 3.0 * np.exp(np.ones(2)), rtol=1e-6)
    out = lox.nolog(f, static_argnames="n")(module, n=4)
    np.testing.assert_allclose(out, 4.0 * np.ones(2))


class Noisy(eqx.Module):
    """Python numbers among the fields: equinox keeps them static, so does lox."""

    linear: eqx.nn.Linear
    dropout: eqx.nn.Dropout  # holds `inference: bool`, used in Python control flow
    repeats: int  # used as a shape
    scale: float

    def __call__(self, x, key):
        h = jnp.tile(self.linear(x), self.repeats) * self.scale
        return self.dropout(h, key=key)


def test_python_numbers_inside_modules_are_static_as_under_filter_jit():
    module = Noisy(eqx.nn.Linear(2, 2, key=jax.random.key(0)), eqx.nn.Dropout(0.5, inference=True), 3, 0.5)
    traces = []

    def f(module, x, key):
        traces.append(None)
        y = module(x, key)
        lox.log({"y": y})
        return module, y

    x, key = jnp.ones(2), jax.random.key(1)
    want_module, want = eqx.filter_jit(f)(module, x, key)
    traces.clear()
    for spooled in (lox.spool(f), lox.spool(eqx.filter_jit(f))):
        (same, y), logs = spooled(module, x, key)
        np.testing.assert_allclose(y, want, rtol=1e-6)
        np.testing.assert_allclose(logs["y"][0], want, rtol=1e-6)
        assert type(same.scale) is float and type(same.repeats) is int and same.dropout.inference is True
    traces.clear()
    spooled = lox.spool(f)
    spooled(module, x, key)  # compiled above
    spooled(eqx.tree_at(lambda m: m.scale, module, 0.25), x, key)  # a new static field: traced again
    spooled(eqx.tree_at(lambda m: m.scale, module, 0.25), x, key)  # an equal one: not again
    assert len(traces) == 1


def test_python_numbers_passed_as_arguments_are_traced_as_under_jax_jit():
    traces = []

    def f(x, config):
        traces.append(None)
        lox.log({"x": x * config["lr"]})
        return x * config["lr"]

    spooled = lox.spool(f)
    for lr in (0.1, 0.2, 0.3):  # a float argument, and one in a dict: no new trace
        out, logs = spooled(2.0, {"lr": lr})
        np.testing.assert_allclose(out, 2.0 * lr, rtol=1e-6)
    assert len(traces) == 1
