"""The router's bulk copy of device arrays to the host (lox_backends/logger/transfer.py),
against copying each array by itself. On this CPU-only suite the stacking path is
forced with `stack_on_cpu` (on an accelerator it is the default)."""

import jax
import jax.numpy as jnp
import numpy as np
from devices import DEVICES
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import lox
from lox_backends.logger import transfer


def by_hand(trees):
    return [jax.tree_util.tree_map(np.asarray, tree) for tree in trees]


def assert_same(got, want):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        assert isinstance(g, np.ndarray) and g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def test_many_small_arrays_of_several_shapes_and_dtypes_arrive_as_each_would():
    rng = np.random.default_rng(0)
    trees = []
    for i in range(transfer.CHUNK * 2 + 7):  # three chunks of each group, the last one padded
        step = jnp.asarray([i], jnp.int32)
        trees.append(lox.logdict(
            {"loss": jnp.asarray(rng.normal(size=1), jnp.float32), "h": jnp.asarray(rng.normal(size=(1, 3))),
             "flag": jnp.asarray([i % 2 == 0]), "host": np.float32([i])},
            {"step": {"loss": step, "h": step, "flag": step, "host": step}}))
    got = transfer.to_host(trees, stack_on_cpu=True)
    assert_same(got, by_hand(trees))
    assert all(isinstance(t, lox.logdict) for t in got)


def test_an_array_shared_by_keys_stays_one_array_and_large_or_sharded_ones_cross_alone():
    step = jnp.asarray([3], jnp.int32)
    big = jnp.arange(transfer.SMALL + 1.0)
    mesh = jax.make_mesh((DEVICES,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    sharded = jax.device_put(jnp.arange(2.0 * DEVICES), NamedSharding(mesh, P("d")))
    trees = [{"a": step, "b": step, "big": big, "sharded": sharded} for _ in range(3)]
    got = transfer.to_host(trees, stack_on_cpu=True)
    assert_same(got, by_hand(trees))
    assert got[0]["a"] is got[0]["b"]  # copied once, as the Arrow conversion expects of a shared step


def test_on_a_cpu_the_router_copies_nothing_here():
    trees = [{"x": jnp.ones(2)}]
    assert transfer.to_host(trees) is trees  # where JAX's default device is a CPU, arrays stay as they are
