"""Many seeds under vmap: tabular Q-learning on a chain, one logger run per seed.

The agent starts at the left end of a chain of 8 states and is rewarded for
reaching the right end, within 20 steps per episode. One `jax.lax.scan` runs
the episodes, an inner one the steps of an episode; every episode logs its
return and length. `jax.vmap` trains 16 seeds in one compiled call, and the
logger writes each seed's logs to its own run.

    python examples/seeds_rl.py
"""

import jax
import jax.numpy as jnp
import numpy as np

import lox

STATES, HORIZON, EPISODES, SEEDS = 8, 20, 100, 16
GAMMA, ALPHA, EPSILON = 0.9, 0.5, 0.1


def episode(q, key, e):
    def step(carry, k):
        q, s, done, length = carry
        k1, k2 = jax.random.split(k)
        explore = (jax.random.uniform(k1) < EPSILON) | (q[s, 0] == q[s, 1])  # also on ties
        a = jnp.where(explore, jax.random.bernoulli(k2).astype(jnp.int32), jnp.argmax(q[s]))
        s2 = jnp.clip(s + 2 * a - 1, 0, STATES - 1)
        r = (s2 == STATES - 1).astype(jnp.float32)
        target = r + GAMMA * (1 - r) * q[s2].max()
        q = jnp.where(done, q, q.at[s, a].add(ALPHA * (target - q[s, a])))
        reward = jnp.where(done, 0.0, r * GAMMA**length)
        return (q, s2, done | (r > 0), length + (~done)), reward

    (q, _, _, length), rewards = jax.lax.scan(step, (q, 0, False, 0), jax.random.split(key, HORIZON))
    lox.log({"return": rewards.sum(), "length": length}, episode=e)
    return q


def train(key):
    def body(q, e):
        return episode(q, jax.random.fold_in(key, e), e), None

    return jax.lax.scan(body, jnp.zeros((STATES, 2)), jnp.arange(EPISODES))[0]


def main():
    logger = lox.loggers.from_config("memory", name="chain")  # e.g. "console,parquet:runs"
    keys = jax.random.split(jax.random.key(0), SEEDS)
    states = jax.vmap(lambda k: logger.init(k, epsilon=EPSILON))(keys)  # 16 runs
    q = jax.jit(jax.vmap(lambda s, k: logger.spool(train, s)(k)))(states, keys)
    logger.finish(states)

    runs = logger.runs()
    logs = [logger.backends[0].logs(run.run_id) for run in runs]
    print(f"{len(runs)} runs, Q tables {q.shape}; per run {logs[0]}")
    print("run       first shortest episode   mean length, last 20")
    for run, log in list(zip(runs, logs, strict=True))[:4]:
        first = int(np.argmax(log["length"] == STATES - 1))
        print(f"{run.name:9} {int(log.episode['length'][first]):22d} {log['length'][-20:].mean():22.2f}")
    lengths = np.stack([log["length"][-20:].mean() for log in logs])
    print(f"all {SEEDS} seeds: mean length {lengths.mean():.2f} (shortest path: {STATES - 1})")


if __name__ == "__main__":
    main()
