"""One local log per Logger: trackers beside a parquet backend send from its
folder, and nothing is written to ./lox-runs, unless a tracker is given
``local=DIR`` (then that folder is written, as before). Checked with the real
trackers: TensorBoard's reader, the MLflow server of the tests, W&B and Neptune
offline."""

import json
import pathlib

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from neptune_records import offline_runs as neptune_runs
from tensorboard.backend.event_processing import event_accumulator as ea
from wandb_records import offline_runs as wandb_runs

import lox
from lox_backends.trackers.sync import sync
from lox_backends.trackers.wandb import wandb_id

BATCHES, STEPS = 3, 4  # batch files per run (a flush after each), steps per batch
EXPECTED = [(step, 0.5**step) for step in range(BATCHES * STEPS)]  # (step, loss) of every event, by hand


def log_batches(logger, name="r"):
    """`BATCHES` batch files of `STEPS` steps each, loss = 0.5 ** step; the run's info once finished."""
    state = logger.init(name=name, lr=0.1)
    for batch in range(BATCHES):
        steps = np.arange(batch * STEPS, (batch + 1) * STEPS)
        logger.log(state, lox.logdict({"loss": 0.5**steps}, {"step": {"loss": steps}}))
        logger.flush()
    logger.finish(state)
    (run,) = logger.runs()
    return run


def saved(folder):
    """(step, loss) of each run saved in `folder`, read back with lox.load."""
    return {run_id: list(zip(logs.step["loss"].tolist(), logs["loss"].tolist(), strict=True))
            for run_id, logs in lox.load(folder).items()}


def sent_files(run_folder):
    """The batch files a run folder's records say reached a tracker, per record."""
    return {path.name: [json.loads(line)["file"] for line in path.read_text().splitlines() if '"file"' in line]
            for path in pathlib.Path(run_folder).glob("_sent-*.jsonl")}


def tensorboard_series(logdir, group, name, tag="loss"):
    accumulator = ea.EventAccumulator(str(pathlib.Path(logdir) / group / name), size_guidance={ea.SCALARS: 0})
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def float32(series):
    """TensorBoard keeps scalars as float32."""
    return [(step, float(np.float32(value))) for step, value in series]


def no_leftovers(folder):
    assert list(pathlib.Path(folder).glob("*/_sending-*.lock")) == []


def test_tensorboard_beside_parquet_sends_from_its_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    logger = lox.loggers.from_config(f"console,parquet:{tmp_path}/runs,tensorboard:{tmp_path}/tb", name="tb")
    run = log_batches(logger)
    assert not (tmp_path / "lox-runs").exists()  # no second copy
    assert saved(tmp_path / "runs") == {run.run_id: EXPECTED}
    assert tensorboard_series(tmp_path / "tb", logger.group, "r") == float32(EXPECTED)  # every batch once
    (record,) = sent_files(tmp_path / "runs" / run.run_id).values()
    assert len(record) == len(set(record)) == BATCHES
    no_leftovers(tmp_path / "runs")


def test_mlflow_beside_parquet_sends_from_its_folder(mlflow_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    experiment = f"local-{tmp_path.name}"
    logger = lox.loggers.from_config(f"parquet:{tmp_path}/runs,mlflow:{mlflow_server.url}?experiment={experiment}")
    run = log_batches(logger)
    assert not (tmp_path / "lox-runs").exists()
    assert saved(tmp_path / "runs") == {run.run_id: EXPECTED}
    client = MlflowClient(mlflow_server.url)
    (found,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert found.info.run_name == "r" and found.info.status == "FINISHED"
    history = sorted((m.step, m.value) for m in client.get_metric_history(found.info.run_id, "loss"))
    assert history == EXPECTED  # each value once
    no_leftovers(tmp_path / "runs")


def test_wandb_beside_parquet_sends_from_its_folder(wandb_env, tmp_path):
    logger = lox.loggers.from_config(f"parquet:{tmp_path}/runs,wandb?project=local&mode=offline")
    run = log_batches(logger)
    assert not (tmp_path / "lox-runs").exists()  # (wandb_env made tmp_path the working directory)
    assert saved(tmp_path / "runs") == {run.run_id: EXPECTED}
    (offline,) = wandb_runs(wandb_env["WANDB_DIR"], wandb_id(run.run_id))
    assert offline.complete and offline.series("loss") == EXPECTED
    no_leftovers(tmp_path / "runs")


def test_neptune_beside_parquet_sends_from_its_folder(neptune_env):
    logger = lox.loggers.from_config(f"parquet:{neptune_env}/runs,neptune:ws/proj?mode=offline")
    run = log_batches(logger)
    assert not (neptune_env / "lox-runs").exists()
    assert saved(neptune_env / "runs") == {run.run_id: EXPECTED}
    (offline,) = neptune_runs(neptune_env / "neptune-data")[run.run_id]
    assert offline.series("metrics/loss") == EXPECTED
    no_leftovers(neptune_env / "runs")


def test_a_local_folder_given_explicitly_is_written_as_well(tmp_path, monkeypatch):
    """``local=DIR`` asks for a local log of the tracker's own: a second copy,
    which the tracker sends from."""
    monkeypatch.chdir(tmp_path)
    logger = lox.loggers.from_config(f"parquet:{tmp_path}/runs,tensorboard:{tmp_path}/tb?local={tmp_path}/own",
                                     name="tb")
    run = log_batches(logger)
    assert not (tmp_path / "lox-runs").exists()
    assert saved(tmp_path / "runs") == saved(tmp_path / "own") == {run.run_id: EXPECTED}
    assert tensorboard_series(tmp_path / "tb", logger.group, "r") == float32(EXPECTED)
    assert sent_files(tmp_path / "runs" / run.run_id) == {}  # sent from `own`, recorded there
    (record,) = sent_files(tmp_path / "own" / run.run_id).values()
    assert len(record) == BATCHES


def test_trackers_without_a_parquet_backend_share_one_local_log(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    logger = lox.loggers.from_config(f"tensorboard:{tmp_path}/tb1,tensorboard:{tmp_path}/tb2", name="two")
    run = log_batches(logger)
    assert saved(tmp_path / "lox-runs") == {run.run_id: EXPECTED}  # one copy in the default folder
    for logdir in ("tb1", "tb2"):
        assert tensorboard_series(tmp_path / logdir, logger.group, "r") == float32(EXPECTED)
    assert len(sent_files(tmp_path / "lox-runs" / run.run_id)) == 2  # a record per destination

    # One tracker given `local=`: the others send from it, and ./lox-runs is not written.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    logger = lox.loggers.from_config(f"tensorboard:{tmp_path}/tb3,tensorboard:{tmp_path}/tb4?local={tmp_path}/own",
                                     name="given")
    run = log_batches(logger)
    assert list(elsewhere.iterdir()) == []
    assert saved(tmp_path / "own") == {run.run_id: EXPECTED}
    for logdir in ("tb3", "tb4"):
        assert tensorboard_series(tmp_path / logdir, logger.group, "r") == float32(EXPECTED)


def test_lox_sync_writes_no_local_log(tmp_path, monkeypatch):
    logger = lox.loggers.from_config(f"parquet:{tmp_path}/runs", name="saved")
    run = log_batches(logger)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    done = sync(str(tmp_path / "runs"), f"tensorboard:{tmp_path}/tb")
    assert done == [(str(tmp_path / "runs" / run.run_id), BATCHES, BATCHES * STEPS)]
    assert list(elsewhere.iterdir()) == []  # no ./lox-runs
    assert tensorboard_series(tmp_path / "tb", logger.group, "r") == float32(EXPECTED)
    no_leftovers(tmp_path / "runs")


def test_a_default_folder_that_cannot_be_written_is_refused_only_when_used(tmp_path, monkeypatch):
    """A file where ./lox-runs would go: refused when a tracker needs it, naming
    the folder; not looked at when the Logger's parquet backend is the local log."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lox-runs").write_text("not a folder")
    lox.loggers.from_config(f"parquet:{tmp_path}/runs,tensorboard:{tmp_path}/tb").close()
    with pytest.raises(ValueError, match=r"the tensorboard backend's local folder \(option local\) .*lox-runs"):
        lox.loggers.from_config(f"tensorboard:{tmp_path}/tb")
