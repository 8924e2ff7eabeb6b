"""The table of runs (``python -m benchmarks runs``): `lox.runs` of 1,024 vmapped
seeds on a local folder, against reading every ``_run.json`` by hand and
against `lox.load` of the same folder; and on a bucket (moto's S3 server,
tests/support/s3_server.py), the requests it makes, counted in the server's
request log, against `lox.load`'s.

The summaries' cost to a training loop is the ``logger`` section run on this
tree and on the commit before summaries, back to back (docs/performance.md
gives the command).
"""

from __future__ import annotations

import glob
import json
import pathlib
import tempfile

import jax
import jax.numpy as jnp

import lox
from benchmarks.buckets import s3_server
from benchmarks.timing import row, side_by_side
from lox_backends.runstore import layout

SEEDS = 1024
STEPS = 20


def write_seeds(root: str, seeds: int = SEEDS) -> None:
    """`seeds` vmapped runs, each logging a loss and an accuracy for `STEPS` steps, with a summary value."""
    logger = lox.loggers.from_config(f"parquet:{root}")
    keys = jax.random.split(jax.random.key(0), seeds)
    state = jax.vmap(lambda k, lr: logger.init(k, run_id="sweep", lr=lr, config={"width": 64}))(
        keys, jnp.linspace(0.001, 0.1, seeds))

    def train(lr):
        for step in range(STEPS):
            lox.log({"loss": 1.0 / (1.0 + lr * step), "acc": lr * step}, step=step)

    jax.vmap(lambda s, lr: logger.spool(train, s)(lr))(state, jnp.linspace(0.001, 0.1, seeds))
    jax.vmap(lambda s, lr: logger.summary(s, {"best_lr": lr}))(state, jnp.linspace(0.001, 0.1, seeds))
    logger.finish(state)
    logger.close()


def by_hand(root: str) -> list[dict]:
    """Every ``_run.json`` read by hand: what finding the best run took before the table."""
    return [json.loads(pathlib.Path(path).read_text()) for path in glob.glob(f"{root}/*/{layout.RUN_FILE}")]


def runs() -> None:
    print(f"The table of runs: lox.runs of {SEEDS:,} vmapped seeds ({STEPS} steps of 2 keys each)")
    with tempfile.TemporaryDirectory() as root:
        write_seeds(root)
        table = lox.runs(root)
        assert table.num_rows == SEEDS, table.num_rows
        t = side_by_side({"hand": lambda: by_hand(root), "runs": lambda: lox.runs(root),
                          "load": lambda: lox.load(root)}, reps=1, rounds=7)
    row("every _run.json read by hand (no summaries)", f"{t['hand'] * 1e3:.0f} ms")
    row("lox.runs(folder): the table, summaries included", f"{t['runs'] * 1e3:.0f} ms", t["runs"] / t["hand"],
        "<= 0.2 s")
    row("lox.load(folder): every run's logs", f"{t['load'] * 1e3:.0f} ms")
    resume_cost()
    bucket_requests()


def resume_cost() -> None:
    """What resuming adds to `init` (with `finish`, which each new init needs): a run
    opened and finished afresh, against the same run resumed from step 10 after
    it logged 100 steps; and 1,024 vmapped seeds likewise."""
    with tempfile.TemporaryDirectory() as root:
        logger = lox.loggers.from_config(f"parquet:{root}")
        state = logger.init(run_id="job")
        logger.spool(lambda: [lox.log({"loss": 1.0}, step=s) for s in range(100)], state)()
        logger.finish(state)
        fresh = iter(range(10**6))
        t = side_by_side({
            "plain": lambda: logger.finish(logger.init()),
            "named": lambda: logger.finish(logger.init(run_id=f"new-{next(fresh)}")),
            "resumed": lambda: logger.finish(logger.init(run_id="job", resume="allow", from_step=10)),
        }, reps=5, rounds=5)
        keys = jax.random.split(jax.random.key(0), SEEDS)
        logger.finish(jax.vmap(lambda k: logger.init(k, run_id="seeds"))(keys))
        seeds = side_by_side({
            "plain": lambda: logger.finish(jax.vmap(lambda k: logger.init(k))(keys)),
            "resumed": lambda: logger.finish(jax.vmap(lambda k: logger.init(k, run_id="seeds", resume="allow",
                                                                            from_step=10))(keys)),
        }, reps=1, rounds=3)
        logger.close()
    row("init + finish, one run", f"{t['plain'] * 1e3:.1f} ms")
    row("init(run_id=new) + finish", f"{t['named'] * 1e3:.1f} ms", t["named"] / t["plain"])
    row("init(run_id, resume='allow', from_step) + finish", f"{t['resumed'] * 1e3:.1f} ms",
        t["resumed"] / t["plain"], "adds <= 1 s")
    row(f"init + finish, {SEEDS:,} vmapped seeds", f"{seeds['plain'] * 1e3:.0f} ms")
    row(f"the same {SEEDS:,} seeds resumed", f"{seeds['resumed'] * 1e3:.0f} ms", seeds["resumed"] / seeds["plain"],
        "adds <= 1 s")


def bucket_requests() -> None:
    with tempfile.TemporaryDirectory() as folder, s3_server(folder) as server:
        server.create_bucket("bench")
        write_seeds("s3://bench/runs")
        log = pathlib.Path(folder) / f"moto-{server.port}.log"

        def requests(read) -> tuple[int, float]:
            before = len(log.read_text().splitlines())
            t = side_by_side({"read": read}, reps=1, rounds=1)["read"]
            lines = log.read_text().splitlines()[before:]
            return sum(('"GET ' in line or '"HEAD ' in line) for line in lines), t

        table_requests, table_time = requests(lambda: lox.runs("s3://bench/runs"))
        load_requests, load_time = requests(lambda: lox.load("s3://bench/runs"))
    row(f"bucket: lox.runs, requests for {SEEDS:,} runs (1 group)", f"{table_requests}",
        None, f"{table_time:.2f} s")
    row(f"bucket: lox.load, requests for {SEEDS:,} runs", f"{load_requests}", None, f"{load_time:.2f} s")
