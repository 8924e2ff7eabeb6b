"""lox on optax: a gradient transformation that logs, inside optax's own wrappers.

optax runs transformations inside conds and loops that the user does not
write (`MultiSteps` and `apply_if_finite` skip updates in a cond, L-BFGS's
line search evaluates the loss in while loops). Each test compares the
parameters with the optimizer alone and the logged values with the same
quantities computed by hand.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lox

TARGET = jnp.array([1.0, -2.0, 3.0])


def log_norm(key="update_norm"):
    """A gradient transformation that logs the norm of the updates it receives."""

    def update(updates, state, params=None):
        lox.log({key: optax.tree.norm(updates)})
        return updates, state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def loss(w, i):
    return jnp.sum((w - TARGET) ** 2 * (1.0 + i))


def grad(w, i, poisoned):
    """The gradient at step `i`, NaN at the steps in `poisoned`."""
    return jax.grad(loss)(w, i) * jnp.where(jnp.isin(i, jnp.asarray(poisoned)), jnp.nan, 1.0)


def train(optimizer, steps, transform, poisoned=()):
    """`steps` steps of `optimizer`, each step a call of ``transform(step)``;
    returns the final parameters and what each call returned."""

    def step(w, state, i):
        updates, state = optimizer.update(grad(w, i, poisoned), state, w)
        return optax.apply_updates(w, updates), state

    w = jnp.zeros(3)
    state = optimizer.init(w)
    run = transform(step)
    results = []
    for i in range(steps):
        result = run(w, state, i)
        (w, state), extra = result if isinstance(result[0], tuple) else (result, None)
        results.append(extra)
    return w, results


@pytest.mark.parametrize("name", ["spool", "tap", "nolog"])
def test_a_logging_transformation_chained_with_adam_trains_as_adam_alone(name):
    want, _ = train(optax.adam(0.1), 5, jax.jit)
    events = []
    transform = {"spool": lox.spool, "tap": lambda f: lox.tap(f, events.append), "nolog": lox.nolog}[name]
    got, results = train(optax.chain(log_norm(), optax.adam(0.1)), 5, transform)
    jax.effects_barrier()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # By hand: the norm of each step's gradient, at the parameters of that step.
    w, by_hand = jnp.zeros(3), []
    state = optax.adam(0.1).init(w)
    for i in range(5):
        g = jax.grad(loss)(w, i)
        by_hand.append(float(jnp.linalg.norm(g)))
        updates, state = optax.adam(0.1).update(g, state, w)
        w = optax.apply_updates(w, updates)
    if name == "spool":
        np.testing.assert_allclose([float(logs["update_norm"][0]) for logs in results], by_hand, rtol=1e-6)
    elif name == "tap":
        np.testing.assert_allclose([float(e["update_norm"]) for e in events], by_hand, rtol=1e-6)
    else:
        assert events == []


def test_apply_if_finite_logs_only_the_updates_it_applies():
    inner = optax.sgd(0.1)
    want, _ = train(optax.apply_if_finite(inner, 3), 5, jax.jit, poisoned=[2])
    got, results = train(optax.apply_if_finite(optax.chain(log_norm(), inner), 3), 5, lox.spool, poisoned=[2])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # The step with a NaN gradient is rejected in a cond: its event is padding.
    assert [logs.valid["update_norm"].tolist() for logs in results] == [[True], [True], [False], [True], [True]]
    w, norms = jnp.zeros(3), []
    for i in range(5):
        g = jax.grad(loss)(w, i)
        if i != 2:
            norms.append(float(jnp.linalg.norm(g)))
            w = w - 0.1 * g
    np.testing.assert_allclose(
        [float(logs.trim()["update_norm"][0]) for logs in results if logs.count["update_norm"]], norms, rtol=1e-6
    )


def test_multi_steps_that_skip_a_step_log_the_steps_they_accumulate():
    k = 3

    def multi(inner):
        return optax.MultiSteps(inner, every_k_schedule=k, should_skip_update_fn=optax.skip_not_finite)

    want, _ = train(multi(optax.sgd(0.1)), 7, jax.jit, poisoned=[4])
    got, results = train(multi(optax.chain(log_norm(), optax.sgd(0.1))), 7, lox.spool, poisoned=[4])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert [bool(logs.valid["update_norm"][0]) for logs in results] == [True, True, True, True, False, True, True]
    # By hand: the inner transformation sees the mean of the gradients accumulated since the last update.
    w, window, norms = jnp.zeros(3), [], []
    for i in range(7):
        if i == 4:
            continue
        window.append(jax.grad(loss)(w, i))
        mean = sum(window) / len(window)
        norms.append(float(jnp.linalg.norm(mean)))
        if len(window) == k:
            w, window = w - 0.1 * mean, []
    np.testing.assert_allclose(
        [float(logs["update_norm"][0]) for logs in results if logs.count["update_norm"]], norms, rtol=1e-5
    )


def objective(w):
    value = jnp.sum((w - TARGET) ** 2) + jnp.sum(w**4)
    lox.log({"objective": value})
    return value


def lbfgs_step(optimizer, fn):
    value_and_grad = optax.value_and_grad_from_state(fn)

    def step(w, state):
        value, g = value_and_grad(w, state=state)
        updates, state = optimizer.update(g, state, w, value=value, grad=g, value_fn=fn)
        return optax.apply_updates(w, updates), state

    return step


def test_lbfgs_logs_every_evaluation_of_its_line_search():
    optimizer = optax.lbfgs()
    # By hand: every evaluation of the objective, recorded by JAX's own ordered host callback.
    evaluations = []

    def recording_objective(w):
        value = jnp.sum((w - TARGET) ** 2) + jnp.sum(w**4)
        jax.debug.callback(lambda v: evaluations.append(float(v)), value, ordered=True)
        return value

    reference_step = jax.jit(lbfgs_step(optimizer, recording_objective))
    w = jnp.zeros(3)
    state = optimizer.init(w)
    per_step = []
    for _ in range(4):
        w, state = reference_step(w, state)
        jax.effects_barrier()
        per_step.append(list(evaluations))
        evaluations.clear()
    want_w = w

    step = lbfgs_step(optimizer, objective)
    # The line search's while loops: spooled with a capacity, refused without one.
    with pytest.raises(ValueError, match=r"inside `jax.lax.while_loop`.*max_events=N"):
        lox.spool(step)(jnp.zeros(3), optimizer.init(jnp.zeros(3)))
    w = jnp.zeros(3)
    state = optimizer.init(w)
    spooled = lox.spool(step, max_events=16)
    for want in per_step:
        (w, state), logs = spooled(w, state)
        assert int(logs.dropped["objective"]) == 0
        np.testing.assert_allclose(logs.trim()["objective"], want, rtol=1e-6)
    np.testing.assert_allclose(w, want_w, rtol=1e-6)
