"""`lox.wandb` and `lox.neptune`, the earlier lox's tracker names, with the real
clients offline: what W&B's run files and Neptune's operation logs hold.

Covers lox/wandb.py and lox/neptune.py over lox_backends/tools/aliases.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from neptune_records import offline_runs as neptune_runs
from wandb_records import offline_runs as wandb_runs

import lox
from lox_backends.trackers.wandb import wandb_id


def train(w, start):
    def step(w, i):
        lox.log({"loss": w * w}, step=i)
        return w * 0.5, None

    return jax.lax.scan(step, w, start + jnp.arange(4))[0]


def by_hand(w, steps):
    """(step, loss) of `train` called on consecutive starts, written out."""
    out = []
    for s in steps:
        out.append((s, w * w))
        w *= 0.5
    return out


def test_wandb_init_log_finish_under_jit_and_vmap_as_the_earlier_lox(wandb_env):
    keys = jax.random.split(jax.random.key(0), 3)
    runs = jax.vmap(lambda k: lox.wandb.init(k, project="old-api", mode="offline", name="mlp",
                                             config={"lr": 0.1}))(keys)

    @jax.jit
    def epoch(runs, w, start):
        def one(run, w):
            w, logs = lox.spool(train)(w, start)
            lox.wandb.log(run, logs)  # a host call for every seed at once
            return w

        return jax.vmap(one)(runs, w)

    w0 = jnp.array([1.0, 2.0, 4.0])
    w = epoch(runs, w0, 0)
    epoch(runs, w, 4)
    lox.wandb.finish(runs)

    again = lox.wandb.init(project="old-api", mode="offline", name="eval")  # another init: a group of its own
    lox.wandb.log(again, lox.logdict({"acc": np.array([0.5])}, steps={"step": {"acc": np.array([0])}}))
    lox.wandb.finish(again)

    seeds, evaluation = lox.wandb.logger_of(runs).runs(), lox.wandb.logger_of(again).runs()
    found = [wandb_runs(wandb_env["WANDB_DIR"], wandb_id(run.run_id)) for run in [*seeds, *evaluation]]
    assert [len(f) for f in found] == [1, 1, 1, 1]
    for seed, (wb,) in enumerate(found[:3]):
        assert wb.complete and wb.run.project == "old-api" and wb.run.display_name == f"mlp-{seed}"
        assert wb.run.run_group == seeds[0].group and wb.config["lr"] == 0.1
        want = by_hand(float(w0[seed]), range(8))
        assert [(s, pytest.approx(v)) for s, v in wb.series("loss")] == want
    (wb,) = found[3]
    assert wb.run.display_name == "eval" and wb.series("acc") == [(0, 0.5)] and wb.run.run_group != seeds[0].group
    with pytest.raises(RuntimeError, match=r"the lox logger 'mlp' was closed"):  # closed once its runs finished
        lox.wandb.log(runs, lox.logdict())


def test_wandb_logger_names_its_runs_and_gives_each_the_config(wandb_env):
    logger = lox.wandb.WandbLogger(project="old-api", mode="offline", name="exp", config={"lr": 0.3})
    assert isinstance(logger, lox.loggers.Logger)
    states = jax.vmap(logger.init)(jax.random.split(jax.random.key(1), 2))
    jax.vmap(lambda s, w: logger.spool(train, s)(w, 0))(states, jnp.array([1.0, 3.0]))
    logger.finish(states)
    for seed, run in enumerate(logger.runs()):
        (wb,) = wandb_runs(wandb_env["WANDB_DIR"], wandb_id(run.run_id))
        assert (wb.run.display_name, wb.config["lr"]) == (f"exp-{seed}", 0.3)
        assert [(s, pytest.approx(v)) for s, v in wb.series("loss")] == by_hand([1.0, 3.0][seed], range(4))


def test_neptune_init_log_finish_as_the_earlier_lox(neptune_env):
    run = lox.neptune.init(jax.random.key(2), project="me/old-api", mode="offline", name="probe",
                           config={"depth": 3})
    w, logs = jax.jit(lox.spool(train))(2.0, 0)
    lox.neptune.log(run, logs)  # eagerly
    jax.jit(lambda run, w: lox.neptune.log(run, lox.spool(train)(w, 4)[1]))(run, w)  # and under jit
    lox.neptune.finish(run)
    logger = lox.neptune.logger_of(run)
    (lox_run,) = [r for r in logger.runs() if r.name == "probe"]
    (neptune_run,) = neptune_runs(neptune_env / "neptune-data")[lox_run.run_id]
    fields = neptune_run.fields()
    assert fields["sys/name"] == "probe" and fields["config/depth"] == 3
    assert [(s, pytest.approx(v)) for s, v in neptune_run.series("metrics/loss")] == by_hand(2.0, range(8))


def test_what_the_aliases_refuse_is_named():
    with pytest.raises(TypeError, match=r"`lox.wandb.init` got 'group', which lox's wandb backend does not take: it "
                                        r"takes `project`, `entity`, `mode`, `local`, `name`, `config`\. Put run data "
                                        r"in `config`, or use `lox.loggers.from_config\('wandb\?...'\)`"):
        lox.wandb.init(project="p", mode="offline", group="g")
    with pytest.raises(TypeError, match=r"`NeptuneLogger` got 'tags', .* it takes `project`, `mode`, `local`, `name`"):
        lox.neptune.NeptuneLogger(project="me/p", mode="offline", tags=["a"])
    state = lox.loggers.from_config("memory").init()
    with pytest.raises(TypeError, match=r"`lox.wandb.log` takes the run `lox.wandb.init` returned, got LoggerState\."):
        lox.wandb.log(state, lox.logdict())
    wandb_run = lox.wandb.TrackerRun(state.run, "wandb", 0)
    with pytest.raises(TypeError, match=r"`lox.neptune.finish` takes the run `lox.neptune.init` returned, got a run of "
                                        r"lox.wandb\."):
        lox.neptune.finish(wandb_run)


def test_wandb_init_names_a_run_by_run_id_and_says_so_for_wandbs_own_id(wandb_env):
    with pytest.raises(TypeError, match=r"got id='job': lox names a run with run_id= .*resume='allow'"):
        lox.wandb.init(project="old-api", mode="offline", id="job")
    run = lox.wandb.init(project="old-api", mode="offline", run_id="job", config={"lr": 0.1})
    lox.wandb.finish(run)
    (info,) = lox.wandb.logger_of(run).runs()
    assert (info.run_id, info.name, info.metadata) == ("job", "job", {"lr": 0.1})
    with pytest.raises(ValueError, match="run 'job' exists"):  # its local log keeps it
        lox.wandb.init(project="old-api", mode="offline", run_id="job")
    again = lox.wandb.init(project="old-api", mode="offline", run_id="job", resume="must")
    lox.wandb.finish(again)
    assert [r.resumed for r in lox.wandb.logger_of(again).runs()] == [True]
