"""`lox_core/runtime.py`: the public names through which lox_backends reads the running JAX
program and job are `_compat`'s readers, and answer as the Logger expects them to: one
process outside a job, a staging trace under `jax.jit` only, manual axes in a `shard_map`
only (eight CPU devices, see conftest.py)."""

import jax
import jax.numpy as jnp
from devices import DEVICES
from jax.sharding import PartitionSpec as P

from lox_core import _compat, runtime


def test_runtime_names_are_the_compatibility_modules_readers():
    for name in ("distributed_runtime", "staging_trace", "manual_axes", "wait_for_effects"):
        assert getattr(runtime, name) is getattr(_compat, name), name


def test_outside_a_distributed_job_there_is_one_process_and_no_client():
    assert runtime.distributed_runtime() == (0, 1, None)


def test_a_staging_trace_under_jit_only_and_manual_axes_in_a_shard_map_only():
    seen = {}

    def f(x):
        seen["jit"] = runtime.staging_trace() is not None
        seen["axes outside"] = runtime.manual_axes()
        return x + 1

    seen["eager"] = runtime.staging_trace() is not None
    jax.jit(f)(jnp.zeros(()))
    mesh = jax.make_mesh((DEVICES,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))

    def per_device(x):
        seen["axes inside"] = runtime.manual_axes()
        return x

    jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("d"), out_specs=P("d")))(jnp.zeros(DEVICES))
    assert seen == {"eager": False, "jit": True, "axes outside": (), "axes inside": ("d",)}


def test_waiting_for_effects_returns_once_the_programs_callbacks_ran():
    calls = []
    jax.jit(lambda x: jax.debug.callback(lambda v: calls.append(float(v)), x))(jnp.float32(2.0))
    runtime.wait_for_effects()
    assert calls == [2.0]
