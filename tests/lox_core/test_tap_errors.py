"""A tap callback that raises: its own exception, raised where lox gets control
back (the eager call, `jax.effects_barrier()`, a logger call), never XLA's
"CpuCallback error"; nothing delivered after it until then; printed at exit
if nothing raised it (`lox_core/failures.py`). (Multi-process jobs:
tests/lox_backends/logger/test_multiprocess.py.)"""

import os
import pathlib
import subprocess
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lox

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def quiet():
    lox.set_default("off")
    yield
    lox.set_default("console")


def train(xs):
    def step(c, x):
        c = c + x
        lox.log({"loss": c, "acc": -c}, step=x)
        return c, None

    return jax.lax.scan(step, 0, xs)[0]


class Failing:
    """A callback that keeps the steps it got and raises at step `at` (a block holding it, with `buffer`)."""

    def __init__(self, at: int):
        self.at, self.steps = at, []

    def check(self, event):
        steps = np.atleast_1d(event.step["loss"] if isinstance(event, lox.logdict) else event.step).tolist()
        if self.at in steps:
            raise ValueError(f"loss too high at step {self.at}")
        self.steps += steps


def innermost(error: BaseException) -> str:
    """The function the traceback ends in: the one that raised."""
    return traceback.extract_tb(error.__traceback__)[-1].name


def test_the_eager_call_raises_the_callbacks_own_exception_with_a_note_naming_it():
    failing = Failing(at=2)
    # pytest matches the message and the notes, one a line.
    with pytest.raises(ValueError, match=r"^loss too high at step 2\nraised by lox\.tap callback Failing\.check "
                                         r"while delivering keys 'loss', 'acc'$") as raised:
        lox.tap(train, failing.check)(jnp.arange(5))
    assert str(raised.value) == "loss too high at step 2"  # the same exception: its message, a note added
    assert innermost(raised.value) == "check"  # the user's frame is where the traceback ends
    # Events before it were delivered, none after it.
    assert failing.steps == [0, 1]
    # Raised once: the next call delivers every event again.
    jax.effects_barrier()
    events = []
    assert int(lox.tap(train, events.append)(jnp.arange(5))) == 10
    assert [e.step for e in events] == [0, 1, 2, 3, 4]


def test_inside_jit_the_next_effects_barrier_raises_it():
    failing = Failing(at=1)
    out = jax.jit(lox.tap(train, failing.check, prefix="train/"))(jnp.arange(4))
    assert int(out) == 6  # XLA never saw an error: the program ran to its end
    with pytest.raises(ValueError, match=r"^loss too high at step 1\nraised by lox\.tap callback Failing\.check "
                                         r"while delivering keys 'train/loss', 'train/acc'$") as raised:
        jax.effects_barrier()
    assert innermost(raised.value) == "check"
    assert failing.steps == [0]
    jax.effects_barrier()  # raised once


def test_under_vmap_the_elements_after_the_failing_one_are_not_delivered():
    seen = []

    def check(event):
        if int(event["loss"]) == 12:
            raise RuntimeError("element 1 at step 1")
        seen.append((int(event.step), int(event["loss"])))

    xs = jnp.array([[1, 2, 3], [10, 2, 5], [100, 1, 1]])
    with pytest.raises(RuntimeError, match=r"^element 1 at step 1\nraised by lox\.tap callback test_under_vmap_\w+"
                                           r"\.<locals>\.check while delivering keys 'loss', 'acc'$") as raised:
        jax.vmap(lox.tap(train, check))(xs)
        jax.effects_barrier()
    assert innermost(raised.value) == "check"
    # One host call per step carries the 3 elements: step 0 whole, step 1 up to element 1.
    assert seen == [(1, 1), (10, 10), (100, 100), (2, 3)]


def test_with_buffer_the_blocks_after_the_failing_one_are_not_delivered():
    failing = Failing(at=5)
    with pytest.raises(ValueError, match=r"^loss too high at step 5\nraised by lox\.tap callback Failing\.check "
                                         r"while delivering keys 'loss', 'acc'$") as raised:
        lox.tap(train, failing.check, buffer=3)(jnp.arange(10))
    assert innermost(raised.value) == "check"
    assert failing.steps == [0, 1, 2]  # the block of steps 3, 4, 5 raised; 6, 7, 8 and 9 were not delivered


def test_a_logger_call_raises_a_tap_exception_pending_from_a_jitted_program():
    logger = lox.loggers.from_config("memory")
    state = logger.init()
    jax.jit(lox.tap(train, Failing(at=0).check))(jnp.arange(3))
    with pytest.raises(ValueError, match=r"^loss too high at step 0\n"):
        logger.spool(train, state)(jnp.arange(3))  # raised before the step runs
    assert int(logger.spool(train, state)(jnp.arange(3))) == 3  # nothing pending any more
    logger.finish(state)
    assert logger.backends[0].logs()["loss"].tolist() == [0, 1, 3]  # the second step's only


class Unprintable(str):  # a str, which metadata may hold, that fails when the run is named
    def __str__(self):
        raise TypeError("this name cannot be printed")


def test_logger_init_raises_what_its_host_call_raised():
    logger = lox.loggers.from_config("memory")
    with pytest.raises(TypeError, match=r"^this name cannot be printed\nraised by `logger\.init` of lox logger 'lox' "
                                        r"while opening runs$") as raised:
        logger.init(name=Unprintable("unnamed"))
    assert innermost(raised.value) == "__str__"
    state = logger.init(name="fine")  # the logger still works
    logger.finish(state)
    assert [run.name for run in logger.runs()] == ["fine"]
    logger.close()


def test_an_exception_nothing_raised_is_printed_at_exit_and_fails_the_process(tmp_path):
    script = tmp_path / "unraised.py"
    script.write_text(
        "import jax, jax.numpy as jnp, lox\n"
        "def f(x):\n"
        "    lox.log({'loss': x})\n"
        "    return x\n"
        "def complain(event):\n"
        "    raise KeyError('no such run')\n"
        "jax.jit(lox.tap(f, complain))(jnp.float32(1))\n"
        "print('the script ended')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1 and done.stdout == "the script ended\n"  # as if the exception had been raised
    assert done.stderr.startswith("lox: a host callback raised, and nothing raised it again before exit:\n")
    assert done.stderr.endswith(
        "in complain\n    raise KeyError('no such run')\nKeyError: 'no such run'\n"
        "raised by lox.tap callback complain while delivering keys 'loss'\n"
    )
