"""``with logger.active(state):``: every uncaptured `lox.log` goes to the state's
runs, read back from real Parquet files against by-hand references.

Covers lox_backends/logger/active_run.py (the core's side: tests/lox_core/test_active.py;
a 2-process job: test_multiprocess.py)."""

import os
import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from devices import DEVICES
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from paths import REPO

import lox


# --- a "library": code that logs and knows nothing of loggers -----------------------------
def library_accuracy(logits, labels, step):
    acc = jnp.mean(jnp.argmax(logits, -1) == labels)
    lox.log({"eval/acc": acc, "eval/margin": jnp.max(logits, -1).mean()}, step=step)
    return acc


@jax.jit
def evaluate(w, x, labels, step):  # jitted without lox, elsewhere
    return library_accuracy(x @ w, labels, step)


def data(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=(16, 5)).astype(np.float32),
            rng.integers(0, 3, size=16))


def by_hand(w, x, labels):
    logits = x @ w
    return float(np.mean(np.argmax(logits, -1) == labels)), float(np.max(logits, -1).mean())


def one_run(folder):
    (logs,) = lox.load(folder).values()
    return logs


def test_a_library_function_called_from_a_function_jitted_without_lox_reaches_the_run(tmp_path):
    w, x, labels = data()
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    state = logger.init(name="eval")
    with logger.active(state):
        for step in range(0, 30, 10):
            evaluate(w * (1 + step), x, labels, step)
    logger.finish(state)
    logs = one_run(tmp_path)
    want = [by_hand(w * (1 + step), x, labels) for step in range(0, 30, 10)]
    assert logs["eval/acc"].tolist() == pytest.approx([a for a, _ in want])
    assert logs["eval/margin"].tolist() == pytest.approx([m for _, m in want], rel=1e-6)
    assert logs.step["eval/acc"].tolist() == [0, 10, 20]


def test_nested_blocks_write_to_the_innermost_run_and_eager_text_too(tmp_path):
    w, x, labels = data()
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    train, probe = logger.init(name="train"), logger.init(name="probe")
    with logger.active(train):
        evaluate(w, x, labels, 0)
        with logger.active(probe):
            evaluate(w, x, labels, 1)
            lox.log({"note": "probing"}, step=1)
        evaluate(w, x, labels, 2)
        lox.log({"lr": 0.5}, step=2)
    logger.finish(train)
    logger.finish(probe)
    runs = {info["name"]: logs for info, logs in zip(lox.runs(tmp_path).to_pylist(),
                                                     lox.load(tmp_path).values(), strict=True)}
    assert runs["train"].step["eval/acc"].tolist() == [0, 2] and runs["train"]["lr"].tolist() == [0.5]
    assert runs["probe"].step["eval/acc"].tolist() == [1]
    assert runs["probe"]["note"].tolist() == ["probing"] and runs["probe"].kind["note"] == "text"


def test_each_thread_writes_to_its_own_run(tmp_path):
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    step = jax.jit(lambda v, i: lox.log({"v": v}, step=i))
    step(0.0, 0)  # compiled before any block, with the default console (printed)
    opened = threading.Barrier(3)
    names = {}

    def work(k):
        state = logger.init(name=f"thread{k}")
        names[k] = state
        with logger.active(state):
            opened.wait()  # the three blocks open at once
            for i in range(10):
                step(float(k), i)
        logger.finish(state)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for info, logs in zip(lox.runs(tmp_path).to_pylist(), lox.load(tmp_path).values(), strict=True):
        k = int(info["name"].removeprefix("thread"))
        assert logs["v"].tolist() == [float(k)] * 10 and logs.step["v"].tolist() == list(range(10))


def test_vmapped_seeds_each_write_their_own_run(tmp_path):
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    keys = jax.random.split(jax.random.key(0), 4)
    states = jax.vmap(logger.init)(keys, lr=jnp.array([0.1, 0.2, 0.3, 0.4]))

    def train_step(w, lr, i):  # plain JAX: the logs carry no state
        loss = (w - 1.0) ** 2
        lox.log({"loss": loss}, step=i)
        return w - lr * 2 * (w - 1.0)

    step = jax.jit(jax.vmap(train_step, in_axes=(0, 0, None)))
    lrs = jnp.array([0.1, 0.2, 0.3, 0.4])
    w = jnp.zeros(4)
    with logger.active(states):
        for i in range(5):
            w = step(w, lrs, i)
        lox.log({"epoch": 1}, step=5)  # not vmapped: every run
    logger.finish(states)
    want_w, want = np.zeros(4, np.float32), []  # in float32, as JAX computes it
    for _ in range(5):
        want.append((want_w - np.float32(1)) ** 2)
        want_w = want_w - np.float32([0.1, 0.2, 0.3, 0.4]) * np.float32(2) * (want_w - np.float32(1))
    for seed, logs in enumerate(lox.load(tmp_path).values()):
        assert logs["loss"].tolist() == pytest.approx([float(v[seed]) for v in want], rel=1e-5, abs=1e-7)  # XLA fuses
        assert logs.step["loss"].tolist() == list(range(5))
        assert logs["epoch"].tolist() == [1]


def test_shard_map_on_every_device_logs_each_devices_shard(tmp_path):
    mesh = jax.make_mesh((DEVICES,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))

    def per_device(x):
        lox.log({"device": jax.lax.axis_index("d"), "sum": x.sum()}, step=0)
        return x * 2

    sharded = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
    x = jax.device_put(jnp.arange(4.0 * DEVICES), NamedSharding(mesh, P("d")))
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    state = logger.init()
    with logger.active(state):
        sharded(x)
    logger.finish(state)
    logs = one_run(tmp_path)
    got = sorted(zip(logs["device"].tolist(), logs["sum"].tolist(), strict=True))
    want = [(d, float(np.arange(4.0 * d, 4.0 * d + 4).sum())) for d in range(DEVICES)]
    assert got == want


def test_a_buffered_tap_without_a_callback_writes_every_event_once(tmp_path):
    def loop(w, xs):
        def step(w, ix):
            i, x = ix
            lox.log({"w": w}, step=i)
            return w * 0.5 + x, None

        return jax.lax.scan(step, w, (jnp.arange(xs.shape[0]), xs))[0]

    xs = jnp.arange(25.0)
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    state = logger.init()
    with logger.active(state):
        lox.tap(loop, buffer=8)(1.0, xs)
    logger.finish(state)
    want, w = [], 1.0
    for x in np.arange(25.0):
        want.append(w)
        w = w * 0.5 + x
    logs = one_run(tmp_path)
    assert logs["w"].tolist() == pytest.approx(want) and logs.step["w"].tolist() == list(range(25))


def test_a_key_that_changes_shape_in_the_block_is_refused_where_the_block_ends(tmp_path):
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    state = logger.init()
    log = jax.jit(lambda v: lox.log({"h": v}, step=0))
    with pytest.raises(ValueError, match="'h'") as caught:
        with logger.active(state):
            log(jnp.zeros(3))
            log(jnp.zeros(4))
    assert "to the active run" in " ".join(caught.value.__notes__)


def test_a_state_the_block_cannot_use_is_refused_with_what_to_do(tmp_path):
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    states = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), 2))

    def inside_jit(states):
        with logger.active(states):
            pass
        return 0

    with pytest.raises(TypeError, match="takes the state itself, not a traced one: open the block outside"):
        jax.jit(inside_jit)(states)
    with pytest.raises(ValueError, match=r"holds runs of shape \(2,\) \(one per seed\), but the event is vmapped"):
        with logger.active(states):
            jax.jit(jax.vmap(lambda v: lox.log({"v": v}, step=0)))(jnp.zeros(3))
    with pytest.raises(TypeError, match="`logger.active` takes the state returned by `logger.init`"):
        logger.active({"run": 0})
    done = logger.init(name="done")
    logger.finish(done)
    with pytest.raises(ValueError, match="runs 'done' were finished by `logger.finish`: nothing logged in the block"):
        logger.active(done)
    logger.close()
    with pytest.raises(RuntimeError, match="was closed; create a new one"):
        logger.active(states)


def test_the_documented_workaround_compiles_a_log_beside_a_returned_matrix_product(tmp_path):
    # JAX 0.10.2's CPU compiler aborts on a side-effecting host call fed by a matrix product the
    # function also returns (docs/sharp-bits.md); the XLA flag the page gives lets it compile.
    script = textwrap.dedent(f"""
        import jax, jax.numpy as jnp, numpy as np, lox

        @jax.jit
        def predict(x, w):
            y = x @ w
            lox.log({{"m": y.mean()}}, step=0)
            return y

        logger = lox.loggers.from_config("parquet:{tmp_path}")
        state = logger.init()
        x = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096
        with logger.active(state):
            y = predict(x, x.T)
        logger.finish(state)
        (logs,) = lox.load("{tmp_path}").values()
        print(np.allclose(logs["m"], np.mean(x @ x.T), rtol=1e-5), np.allclose(y, x @ x.T, rtol=1e-5))
    """)
    env = {**os.environ, "XLA_FLAGS": "--xla_disable_hlo_passes=dot-library-passes", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]
