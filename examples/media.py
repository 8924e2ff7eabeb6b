"""Images and video from inside `jax.jit`: generated samples, and RL rollouts.

1. A tiny decoder learns to draw four 8x8 patterns from a learned code each
   (generative latent optimisation). Each spooled call trains 100 SGD steps in a
   `jax.lax.scan`, logging the loss per step, then logs the four samples it
   draws as one `lox.image` batch. `lox.load` reads them back from Parquet.
2. A point mass is steered to a goal by a PD controller; `jax.lax.scan` runs
   an episode and renders each step to a 16x16 RGB frame, logged as
   `lox.video(frames, fps=8)`. Three seeds under `jax.vmap`, each its own run
   with its own rollout.

    python examples/media.py
"""

import tempfile

import jax
import jax.numpy as jnp
import numpy as np

import lox

SIZE, CODE, HIDDEN = 8, 2, 32
CHUNK, CHUNKS, LR = 100, 4, 4.0
SHADES = " .:-=+*#"


def patterns():
    """Four 8x8 targets in [0, 1]: a horizontal bar, a vertical bar, a diagonal, a frame."""
    i, j = jnp.meshgrid(jnp.arange(SIZE), jnp.arange(SIZE), indexing="ij")
    shapes = [(i >= 3) & (i <= 4), (j >= 3) & (j <= 4), jnp.abs(i - j) <= 1,
              (i == 0) | (j == 0) | (i == SIZE - 1) | (j == SIZE - 1)]
    return jnp.stack(shapes).astype(jnp.float32)[..., None]  # (4, 8, 8, 1): NHWC


def init(key):
    k1, k2, k3 = jax.random.split(key, 3)
    return {"codes": jax.random.normal(k1, (4, CODE)), "w1": jax.random.normal(k2, (CODE, HIDDEN)),
            "w2": jax.random.normal(k3, (HIDDEN, SIZE * SIZE)) / HIDDEN**0.5, "b2": jnp.zeros(SIZE * SIZE)}


def draw(params):
    """The decoder: each code to an 8x8 image in [0, 1]."""
    h = jnp.tanh(params["codes"] @ params["w1"])
    return jax.nn.sigmoid(h @ params["w2"] + params["b2"]).reshape(4, SIZE, SIZE, 1)


def loss_fn(params, targets):
    return jnp.mean((draw(params) - targets) ** 2)


def train_chunk(params, targets, start):
    def step(params, i):
        loss, grads = jax.value_and_grad(loss_fn)(params, targets)
        lox.log({"loss": loss}, step=start + i)
        return jax.tree_util.tree_map(lambda p, g: p - LR * g, params, grads), None

    params, _ = jax.lax.scan(step, params, jnp.arange(CHUNK))
    lox.log({"samples": lox.image(draw(params))}, step=start + CHUNK)  # (4, 8, 8, 1): one grid, or 4 images
    return params


def shown(images):
    """Images (N, H, W, 1) side by side, as characters."""
    rows = []
    for r in range(images.shape[1]):
        rows.append("  ".join("".join(SHADES[min(int(v * len(SHADES)), len(SHADES) - 1)] for v in image[r, :, 0])
                              for image in images))
    return "\n".join(rows)


# --- 2. rollouts of a point mass, as video ------------------------------------------------------
FRAME, HORIZON, SEEDS, DT = 16, 24, 3, 0.1


def render(position, goal):
    """A 16x16 RGB frame: the goal a green dot, the mass a red one (coordinates in [0, 1])."""
    centres = (jnp.arange(FRAME) + 0.5) / FRAME
    def dot(p):
        return jnp.exp(-((centres[:, None] - p[1]) ** 2 + (centres[None, :] - p[0]) ** 2) * FRAME**2 / 2)
    return jnp.stack([dot(position), dot(goal), jnp.zeros((FRAME, FRAME))], -1)


def rollout(key):
    k1, k2 = jax.random.split(key)
    goal = jax.random.uniform(k1, (2,), minval=0.2, maxval=0.8)
    start = jax.random.uniform(k2, (2,), minval=0.1, maxval=0.9)

    def step(carry, _):
        position, velocity = carry
        force = 16.0 * (goal - position) - 8.0 * velocity  # the policy: a PD controller
        velocity = velocity + DT * force
        position = jnp.clip(position + DT * velocity, 0.0, 1.0)
        return (position, velocity), (render(position, goal), -jnp.linalg.norm(goal - position))

    _, (frames, rewards) = jax.lax.scan(step, (start, jnp.zeros(2)), None, length=HORIZON)
    lox.log({"rollout": lox.video(frames, fps=8), "return": rewards.sum()}, step=0)  # frames: (24, 16, 16, 3)
    return rewards[-1]


def where(frame, channel=0):
    """The row and column of the brightest pixel of a frame (H, W, 3) in a
    channel: 0 the mass (red), 1 the goal (green)."""
    return tuple(int(v) for v in np.unravel_index(np.argmax(frame[..., channel]), frame.shape[:2]))


def main():
    with tempfile.TemporaryDirectory() as folder:
        logger = lox.loggers.from_config(f"parquet:{folder}/samples")
        state = logger.init(jax.random.key(0), lr=LR)
        train = logger.spool(train_chunk, state)  # compiled once
        params, targets = init(jax.random.key(0)), patterns()
        for c in range(CHUNKS):
            params = train(params, targets, c * CHUNK)
        logger.finish(state)
        (logs,) = lox.load(f"{folder}/samples").values()

        print(logs.kind)
        samples = logs["samples"]  # an Image: pixels (events, 4, 8, 8, 1)
        print(f"{samples.pixels.shape} {samples.pixels.dtype}, at steps {logs.step['samples'].tolist()}")
        print(f"step {logs.step['samples'][0]}:\n{shown(samples.pixels[0])}")
        print(f"step {logs.step['samples'][-1]}:\n{shown(samples.pixels[-1])}")
        error = np.abs(samples.pixels[-1] - np.asarray(targets)).max()
        print(f"loss {logs['loss'][0]:.4f} -> {logs['loss'][-1]:.4f}; largest pixel error at the end {error:.3f}")

        logger = lox.loggers.from_config(f"parquet:{folder}/rollouts", name="mass")
        keys = jax.random.split(jax.random.key(1), SEEDS)
        states = jax.vmap(logger.init)(keys)  # one run per seed
        jax.jit(jax.vmap(lambda s, k: logger.spool(rollout, s)(k)))(states, keys)
        logger.finish(states)
        runs = lox.load(f"{folder}/rollouts")

    print(f"{len(runs)} runs; rollout kind {next(iter(runs.values())).kind['rollout']}")
    for seed, (_, logs) in enumerate(sorted(runs.items())):  # run ids end in -0, -1, -2
        video = logs["rollout"]
        frames = np.asarray(video.frames[0])  # the first (only) event: (24, 16, 16, 3)
        print(f"seed {seed}: {frames.shape} at {video.fps} fps, mass at {where(frames[0])} -> "
              f"{where(frames[-1])}, goal at {where(frames[-1], 1)}, return {logs['return'][0]:.2f}")


if __name__ == "__main__":
    main()
