"""A run's status as `lox_backends.runstore.reader.runs` reports it: stored statuses as
stored, and a run stored as "running" reported "killed" once its writer is gone
(its process on this host, or its heartbeat for three intervals).

The files are written here by hand, in the format the parquet backend writes
(an independent reference of it): ``_run.json`` with ``status``, ``host``,
``pid`` and ``heartbeat`` ({"file": path relative to DIR, "every": seconds}), and
the heartbeat file {"time", "host", "pid"}, rewritten by a real process."""

import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from lox_backends.runstore import filesystems, reader

HERE = socket.gethostname()
OTHER_HOST = "another-host.invalid"  # never this machine's name

# A writer as the parquet backend is one: its runs' _run.json, then a heartbeat
# rewritten (whole, by a rename) every `every` seconds while it lives.
WRITER = r"""
import datetime, json, os, socket, sys, time
root, every, runs = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
beat = os.path.join(root, "g.batches", "_alive-0123abcd.json")
os.makedirs(os.path.dirname(beat), exist_ok=True)

def write(path, value):
    with open(path + ".tmp", "w") as f:
        json.dump(value, f)
    os.replace(path + ".tmp", path)

for run in runs:
    os.makedirs(os.path.join(root, run), exist_ok=True)
    write(os.path.join(root, run, "_run.json"), {
        "run_id": run, "name": run, "group": "g", "index": 0, "metadata": {},
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(), "lox_version": "0.2.0",
        "status": "running", "batches": "g.batches", "host": socket.gethostname(), "pid": os.getpid(),
        "heartbeat": {"file": "g.batches/_alive-0123abcd.json", "every": every},
    })
while True:
    write(beat, {"time": time.time(), "host": socket.gethostname(), "pid": os.getpid()})
    if not sys.stdout.closed:
        print("beat", flush=True)
        sys.stdout.close()
    time.sleep(every)
"""


def start_writer(root, every, *runs):
    """A real process writing `runs` of group ``g`` under `root`, once its first heartbeat is written."""
    process = subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(every), *runs],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stderr is not None
    line = process.stdout.readline()
    assert line == "beat\n", process.stderr.read()
    return process


def statuses(root):
    return {info["run_id"]: info["status"] for info in reader.runs(root)}


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def write_run(root, run_id, created_ago=0.0, **fields):
    """A run's _run.json as the writer writes it, `fields` overriding; created `created_ago` seconds ago."""
    created = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=created_ago)
    info = {"run_id": run_id, "name": run_id, "group": "g", "index": 0, "metadata": {},
            "created": created.isoformat(), "lox_version": "0.2.0", "status": "running", "batches": "g.batches",
            **fields}
    root = str(root)
    if filesystems.is_uri(root):
        filesystems.put(filesystems.join(root, run_id, "_run.json"), json.dumps(info).encode())
    else:
        os.makedirs(os.path.join(root, run_id), exist_ok=True)
        with open(os.path.join(root, run_id, "_run.json"), "w") as f:
            json.dump(info, f)
    return info


def write_beat(root, name, ago, host=OTHER_HOST, pid=12345):
    """A heartbeat file written `ago` seconds ago; its path relative to `root`."""
    root, relative = str(root), f"g.batches/{name}"
    data = json.dumps({"time": time.time() - ago, "host": host, "pid": pid}).encode()
    if filesystems.is_uri(root):
        filesystems.put(filesystems.join(root, "g.batches", name), data)
    else:
        os.makedirs(os.path.join(root, "g.batches"), exist_ok=True)
        with open(os.path.join(root, relative), "wb") as f:
            f.write(data)
    return relative


def dead_pid():
    """The pid of a process of this host that has exited (and been reaped)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


# --- this host: the writer's process -------------------------------------------------------
def test_a_writer_killed_on_this_host_is_killed_at_once(tmp_path):
    writer = start_writer(tmp_path, 5.0, "run-a", "run-b")
    try:
        assert statuses(tmp_path) == {"run-a": "running", "run-b": "running"}
        writer.send_signal(signal.SIGKILL)
        # Killed though its last heartbeat is fresh, and before its parent reaps it (a zombie until then).
        wait_for(lambda: statuses(tmp_path) == {"run-a": "killed", "run-b": "killed"})
    finally:
        writer.kill()
        writer.wait()
    assert statuses(tmp_path) == {"run-a": "killed", "run-b": "killed"}
    on_disk = json.loads((tmp_path / "run-a" / "_run.json").read_text())
    assert on_disk["status"] == "running"  # reported, not rewritten
    assert reader.run_status(str(tmp_path / "run-a"), on_disk) == "killed"


def test_a_frozen_writer_on_this_host_is_killed_after_three_heartbeats(tmp_path):
    """A process alive but stopped (SIGSTOP) writes no heartbeat: killed after 3
    intervals; when it continues, its heartbeat makes it running again."""
    writer = start_writer(tmp_path, 0.5, "run-a")
    try:
        writer.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        assert statuses(tmp_path) == {"run-a": "running"}
        wait_for(lambda: statuses(tmp_path) == {"run-a": "killed"})
        assert time.monotonic() - stopped > 1.0  # not before 3 x 0.5 s since its last heartbeat (give or take 0.5)
        writer.send_signal(signal.SIGCONT)
        wait_for(lambda: statuses(tmp_path) == {"run-a": "running"})
    finally:
        writer.kill()
        writer.wait()


def test_a_dead_pid_on_this_host_is_killed_even_with_a_fresh_heartbeat(tmp_path):
    pid = dead_pid()
    beat = write_beat(tmp_path, "_alive-a.json", ago=0.0, host=HERE, pid=pid)
    write_run(tmp_path, "r", host=HERE, pid=pid, heartbeat={"file": beat, "every": 5.0})
    assert statuses(tmp_path) == {"r": "killed"}


# --- the heartbeat, from anywhere -----------------------------------------------------------
def test_another_hosts_run_is_told_by_its_heartbeat(tmp_path):
    """A pid of another host says nothing here (this one is dead here); its heartbeat does."""
    pid = dead_pid()
    fresh = write_beat(tmp_path, "_alive-fresh.json", ago=14.0)
    stale = write_beat(tmp_path, "_alive-stale.json", ago=16.0)
    quick = write_beat(tmp_path, "_alive-quick.json", ago=4.0)
    write_run(tmp_path, "fresh", host=OTHER_HOST, pid=pid, heartbeat={"file": fresh, "every": 5.0})
    write_run(tmp_path, "stale", host=OTHER_HOST, pid=pid, heartbeat={"file": stale, "every": 5.0})
    write_run(tmp_path, "quick", host=OTHER_HOST, pid=pid, heartbeat={"file": quick, "every": 1.0})
    write_run(tmp_path, "default", host=OTHER_HOST, pid=pid, heartbeat={"file": stale})  # every: 5 s by default
    assert statuses(tmp_path) == {"fresh": "running", "stale": "killed", "quick": "killed", "default": "killed"}


def test_a_missing_heartbeat_counts_from_the_runs_creation(tmp_path):
    beat = {"file": "g.batches/_alive-never.json", "every": 5.0}
    write_run(tmp_path, "new", created_ago=1.0, host=OTHER_HOST, pid=1, heartbeat=beat)
    write_run(tmp_path, "old", created_ago=20.0, host=OTHER_HOST, pid=1, heartbeat=beat)
    assert statuses(tmp_path) == {"old": "killed", "new": "running"}


def test_a_heartbeat_file_lox_cannot_parse_counts_from_when_it_was_written(tmp_path):
    beat = write_beat(tmp_path, "_alive-garbled.json", ago=0.0)
    (tmp_path / beat).write_text("{not json")
    write_run(tmp_path, "r", host=OTHER_HOST, pid=1, heartbeat={"file": beat, "every": 5.0})
    assert statuses(tmp_path) == {"r": "running"}
    os.utime(tmp_path / beat, (time.time() - 60, time.time() - 60))
    assert statuses(tmp_path) == {"r": "killed"}


def test_stored_statuses_other_than_running_are_reported_as_stored(tmp_path):
    pid = dead_pid()
    stale = write_beat(tmp_path, "_alive-stale.json", ago=60.0)
    for status in ["finished", "failed"]:
        write_run(tmp_path, status, status=status, host=HERE, pid=pid, heartbeat={"file": stale, "every": 5.0},
                  rows=0)
    assert statuses(tmp_path) == {"finished": "finished", "failed": "failed"}


def test_running_runs_of_earlier_lox_stay_running(tmp_path):
    """Written before lox recorded its writers: nothing tells whether they live."""
    write_run(tmp_path, "old", created_ago=86400.0)
    assert statuses(tmp_path) == {"old": "running"}
    assert reader.run_status(str(tmp_path / "old"), {"status": "running"}) == "running"


def test_a_thousand_runs_of_a_group_read_their_heartbeat_once(tmp_path):
    """Their writer's heartbeat file is read once, its process looked up once
    (the interpreter's audit events count each open and kill)."""
    writer = start_writer(tmp_path, 5.0, *[f"seed-{i:04d}" for i in range(1000)])
    beat = os.path.abspath(tmp_path / "g.batches" / "_alive-0123abcd.json")
    seen = {"open": 0, "os.kill": 0}
    watching = [False]

    def audit(event, args):
        if not watching[0]:
            return
        if event == "open" and args and os.fspath(args[0]) == beat:
            seen["open"] += 1
        elif event == "os.kill" and args[0] == writer.pid:
            seen["os.kill"] += 1

    sys.addaudithook(audit)  # for the rest of the session: inert but while `watching`
    try:
        watching[0] = True
        found = reader.runs(tmp_path)
        watching[0] = False
        assert [info["status"] for info in found] == ["running"] * 1000
        assert seen == {"open": 1, "os.kill": 1}
    finally:
        watching[0] = False
        writer.kill()
        writer.wait()


# --- in a bucket --------------------------------------------------------------------------
@pytest.fixture
def bucket(s3_server, monkeypatch):
    return f"{s3_server.fresh_bucket(monkeypatch)}/runs"  # s3_server: tests/conftest.py


def test_heartbeats_in_a_bucket(bucket):
    pid = dead_pid()
    fresh = write_beat(bucket, "_alive-fresh.json", ago=1.0)
    stale = write_beat(bucket, "_alive-stale.json", ago=30.0)
    write_run(bucket, "fresh", host=OTHER_HOST, pid=pid, heartbeat={"file": fresh, "every": 5.0})
    write_run(bucket, "stale", host=OTHER_HOST, pid=pid, heartbeat={"file": stale, "every": 5.0})
    write_run(bucket, "here", host=HERE, pid=pid, heartbeat={"file": fresh, "every": 5.0})  # its process is gone
    write_run(bucket, "missing", created_ago=30.0, host=OTHER_HOST, pid=pid,
              heartbeat={"file": "g.batches/_alive-none.json", "every": 5.0})
    write_run(bucket, "done", status="finished", host=OTHER_HOST, pid=pid, heartbeat={"file": stale, "every": 5.0})
    assert statuses(bucket) == {"fresh": "running", "stale": "killed", "here": "killed", "missing": "killed",
                                "done": "finished"}
