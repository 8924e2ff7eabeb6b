"""`lox sync --timeout` (`sync(..., timeout=)` of `lox_backends/trackers/sync.py`, whose sending
of what is missing the trackers' own tests check): an MLflow server that
is down is reported at once, not after the client's minutes of retries; one
that never answers, or any tracker call that hangs, stops the sync after the
timeout, naming the tracker and what to do, with nothing recorded as sent."""

import os
import pathlib
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
from logs_testing import free_port, saved_runs
from s3_server import S3Server

from lox_backends.plugin import hooks
from lox_backends.plugin.registry import registry
from lox_backends.tools import cli
from lox_backends.trackers.sync import SyncError, SyncTimeout, sync
from lox_backends.trackers.template import TrackerBackend

LOX = os.path.join(os.path.dirname(sys.executable), "lox")  # the installed console script


def save_runs(folder, names=("r",)):
    """Runs saved by a parquet Logger, two batch files of 4 steps each; their run folders."""
    return [str(pathlib.Path(folder) / run_id) for run_id in saved_runs(folder, names)]


def nothing_recorded(folder):
    """No record of anything sent in any run folder of `folder`."""
    assert list(pathlib.Path(folder).glob("*/_sent-*")) == []


def locks(folder):
    return list(pathlib.Path(folder).glob("*/_sending-*.lock"))


def mlflow_env(**chosen):
    """The environment without the tests' MLflow client settings (its own defaults: 7 retries over
    about 4 minutes, 120 s per request), with `chosen` ones."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP_REQUEST")}
    return {**env, "MLFLOW_DISABLE_TELEMETRY": "true", "LOX_DEFAULT": "off", "JAX_PLATFORMS": "cpu", **chosen}


@pytest.fixture
def silent_server():
    """A port that takes connections (the kernel's backlog) and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


def test_an_mlflow_server_that_is_down_is_reported_at_once(tmp_path):
    """With MLflow's own retry settings its client takes about 4 minutes to fail
    each request: lox sync makes it try once, and stops after the first run."""
    folders = save_runs(tmp_path / "runs", names=("a", "b", "c"))
    port = free_port()  # nothing listens there
    spec = f"mlflow:http://127.0.0.1:{port}?experiment=down"
    began = time.monotonic()
    result = subprocess.run([LOX, "sync", str(tmp_path / "runs"), "--to", spec], env=mlflow_env(),
                            capture_output=True, text=True, timeout=300)
    took = time.monotonic() - began
    assert result.returncode == 1 and took < 60, (took, result.stderr)  # 249 s before
    assert result.stdout == f"sent 0 batch file(s), 0 row(s) to {spec}\n"
    pattern = (
        rf"lox sync: error: 3 run\(s\) could not be synced to {re.escape(spec)}:\n"
        rf"  {re.escape(folders[0])}: MlflowException: API request to http://127\.0\.0\.1:{port}/\S+ failed with "
        r"exception .*Connection refused.*\n"
        r"  and 2 more run\(s\), not tried: the tracker could not be reached\n"
        r"Run `lox sync` again once the cause is fixed: it sends only what is missing\.\n"
    )
    assert re.fullmatch(pattern, result.stderr), result.stderr
    nothing_recorded(tmp_path / "runs")
    assert locks(tmp_path / "runs") == [] and not (tmp_path / "lox-runs").exists()


def test_an_mlflow_server_that_never_answers_is_given_up_on_after_the_timeout(tmp_path, silent_server, monkeypatch):
    (folder,) = save_runs(tmp_path / "runs")
    spec = f"mlflow:{silent_server}?experiment=silent"
    for name, value in mlflow_env().items():
        monkeypatch.setenv(name, value)
    for name in [n for n in os.environ if n.startswith("MLFLOW_HTTP_REQUEST")]:
        monkeypatch.delenv(name)
    # MLflow's client gives up itself after 3 s, told to by lox sync, with its own error.
    began = time.monotonic()
    with pytest.raises(SyncError, match=rf"^1 run\(s\) could not be synced to {re.escape(spec)}:\n  "
                       rf"{re.escape(folder)}: MlflowException: API request to {silent_server}/\S+ failed with "
                       r"exception .*Read timed out\. \(read timeout=3\)"):
        sync(str(tmp_path / "runs"), spec, timeout=3)
    assert time.monotonic() - began < 10  # 3 s of waiting, and importing MLflow
    assert not any(name.startswith("MLFLOW_HTTP_REQUEST") for name in os.environ)  # put back as it was
    nothing_recorded(tmp_path / "runs")

    # Where the user made the client wait longer, lox sync stops waiting for it after 3 s all the same.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "600")
    began = time.monotonic()
    with pytest.raises(SyncTimeout) as raised:
        sync(str(tmp_path / "runs"), spec, timeout=3)
    assert 3 <= time.monotonic() - began < 9
    assert str(raised.value) == (
        f"lox sync gave up on opening run 'r', which took longer than 3 s: {spec} did not answer in time, and "
        f"nothing more was recorded as sent. Check that {spec} is up and reachable from here, then run `lox sync "
        f"{tmp_path / 'runs'} --to '{spec}'` again (it sends only what is missing), with a larger --timeout if "
        "it is only slow."
    )
    assert raised.value.done == [] and raised.value.failed == []
    nothing_recorded(tmp_path / "runs")
    assert len(locks(tmp_path / "runs")) == 1  # held by the call still waiting, in a thread of its own


def test_the_lox_command_exits_at_the_timeout_though_a_call_still_waits(tmp_path, silent_server):
    save_runs(tmp_path / "runs")
    spec = f"mlflow:{silent_server}?experiment=silent"
    env = mlflow_env(MLFLOW_HTTP_REQUEST_TIMEOUT="600")  # the client would wait 10 minutes
    result = subprocess.run([LOX, "sync", str(tmp_path / "runs"), "--to", spec, "--timeout", "2"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stdout == f"sent 0 batch file(s), 0 row(s) to {spec}\n"
    assert result.stderr == (
        f"lox sync: error: lox sync gave up on opening run 'r', which took longer than 2 s: {spec} did not answer "
        f"in time, and nothing more was recorded as sent. Check that {spec} is up and reachable from here, then "
        f"run `lox sync {tmp_path / 'runs'} --to '{spec}'` again (it sends only what is missing), with a larger "
        "--timeout if it is only slow.\n"
    )
    nothing_recorded(tmp_path / "runs")


def test_a_bucket_that_does_not_answer_stops_the_sync_at_the_timeout(tmp_path, monkeypatch):
    """Runs in a bucket whose server is frozen (SIGSTOP: it takes connections, answers nothing):
    the bucket's operations are bounded by --timeout too (storage.time_limit), not by lox's default."""
    server = S3Server(tmp_path).start()
    try:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        server.create_bucket("runs")
        save_runs("s3://runs/lox")
        server.pause()
        began = time.monotonic()
        with pytest.raises(TimeoutError, match=r"^lox: .* 's3://runs/lox' did not finish within 2 s; lox stopped "
                           r"waiting for it\. Check that the store answers \(.*AWS_ENDPOINT_URL.*\), or give a longer "
                           r"timeout \(the Logger's timeout=, `lox sync --timeout`\)\.$"):
            sync("s3://runs/lox", f"tensorboard:{tmp_path}/tb", timeout=2)
        assert 2 <= time.monotonic() - began < 5
    finally:
        server.stop()  # resumes it first
    assert not (tmp_path / "tb").exists()


# --- a tracker whose client cannot be told to give up ---------------------------------------
class Stalling(TrackerBackend):
    """Writes what it is sent to `sent`; a batch of run 'stuck' waits until `release` is set."""

    tracker = "stall"
    sent: list[tuple[str, str]] = []
    release = threading.Event()
    returned = threading.Event()

    def destination(self):
        return "stall"

    def start_run(self, run, remote):
        return {"id": run.run_id}

    def send(self, run, remote, batch):
        if run.name == "stuck":
            Stalling.release.wait()
            Stalling.returned.set()
        Stalling.sent.append((run.name, batch.name))


class StallPlugin:
    @hooks.hookimpl
    def lox_backends(self):
        return [hooks.BackendSpec("stall", Stalling)]


def test_a_call_that_returns_after_the_timeout_records_nothing(tmp_path):
    registry.register(StallPlugin(), name="lox-tests:stall")
    first, stuck = save_runs(tmp_path / "runs", names=("first", "stuck"))
    began = time.monotonic()
    with pytest.raises(SyncTimeout, match=r"^lox sync gave up on sending batch-000000-[0-9a-f]{8}\.parquet "
                       r"of run 'stuck', which took longer than 1 s: stall did not answer in time, and nothing more "
                       "was recorded as sent"):
        sync(str(tmp_path / "runs"), "stall", timeout=1)
    assert 1 <= time.monotonic() - began < 6
    record = pathlib.Path(stuck).glob("_sent-stall-*.jsonl")
    before = [path.read_text() for path in record]
    Stalling.release.set()  # the call returns, long after lox sync gave up on it
    assert Stalling.returned.wait(10)
    time.sleep(0.5)
    assert [path.read_text() for path in pathlib.Path(stuck).glob("_sent-stall-*.jsonl")] == before
    assert '"file"' not in "".join(before)  # nothing recorded for the stuck run
    assert [name for name, _ in Stalling.sent] == ["first", "first", "stuck"]

    # The next sync sends what is missing, and only that.
    done = sync(str(tmp_path / "runs"), "stall", timeout=1)
    assert done == [(first, 0, 0), (stuck, 2, 8)]
    assert [name for name, _ in Stalling.sent] == ["first", "first", "stuck", "stuck", "stuck"]


def test_the_timeout_must_be_a_positive_number_of_seconds(tmp_path, capsys):
    save_runs(tmp_path / "runs")
    for bad in (0, -3, float("nan"), float("inf"), "5"):
        with pytest.raises(ValueError, match=r"^lox sync's timeout is a positive number of seconds \(or None: no "
                                             rf"bound\), got {re.escape(repr(bad))}; e\.g\. --timeout 60\.$"):
            sync(str(tmp_path / "runs"), f"tensorboard:{tmp_path}/tb", timeout=bad)
    with pytest.raises(SystemExit) as exited:
        cli.main(["sync", str(tmp_path / "runs"), "--to", f"tensorboard:{tmp_path}/tb", "--timeout", "-3"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "lox sync: error: lox sync's timeout is a positive number of seconds (or None: no bound), got -3.0; "
        "e.g. --timeout 60.\n"
    )
    assert not (tmp_path / "tb").exists()


def test_sync_help_describes_the_timeout(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        cli.main(["sync", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ("--timeout SECONDS give up when one step (a call to the tracker, reading a run's files) takes longer "
            "than this (default: 30); nothing is recorded as sent that was not") in text
