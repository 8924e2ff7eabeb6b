"""A data-parallel training job of 2 processes (`jax.distributed` on 127.0.0.1,
4 CPU devices each, gloo collectives), two seeds under `jax.vmap`, logged by lox
as one run per seed: the processes agree on the run ids and process 0 writes.

Run as is, it starts its two processes, waits for them, and reads the runs back.
On a cluster, each process calls `train(process_id, num_processes, coordinator, folder)`.
"""

import os
import socket
import subprocess
import sys


def train(process_id: int, num_processes: int, coordinator: str, folder: str) -> None:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"  # before JAX starts
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id)

    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import lox

    # The batch is sharded over the 8 devices of both processes; each process holds its half.
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(32, 2)
    y = x @ np.array([2.0, -1.0], np.float32) + 0.5
    sharding = NamedSharding(mesh, P("data"))
    xs, ys = (jax.make_array_from_callback(a.shape, sharding, lambda i, a=a: a[i]) for a in (x, y))

    def epoch(params, xs, ys, first_step):
        def step(params, i):
            def loss_fn(p):
                return jnp.mean((xs @ p["w"] + p["b"] - ys) ** 2)

            loss, grads = jax.value_and_grad(loss_fn)(params)
            lox.log({"loss": loss}, step=first_step + i)
            return jax.tree_util.tree_map(lambda p, g: p - 0.2 * g, params, grads), None

        return jax.lax.scan(step, params, jnp.arange(10))[0]

    # After jax.distributed.initialize, on every process, in the same order.
    logger = lox.loggers.from_config(f"parquet:{folder}")
    runs = jax.vmap(lambda key: logger.init(key, name="seed"))(jax.random.split(jax.random.key(0), 2))
    params = {"w": jax.random.normal(jax.random.key(1), (2, 2)), "b": jnp.zeros(2)}  # a row per seed
    train_epoch = jax.jit(jax.vmap(lambda run, p, xs, ys, s: logger.spool(epoch, run)(p, xs, ys, s),
                                   in_axes=(0, 0, None, None, None)))
    for e in range(5):
        params = train_epoch(runs, params, xs, ys, 10 * e)
    logger.finish(runs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    if len(sys.argv) > 1:  # one process of the job
        train(int(sys.argv[1]), 2, sys.argv[2], sys.argv[3])
    else:
        coordinator, folder = f"127.0.0.1:{free_port()}", "multi-process-runs"
        # (Their stdout holds only gloo's connection messages.)
        jobs = [subprocess.Popen([sys.executable, __file__, str(i), coordinator, folder], stdout=subprocess.DEVNULL)
                for i in range(2)]
        assert all(job.wait(timeout=300) == 0 for job in jobs), "a process of the job failed"

        import lox
        from lox_backends.runstore.reader import runs

        print(f"{len(os.listdir(folder))} entries in {folder}: a run per seed, and their batch files")
        for info, logs in zip(runs(folder), lox.load(folder).values(), strict=True):
            steps = logs.step["loss"]
            print(f"{info['name']}: {len(logs['loss'])} losses at steps {steps[0]}..{steps[-1]}, "
                  f"from {logs['loss'][0]:.3f} to {logs['loss'][-1]:.3f}")
