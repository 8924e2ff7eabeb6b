"""How runs ended, as trackers and `lox runs` show it: runs written by real
processes that finished, raised, or were killed (SIGKILL), and one still
being written; `lox sync` gives each tracker the status (MLflow's run status,
read back from the server; W&B's exit code, from its offline run file; Neptune's
``sys/failed`` and ``lox/status``, from its offline operations), and leaves a
run that is still written open."""

import datetime
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import uuid

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from mlflow_server import CLIENT_ENV
from neptune_records import offline_runs as neptune_runs
from s3_server import S3Server
from wandb_records import offline_runs as wandb_runs
from wandb_records import records

import lox
from lox_backends.tools import cli
from lox_backends.trackers.sync import sync
from lox_backends.trackers.wandb import wandb_id

REPO = pathlib.Path(__file__).resolve().parents[3]
LOX = os.path.join(os.path.dirname(sys.executable), "lox")  # the installed console script
ENV = {**os.environ, **CLIENT_ENV, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", "LOX_DEFAULT": "off"}
LOSS = [(0, 3.0), (1, 2.0), (2, 1.0)]  # (step, loss) each run logs

WRITER = """
import os, signal, sys, numpy as np, lox
how, spec = sys.argv[1], sys.argv[2]
logger = lox.loggers.from_config(spec, name=how)
state = logger.init(name=how, lr=0.5)
logger.log(state, lox.logdict({"loss": np.array([3.0, 2.0, 1.0])}, {"step": {"loss": np.array([0, 1, 2])}}))
if how == "finished":
    logger.finish(state)
elif how == "failed":
    raise RuntimeError("the training failed")  # uncaught: the exit closes the run, as failed
else:
    logger.flush()
    print("flushed", flush=True)
    if how == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.stdin.readline()  # running until told
"""


def write(how, spec, cwd):
    """A process that logs a run named `how` to `spec` and then ends as `how` says (or goes on: "running")."""
    return subprocess.Popen([sys.executable, "-c", WRITER, how, spec], cwd=cwd, env=ENV, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture(scope="module")
def ended(tmp_path_factory):
    """A folder of three runs, written by processes that finished, raised and were killed."""
    folder = tmp_path_factory.mktemp("ended")
    processes = {how: write(how, f"parquet:{folder}/runs", folder) for how in ("finished", "failed", "killed")}
    for how, process in processes.items():
        out, err = process.communicate(timeout=300)
        expected = {"finished": 0, "failed": 1, "killed": -signal.SIGKILL}[how]
        assert process.returncode == expected, (how, err)
    return folder / "runs"


def copy(ended, tmp_path):
    """The runs, in a folder of the test's own (`lox sync` records what it sent in their folders)."""
    shutil.copytree(ended, tmp_path / "runs")
    return tmp_path / "runs"


def run_jsons(folder):
    """name -> _run.json, read as JSON (not with lox)."""
    found = [json.loads(path.read_text()) for path in pathlib.Path(folder).glob("*/_run.json")]
    return {info["name"]: info for info in found}


# --- lox runs ------------------------------------------------------------------------------
def test_lox_runs_lists_each_run_with_its_status(ended, capsys):
    infos = run_jsons(ended)
    assert {name: info["status"] for name, info in infos.items()} == {
        "finished": "finished", "failed": "failed", "killed": "running"}  # as stored: killed while running
    statuses = {"finished": "finished", "failed": "failed", "killed": "killed"}  # the killed process is gone
    order = sorted(infos, key=lambda name: infos[name]["created"])
    expected = [["name", "run", "id", "status", "created", "(UTC)", "rows"]]
    for name in order:
        created = datetime.datetime.fromisoformat(infos[name]["created"]).astimezone(datetime.timezone.utc)
        rows = ["3"] if statuses[name] != "killed" else []  # recorded when a run ends
        expected.append([name, infos[name]["run_id"], statuses[name], *created.strftime("%Y-%m-%d %H:%M:%S").split(),
                         *rows])
    assert cli.main(["runs", "--short", str(ended)]) == 0
    printed = capsys.readouterr().out
    assert [line.split() for line in printed.splitlines()] == expected
    result = subprocess.run([LOX, "runs", "--short", str(ended)], capture_output=True, text=True, env=ENV, timeout=300)
    assert result.returncode == 0 and result.stdout == printed, result.stderr
    # One run's folder lists that run.
    killed = ended / infos["killed"]["run_id"]
    assert cli.main(["runs", "--short", str(killed)]) == 0
    assert [line.split()[:3] for line in capsys.readouterr().out.splitlines()[1:]] == [
        ["killed", infos["killed"]["run_id"], "killed"]]


def test_lox_runs_of_a_missing_folder_says_what_it_expects(tmp_path):
    result = subprocess.run([LOX, "runs", str(tmp_path / "nope")], capture_output=True, text=True, env=ENV)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"lox runs: error: no such folder: {str(tmp_path / 'nope')!r}; expected a run folder (holding _run.json) "
        "or a folder of run folders (the DIR of a 'parquet:DIR' backend).\n"
    )


def test_lox_runs_lists_the_runs_in_a_bucket(tmp_path, monkeypatch, capsys):
    server = S3Server(tmp_path).start()
    try:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        server.create_bucket("runs")
        logger = lox.loggers.from_config("parquet:s3://runs/lox", name="bucket")
        done, open_ = logger.init(name="done"), logger.init(name="open")
        for state in (done, open_):
            logger.log(state, lox.logdict({"loss": np.array([3.0, 2.0, 1.0])}, {"step": {"loss": np.arange(3)}}))
        logger.finish(done)
        logger.flush()
        assert cli.main(["runs", "--short", "s3://runs/lox"]) == 0
        lines = [line.split() for line in capsys.readouterr().out.splitlines()]
        ids = [run.run_id for run in logger.runs()]
        assert [line[:3] for line in lines[1:]] == [["done", ids[0], "finished"], ["open", ids[1], "running"]]
        assert [line[5:] for line in lines[1:]] == [["3"], []]  # rows, once a run ended
        logger.close()
    finally:
        server.stop()


# --- the status at each tracker ------------------------------------------------------------
def mlflow_runs(url, experiment):
    client = MlflowClient(url)
    found = client.get_experiment_by_name(experiment)
    return client, {r.info.run_name: r for r in client.search_runs([found.experiment_id])}


def history(client, run):
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss"))


def test_lox_sync_gives_mlflow_each_runs_status(mlflow_server, ended, tmp_path):
    runs = copy(ended, tmp_path)
    experiment = f"status-{uuid.uuid4().hex[:8]}"
    assert cli.main(["sync", str(runs), "--to", f"mlflow:{mlflow_server.url}?experiment={experiment}"]) == 0
    client, found = mlflow_runs(mlflow_server.url, experiment)
    assert {name: run.info.status for name, run in found.items()} == {
        "finished": "FINISHED", "failed": "FAILED", "killed": "KILLED"}
    assert all(history(client, run) == LOSS for run in found.values())


def test_a_run_still_being_written_is_left_running_until_its_process_is_gone(mlflow_server, tmp_path):
    process = write("running", f"parquet:{tmp_path}/runs", tmp_path)
    spec = f"mlflow:{mlflow_server.url}?experiment=live-{uuid.uuid4().hex[:8]}"
    try:
        assert process.stdout.readline() == "flushed\n", process.stderr.read()
        assert sync(str(tmp_path / "runs"), spec)[0][1:] == (1, 3)
        client, found = mlflow_runs(mlflow_server.url, spec.rpartition("=")[2])
        assert found["running"].info.status == "RUNNING" and history(client, found["running"]) == LOSS
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate()
    assert sync(str(tmp_path / "runs"), spec)[0][1:] == (0, 0)  # nothing more to send; ended
    client, found = mlflow_runs(mlflow_server.url, spec.rpartition("=")[2])
    assert found["running"].info.status == "KILLED" and history(client, found["running"]) == LOSS


def test_a_program_that_raises_ends_its_mlflow_run_failed(mlflow_server, tmp_path):
    """Through the Logger, not `lox sync`: the exit closes the run as failed, and its sender says so."""
    experiment = f"raised-{uuid.uuid4().hex[:8]}"
    process = write("failed", f"mlflow:{mlflow_server.url}?experiment={experiment}", tmp_path)
    out, err = process.communicate(timeout=300)
    assert process.returncode == 1 and "RuntimeError: the training failed" in err, err
    client, found = mlflow_runs(mlflow_server.url, experiment)
    assert found["failed"].info.status == "FAILED" and history(client, found["failed"]) == LOSS


def exit_code(path):
    (code,) = [r.exit.exit_code for r in records(path) if r.WhichOneof("record_type") == "exit"]
    return code


def test_lox_sync_gives_wandb_each_runs_exit_code(wandb_env, ended, tmp_path):
    runs = copy(ended, tmp_path)
    assert cli.main(["sync", str(runs), "--to", "wandb?project=status&mode=offline"]) == 0
    codes = {}
    for name, info in run_jsons(runs).items():
        (offline,) = wandb_runs(wandb_env["WANDB_DIR"], wandb_id(info["run_id"]))
        assert offline.complete and offline.series("loss") == LOSS
        codes[name] = exit_code(offline.path)
    assert codes == {"finished": 0, "failed": 1, "killed": 137}  # W&B: finished, failed, failed


def test_lox_sync_gives_neptune_each_runs_status(neptune_env, ended):
    runs = copy(ended, neptune_env)
    assert cli.main(["sync", str(runs), "--to", "neptune:ws/proj?mode=offline"]) == 0
    found = neptune_runs(neptune_env / "neptune-data")
    fields = {}
    for name, info in run_jsons(runs).items():
        (offline,) = found[info["run_id"]]
        assert offline.series("metrics/loss") == LOSS
        fields[name] = (offline.fields()["lox/status"], offline.fields()["sys/failed"])
    assert fields == {"finished": ("finished", False), "failed": ("failed", True), "killed": ("killed", True)}
