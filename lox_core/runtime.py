"""What lox reads of the running JAX program and job, for code outside lox_core.

`lox_core._compat` reads JAX's internals and is lox_core's own; the Logger
(`lox_backends.logger`) needs four of its readers, and takes them from here:

- `distributed_runtime`: ``(process index, process count, key-value client)``
  of the job `jax.distributed.initialize` joined, or ``(0, 1, None)``.
- `staging_trace`: the trace building the jaxpr that equations bound now end up
  in (under `jax.jit`), or None when nothing is being staged.
- `manual_axes`: the mesh axes of the enclosing `shard_map` or `pmap`.
- `wait_for_effects`: wait for the host callbacks of the programs dispatched,
  as `jax.effects_barrier()` does, without raising what a callback raised.
"""

from lox_core._compat import distributed_runtime as distributed_runtime
from lox_core._compat import manual_axes as manual_axes
from lox_core._compat import staging_trace as staging_trace
from lox_core._compat import wait_for_effects as wait_for_effects
