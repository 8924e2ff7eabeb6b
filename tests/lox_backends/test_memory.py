"""The memory backend: keeps runs, batches, events and flags as given, and reads a run
back as the concatenation of what it received."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pytest
from logs_testing import assert_logs_equal, event

import lox
from lox_backends import memory
from lox_backends.memory import MemoryBackend
from lox_backends.plugin import hooks
from lox_core.arrow import to_arrow
from lox_core.logdict import concat


def make_logs(start, n):
    step = np.arange(start, start + n)
    return lox.logdict(
        {"loss": (step * 0.5).astype(np.float32), "w": np.stack([step, -step], axis=1).astype(np.float64)},
        steps={"step": {"loss": step, "w": step}},
    )


RUN = hooks.RunInfo("run-0", name="demo", group="g", metadata={"lr": 0.1})


def test_batches_and_events_come_back_in_arrival_order():
    backend = MemoryBackend()
    backend.open_run(RUN)
    writes = [make_logs(0, 3), event(3, loss=np.float32(9.0)), make_logs(4, 2), event(6, loss=np.float32(7.0))]
    for w in writes:
        backend.write(RUN, to_arrow(w, run=RUN.run_id))
    assert [type(w) for w in backend.writes["run-0"]] == [pa.Table] * 4
    assert backend.tables() == backend.tables("run-0") == backend.writes["run-0"]
    logs = backend.logs()
    assert_logs_equal(logs, concat(writes))
    np.testing.assert_array_equal(logs.step["loss"], [0, 1, 2, 3, 4, 5, 6])


def test_runs_flags_and_flushes_are_recorded():
    backend = MemoryBackend()
    other = hooks.RunInfo("run-1", name="other", group="g", index=1)
    backend.open_run(RUN)
    backend.open_run(other)
    backend.flush()
    backend.close_run(RUN)
    assert backend.runs == {"run-0": RUN, "run-1": other}
    assert backend.closed == {"run-0": True, "run-1": False}
    assert (backend.flushes, backend.is_closed) == (1, False)
    backend.close_run(other)
    backend.close()
    assert backend.closed == {"run-0": True, "run-1": True} and backend.is_closed
    assert backend.logs("run-1") == {}


def test_a_spooled_and_a_tapped_loop_agree():
    def train(w):
        def step(w, i):
            lox.log({"loss": jnp.sum(w**2), "w": w}, step=i)
            return w * 0.9, None

        return jax.lax.scan(step, w, jnp.arange(6))[0]

    backend = MemoryBackend()
    spooled_run = hooks.RunInfo("spooled", name="s", group="g")
    tapped_run = hooks.RunInfo("tapped", name="t", group="g")
    _, spooled = lox.spool(train)(jnp.ones(3))
    backend.write(spooled_run, to_arrow(spooled, run="spooled"))
    write = lambda e: backend.write(tapped_run, to_arrow(e.to_logdict(), run="tapped"))  # noqa: E731
    jax.block_until_ready(lox.tap(train, write)(jnp.ones(3)))
    assert_logs_equal(backend.logs("spooled"), spooled)
    tapped = backend.logs("tapped")
    np.testing.assert_allclose(tapped["w"], spooled["w"], rtol=1e-6)
    np.testing.assert_array_equal(tapped.step["loss"], np.arange(6))


def test_logs_asks_which_run():
    backend = MemoryBackend()
    with pytest.raises(ValueError, match="holds no runs yet"):
        backend.logs()
    backend.open_run(RUN)
    backend.open_run(hooks.RunInfo("run-1", name="b", group="g"))
    with pytest.raises(ValueError, match=r"holds 2 runs \('run-0', 'run-1'\).*backend.logs\(run_id\)"):
        backend.logs()
    with pytest.raises(ValueError, match="has no run 'nope'; its runs are 'run-0', 'run-1'"):
        backend.logs("nope")
    with pytest.raises(TypeError, match=r"takes a run's id \(a str, such as `logger.runs\(\)\[0\].run_id`\), got dict"):
        backend.logs({"run": 0})  # a logger's state, say


def test_the_plugin_offers_the_backend():
    import pluggy

    manager = pluggy.PluginManager(hooks.PROJECT)
    manager.add_hookspecs(hooks.Hooks)
    manager.register(memory)
    (spec,) = [s for specs in manager.hook.lox_backends() for s in specs]
    assert spec.name == "memory" and spec.load() is MemoryBackend and spec.missing() == []


@pytest.mark.parametrize("spec, message", [
    ("memory:target", "the memory backend takes no target (got 'memory:target'); it keeps runs in this process. "
                      "Use 'memory'."),
    ("memory?keep=1", "the memory backend has no options (got 'keep'). E.g. 'memory'."),
])
def test_a_target_or_options_are_refused(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        lox.loggers.from_config(spec)


def test_a_logger_gives_each_seed_its_media_and_text_back_with_their_kinds():
    logger = lox.loggers.from_config("memory", name="media")
    states = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), 2))
    pixels = np.arange(2 * 3 * 4 * 4, dtype=np.uint8).reshape(2, 3, 4, 4, 1)  # (seeds, N, H, W, C)
    values = np.linspace(0.0, 1.0, 2 * 20, dtype=np.float32).reshape(2, 20) ** 2

    def step(x, v, i):
        lox.log({"img": lox.image(x), "h": lox.histogram(v, bins=3), "loss": jnp.mean(v)}, step=i)
        return i

    jax.jit(jax.vmap(lambda s, x, v: logger.spool(step, s)(x, v, 0)))(states, pixels, values)
    logger.log(states, {"note": "hello"}, step=1)
    logger.finish(states)
    backend = logger.backends[0]
    for seed, run in enumerate(logger.runs()):
        logs = backend.logs(run.run_id)
        assert logs.kind == {"img": "image", "h": "histogram", "loss": "scalar", "note": "text"}
        np.testing.assert_array_equal(logs["img"].pixels, pixels[seed][None])
        counts, edges = np.histogram(values[seed], bins=3)
        np.testing.assert_array_equal(logs["h"].counts, counts[None])
        np.testing.assert_allclose(logs["h"].edges, edges[None], rtol=1e-6)
        assert logs["note"].tolist() == ["hello"] and logs.step["note"].tolist() == [1]
        assert list(backend.summaries[run.run_id]["keys"]) == ["loss"]  # never text or media
