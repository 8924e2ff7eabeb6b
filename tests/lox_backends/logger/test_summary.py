"""`logger.summary` (lox_backends/logger/logger.py): user summary values reach every
backend's `summarize`, per run, after what was logged before them; what is not a
scalar per run, or clashes with a column of the table of runs, is refused at the call."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lox
from lox_backends.logger.logger import Logger
from lox_backends.plugin import hooks


class Recording(hooks.Backend):
    """A backend that records, in order, what reaches it."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def open_run(self, run):
        self.calls.append(("open", run.run_id))

    def write(self, run, table):
        self.calls.append(("write", run.run_id, table.num_rows))

    def summarize(self, run, values):
        self.calls.append(("summary", run.run_id, values))


def summaries(backend):
    return [call[1:] for call in backend.calls if call[0] == "summary"]


def test_values_reach_each_run_eagerly_under_jit_and_under_vmap():
    backend = Recording()
    logger = Logger([backend])
    state = jax.vmap(lambda k: logger.init(k, run_id="s"))(jax.random.split(jax.random.key(0), 3))

    @jax.jit
    def best(state, accuracy):
        jax.vmap(lambda s, a: logger.summary(s, {"best_acc": a, "model": "mlp"}))(state, accuracy)

    best(state, jnp.array([0.5, 0.75, 0.25]))
    logger.summary(state, {"epochs": 3, "seed": jnp.arange(3), "done": True})
    logger.flush()
    assert summaries(backend) == [
        ("s-0", {"model": "mlp", "best_acc": 0.5}), ("s-1", {"model": "mlp", "best_acc": 0.75}),
        ("s-2", {"model": "mlp", "best_acc": 0.25}),
        ("s-0", {"epochs": 3, "done": True, "seed": 0}), ("s-1", {"epochs": 3, "done": True, "seed": 1}),
        ("s-2", {"epochs": 3, "done": True, "seed": 2}),
    ]
    values = [v for _, values in summaries(backend) for v in values.values()]
    assert all(type(v) in (float, int, bool, str) for v in values)  # Python scalars, not NumPy
    logger.close()


def test_values_of_jaxs_own_floating_dtypes_are_taken_as_floats():
    # A loss in mixed precision is bfloat16: NumPy does not count it a number, JAX does.
    backend = Recording()
    logger = Logger([backend])
    state = logger.init(run_id="r")
    logger.summary(state, {"best": jnp.bfloat16(1.5), "eight": jnp.asarray(0.25, jnp.float8_e4m3fn)})
    jax.jit(lambda s, x: logger.summary(s, {"jit": x}))(state, jnp.bfloat16(-2.0))
    logger.flush()
    assert summaries(backend) == [("r", {"best": 1.5, "eight": 0.25}), ("r", {"jit": -2.0})]
    assert all(type(v) is float for _, values in summaries(backend) for v in values.values())
    logger.close()


def test_values_come_after_what_was_logged_before_them():
    backend = Recording()
    logger = Logger([backend])
    state = logger.init()

    def step(x):
        lox.log({"loss": x}, step=0)
        return x

    logger.spool(step, state)(1.0)
    logger.summary(state, {"final": 1.0})
    logger.finish(state)
    kinds = [call[0] for call in backend.calls]
    assert kinds == ["open", "write", "summary"]


def test_a_run_ended_by_finish_takes_no_more_values():
    logger = Logger([Recording()])
    state = logger.init()
    logger.finish(state)
    logger.summary(state, {"late": 1.0})
    with pytest.raises(Exception, match="arrived after `logger.finish` closed it"):
        logger.flush()
    logger.close()


@pytest.mark.parametrize(("values", "error", "words"), [
    ({"x": jnp.ones(2)}, TypeError, ["'x'", "shape (2,)", "one scalar per run"]),
    ({"x": np.array(["a"])}, TypeError, ["'x'", "one scalar per run"]),
    ({"x": jnp.array(1 + 2j)}, TypeError, ["'x'", "complex64"]),
    ({"x": [1, 2]}, TypeError, ["'x' = list"]),
    ({"x": None}, TypeError, ["'x' = NoneType"]),
    ({"status": 1}, ValueError, ["'status'", "a column of every run"]),
    ({"lr": 1}, ValueError, ["'lr'", "a metadata key of a run of this logger"]),
    ({"cfg.depth": 1}, ValueError, ["'cfg.depth'", "a metadata key"]),
    ({"loss.max": 1}, ValueError, ["'loss.max'", "a key's max"]),
    ({3: 1}, TypeError, ["non-empty strings"]),
])
def test_what_is_no_summary_value_is_refused_at_the_call_naming_it(values, error, words):
    backend = Recording()
    logger = Logger([backend])
    state = logger.init(lr=0.1, cfg={"depth": 2})
    with pytest.raises(error) as raised:
        logger.summary(state, values)
    for word in words:
        assert word in str(raised.value)
    logger.finish(state)
    assert summaries(backend) == []
    logger.close()


def test_a_dict_is_what_summary_takes_and_its_state_must_be_this_loggers():
    logger, other = Logger([Recording()]), Logger([Recording()])
    state = logger.init()
    with pytest.raises(TypeError, match="takes a dict of names to values, got list"):
        logger.summary(state, [("a", 1)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="got a state that lox logger"):
        other.summary(state, {"a": 1})
    logger.close()
    other.close()
