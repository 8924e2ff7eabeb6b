"""`lox.log` of sharded arrays: meshes with explicit axes (the default of
`jax.make_mesh` since JAX 0.9), auto axes, and manual axes inside `jax.shard_map`,
on eight CPU devices (see conftest.py). Logged values equal the unsharded
computation, and the event axis lox adds is never sharded.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from devices import DEVICES
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import lox

STEPS = 3


@pytest.fixture(params=["default", "Explicit", "Auto"])
def mesh(request):
    assert len(jax.devices()) == DEVICES
    if request.param == "default":
        return jax.make_mesh((DEVICES,), ("d",))
    return jax.make_mesh((DEVICES,), ("d",), axis_types=(getattr(AxisType, request.param),))


def sharded(mesh):
    x = jnp.arange(2.0 * DEVICES).reshape(DEVICES, 2) / DEVICES
    return jax.device_put(x, NamedSharding(mesh, P("d")))


def program(x):
    lox.log({"x": x, "total": x.sum()}, step=0)

    def body(c, i):
        c = jnp.tanh(c * 1.5)
        lox.log({"c": c}, step=i)
        return c, None

    return jax.lax.scan(body, x, jnp.arange(1, STEPS + 1))[0]


def by_hand(x):
    """The same computation on one device, the logged values carried out by hand."""
    x = np.asarray(x)
    cs = [x]
    for _ in range(STEPS):
        cs.append(np.tanh(cs[-1] * 1.5))
    return {"out": cs[-1], "x": x[None], "total": x.sum()[None], "c": np.stack(cs[1:])}


def assert_unsharded_event_axis(logs):
    for key, value in logs.items():
        assert value.sharding.shard_shape(value.shape)[0] == value.shape[0], key


def assert_logged_as_by_hand(logs, want):
    for key in ("x", "total", "c"):
        np.testing.assert_allclose(np.asarray(logs[key]), want[key], rtol=1e-6, err_msg=key)
    assert logs.step["c"].tolist() == list(range(1, STEPS + 1))


def test_spooled_logs_of_sharded_arrays_equal_the_unsharded_computation(mesh):
    x = sharded(mesh)
    want = by_hand(x)
    with jax.set_mesh(mesh):
        for spooled in (lox.spool(program), jax.jit(lox.spool(program))):
            out, logs = spooled(x)
            np.testing.assert_allclose(out, want["out"], rtol=1e-6)
            assert out.sharding.is_equivalent_to(x.sharding, out.ndim)
            assert_logged_as_by_hand(logs, want)
            assert_unsharded_event_axis(logs)
    out, logs = lox.spool(program)(x)  # without a mesh in context: the arrays carry it
    assert_logged_as_by_hand(logs, want)


def test_tapped_unlogged_and_printed_sharded_arrays(mesh, capfd):
    x = sharded(mesh)
    want = by_hand(x)
    events = []
    with jax.set_mesh(mesh):
        out = lox.tap(program, events.append)(x)
        np.testing.assert_allclose(out, want["out"], rtol=1e-6)
        assert [list(e) for e in events] == [["x", "total"]] + [["c"]] * STEPS
        np.testing.assert_allclose(events[0]["x"], want["x"][0], rtol=1e-6)  # as logged: no event axis
        np.testing.assert_allclose(np.stack([e["c"] for e in events[1:]]), want["c"], rtol=1e-6)
        np.testing.assert_allclose(lox.nolog(program)(x), want["out"], rtol=1e-6)
        capfd.readouterr()
        jax.jit(program)(x)  # no transform: the default console output
        jax.effects_barrier()
    events = [line for line in capfd.readouterr().out.splitlines() if line.startswith("[step=")]
    assert sorted(line.split("]")[0] for line in events) == [f"[step={i}" for i in range(STEPS + 1)]
    assert any(line.startswith("[step=0] x=") for line in events)


def test_loggers_write_sharded_arrays(mesh):
    x = sharded(mesh)
    want = by_hand(x)
    with jax.set_mesh(mesh):
        logger = lox.loggers.MemoryLogger()
        hows = ("spool", "tap", "log", "jit(spool)", "jit(tap)", "jit(log)")
        runs = {how: logger.init(name=how) for how in hows}  # under a mesh too
        logger.spool(program, runs["spool"])(x)
        logger.tap(program, runs["tap"])(x)
        out, logs = lox.spool(program)(x)
        logger.log(runs["log"], logs)
        # Inside an outer jit over the devices: no ordered effect, which JAX refuses there.
        jax.jit(lambda run, x: logger.spool(program, run)(x))(runs["jit(spool)"], x)
        jax.jit(lambda run, x: logger.tap(program, run)(x))(runs["jit(tap)"], x)
        jax.jit(lambda run, x: logger.log(run, lox.spool(program)(x)[1]))(runs["jit(log)"], x)
        for run in runs.values():
            logger.finish(run)
    assert [run.name for run in logger.runs()] == list(hows)
    for run in logger.runs():
        written = logger.backends[0].logs(run.run_id)
        for key in ("x", "total", "c"):
            np.testing.assert_allclose(np.asarray(written[key]), want[key], rtol=1e-6, err_msg=f"{run.name}: {key}")


def test_inside_shard_map_each_device_logs_its_own_block(mesh):
    x = sharded(mesh)

    def block(x):
        lox.log({"block": x, "device_sum": x.sum()})
        return 2 * x

    mapped = jax.shard_map(block, mesh=mesh, in_specs=P("d"), out_specs=P("d"))
    events = []
    with jax.set_mesh(mesh):
        out = lox.tap(mapped, events.append)(x)
        np.testing.assert_allclose(out, 2 * np.asarray(x))
        np.testing.assert_allclose(lox.nolog(mapped)(x), 2 * np.asarray(x))
        with pytest.raises(
            ValueError, match=r"cannot collect logs \(keys 'block', 'device_sum'\) from inside `jax.shard_map`"
        ):
            lox.spool(mapped)(x)
    assert len(events) == DEVICES
    blocks = sorted(e["block"].tolist() for e in events)
    assert blocks == sorted(np.asarray(x).reshape(DEVICES, 1, 2).tolist())
    for e in events:
        np.testing.assert_allclose(e["device_sum"], e["block"].sum(), rtol=1e-6)


def test_loggers_inside_shard_map_and_pmap_write_each_devices_block(mesh):
    x = sharded(mesh)

    def block(x):
        lox.log({"block": x, "device_sum": x.sum()}, step=0)
        return 2 * x

    logger = lox.loggers.MemoryLogger()
    hows = ("shard_map(spool)", "shard_map(tap)", "shard_map(log)", "pmap(spool)", "pmap(tap)")
    runs = {how: logger.init(name=how) for how in hows}

    def in_shard_map(f):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("d"), out_specs=P("d")))

    with jax.set_mesh(mesh):
        in_shard_map(lambda x: logger.spool(block, runs["shard_map(spool)"])(x))(x)
        in_shard_map(lambda x: logger.tap(block, runs["shard_map(tap)"])(x))(x)
        def log_block(x):
            logs = {"block": x[None], "device_sum": x.sum()[None]}
            logger.log(runs["shard_map(log)"], lox.logdict(logs, {"step": {k: jnp.zeros(1, jnp.int32) for k in logs}}))
            return 2 * x

        in_shard_map(log_block)(x)
    local = np.asarray(x).reshape(DEVICES, 1, 2)
    jax.pmap(lambda x: logger.spool(block, runs["pmap(spool)"])(x))(local)
    jax.pmap(lambda x: logger.tap(block, runs["pmap(tap)"])(x))(local)
    for run in runs.values():
        logger.finish(run)
    for run in logger.runs():
        written = logger.backends[0].logs(run.run_id)
        # One event per device, each with its own block (in the order the devices called).
        assert sorted(written["block"].tolist()) == sorted(local.tolist()), run.name
        np.testing.assert_allclose(written["device_sum"], written["block"].sum(axis=(1, 2)), rtol=1e-6)


def test_padded_series_of_sharded_arrays_keep_their_sharding(mesh):
    x = sharded(mesh)

    def branches(x):  # a key logged in one branch only, and a while loop under `max_events`
        def step(c, i):
            jax.lax.cond(i % 2 == 0, lambda: (lox.log({"even": c}, step=i), None)[1], lambda: None)
            return c * 2.0, None

        c = jax.lax.scan(step, x, jnp.arange(4))[0]

        def body(carry):
            i, c = carry
            lox.log({"halved": c}, step=i)
            return i + 1, c / 2.0

        return jax.lax.while_loop(lambda carry: carry[0] < 3, body, (0, c))[1]

    xs = np.asarray(x)
    with jax.set_mesh(mesh):
        out, logs = lox.spool(branches, max_events=5)(x)
        blocks = []
        tapped = lox.tap(branches, blocks.append, buffer=2)(x)
    np.testing.assert_allclose(out, xs * 16 / 8, rtol=1e-6)
    np.testing.assert_allclose(tapped, out, rtol=1e-6)
    assert logs.valid["even"].tolist() == [True, False, True, False]
    np.testing.assert_allclose(logs.trim()["even"], [xs, xs * 4], rtol=1e-6)
    np.testing.assert_allclose(logs.trim()["halved"], [xs * 16, xs * 8, xs * 4], rtol=1e-6)
    assert_unsharded_event_axis(logs)
    tapped_even = np.concatenate([b["even"] for b in blocks if "even" in b])
    np.testing.assert_allclose(tapped_even, [xs, xs * 4], rtol=1e-6)
