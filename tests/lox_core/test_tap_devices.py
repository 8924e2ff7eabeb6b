"""`lox.tap` on several devices: sharded `jit` and `shard_map` (eight CPU devices, see conftest.py).

Ordered host callbacks are refused on more than one device; lox orders its
calls by data dependency instead, so these programs run and each device's
events arrive in program order.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from devices import DEVICES
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from logs_testing import tapped

import lox


@pytest.fixture(scope="module")
def mesh():
    assert len(jax.devices()) == DEVICES  # the suite's flag took effect
    return jax.make_mesh((DEVICES,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))


def walk(x, steps=20):
    """A scan that logs twice per step, so that order within a step matters too."""

    def step(c, i):
        c = c + jnp.sum(x) * 0 + 1.0
        lox.log({"before": c}, step=i)
        lox.log({"after": -c}, step=i)
        return c, None

    return jax.lax.scan(step, jnp.zeros(()), jnp.arange(steps))[0]


def test_raw_ordered_callbacks_fail_on_several_devices_and_tap_does_not(mesh):
    x = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("d")))

    def raw(x):
        jax.debug.callback(lambda v: None, x.sum(), ordered=True)
        return x

    with pytest.raises(ValueError, match="ordered effects are not supported for more than 1 device"):
        jax.jit(raw)(x)
    events = []
    lox.tap(walk, events.append)(x)
    assert len(events) == 40


def test_sharded_jit_delivers_every_event_once_in_program_order(mesh):
    x = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("d")))

    def f(x):
        lox.log({"total": x.sum(), "x": x}, step=0)
        y = walk(x)
        lox.log({"end": y})
        return x * y

    events = []
    out = lox.tap(f, events.append)(x)
    np.testing.assert_allclose(out, np.arange(16.0) * 20)
    assert [list(e) for e in events[:3]] == [["total", "x"], ["before"], ["after"]]
    np.testing.assert_array_equal(events[0]["x"], np.arange(16.0))  # the whole array, not a shard
    logs = tapped(events)
    np.testing.assert_array_equal(logs["before"], np.arange(1.0, 21.0))
    np.testing.assert_array_equal(logs.step["after"], np.arange(20))
    _, spooled = lox.spool(f)(x)  # spool of a sharded program: the same logs
    for key in spooled:
        np.testing.assert_array_equal(np.asarray(spooled[key]), logs[key])


def test_shard_map_calls_back_per_device_in_program_order(mesh):
    x = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("d")))

    def per_device(x):
        who = jax.lax.axis_index("d")

        def step(c, i):
            c = c + x.sum()
            lox.log({"c": c, "who": who}, step=i)
            return c, None

        c, _ = jax.lax.scan(step, jnp.sum(x) * 0, jnp.arange(30))
        return x * 2

    sharded = jax.shard_map(per_device, mesh=mesh, in_specs=P("d"), out_specs=P("d"))
    events = []
    out = lox.tap(sharded, events.append)(x)
    np.testing.assert_allclose(out, np.arange(16.0) * 2)
    assert len(events) == DEVICES * 30
    for device in range(DEVICES):
        mine = [e for e in events if int(e["who"]) == device]
        shard_sum = np.arange(16.0).reshape(DEVICES, 2)[device].sum()
        assert [e.step for e in mine] == list(range(30))  # program order
        np.testing.assert_allclose([float(e["c"]) for e in mine], shard_sum * np.arange(1, 31))


def test_tap_inside_shard_map_and_buffered_loops_per_device(mesh):
    x = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("d")))
    blocks = []

    def per_device(x):
        who = jax.lax.axis_index("d")

        def step(c, i):
            lox.log({"i": i, "who": who}, step=i)
            return c, None

        jax.lax.scan(step, 0, jnp.arange(10))
        return x

    tapped = lox.tap(per_device, blocks.append, buffer=4)
    jax.jit(jax.shard_map(tapped, mesh=mesh, in_specs=P("d"), out_specs=P("d")))(x)
    jax.effects_barrier()
    assert len(blocks) == DEVICES * 3
    for device in range(DEVICES):
        mine = [b for b in blocks if set(b["who"].tolist()) == {device}]
        assert [b["i"].tolist() for b in mine] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def sum_per_device(mesh):
    """A shard_map that logs the sum of each device's shard."""

    def per_device(x):
        lox.log({"s": x.sum()})
        return x + 1

    return jax.shard_map(per_device, mesh=mesh, in_specs=P("d"), out_specs=P("d"))


def test_nolog_through_shard_map_and_spool_refuses_with_a_clear_message(mesh):
    x = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("d")))
    sharded = sum_per_device(mesh)
    np.testing.assert_allclose(lox.nolog(sharded)(x), np.arange(16.0) + 1)
    with pytest.raises(ValueError, match=r"`lox.spool` cannot collect logs \(keys 's'\) from inside `jax.shard_map`"):
        lox.spool(sharded)(x)


def test_a_shard_map_inside_a_buffered_loop_is_refused(mesh):
    x = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("d")))
    sharded = sum_per_device(mesh)

    def f(x):
        return jax.lax.scan(lambda c, _: (sharded(c), None), x, None, length=3)[0]

    with pytest.raises(
        NotImplementedError, match=r"cannot buffer the logs \(keys 's'\) of a `jax.shard_map` inside a buffered loop"
    ):
        lox.tap(f, print, buffer=4)(x)
    events = []
    lox.tap(f, events.append)(x)
    assert len(events) == 3 * DEVICES


def test_logger_tap_on_a_sharded_program(mesh, tmp_path):
    x = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("d")))
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    state = logger.init()
    logger.tap(walk, state)(x)
    logger.finish(state)
    logger.close()
    (logs,) = lox.load(str(tmp_path)).values()
    np.testing.assert_array_equal(logs["before"], np.arange(1.0, 21.0))
