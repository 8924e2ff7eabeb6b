"""One process of a job for tests/lox_backends/logger/test_multiprocess.py (also run alone, as the
single-process reference).

    python multiprocess_job.py SCENARIO PROCESS_ID NUM_PROCESSES PORT FOLDER MODE

8 CPU devices in all (8 / NUM_PROCESSES per process), gloo collectives. Prints
one JSON line with what the test checks (run ids, tapped events, errors),
except where it ends with an uncaught exception (the scenarios "raise-...").
The scenarios "train-until-killed" and "finish-apart" (tests/lox_backends/logger/test_process_death.py)
print a line per step instead, and the first never ends by itself.
"""

import json
import os
import sys
import time


def main(scenario: str, pid: int, count: int, port: str, folder: str, mode: str) -> dict:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={8 // count}"  # before JAX starts
    import jax

    import lox

    report: dict = {"process": pid}
    if scenario == "early":  # a logger made before the job is joined
        early = lox.loggers.from_config(f"parquet:{folder}")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if count > 1:
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=count, process_id=pid,
                                   initialization_timeout=120)
    if scenario in ("train-until-killed", "finish-apart"):
        return process_death(scenario, pid, folder, mode)

    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    data = np.arange(64.0, dtype=np.float32).reshape(16, 4) / 64
    batch = jax.make_array_from_callback(data.shape, NamedSharding(mesh, P("data")), lambda index: data[index])

    def train_step(w, batch, i):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((batch @ w - 1.0) ** 2))(w)
        lox.log({"loss": loss, "grad_norm": jnp.linalg.norm(grad)}, step=i)
        return w - 0.1 * grad

    if scenario == "train":
        logger = lox.loggers.from_config(f"parquet:{folder}", processes=mode)
        states = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), 2), lr=jnp.array([0.1, 0.2]))
        report["runs"] = [run.run_id for run in logger.runs()]

        def evaluate(state, w, b, i):
            return logger.tap(lambda w: lox.log({"eval": jnp.sum(b @ w)}, step=i), state)(w)

        step = jax.jit(jax.vmap(lambda state, w, b, i: logger.spool(train_step, state)(w, b, i),
                                in_axes=(0, 0, None, None)))
        evaluate = jax.jit(jax.vmap(evaluate, in_axes=(0, 0, None, None)))
        ws = jnp.stack([jnp.zeros(4), jnp.ones(4)])
        for i in range(3):
            ws = step(states, ws, batch, i)
            evaluate(states, ws, batch, i)
        first = jax.tree_util.tree_map(lambda s: s[0], states)
        # Outside jit: a value sharded across processes, and a replicated one.
        steps = {"step": {"batch": jnp.array([3]), "w": jnp.array([3])}}
        logger.log(first, lox.logdict({"batch": batch[None], "w": ws[0][None]}, steps))
        seen = []
        summed = lox.tap(lambda x: lox.log({"sum": jnp.sum(x)}, step=7), lambda e: seen.append(float(e["sum"])))
        jax.jit(summed)(batch)
        jax.effects_barrier()
        report["tapped"] = seen
        logger.finish(states)
    elif scenario == "local":  # programs on process-local arrays, which every process runs alike
        logger = lox.loggers.from_config(f"parquet:{folder}")
        states = jax.jit(jax.vmap(logger.init))(jax.random.split(jax.random.key(0), 3))
        report["runs"] = [run.run_id for run in logger.runs()]
        step = jax.jit(jax.vmap(lambda s, x: logger.spool(lambda x: (lox.log({"x": x}, step=0), 2 * x)[1], s)(x)))
        step(states, jnp.arange(3.0))
        tap = jax.jit(jax.vmap(lambda s, x: logger.tap(lambda x: (lox.log({"x": x}, step=1), 2 * x)[1], s)(x)))
        tap(states, jnp.arange(3.0))
        logger.finish(states)
    elif scenario == "active":  # every log the block does not capture goes to the states' runs
        logger = lox.loggers.from_config(f"parquet:{folder}", processes=mode)
        states = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), 2))
        report["runs"] = [run.run_id for run in logger.runs()]
        step = jax.jit(jax.vmap(train_step, in_axes=(0, None, None)))  # plain JAX: no logger in it

        def per_device(b):
            lox.log({"rows": b.sum()}, step=4)
            return b

        ws = jnp.stack([jnp.zeros(4), jnp.ones(4)])
        with logger.active(states):
            for i in range(3):
                ws = step(ws, batch, i)
            lox.log({"done": 1}, step=3)  # eager: every process runs it, process 0 writes it
            try:  # per device: each process's devices would log their own rows
                jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("data"), out_specs=P("data")))(batch)
            except ValueError as error:
                report["error"] = str(error)
        logger.finish(states)
    elif scenario == "refuse":  # a logger call inside shard_map: refused by default
        logger = lox.loggers.from_config(f"parquet:{folder}", processes=mode)
        state = logger.init()
        inside = jax.shard_map(lambda b: logger.spool(train_step, state)(jnp.ones(4), b, 0), mesh=mesh,
                               in_specs=P("data"), out_specs=P("data"))
        try:
            jax.jit(inside)(batch)
        except ValueError as error:
            report["error"] = str(error)
        logger.finish(state)
    elif scenario in ("raise-jit", "raise-local"):  # a tap callback raises: uncaught, where lox raises it

        def raising_callback(event):
            raise ValueError(f"boom on process {pid}")

        summed = lox.tap(lambda x: lox.log({"sum": jnp.sum(x)}, step=7), raising_callback)
        if scenario == "raise-jit":
            jax.jit(summed)(batch)  # its host call runs on the program's first device: process 0
            jax.effects_barrier()
        else:
            summed(jnp.arange(3.0))  # process-local: every process runs it, and its callback
    elif scenario == "resume":  # a run of an id written, resumed by another Logger, refused by a third
        def log_steps(value, steps):
            for step in steps:
                lox.log({"x": value}, step=step)

        first = lox.loggers.from_config(f"parquet:{folder}")
        state = first.init(run_id="job", lr=0.1)
        first.spool(log_steps, state)(1.0, [0, 1, 2])
        first.close()
        again = lox.loggers.from_config(f"parquet:{folder}")
        state = again.init(run_id="job", resume="allow", from_step=1)
        report["runs"] = [(run.run_id, run.resumed, run.from_step) for run in again.runs()]
        again.spool(log_steps, state)(2.0, [1, 2])
        again.close()
        third = lox.loggers.from_config(f"parquet:{folder}")
        try:
            third.init(run_id="job")
        except ValueError as error:
            report["error"] = str(error)
        third.close()
    elif scenario == "early":
        try:
            early.init()
        except RuntimeError as error:
            report["error"] = str(error)
    elif scenario == "mismatch":  # process 1 creates a logger process 0 does not
        if pid == 1:
            try:
                lox.loggers.from_config(f"parquet:{folder}", timeout=2.0)
            except TimeoutError as error:
                report["error"] = str(error)
    return report


def process_death(scenario: str, pid: int, folder: str, mode: str) -> dict:
    """Steps that sum a batch sharded over every device of the job (a collective, as a training step's
    gradient is): each step logs the sum times the step from jit (process 0's host call writes it) and, outside
    jit, the process index plus the step (each process's own value: written by process 0 with
    processes="first", by each process with "each"). A line "step I" on stdout once step I reached the logger.

    "train-until-killed": steps until the test kills a process (its peers then hang in the next step's
    collective); flush_every is 600 s, so what lox writes before that is what it writes when a peer is gone.
    "finish-apart": 3 steps; then the others finish and exit at once while process 0 goes on logging alone for
    13 s (longer than a watcher waits for a silent process: lox_backends.logger.processes.GONE_AFTER) before it
    finishes, or, with MODE "shutdown", every process finishes and calls `jax.distributed.shutdown()`, and
    process 0 lingers 13 s without the job."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import lox

    devices = len(jax.devices())
    mesh = jax.make_mesh((devices,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    data = np.arange(devices, dtype=np.float32)  # sums to devices * (devices - 1) / 2
    batch = jax.make_array_from_callback(data.shape, NamedSharding(mesh, P("data")), lambda index: data[index])
    processes = "each" if mode == "each" else "first"
    logger = lox.loggers.from_config(f"parquet:{folder}", flush_every=600.0, processes=processes)
    state = logger.init()

    def train_step(x, i):
        lox.log({"total": jnp.sum(x) * i}, step=i)
        return x

    step = jax.jit(lambda state, x, i: logger.spool(train_step, state)(x, i))

    def log_local(value: float, i: int) -> None:  # outside jit: one event of a value this process holds
        logger.log(state, lox.logdict({"local": np.array([value], np.float32)}, {"step": {"local": np.array([i])}}))
    for i in range(3 if scenario == "finish-apart" else 10_000):
        batch = step(state, batch, i)
        log_local(pid * 100 + i, i)
        jax.block_until_ready(batch)
        jax.effects_barrier()  # this step's logs reached the logger
        print(f"step {i}", flush=True)
        time.sleep(0.2)
    runs = [run.run_id for run in logger.runs()]
    if mode == "shutdown":
        logger.finish(state)
        jax.distributed.shutdown()
        if pid == 0:
            time.sleep(13.0)  # without the job, while the others are gone
    elif pid == 0:  # the others finish and exit first, while this one logs on alone
        for i in range(3, 16):
            time.sleep(1.0)
            log_local(i, i)
        logger.finish(state)
    else:
        logger.finish(state)
    return {"process": pid, "runs": runs}


if __name__ == "__main__":  # not when pytest collects this folder
    scenario, pid, count, port, folder, mode = sys.argv[1:7]
    print(json.dumps(main(scenario, int(pid), int(count), port, folder, mode)), flush=True)
