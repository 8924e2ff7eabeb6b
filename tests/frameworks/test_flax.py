"""lox on flax.nnx: models and optimizers that a step updates in place.

Each test trains the same model by the framework alone (`nnx.jit`, the
logged values returned by hand) and under a lox transform or logger method,
then compares the parameters, batch statistics, RNG state, optimizer state,
losses and logged values.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import lox

STEPS = 4


class Model(nnx.Module):
    """Parameters, batch statistics (updated by the forward pass) and dropout
    (which draws from an RNG stream whose count advances)."""

    def __init__(self, rngs):
        self.hidden = nnx.Linear(3, 16, rngs=rngs)
        self.norm = nnx.BatchNorm(16, rngs=rngs)
        self.drop = nnx.Dropout(0.2, rngs=rngs)
        self.out = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        return self.out(self.drop(jax.nn.relu(self.norm(self.hidden(x)))))


def make(seed=0):
    model = Model(nnx.Rngs(seed))
    return model, nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)


def data(batches=None):
    x = jax.random.normal(jax.random.key(1), (32, 3) if batches is None else (batches, 32, 3))
    return x, x @ jnp.array([[1.0], [-2.0], [0.5]])


def step_by_hand(model, opt, x, y):
    """One training step; returns the loss, the values a logging step logs, and the step."""

    def loss_fn(model):
        return jnp.mean((model(x) - y) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    opt.update(model, grads)
    return loss, {"loss": loss, "grad_norm": optax.tree.norm(grads)}, opt.step[...]


def logged_step(model, opt, x, y):
    loss, values, step = step_by_hand(model, opt, x, y)
    lox.log(values, step=step)
    return loss


def state(*objects):
    """Every Variable's value (keys as their data), as NumPy arrays."""
    leaves = jax.tree_util.tree_leaves(nnx.state(objects))
    return [
        np.asarray(jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x)
        for x in leaves
    ]


def assert_same_state(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def reference(steps=STEPS):
    """The framework alone: `nnx.jit`, the logged values carried out by hand."""
    model, opt = make()
    x, y = data()
    losses, values = [], []
    for _ in range(steps):
        loss, logged, step = nnx.jit(step_by_hand)(model, opt, x, y)
        losses.append(float(loss))
        values.append({k: float(v) for k, v in logged.items()} | {"step": int(step)})
    return state(model, opt), losses, values


def spooled_values(logs_list):
    return [
        {"loss": float(logs["loss"][0]), "grad_norm": float(logs["grad_norm"][0]), "step": int(logs.step["loss"][0])}
        for logs in logs_list
    ]


def assert_same_values(got, want):
    """Per step: the same step exactly, the same loss and gradient norm."""
    assert [g["step"] for g in got] == [w["step"] for w in want]
    np.testing.assert_allclose(
        [(g["loss"], g["grad_norm"]) for g in got], [(w["loss"], w["grad_norm"]) for w in want], rtol=1e-6
    )


FORMS = {
    "lox.spool(step)": lambda: lox.spool(logged_step),
    "nnx.jit(lox.spool(step))": lambda: nnx.jit(lox.spool(logged_step)),
    "lox.spool(nnx.jit(step))": lambda: lox.spool(nnx.jit(logged_step)),
}


@pytest.mark.parametrize("form", FORMS)
def test_a_spooled_step_trains_the_model_as_nnx_jit_does(form):
    want_state, want_losses, want_values = reference()
    model, opt = make()
    x, y = data()
    step = FORMS[form]()
    results = [step(model, opt, x, y) for _ in range(STEPS)]
    assert_same_state(state(model, opt), want_state)
    assert int(opt.step[...]) == STEPS
    np.testing.assert_allclose([float(loss) for loss, _ in results], want_losses, rtol=1e-6)
    assert_same_values(spooled_values([logs for _, logs in results]), want_values)


@pytest.mark.parametrize("form", ["lox.tap(step)", "nnx.jit(lox.tap(step))", "lox.nolog(step)"])
def test_tapped_and_unlogged_steps_train_the_model_as_nnx_jit_does(form):
    want_state, want_losses, want_values = reference()
    events = []
    step = {
        "lox.tap(step)": lambda: lox.tap(logged_step, events.append),
        "nnx.jit(lox.tap(step))": lambda: nnx.jit(lox.tap(logged_step, events.append)),
        "lox.nolog(step)": lambda: lox.nolog(logged_step),
    }[form]()
    model, opt = make()
    x, y = data()
    losses = [float(step(model, opt, x, y)) for _ in range(STEPS)]
    jax.effects_barrier()
    assert_same_state(state(model, opt), want_state)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
    if form == "lox.nolog(step)":
        assert events == []
    else:
        assert_same_values(spooled_values([e.to_logdict() for e in events]), want_values)


@pytest.mark.parametrize("inside_nnx_jit", [False, True])
@pytest.mark.parametrize("method", ["spool", "tap"])
def test_logger_methods_train_the_model_and_write_every_step(method, inside_nnx_jit):
    want_state, want_losses, want_values = reference()
    logger = lox.loggers.MemoryLogger()
    run = logger.init(name="nnx")
    model, opt = make()
    x, y = data()
    if inside_nnx_jit:
        step = nnx.jit(lambda model, opt, run, x, y: getattr(logger, method)(logged_step, run)(model, opt, x, y))
        losses = [float(step(model, opt, run, x, y)) for _ in range(STEPS)]
    else:
        step = getattr(logger, method)(logged_step, run)
        losses = [float(step(model, opt, x, y)) for _ in range(STEPS)]
    logger.finish(run)
    assert_same_state(state(model, opt), want_state)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
    written = logger.backends[0].logs()
    np.testing.assert_allclose(written["loss"], [v["loss"] for v in want_values], rtol=1e-6)
    np.testing.assert_allclose(written["grad_norm"], [v["grad_norm"] for v in want_values], rtol=1e-6)
    assert written.step["loss"].tolist() == [v["step"] for v in want_values]


def test_nnx_scan_inside_a_spool_trains_every_batch():
    xs, ys = data(batches=STEPS)

    def epoch(model, opt, xs, ys, step):
        @nnx.scan(in_axes=(nnx.Carry, 0, 0), out_axes=(nnx.Carry, 0))
        def body(carry, x, y):
            model, opt = carry
            return (model, opt), step(model, opt, x, y)

        return body((model, opt), xs, ys)[1]

    model, opt = make()
    by_hand = nnx.jit(lambda m, o, xs, ys: epoch(m, o, xs, ys, lambda *a: step_by_hand(*a)[1]))(model, opt, xs, ys)
    want = state(model, opt)
    model, opt = make()
    losses, logs = lox.spool(lambda m, o, xs, ys: epoch(m, o, xs, ys, logged_step))(model, opt, xs, ys)
    assert_same_state(state(model, opt), want)
    np.testing.assert_allclose(losses, by_hand["loss"], rtol=1e-6)
    np.testing.assert_allclose(logs["grad_norm"], by_hand["grad_norm"], rtol=1e-6)
    assert logs.step["loss"].tolist() == list(range(1, STEPS + 1))


def test_an_ensemble_made_and_trained_with_nnx_vmap_inside_a_spool():
    members = 3

    @nnx.vmap(in_axes=0, out_axes=0)
    def create(key):
        return Model(nnx.Rngs(key))

    def train(models, x, y):
        @nnx.vmap(in_axes=(0, None, None), out_axes=0)
        def one(model, x, y):
            grads = nnx.grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
            nnx.update(model, jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, nnx.state(model, nnx.Param), grads))
            loss = jnp.mean((model(x) - y) ** 2)
            return loss

        losses = one(models, x, y)
        lox.log({"losses": losses})
        return losses

    x, y = data()
    keys = jax.random.split(jax.random.key(0), members)
    models = create(keys)
    want = nnx.jit(train)(models, x, y)
    want_state = state(models)
    models = create(keys)
    losses, logs = lox.spool(train)(models, x, y)
    assert_same_state(state(models), want_state)
    np.testing.assert_allclose(losses, want, rtol=1e-6)
    np.testing.assert_allclose(logs["losses"][0], want, rtol=1e-6)


def test_a_variable_and_a_dict_passed_as_arguments_are_updated_in_place():
    count = nnx.Variable(jnp.zeros((), jnp.int32))
    totals = {"sum": jnp.zeros(3), "name": "totals"}

    def accumulate(count, totals, x):
        count[...] += 1
        totals["sum"] = totals["sum"] + x
        lox.log({"x": x})
        return x

    for _ in range(3):
        lox.spool(accumulate)(count, totals, jnp.arange(3.0))
    assert int(count[...]) == 3
    np.testing.assert_array_equal(totals["sum"], 3 * np.arange(3.0))
    assert totals["name"] == "totals"


def test_a_step_that_changes_the_model_s_structure_is_refused_naming_the_argument():
    model, opt = make()
    x, y = data()

    def adds_a_variable(model, x):
        model.extra = nnx.Variable(jnp.ones(()))
        lox.log({"x": x.sum()})
        return x

    with pytest.raises(
        ValueError, match=r"argument `model`: it added `model\.extra`.*outside the function, before calling it"
    ):
        lox.spool(adds_a_variable)(model, x)
    assert not hasattr(model, "extra")

    def switches_to_eval(model, x):
        model.eval()  # a static flag of the dropout and batch norm layers
        return model(x)

    with pytest.raises(
        ValueError,
        match=r"argument `model`: it changed a static \(non-array\) attribute of `model\.drop`.*before calling it",
    ):
        lox.tap(switches_to_eval, print)(model, x)


def test_a_step_that_mutates_a_model_it_closes_over_fails_as_under_jax_jit():
    model, opt = make()
    x, y = data()

    def closed(x, y):
        return logged_step(model, opt, x, y)

    with pytest.raises(ValueError, match="different trace level") as under_jit:
        jax.jit(closed)(x, y)
    with pytest.raises(ValueError, match="different trace level") as under_spool:
        lox.spool(closed)(x, y)
    assert type(under_jit.value) is type(under_spool.value)
    assert int(opt.step[...]) == 0


def test_calling_a_spooled_step_100_times_traces_it_once():
    traces = []

    def step(model, opt, x, y):
        traces.append(1)
        return logged_step(model, opt, x, y)

    model, opt = make()
    x, y = data()
    spooled = lox.spool(step)
    for _ in range(100):
        spooled(model, opt, x, y)
    assert len(traces) == 1
    assert int(opt.step[...]) == 100


class Tied(nnx.Module):
    """An autoencoder whose decoder holds the encoder's kernel: one Variable in two places."""

    def __init__(self, rngs):
        self.encoder = nnx.Linear(4, 2, rngs=rngs)
        self.decoder = nnx.Linear(2, 4, rngs=rngs)
        self.decoder.kernel = self.encoder.kernel  # transposed in use

    def __call__(self, x):
        return self.encoder(x) @ self.decoder.kernel[...].T + self.decoder.bias[...]


def test_objects_held_in_two_places_stay_one_object_as_under_nnx_jit():
    x = jax.random.normal(jax.random.key(2), (8, 4))

    def step(model, opt):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - x) ** 2))(model)
        opt.update(model, grads)
        lox.log({"loss": loss})
        return loss

    def train(transform):
        model = Tied(nnx.Rngs(0))
        opt = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
        losses = [float(transform(step)(model, opt)) if transform is nnx.jit else float(transform(step)(model, opt)[0])
                  for _ in range(3)]
        assert model.decoder.kernel is model.encoder.kernel
        return losses, state(model, opt)

    want_losses, want_state = train(nnx.jit)
    losses, got_state = train(lox.spool)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-6)
    assert_same_state(got_state, want_state)


def test_a_model_and_its_optimizer_that_refers_to_it():
    x, y = data()

    def step(model, opt):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        opt.update(grads)  # updates `opt.model`, which is `model`
        return loss, jnp.mean((model(x) - y) ** 2)  # the loss after the update, through `model`

    def run(transform):
        model = Model(nnx.Rngs(0))
        model.eval()  # no dropout, no batch statistics: the two losses compare exactly
        opt = nnx.ModelAndOptimizer(model, optax.adam(1e-2))
        return [tuple(float(v) for v in transform(step)(model, opt)) for _ in range(3)], model, opt

    want, _, _ = run(nnx.jit)
    got, model, opt = run(lambda f: lambda *a: lox.spool(f)(*a)[0])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert opt.model is model


@pytest.mark.parametrize("how", ["argument", "list"])
def test_the_same_object_passed_twice_is_one_object_inside(how):
    def bump(a, b):
        b = b if isinstance(b, nnx.Linear) else b[0]
        a.bias[...] += 1.0
        b.bias[...] += 10.0  # the same bias: 11 in all
        lox.log({"bias": a.bias[...]})
        return a

    def run(transform):
        layer = nnx.Linear(2, 2, rngs=nnx.Rngs(0))
        return layer, transform(bump)(layer, layer if how == "argument" else [layer])

    want, returned = run(nnx.jit)
    assert returned is want
    layer, (out, logs) = run(lox.spool)
    np.testing.assert_array_equal(layer.bias[...], want.bias[...])
    np.testing.assert_array_equal(logs["bias"][0], want.bias[...])
    assert out is layer  # a node of the arguments comes back as the caller's object, as from nnx.jit
