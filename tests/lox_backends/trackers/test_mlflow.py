"""The mlflow backend against a real MLflow server on 127.0.0.1 (and SQLite
tracking URIs): seeds become runs, every value arrives once, through a server
outage and a killed process (`lox sync`)."""

import json
import os
import pathlib
import posixpath
import re
import shutil
import signal
import subprocess
import sys
import uuid

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow.parquet as pq
import pytest
import tracker_media
from logs_testing import free_port, log_epochs
from mlflow.tracking import MlflowClient
from mlflow_server import CLIENT_ENV, MlflowServer
from paths import DATA

import lox
from lox_backends.logger.logger import BackendError
from lox_backends.parquet import ParquetBackend
from lox_backends.plugin import hooks
from lox_backends.runstore.reader import run_files
from lox_backends.runstore.sent import SentRecord
from lox_backends.tools import cli
from lox_backends.trackers.sending import SLOW_CALL, Shutdown
from lox_backends.trackers.sync import SyncError, sync
from lox_core.arrow import from_arrow

REPO = pathlib.Path(__file__).resolve().parents[3]
HERE = pathlib.Path(__file__).resolve().parent
STEPS_PER_EPOCH = 4


def train(w, epoch):
    """Halves w every step; logs loss = w², a 2-vector and the epoch."""

    def step(w, i):
        lox.log({"loss": w * w, "grad": jnp.stack([w, -w])}, step=epoch * STEPS_PER_EPOCH + i, epoch=epoch)
        return w * 0.5, None

    return jax.lax.scan(step, w, jnp.arange(STEPS_PER_EPOCH))[0]


def expected(w0, epochs):
    """The events `train` logs from w0 over `epochs` calls, computed by hand in float32."""
    w = np.float32(w0)
    events = []
    for epoch in range(epochs):
        for i in range(STEPS_PER_EPOCH):
            events.append((epoch * STEPS_PER_EPOCH + i, epoch, float(w * w), [float(w), float(-w)]))
            w = np.float32(w * np.float32(0.5))
    return events


def history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def runs_by_name(client, experiment):
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"experiment {experiment!r} was not created"
    return {r.info.run_name: r for r in client.search_runs([found.experiment_id])}


def fresh_experiment():
    return f"test-{uuid.uuid4().hex[:8]}"


def train_seeds(logger, w0s, epochs):
    states = jax.vmap(lambda key, w0: logger.init(key, lr=0.1, w0=w0))(
        jax.random.split(jax.random.key(0), len(w0s)), jnp.asarray(w0s)
    )
    one_epoch = jax.jit(jax.vmap(lambda s, w, e: logger.spool(train, s)(w, e), in_axes=(0, 0, None)))
    w = jnp.asarray(w0s, jnp.float32)
    for epoch in range(epochs):
        w = one_epoch(states, w, epoch)
    return states


def test_seeds_become_runs_with_every_value_once(mlflow_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    experiment = fresh_experiment()
    logger = lox.loggers.from_config(f"mlflow:{mlflow_server.url}?experiment={experiment}", name="seed")
    w0s = [1.0, 2.0, 3.0]
    states = train_seeds(logger, w0s, epochs=3)
    logger.finish(states)

    client = MlflowClient(mlflow_server.url)
    runs = runs_by_name(client, experiment)
    assert sorted(runs) == ["seed-0", "seed-1", "seed-2"]
    groups = {r.data.tags["lox.group"] for r in runs.values()}
    assert groups == {logger.group}  # the seeds share one group tag
    for index, w0 in enumerate(w0s):
        run = runs[f"seed-{index}"]
        assert run.info.status == "FINISHED"
        assert run.data.tags["lox.index"] == str(index)
        assert run.data.params["lr"] == "0.1" and float(run.data.params["w0"]) == w0
        events = expected(w0, 3)
        assert history(client, run.info.run_id, "loss") == [(s, v) for s, _, v, _ in events]
        assert history(client, run.info.run_id, "epoch") == [(s, float(e)) for s, e, _, _ in events]
        # The vector went to the artifacts as Parquet, in lox's schema.
        folder = client.download_artifacts(run.info.run_id, "lox", str(tmp_path / f"artifacts-{index}"))
        parts = [from_arrow(pq.read_table(p)) for p in sorted(pathlib.Path(folder).glob("*.parquet"))]
        grads = np.concatenate([p["grad"] for p in parts])
        steps = np.concatenate([p.step["grad"] for p in parts])
        assert steps.tolist() == [s for s, _, _, _ in events]
        assert grads.tolist() == [g for _, _, _, g in events]

    # The local log the runs were sent from reads back the same.
    local = lox.load(tmp_path / "lox-runs")
    assert len(local) == 3
    for logs, w0 in zip(local.values(), w0s, strict=True):  # one run per seed
        assert logs["loss"].tolist() == [v for _, _, v, _ in expected(w0, 3)]


def test_tapped_events_reach_a_sqlite_tracking_uri(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, value in CLIENT_ENV.items():
        monkeypatch.setenv(name, value)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    logger = lox.loggers.from_config(f"mlflow:{uri}?experiment=tapped")
    state = logger.init(name="tapped")
    jax.jit(logger.tap(train, state))(jnp.float32(2.0), 0)
    jax.jit(logger.tap(train, state))(jnp.float32(0.125), 1)
    logger.finish(state)

    client = MlflowClient(uri)
    run = runs_by_name(client, "tapped")["tapped"]
    assert history(client, run.info.run_id, "loss") == [(s, v) for s, _, v, _ in expected(2.0, 2)]


def test_a_batch_larger_than_one_request(mlflow_server, tmp_path, monkeypatch):
    """MLflow takes at most 1000 metrics per request: a 1500-event batch (3000
    metrics with its epoch) is split, and every value arrives."""
    monkeypatch.chdir(tmp_path)
    experiment = fresh_experiment()
    logger = lox.loggers.from_config(f"mlflow:{mlflow_server.url}?experiment={experiment}")
    state = logger.init(name="big")

    def many(x):
        def step(x, i):
            lox.log({"x": x}, step=i, epoch=i // 100)
            return x + 1.0, None

        return jax.lax.scan(step, x, jnp.arange(1500))[0]

    logger.spool(many, state)(jnp.float32(0.0))
    logger.finish(state)
    client = MlflowClient(mlflow_server.url)
    run = runs_by_name(client, experiment)["big"]
    assert history(client, run.info.run_id, "x") == [(i, float(i)) for i in range(1500)]
    assert history(client, run.info.run_id, "epoch") == [(i, float(i // 100)) for i in range(1500)]


def test_a_parquet_backend_on_the_same_folder_is_the_local_log(mlflow_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    experiment = fresh_experiment()
    logger = lox.loggers.from_config(f"parquet:runs,mlflow:{mlflow_server.url}?experiment={experiment}&local=runs")
    states = train_seeds(logger, [1.0, 2.0], epochs=2)
    logger.finish(states)
    # Each event saved once (one writer for the folder), and sent.
    local = lox.load(tmp_path / "runs")
    assert [logs["loss"].tolist() for logs in local.values()] == [
        [v for _, _, v, _ in expected(w0, 2)] for w0 in (1.0, 2.0)
    ]
    client = MlflowClient(mlflow_server.url)
    runs = runs_by_name(client, experiment)
    assert [len(history(client, runs[f"lox-{i}"].info.run_id, "loss")) for i in range(2)] == [8, 8]


def test_two_parquet_backends_on_one_folder_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"two parquet backends write to '.*same'; every event would be saved twice"):
        lox.loggers.from_config(f"parquet:{tmp_path}/same,parquet:{tmp_path}/same")


def test_unknown_option_is_refused():
    with pytest.raises(
        ValueError, match=r"the mlflow backend has no option 'project'; its options are: experiment .*local"
    ):
        lox.loggers.from_config("mlflow:sqlite:///x.db?project=p")


@pytest.fixture
def own_server(tmp_path):
    """A server the test can stop and start again (same port, same database)."""
    folder = tmp_path / "server"
    folder.mkdir()
    server = MlflowServer(folder, port=free_port()).start()
    yield server
    server.stop()


def test_server_down_then_back_loses_and_repeats_nothing(own_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, value in CLIENT_ENV.items():
        monkeypatch.setenv(name, value)
    spec = f"mlflow:{own_server.url}?experiment=outage"
    logger = lox.loggers.from_config(spec, flush_every=0.5)
    state = logger.init(name="outage")
    step = jax.jit(logger.spool(train, state))
    w = step(jnp.float32(1.0), 0)
    logger.flush()

    own_server.stop()
    w = step(w, 1)  # training goes on while the server is down
    with pytest.warns(RuntimeWarning) as caught:
        logger.flush(timeout=3)
    messages = [str(w.message) for w in caught]
    assert any("sending to mlflow:" in m and "keeps retrying in the background" in m for m in messages), messages
    assert any(
        "were not sent within 3 s" in m and f"lox sync {tmp_path / 'lox-runs'} --to '{spec}'" in m for m in messages
    ), messages
    w = step(w, 2)

    own_server.start()
    logger.finish(state, timeout=120)
    client = MlflowClient(own_server.url)
    run = runs_by_name(client, "outage")["outage"]
    assert history(client, run.info.run_id, "loss") == [(s, v) for s, _, v, _ in expected(1.0, 3)]
    assert client.get_run(run.info.run_id).info.status == "FINISHED"


CRASHING = """
import sys, time, jax, jax.numpy as jnp, lox
sys.path[:0] = {paths!r}  # this test module, and the helpers it imports
from test_mlflow import train
logger = lox.loggers.from_config({spec!r})
state = logger.init(name="crashed")
step = jax.jit(logger.spool(train, state))
w = step(jnp.float32(1.0), 0)
logger.flush()
print("sent", flush=True)
sys.stdin.readline()  # the server is stopped now
w = step(w, 1)
w = step(w, 2)
logger.flush(timeout=1)  # on disk; not sent
print("flushed", flush=True)
time.sleep(600)
"""


def test_killed_process_then_lox_sync_delivers_everything_once(own_server, tmp_path):
    spec = f"mlflow:{own_server.url}?experiment=crash"
    env = {**os.environ, **CLIENT_ENV, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    script = CRASHING.format(paths=[str(HERE), str(REPO / "tests" / "support")], spec=spec)
    process = subprocess.Popen(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout.readline().strip() == "sent", process.stderr.read()
        own_server.stop()
        process.stdin.write("go\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "flushed", process.stderr.read()
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()

    own_server.start()
    client = MlflowClient(own_server.url)
    run_id = runs_by_name(client, "crash")["crashed"].info.run_id
    assert history(client, run_id, "loss") == [(s, v) for s, _, v, _ in expected(1.0, 1)]

    command = [sys.executable, "-m", "lox_backends.tools.cli", "sync", "lox-runs", "--to", spec]
    first = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-1] == f"sent 1 batch file(s), 16 row(s) to {spec}"
    assert history(client, run_id, "loss") == [(s, v) for s, _, v, _ in expected(1.0, 3)]
    assert history(client, run_id, "epoch") == [(s, float(e)) for s, e, _, _ in expected(1.0, 3)]
    assert client.get_run(run_id).info.status == "KILLED"  # its process was killed
    assert list((tmp_path / "lox-runs").glob("*/_sending-*.lock")) == []  # the killed sender's lock went

    again = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert again.stdout.splitlines()[-1] == f"sent 0 batch file(s), 0 row(s) to {spec}"
    assert len(history(client, run_id, "loss")) == 3 * STEPS_PER_EPOCH


DOWN_FOR_GOOD = """
import sys, time, warnings, jax, lox
sys.path[:0] = {paths!r}  # this test module, and the helpers it imports
from test_mlflow import train
logger = lox.loggers.from_config({spec!r})
state = logger.init(name="down")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    w = jax.jit(logger.spool(train, state))(1.0, 0)  # training goes on
    deadline = time.monotonic() + 120
    while not caught and time.monotonic() < deadline:
        time.sleep(0.1)
for warning in caught:
    print("while training:", warning.message, flush=True)
logger.finish(state, timeout=2)
print("finished", flush=True)
"""


def test_a_tracker_down_for_good_is_said_within_seconds_and_waited_for_once(tmp_path):
    # Nothing listens on the port, and the MLflow client retries as it does by default: its
    # calls take minutes and raise nothing meanwhile.
    spec = f"mlflow:http://127.0.0.1:{free_port()}?experiment=down"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST")}
    env.update(PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", MLFLOW_DISABLE_TELEMETRY="true")
    script = DOWN_FOR_GOOD.format(paths=[str(HERE), str(REPO / "tests" / "support")], spec=spec)
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout
    # Said while training, before `finish`: no error reached lox, the call just hangs.
    slow = f"while training: lox: {spec} has not answered for {SLOW_CALL:g} s (opening run 'down')."
    assert [line for line in lines if line.startswith("while training:")] == [
        slow + " lox keeps trying in the background and training goes on; your logs are safe in "
        f"{str(tmp_path / 'lox-runs')!r}."
    ], result.stdout
    # `finish` waits its timeout and says how to send the rest later; exit neither waits nor says it again.
    command = f"`lox sync {tmp_path / 'lox-runs'} --to '{spec}'`"
    assert [line for line in lines if "were not sent within" in line] == [
        line for line in lines if "were not sent within 2 s" in line and line.endswith(command + ".")
    ], result.stdout
    said = next(i for i, line in enumerate(lines) if command in line)
    assert result.stdout.count(command) == 1 and said < lines.index("finished"), result.stdout


def test_sync_resends_a_batch_without_duplicates(tmp_path, monkeypatch):
    """The record of what was sent lost (a crash between sending and
    recording): sending again leaves MLflow with each value once."""
    monkeypatch.chdir(tmp_path)
    for name, value in CLIENT_ENV.items():
        monkeypatch.setenv(name, value)
    spec = f"mlflow:sqlite:///{tmp_path}/m.db?experiment=again"
    logger = lox.loggers.from_config(spec)
    states = train_seeds(logger, [1.0, 2.0], epochs=2)
    logger.finish(states)
    for record in (tmp_path / "lox-runs").glob("*/_sent-mlflow-*.jsonl"):
        record.unlink()
    assert [files for _, files, _ in sync("lox-runs", spec)] == [1, 1]
    client = MlflowClient(f"sqlite:///{tmp_path}/m.db")
    runs = runs_by_name(client, "again")
    assert sorted(runs) == ["lox-0", "lox-1"]  # found again by their lox.run_id tag
    for index, w0 in enumerate([1.0, 2.0]):
        assert history(client, runs[f"lox-{index}"].info.run_id, "loss") == [(s, v) for s, _, v, _ in expected(w0, 2)]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["sync", "{tmp}/runs", "--to", "parquet:x"], "'parquet' is not a tracker; lox sync sends runs to trackers"),
        (["sync", "{tmp}/runs", "--to", "mlflow,mlflow"], "`lox sync --to` takes one tracker, got 2"),
        (["sync", "{tmp}/missing", "--to", "mlflow"], "no such folder: '{tmp}/missing'"),
        (["sync", "{tmp}/runs", "--to", "mlflw"], "Did you mean 'mlflow'?"),
    ],
)
def test_sync_errors(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    backend = ParquetBackend(str(tmp_path / "runs"))
    backend.open_run(hooks.RunInfo("run-0", "run", "g"))  # a run to sync
    argv = [a.format(tmp=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as exit:
        cli.main(argv)
    assert exit.value.code == 2
    assert message.format(tmp=tmp_path) in capsys.readouterr().err


def test_a_refused_batch_is_skipped_with_a_warning_not_retried_forever(mlflow_server, tmp_path, monkeypatch):
    """MLflow refusing a request for good (the run was deleted meanwhile) is
    not an outage: lox warns, goes on, and `finish` returns."""
    monkeypatch.chdir(tmp_path)
    experiment = fresh_experiment()
    logger = lox.loggers.from_config(f"mlflow:{mlflow_server.url}?experiment={experiment}")
    state = logger.init(name="deleted")
    logger.flush()
    client = MlflowClient(mlflow_server.url)
    client.delete_run(runs_by_name(client, experiment)["deleted"].info.run_id)
    jax.jit(logger.spool(train, state))(jnp.float32(1.0), 0)
    with pytest.warns(RuntimeWarning) as caught:
        logger.finish(state, timeout=30)
    messages = [str(w.message) for w in caught]
    assert any(
        re.search(
            r"refused batch-000000-[0-9a-f]{8}\.parquet of run 'deleted' "
            r"\(RestException: INVALID_PARAMETER_VALUE.*deleted",
            m,
        )
        and "What it refused stays in" in m and "lox goes on without retrying it" in m
        for m in messages
    ), messages
    assert not any("were not sent within" in m for m in messages), messages  # nothing left hanging
    assert lox.load(tmp_path / "lox-runs").popitem()[1]["loss"].shape == (STEPS_PER_EPOCH,)  # kept locally


def test_a_run_the_tracker_refuses_to_open_is_warned_about_once(mlflow_server, tmp_path, monkeypatch, recwarn):
    """The experiment was deleted: MLflow refuses to create runs in it. lox
    warns once, keeps every batch locally, and `finish` returns at once."""
    monkeypatch.chdir(tmp_path)
    experiment = fresh_experiment()
    client = MlflowClient(mlflow_server.url)
    client.delete_experiment(client.create_experiment(experiment))
    logger = lox.loggers.from_config(f"mlflow:{mlflow_server.url}?experiment={experiment}")
    state = logger.init(name="nowhere")
    step = jax.jit(logger.spool(train, state))
    w = step(jnp.float32(1.0), 0)
    logger.flush()
    step(w, 1)
    logger.finish(state, timeout=60)
    messages = [str(w.message) for w in recwarn]
    refused = [m for m in messages if "refused to open run 'nowhere'" in m]
    assert len(refused) == 1, messages
    assert "RestException" in refused[0] and "must be in the 'active' state" in refused[0], messages
    assert not any("were not sent within" in m for m in messages), messages
    (logs,) = lox.load(tmp_path / "lox-runs").values()
    assert logs["loss"].shape == (2 * STEPS_PER_EPOCH,)


def test_names_mlflow_refuses_are_made_valid_and_the_other_keys_still_arrive(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/m.db"
    logger = lox.loggers.from_config(f"mlflow:{uri}?experiment=names")
    state = logger.init(name="names")
    values = np.array([0.5, 0.25])
    logger.log(state, lox.logdict({"train//loss": values, "/x/./y": values + 1, "good": values + 2},
                                  {"step": dict.fromkeys(["train//loss", "/x/./y", "good"], np.array([0, 1]))}))
    logger.finish(state)
    client = MlflowClient(uri)
    run_id = runs_by_name(client, "names")["names"].info.run_id
    assert history(client, run_id, "train/_/loss") == [(0, 0.5), (1, 0.25)]
    assert history(client, run_id, "_/x/_/y") == [(0, 1.5), (1, 1.25)]
    assert history(client, run_id, "good") == [(0, 2.5), (1, 2.25)]


def test_an_event_without_step_uses_its_other_step_name(tmp_path, monkeypatch):
    """`val` is logged per epoch only, `loss` per step and epoch, in one batch:
    each metric's MLflow step is its own step name's."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/m.db"
    logger = lox.loggers.from_config(f"mlflow:{uri}?experiment=epochs")
    state = logger.init(name="epochs")
    log_epochs(logger, state)
    logger.finish(state)
    client = MlflowClient(uri)
    run_id = runs_by_name(client, "epochs")["epochs"].info.run_id
    assert history(client, run_id, "val") == [(0, 10.25), (1, 10.0625), (2, 10.015625)]
    assert history(client, run_id, "loss") == [(s, 0.5**s) for s in range(6)]
    assert history(client, run_id, "epoch") == [(s, float(s // 2)) for s in range(6)]  # at the loss steps


def test_close_after_a_backend_error_still_sends_everything(tmp_path, monkeypatch):
    """An error kept from earlier (logs sent to a finished run) is raised by
    `close`, after the tracker got everything else."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/m.db"
    logger = lox.loggers.from_config(f"mlflow:{uri}?experiment=close")
    a, b = logger.init(name="a"), logger.init(name="b")
    logger.finish(a)
    step = jax.jit(logger.spool(train, b))
    w = step(jnp.float32(1.0), 0)
    logger.spool(train, a)(w, 1)  # too late for run a
    step(w, 1)
    with pytest.raises(BackendError, match="arrived after `logger.finish` closed it"):
        logger.close()
    client = MlflowClient(uri)
    run_id = runs_by_name(client, "close")["b"].info.run_id
    assert history(client, run_id, "loss") == [(s, v) for s, _, v, _ in expected(1.0, 2)]


def test_a_password_in_the_uri_never_shows(tmp_path, monkeypatch, recwarn):
    monkeypatch.chdir(tmp_path)
    for name, value in CLIENT_ENV.items():
        monkeypatch.setenv(name, value)
    spec = f"mlflow:http://alice:s3cretPW@127.0.0.1:{free_port()}?experiment=x"
    logger = lox.loggers.from_config(spec)
    state = logger.init(name="secret")
    logger.spool(train, state)(jnp.float32(1.0), 0)
    logger.flush(timeout=2)
    messages = [str(w.message) for w in recwarn]
    assert any("were not sent within 2 s" in m for m in messages), messages
    assert not any("s3cretPW" in m for m in messages), messages
    logger._stop()  # nothing to wait for at exit: the server never existed
    for backend in logger.backends:
        backend.sender.put(Shutdown())

    result = subprocess.run(
        [sys.executable, "-m", "lox_backends.tools.cli", "sync", "lox-runs", "--to", spec[: spec.index("?")]],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 1 and "could not be synced" in result.stderr, result.stderr
    assert "s3cretPW" not in result.stdout + result.stderr


def test_lox_sync_leaves_a_run_that_a_live_process_is_sending(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = f"mlflow:sqlite:///{tmp_path}/m.db?experiment=live"
    logger = lox.loggers.from_config(spec)
    state = logger.init(name="live")
    logger.spool(train, state)(jnp.float32(1.0), 0)
    logger.flush()  # the logger's sending thread holds the run now
    # As if its batch were being sent right now (sent, not yet recorded):
    (record,) = (tmp_path / "lox-runs").glob("*/_sent-mlflow-*.jsonl")
    lines = record.read_text().splitlines()
    record.write_text("\n".join(line for line in lines if '"file"' not in line) + "\n")
    with pytest.raises(SyncError, match=r"1 run\(s\) could not be synced to mlflow:sqlite:///.*m\.db\?experiment=live:"
                                         r"\n  .*another process is sending run 'live'"):
        sync("lox-runs", spec)
    logger.finish(state)
    client = MlflowClient(f"sqlite:///{tmp_path}/m.db")
    run_id = runs_by_name(client, "live")["live"].info.run_id
    assert history(client, run_id, "loss") == [(s, v) for s, _, v, _ in expected(1.0, 1)]


def test_a_record_line_torn_by_a_crash_spoils_only_itself(tmp_path):
    record = SentRecord(str(tmp_path), "mlflow", "somewhere")
    record.add_file("batch-000000-aaaaaaaa.parquet")
    with open(record.path, "a") as f:
        f.write('{"file": "batch-000001-bbbb')  # the process died here
    again = SentRecord(str(tmp_path), "mlflow", "somewhere")
    again.add_file("batch-000001-bbbbbbbb.parquet")
    assert SentRecord(str(tmp_path), "mlflow", "somewhere").files == {
        "batch-000000-aaaaaaaa.parquet", "batch-000001-bbbbbbbb.parquet"
    }


def test_complex_scalars_go_to_the_artifacts_with_the_arrays(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/m.db"
    logger = lox.loggers.from_config(f"mlflow:{uri}?experiment=complex")
    state = logger.init(name="complex")
    z = np.array([1 + 2j, 3 - 4j], np.complex64)
    logger.log(state, lox.logdict({"z": z, "x": np.array([0.5, 0.25])},
                                  {"step": {"z": np.array([0, 1]), "x": np.array([0, 1])}}))
    logger.finish(state)
    client = MlflowClient(uri)
    run_id = runs_by_name(client, "complex")["complex"].info.run_id
    assert history(client, run_id, "x") == [(0, 0.5), (1, 0.25)]
    folder = client.download_artifacts(run_id, "lox", str(tmp_path / "artifacts"))
    (path,) = pathlib.Path(folder).glob("*.parquet")
    back = from_arrow(pq.read_table(path))
    assert list(back) == ["z"] and back["z"].tolist() == z.tolist() and back.step["z"].tolist() == [0, 1]


def test_lox_sync_sends_runs_written_by_lox_0_1(tmp_path, monkeypatch):
    """Run folders of the older layout (each holding its own batch files) are sent as they are."""
    monkeypatch.chdir(tmp_path)
    for name, value in CLIENT_ENV.items():
        monkeypatch.setenv(name, value)
    shutil.copytree(DATA / "lox-0.1-runs", tmp_path / "runs")
    spec = f"mlflow:sqlite:///{tmp_path}/m.db?experiment=old"
    done = sync(str(tmp_path / "runs"), spec)
    assert [(pathlib.Path(folder).name, files, rows) for folder, files, rows in done] == [
        ("old-0", 2, 12), ("old-1", 2, 12)]  # two batch files of 3 steps x (loss + w) each
    runs = runs_by_name(MlflowClient(f"sqlite:///{tmp_path}/m.db"), "old")
    for r in range(2):
        run = runs[f"old-{r}"]
        assert history(MlflowClient(f"sqlite:///{tmp_path}/m.db"), run.info.run_id, "loss") == [
            (s, s * 0.5 + r) for s in range(6)]
        assert run.data.params["lr"] == str(0.1 * (r + 1)) and run.info.status == "FINISHED"
    assert [files for _, files, _ in sync(str(tmp_path / "runs"), spec)] == [0, 0]  # sent once


# --- images, video, audio, histograms and text ------------------------------------------------
def mlflow_media(client, run_id, folder):
    """A run's media as MLflow holds it: images by (key, step) → [(timestamp, PNG bytes)],
    and the files under ``media/`` by path → bytes."""
    images = {}
    for item in client.list_artifacts(run_id, "images"):
        name = posixpath.basename(item.path)
        if name.endswith(".png"):
            key, step_word, step, time_word, time_ms, _ = name.removesuffix(".png").split("+")
            assert (step_word, time_word) == ("step", "timestamp"), name
            local = pathlib.Path(client.download_artifacts(run_id, item.path, str(folder)))
            images.setdefault((key.replace("~", "/"), int(step)), []).append((int(time_ms), local.read_bytes()))
    files = {}
    if any(item.path == "media" for item in client.list_artifacts(run_id)):
        root = pathlib.Path(client.download_artifacts(run_id, "media", str(folder)))
        files = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    return images, files


def check_mlflow_media(client, run_id, folder, seed, steps):
    """Every media event of `seed` at `steps` once, decoded, against the by-hand references."""
    images, files = mlflow_media(client, run_id, folder)
    assert sorted(images) == sorted((key, i) for key in ("samples", "grey") for i in steps)
    for (key, i), found in images.items():
        assert len(found) == 1, (key, i)  # once
        np.testing.assert_array_equal(tracker_media.png_pixels(found[0][1]), tracker_media.reference(seed, i)[key])
    names = {f"{key}/step_{i}.{ext}" for i in steps
             for key, ext in [("rollout", "gif"), ("rollouts", "gif"), ("sound", "wav"), ("weights", "json"),
                              ("caption", "txt"), ("table", "json")]}
    assert set(files) == names
    for i in steps:
        for key in ("rollout", "rollouts", "sound", "weights"):
            ext = {"sound": "wav", "weights": "json"}.get(key, "gif")
            tracker_media.check_media_file(key, files[f"{key}/step_{i}.{ext}"], seed, i)
        assert files[f"caption/step_{i}.txt"].decode() == tracker_media.caption(seed, i)
        assert json.loads(files[f"table/step_{i}.json"]) == {"columns": ["0", "1"],
                                                             "data": tracker_media.table(seed, i)}
    metrics = client.get_run(run_id).data.metrics
    assert {name.split(".")[0] for name in metrics} == {"loss"}  # media are no metrics (summaries aside)
    return images


def test_media_of_vmapped_seeds_become_images_gifs_wavs_json_and_text(mlflow_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    experiment = fresh_experiment()
    logger = lox.loggers.from_config(f"mlflow:{mlflow_server.url}?experiment={experiment}", name="media")
    seeds = 2
    tracker_media.log_batches(logger, jax.random.key(0), seeds, calls=2)  # two batch files

    client = MlflowClient(mlflow_server.url)
    runs = runs_by_name(client, experiment)
    steps = range(2 * tracker_media.MEDIA_STEPS)
    for seed in range(seeds):
        run = runs[f"media-{seed}"]
        images = check_mlflow_media(client, run.info.run_id, tmp_path / f"seed-{seed}", seed, steps)
        # Each image has the timestamp of its batch file; MLflow's UI shows them by step.
        assert len({time_ms for found in images.values() for time_ms, _ in found}) == 2
        assert run.data.tags["mlflow.loggedImages"] == "True"
        assert history(client, run.info.run_id, "loss") == [(i, (7 * seed + i) * 0.5) for i in steps]
        assert "lox" not in [item.path for item in client.list_artifacts(run.info.run_id)]  # no arrays


def test_tapped_media_reach_mlflow(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, value in CLIENT_ENV.items():
        monkeypatch.setenv(name, value)
    uri = f"sqlite:///{tmp_path}/m.db"
    logger = lox.loggers.from_config(f"mlflow:{uri}?experiment=tapped-media")
    state = logger.init(name="tapped")
    jax.jit(logger.tap(tracker_media.media_chunk, state))(0, 0)
    for i in range(tracker_media.MEDIA_STEPS):
        tracker_media.log_text(logger, state, None, i)
    logger.finish(state)
    client = MlflowClient(uri)
    run_id = runs_by_name(client, "tapped-media")["tapped"].info.run_id
    check_mlflow_media(client, run_id, tmp_path / "artifacts", 0, range(tracker_media.MEDIA_STEPS))


def test_media_without_steps_and_repeated_at_one_step_each_get_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/m.db"
    logger = lox.loggers.from_config(f"mlflow:{uri}?experiment=nostep")
    state = logger.init(name="nostep")
    for i in range(2):
        logger.log(state, {"note": f"at 7, {i}"}, step=7)
        logger.log(state, {"free": f"free {i}", "odd key:é": "x"})
    logger.finish(state)
    client = MlflowClient(uri)
    run_id = runs_by_name(client, "nostep")["nostep"].info.run_id
    _, files = mlflow_media(client, run_id, tmp_path / "artifacts")
    (batch,) = {name.split("/")[1].rsplit("-", 1)[0] for name in files if name.startswith("free/")}
    assert batch.startswith("batch-")
    assert {name: data.decode() for name, data in files.items()} == {
        "note/step_7.txt": "at 7, 0", "note/step_7-1.txt": "at 7, 1",
        f"free/{batch}-0.txt": "free 0", f"free/{batch}-1.txt": "free 1",
        f"odd key__/{batch}-0.txt": "x", f"odd key__/{batch}-1.txt": "x",
    }


SYNC_DIES = """
import os, signal, sys
from lox_backends.tools import cli
from lox_backends.trackers.mlflow import MlflowBackend

log_media = MlflowBackend._log_media

def log_then_die(self, run_id, event, *args):
    # Killed within the batch of steps {steps}, after its first images.
    if event.key == "grey" and event.step == {steps}:
        os.kill(os.getpid(), signal.SIGKILL)
    return log_media(self, run_id, event, *args)

MlflowBackend._log_media = log_then_die
sys.exit(cli.main(["sync", "runs", "--to", {spec!r}]))
"""


def test_lox_sync_sends_media_once_also_when_interrupted_and_run_again(mlflow_server, tmp_path, monkeypatch):
    """Runs logged while MLflow was out of reach (a parquet log only), then `lox
    sync`, killed halfway through a batch's media, then run again: every
    image, GIF, WAV, histogram and text is there once."""
    monkeypatch.chdir(tmp_path)
    logger = lox.loggers.from_config("parquet:runs", name="offline")
    seeds = 2
    tracker_media.log_batches(logger, jax.random.key(1), seeds, calls=3)  # three batch files

    experiment = fresh_experiment()
    spec = f"mlflow:{mlflow_server.url}?experiment={experiment}"
    script = SYNC_DIES.format(steps=tracker_media.MEDIA_STEPS + 1, spec=spec)
    env = {**os.environ, **CLIENT_ENV, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    killed = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    client = MlflowClient(mlflow_server.url)
    first = runs_by_name(client, experiment)["offline-0"].info.run_id
    images, files = mlflow_media(client, first, tmp_path / "halfway")
    # The first chunk's media, and of the second's, its samples and one grey image.
    assert sorted(images) == sorted([("samples", i) for i in range(2 * tracker_media.MEDIA_STEPS)]
                                    + [("grey", i) for i in range(tracker_media.MEDIA_STEPS + 1)])

    recorded = {folder.name: [line for path in folder.glob("_sent-mlflow-*.jsonl")
                              for line in path.read_text().splitlines() if '"file"' in line]
                for folder in (tmp_path / "runs").iterdir() if (folder / "_run.json").exists()}
    done = {pathlib.Path(folder).name: files for folder, files, _ in sync("runs", spec)}
    # Seed 0's first batches were recorded as sent; the killed one and every later one are sent now.
    assert sorted(bool(files) for files in recorded.values()) == [False, True]
    assert done == {name: len(run_files(str(tmp_path / "runs" / name))) - len(files)
                    for name, files in recorded.items()}
    runs = runs_by_name(client, experiment)
    assert sorted(runs) == ["offline-0", "offline-1"]
    steps = range(3 * tracker_media.MEDIA_STEPS)
    for seed in range(seeds):
        run_id = runs[f"offline-{seed}"].info.run_id
        check_mlflow_media(client, run_id, tmp_path / f"seed-{seed}", seed, steps)
        assert history(client, run_id, "loss") == [(i, (7 * seed + i) * 0.5) for i in steps]
    assert [files for _, files, _ in sync("runs", spec)] == [0, 0]
