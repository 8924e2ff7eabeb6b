"""Runs opened inside `jax.set_mesh` (explicit and auto axes, eight CPU devices,
see conftest.py): the states a Logger hands back are usable by any program,
under the mesh and after it. Each run's logs, as the memory backend received
them, equal the computation done by hand.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from devices import DEVICES
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import lox

SEEDS, STEPS = 2, 3
W0 = np.arange(8.0, dtype=np.float32).reshape(SEEDS, 4)  # one row per seed
LRS = np.array([0.5, 0.25], np.float32)


@pytest.fixture(params=["Explicit", "Auto"])
def mesh(request):
    assert len(jax.devices()) == DEVICES
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(getattr(AxisType, request.param),) * 2)


def train(w):
    def step(w, i):
        lox.log({"w": w, "norm": jnp.sum(w * w)}, step=i)
        return w * 0.5 + 1.0, None

    return jax.lax.scan(step, w, jnp.arange(STEPS))[0]


def by_hand(w):
    ws = [np.asarray(w, np.float32)]
    for _ in range(STEPS - 1):
        ws.append(ws[-1] * 0.5 + 1.0)
    return {"w": np.stack(ws), "norm": np.array([np.sum(w * w) for w in ws])}


def assert_run_logged(logger, name, w):
    (run,) = [run for run in logger.runs() if run.name == name]
    logs = logger.backends[0].logs(run.run_id)
    want = by_hand(w)
    assert list(logs) == ["w", "norm"], name
    for key in ("w", "norm"):
        np.testing.assert_allclose(logs[key], want[key], rtol=1e-6, err_msg=f"{name}: {key}")
        assert logs.step[key].tolist() == list(range(STEPS)), name
    return run


def test_vmapped_runs_opened_in_a_mesh_take_logs_from_jit(mesh):
    logger = lox.loggers.MemoryLogger()
    hows = ("spool", "tap", "log")
    with jax.set_mesh(mesh):
        keys = jax.random.split(jax.random.key(0), SEEDS)
        runs = {how: jax.vmap(lambda key, lr, how=how: logger.init(key, lr=lr, name=how))(keys, LRS) for how in hows}
        w0 = jax.device_put(W0, NamedSharding(mesh, P(None, "data")))  # each seed's w sharded over "data"
        out = jax.jit(jax.vmap(lambda run, w: logger.spool(train, run)(w)))(runs["spool"], w0)
        jax.jit(jax.vmap(lambda run, w: logger.tap(train, run)(w)))(runs["tap"], w0)
        jax.jit(jax.vmap(lambda run, w: logger.log(run, lox.spool(train)(w)[1])))(runs["log"], w0)
    np.testing.assert_allclose(out, [by_hand(w)["w"][-1] * 0.5 + 1.0 for w in W0], rtol=1e-6)
    for how in hows:
        logger.finish(runs[how])
    key_data = np.asarray(jax.random.key_data(keys)).tolist()
    for how in hows:
        for seed in range(SEEDS):
            run = assert_run_logged(logger, f"{how}-{seed}", W0[seed])
            assert run.metadata == {"lr": float(LRS[seed]), "name": how, "key": key_data[seed]}


def test_runs_opened_eagerly_and_under_jit_in_a_mesh_are_used_in_it_and_after_it(mesh):
    logger = lox.loggers.MemoryLogger()
    spool_in_jit = jax.jit(lambda run, w: logger.spool(train, run)(w))
    vmapped_tap = jax.jit(jax.vmap(lambda run, w: logger.tap(train, run)(w)))
    with jax.set_mesh(mesh):
        eager = logger.init(jax.random.key(1), name="eager")
        jitted = jax.jit(lambda key: logger.init(key, name="jit"))(jax.random.key(2))
        seeds = jax.vmap(lambda key: logger.init(key, name="vmap"))(jax.random.split(jax.random.key(3), SEEDS))
        jit_seeds = jax.jit(jax.vmap(lambda key: logger.init(key, name="jit(vmap)")))(
            jax.random.split(jax.random.key(4), SEEDS)
        )
        after = [logger.init(name="after"), jax.vmap(lambda key: logger.init(key, name="vmap-after"))(
            jax.random.split(jax.random.key(5), SEEDS))]
        spool_in_jit(eager, W0[0])  # in the mesh
        jax.jit(lambda run, w: logger.log(run, lox.spool(train)(w)[1]))(jitted, W0[1])
        vmapped_tap(seeds, W0)
        jax.vmap(lambda run, w: logger.spool(train, run)(w))(jit_seeds, W0)  # eager vmap
    # After the block, with no mesh in context.
    spool_in_jit(after[0], W0[1])
    vmapped_tap(after[1], W0)
    for state in (eager, jitted, seeds, jit_seeds, *after):
        logger.finish(state)
    assert_run_logged(logger, "eager", W0[0])
    assert_run_logged(logger, "jit", W0[1])
    assert_run_logged(logger, "after", W0[1])
    for seed in range(SEEDS):
        for name in ("vmap", "jit(vmap)", "vmap-after"):
            assert_run_logged(logger, f"{name}-{seed}", W0[seed])
