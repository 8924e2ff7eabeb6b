"""Trackers and resumed runs (``logger.init(run_id=..., resume="allow", from_step=N)``)
and run summaries, with the real clients: a job SIGKILLed at a random step, then
restarted from its last checkpoint, continues its TensorBoard folder, its W&B run
(offline) and its MLflow run (a real server); each reads back every step with the
values of an uninterrupted run (a by-hand reference), as far as the tracker can
drop what was superseded (MLflow keeps both values: warned about). Covers the
resuming parts of `lox_backends.trackers.template`, `sending` and `sync`."""

import os
import pathlib
import random
import signal
import subprocess
import sys
import warnings

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from neptune_records import offline_runs as neptune_runs
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.backend.event_processing import plugin_event_accumulator
from wandb_records import offline_runs

import lox
from lox_backends.trackers.template import summary_values

REPO = pathlib.Path(__file__).resolve().parents[3]
EVERYTHING = {ea.SCALARS: 0, ea.HISTOGRAMS: 0, ea.TENSORS: 0}
TOTAL = 40  # steps of the job
EVERY = 10  # a checkpoint before every tenth step: a restart goes on from a multiple of 10
DIVERGED = 1000.0  # what the killed process adds to its losses after its last checkpoint


def loss(step: int) -> float:
    return 1.0 / (step + 1)


# One attempt of the job: from `start` (0: a new run), killed (SIGKILL) after step `kill_at` (-1: never).
# Logs flushed every third step (as a Logger's timer would): what the kill supersedes reached the disk.
JOB = r"""
import os, signal, sys
import numpy as np
import lox
spec, start, kill_at, total, every = sys.argv[1], *map(int, sys.argv[2:])
logger = lox.loggers.from_config(spec, name="job", flush_every=600)
resume = {"resume": "allow", "from_step": start} if start else {}
state = logger.init(run_id="job", lr=0.1, **resume)
checkpoint = kill_at // every * every  # where the restart goes on from
for step in range(start, total):
    value = 1.0 / (step + 1) + ({DIVERGED} if 0 <= checkpoint <= step else 0.0)
    logger.log(state, lox.logdict({"loss": np.array([value])}, steps={"step": {"loss": np.array([step])}}))
    if step % 3 == 2 or step % every == every - 1:
        logger.flush()
    if step == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
logger.summary(state, {"best": 0.5})
logger.finish(state)
""".replace("{DIVERGED}", repr(DIVERGED))


def attempt(folder, spec, start, kill_at):
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", JOB, spec, str(start), str(kill_at), str(TOTAL), str(EVERY)],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == (-signal.SIGKILL if kill_at >= 0 else 0), done.stderr
    return done.stderr


def tb_scalars(folder, tag):
    accumulator = ea.EventAccumulator(str(folder), size_guidance=EVERYTHING)
    accumulator.Reload()
    return [(e.step, e.value) for e in accumulator.Scalars(tag)], accumulator


def test_a_job_killed_at_random_steps_goes_on_in_the_same_tracker_runs(tmp_path, wandb_env, mlflow_server):
    reference = [(step, loss(step)) for step in range(TOTAL)]
    for trial, kill_at in enumerate(random.Random(29).sample(range(EVERY + 2, TOTAL - 2), 3)):
        folder = tmp_path / f"trial-{trial}"
        folder.mkdir()
        os.environ["WANDB_DIR"] = str(folder)  # the subprocesses' W&B folder (wandb_env undoes it)
        experiment = f"resume-{trial}"
        spec = (f"parquet:{folder}/lox-runs,tensorboard:{folder}/tb,wandb?mode=offline&project=p,"
                f"mlflow:{mlflow_server.url}?experiment={experiment}")
        attempt(folder, spec, 0, kill_at)
        from_step = kill_at // EVERY * EVERY
        restarted = attempt(folder, spec, from_step, -1)

        logs = lox.load(folder / "lox-runs" / "job")
        assert list(zip(logs.step["loss"].tolist(), logs["loss"].tolist(), strict=True)) == reference

        # TensorBoard: one folder, a new event file that purges the steps from `from_step` on.
        tb, accumulator = tb_scalars(folder / "tb" / "job" / "job", "loss")
        assert tb == [(step, float(np.float32(value))) for step, value in reference]
        assert [(e.step, e.value) for e in accumulator.Scalars("summary/best")] == [(TOTAL - 1, 0.5)]
        assert accumulator.Scalars("summary/loss.min")[0].value == np.float32(loss(TOTAL - 1))

        # W&B: the restart's offline folder holds the whole run (the killed one had nothing
        # confirmed, its file being partial), each step once, and the summary.
        *_, resumed = offline_runs(str(folder), "job")
        assert resumed.complete and resumed.series("loss") == reference
        assert resumed.summary["best"] == 0.5 and resumed.summary["loss.min"] == loss(TOTAL - 1)
        assert resumed.summary["loss.count"] == TOTAL and resumed.config["lr"] == 0.1

        # MLflow: one run, finished, every step; MLflow keeps the superseded values that
        # reached it (the killed process's, diverged), which the restart warned about.
        client = MlflowClient(mlflow_server.url)
        found = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
        assert [run.data.tags["lox.run_id"] for run in found] == ["job"]
        (run,) = found
        assert run.info.status == "FINISHED" and run.data.params == {"lr": "0.1"}
        history = sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: (m.step, m.timestamp))
        latest = {m.step: m.value for m in history}  # the value logged last, at each step
        assert sorted(latest.items()) == reference
        superseded = [(m.step, m.value) for m in history if m.value != latest[m.step]]
        assert all(step >= from_step and value == loss(step) + DIVERGED for step, value in superseded)
        assert len(history) == TOTAL + len(superseded)
        assert ("MLflow cannot delete metric values" in restarted) == bool(superseded)
        assert run.data.metrics["best"] == 0.5 and run.data.metrics["loss.min"] == loss(TOTAL - 1)
        assert run.data.metrics["loss.count"] == TOTAL


def log_steps(logger, state, steps, offset=0.0):
    for step in steps:
        logger.log(state, lox.logdict({"loss": np.array([loss(step) + offset])},
                                      steps={"step": {"loss": np.array([step])}}))


def test_a_finished_run_resumed_in_the_same_process_is_ended_again(tmp_path, mlflow_server):
    """A run that ended goes on (its sent record reopened): its MLflow run is
    RUNNING again while it logs, FINISHED at the end, and a param given another
    value is warned about, not sent (MLflow refuses to change one)."""
    spec = f"parquet:{tmp_path}/lox-runs,mlflow:{mlflow_server.url}?experiment=reopened,tensorboard:{tmp_path}/tb"
    logger = lox.loggers.from_config(spec, name="job")
    state = logger.init(run_id="again", lr=0.1)
    log_steps(logger, state, range(6), offset=DIVERGED)
    logger.finish(state)
    client = MlflowClient(mlflow_server.url)
    (first,) = client.search_runs([client.get_experiment_by_name("reopened").experiment_id])
    assert first.info.status == "FINISHED"

    with pytest.warns(RuntimeWarning, match=r"other values of 'lr'.*MLflow keeps a param's first value") as caught:
        state = logger.init(run_id="again", resume="allow", from_step=3, lr=0.2)
        logger.flush()
        assert client.get_run(first.info.run_id).info.status == "RUNNING"
        log_steps(logger, state, range(3, 8))
        logger.finish(state)
    assert any("MLflow cannot delete metric values" in str(w.message) for w in caught)
    run = client.get_run(first.info.run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"lr": "0.1"}
    latest = {}
    for m in sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: (m.step, m.timestamp)):
        latest[m.step] = m.value
    assert latest == {step: loss(step) + (DIVERGED if step < 3 else 0.0) for step in range(8)}

    # TensorBoard purged steps 3 to 5 of the first attempt: each step once, the new values.
    tb, _ = tb_scalars(tmp_path / "tb" / "again" / "again", "loss")
    assert tb == [(step, float(np.float32(loss(step) + (DIVERGED if step < 3 else 0.0)))) for step in range(8)]


def test_a_resume_from_step_0_supersedes_every_step_but_keeps_the_metadata(tmp_path):
    logger = lox.loggers.from_config(f"tensorboard:{tmp_path}/tb?local={tmp_path}/lox-runs", name="job")
    state = logger.init(run_id="zero", lr=0.1)
    log_steps(logger, state, range(4), offset=DIVERGED)
    logger.finish(state)
    state = logger.init(run_id="zero", resume="allow", from_step=0, lr=0.1)
    log_steps(logger, state, range(2))
    logger.finish(state)
    folder = tmp_path / "tb" / "zero" / "zero"
    for reader in (ea, plugin_event_accumulator):  # TensorBoard's, and its server's (summaries as tensors)
        accumulator = reader.EventAccumulator(str(folder), size_guidance=EVERYTHING)
        accumulator.Reload()
        assert len(accumulator.Tensors("_lox/run")) == 1  # TensorBoard purges scalars, not the metadata
    tb, _ = tb_scalars(folder, "loss")
    assert tb == [(step, float(np.float32(loss(step)))) for step in range(2)]


def test_neptune_gets_the_summary_and_a_resumed_run_warns_about_what_it_keeps(tmp_path, neptune_env):
    logger = lox.loggers.from_config(f"neptune?mode=offline&local={tmp_path}/lox-runs", name="job")
    state = logger.init(run_id="nep", lr=0.1)
    log_steps(logger, state, range(5))
    logger.summary(state, {"best": 0.25, "note": "ok"})
    logger.finish(state)
    (first,) = neptune_runs(tmp_path / "neptune-data")["nep"]
    fields = first.fields()
    assert fields["summary/best"] == 0.25 and fields["summary/note"] == "ok"
    assert fields["summary/loss.min"] == loss(4) and fields["summary/loss.count"] == 5
    assert first.series("metrics/loss") == [(float(step), loss(step)) for step in range(5)]

    with pytest.warns(RuntimeWarning, match="Neptune cannot delete the points of a series"):
        state = logger.init(run_id="nep", resume="allow", from_step=3)
        log_steps(logger, state, range(3, 7))
        logger.finish(state)
    # Offline, the resumed run is a new offline run (neptune sync uploads it as a run of its own).
    _, resumed = neptune_runs(tmp_path / "neptune-data")["nep"]
    assert resumed.series("metrics/loss") == [(float(step), loss(step)) for step in range(3, 7)]
    assert resumed.fields()["summary/loss.count"] == 7 and resumed.fields()["lox/status"] == "finished"


def test_summary_values_are_the_names_of_the_table_of_runs():
    summary = {"keys": {"loss": {"last": 0.5, "min": "NaN", "max": None, "count": 2}, "acc": {"count": 0}},
               "values": {"best": 1, "tag": "x"}}
    values = summary_values(summary)
    assert list(values) == ["loss.last", "loss.min", "loss.count", "acc.count", "best", "tag"]
    assert np.isnan(values["loss.min"]) and values["loss.last"] == 0.5 and values["tag"] == "x"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert summary_values(None) == {} and summary_values({}) == {}
