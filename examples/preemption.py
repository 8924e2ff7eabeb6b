"""A training job that is killed (SIGKILL, as a preemption ends it) and restarted from its
last checkpoint: lox goes on with the same runs, and each step is read once.

Two seeds train under `jax.vmap` (runs ``job-0`` and ``job-1``), checkpointing every 10
steps, by hand (pickle) or with Orbax. Run as is, it runs the job in a process of its own
that kills itself at step 37, runs it again (it restarts from the checkpoint of step 30),
and reads the runs back. On a cluster, the scheduler restarts ``job(...)``.
"""

import os
import pickle
import signal
import subprocess
import sys

STEPS, EVERY = 60, 10  # train 60 steps, checkpoint every 10


class Checkpoints:
    """Hand-written checkpoints: the training state as a pickle, one file per step."""

    def __init__(self, folder: str):
        self.folder = folder
        os.makedirs(folder, exist_ok=True)

    def latest(self) -> int | None:
        steps = [int(name.split("-")[1].split(".")[0]) for name in os.listdir(self.folder) if name.startswith("ckpt-")]
        return max(steps, default=None)

    def save(self, step: int, state) -> None:
        import jax

        path = os.path.join(self.folder, f"ckpt-{step}.pkl")
        with open(path + ".tmp", "wb") as f:
            pickle.dump(jax.device_get(state), f)
        os.replace(path + ".tmp", path)  # whole or absent, even if the job dies while saving

    def restore(self, step: int, like):
        with open(os.path.join(self.folder, f"ckpt-{step}.pkl"), "rb") as f:
            return pickle.load(f)

    def close(self) -> None:
        pass


class OrbaxCheckpoints:
    """The same with Orbax (`orbax-checkpoint`): its CheckpointManager saves in the background."""

    def __init__(self, folder: str):
        import orbax.checkpoint as ocp

        self.ocp = ocp
        self.manager = ocp.CheckpointManager(os.path.abspath(folder))

    def latest(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state) -> None:
        self.manager.save(step, args=self.ocp.args.StandardSave(state))

    def restore(self, step: int, like):
        return self.manager.restore(step, args=self.ocp.args.StandardRestore(like))

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def job(runs_folder: str, checkpoints, killed_at: int | None = None) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import lox

    x = np.linspace(-1, 1, 32, dtype=np.float32)
    y = 3.0 * x - 1.0

    def train_step(state, step):
        def loss_fn(params):
            return jnp.mean((params["w"] * x + params["b"] - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(state["params"])
        momentum = jax.tree_util.tree_map(lambda m, g: 0.9 * m + g, state["momentum"], grads)
        params = jax.tree_util.tree_map(lambda p, m: p - 0.05 * m, state["params"], momentum)
        lox.log({"loss": loss}, step=step)
        return {"params": params, "momentum": momentum}

    # A fresh start, or the state of the last checkpoint: the state before step `start`.
    keys = jax.random.split(jax.random.key(0), 2)
    params = jax.vmap(lambda key: {"w": jax.random.normal(key), "b": jnp.zeros(())})(keys)
    state = {"params": params, "momentum": jax.tree_util.tree_map(jnp.zeros_like, params)}
    start = checkpoints.latest() or 0
    if start:
        state = checkpoints.restore(start, state)

    # The same run ids at every restart; what the runs logged from step `start` on before the kill is superseded.
    logger = lox.loggers.from_config(f"parquet:{runs_folder}")
    runs = jax.vmap(lambda key: logger.init(key, run_id="job", resume="allow", from_step=start))(keys)
    step_fn = jax.jit(jax.vmap(lambda run, s, i: logger.spool(train_step, run)(s, i), in_axes=(0, 0, None)))

    for step in range(start, STEPS):
        state = step_fn(runs, state, step)
        if (step + 1) % EVERY == 0:  # a checkpoint of the state before step + 1
            logger.flush()  # first: once the checkpoint exists, every step before it is on disk
            checkpoints.save(step + 1, state)
        if step == killed_at:  # preempted
            logger.flush()  # (what the periodic flush, every 5 s, would have written by now)
            os.kill(os.getpid(), signal.SIGKILL)
    checkpoints.close()
    logger.finish(runs)


def uninterrupted_losses() -> list[list[float]]:
    """The losses of each seed, trained 60 steps without lox nor a kill: the reference."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    x = np.linspace(-1, 1, 32, dtype=np.float32)
    y = 3.0 * x - 1.0

    @jax.jit
    def step(params, momentum):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((p["w"] * x + p["b"] - y) ** 2))(params)
        momentum = jax.tree_util.tree_map(lambda m, g: 0.9 * m + g, momentum, grads)
        return jax.tree_util.tree_map(lambda p, m: p - 0.05 * m, params, momentum), momentum, loss

    losses = []
    for key in jax.random.split(jax.random.key(0), 2):
        params = {"w": jax.random.normal(key), "b": jnp.zeros(())}
        momentum = jax.tree_util.tree_map(jnp.zeros_like, params)
        seed = []
        for _ in range(STEPS):
            params, momentum, loss = step(params, momentum)
            seed.append(float(loss))
        losses.append(seed)
    return losses


if __name__ == "__main__":
    kinds = {"pickle": Checkpoints, "orbax": OrbaxCheckpoints}
    if len(sys.argv) > 1:  # the job: python preemption.py pickle|orbax [killed-at step]
        kind, folder = sys.argv[1], f"preemption-{sys.argv[1]}"
        job(f"{folder}/runs", kinds[kind](f"{folder}/checkpoints"), int(sys.argv[2]) if len(sys.argv) > 2 else None)
    else:
        import numpy as np

        import lox
        from lox_backends.runstore.reader import runs

        reference = uninterrupted_losses()
        for kind in kinds:
            folder = f"preemption-{kind}/runs"
            first = subprocess.run([sys.executable, __file__, kind, "37"])
            on_disk = lox.load(folder)["job-0"].step["loss"]
            statuses = sorted({info["status"] for info in runs(folder)})
            print(f"{kind}: killed at step 37 (exit status {first.returncode}); on disk: steps "
                  f"{on_disk[0]}..{on_disk[-1]}, runs {statuses}")
            subprocess.run([sys.executable, __file__, kind], check=True)  # restarted, from its last checkpoint
            for info in sorted(runs(folder), key=lambda info: info["run_id"]):
                seed = reference[int(info["run_id"].removeprefix("job-"))]
                logs = lox.load(folder)[info["run_id"]]
                steps = logs.step["loss"].tolist()
                same = len(steps) == STEPS and np.allclose(logs["loss"], seed)
                print(f"  {info['run_id']}: {info['status']}, steps {steps[0]}..{steps[-1]}, each once: "
                      f"{steps == list(range(STEPS))}, as if never killed: {same}")
