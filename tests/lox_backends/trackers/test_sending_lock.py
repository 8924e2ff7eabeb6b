"""The lock that keeps two processes from sending one run to one destination at
once (``_sending-*.lock`` in the run folder): removed when its sender lets go
of it, without two processes ever holding it at once (real processes
contending), and a killed sender's removed by the next `lox sync`."""

import collections
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
from logs_testing import saved_runs

import lox
from lox_backends.tools import cli

REPO = pathlib.Path(__file__).resolve().parents[3]
LOX = os.path.join(os.path.dirname(sys.executable), "lox")  # the installed console script
ENV = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", "LOX_DEFAULT": "off"}


def locks(folder):
    return sorted(p.name for p in pathlib.Path(folder).glob("*/_sending-*.lock"))


def test_no_lock_file_stays_after_finish(tmp_path):
    logger = lox.loggers.from_config(f"tensorboard:{tmp_path}/tb?local={tmp_path}/runs", name="tb")
    state = logger.init(name="r")
    logger.log(state, lox.logdict({"loss": np.array([1.0, 0.5])}, {"step": {"loss": np.array([0, 1])}}))
    logger.flush()
    assert len(locks(tmp_path / "runs")) == 1  # held while the run is open
    logger.finish(state)
    assert locks(tmp_path / "runs") == []
    assert len(list((tmp_path / "runs").glob("*/_sent-tensorboard-*.jsonl"))) == 1  # what was sent, kept


CONTENDER = """
import os, sys, time
from lox_backends.runstore.sent import SentRecord
folder, log, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # one write per line: whole lines
while not os.path.exists(os.path.join(folder, "go")):
    time.sleep(0.001)
held = 0
while held < rounds:
    record = SentRecord(folder, "mlflow", "http://tracker experiment=x")
    if not record.lock():
        continue
    os.write(out, f"in {os.getpid()}\\n".encode())
    time.sleep(0.0005)
    os.write(out, f"out {os.getpid()}\\n".encode())
    held += 1
    record.unlock()
"""


def test_processes_contending_for_a_run_never_hold_its_lock_at_once(tmp_path):
    """Four processes take and let go of one run's lock as fast as they can;
    each notes when it holds it. A holder removes the lock file as it lets go:
    a process that opened the old file just before must not take a lock on a
    file that is gone while another takes one on the new file."""
    log, rounds = tmp_path / "holders.log", 150
    processes = [subprocess.Popen([sys.executable, "-c", CONTENDER, str(tmp_path), str(log), str(rounds)],
                                  env=ENV, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    (tmp_path / "go").touch()
    for process in processes:
        assert process.wait(timeout=300) == 0, process.stderr.read()
    lines = log.read_text().splitlines()
    assert len(lines) == 2 * 4 * rounds
    holder = None
    for line in lines:  # strictly "in P", "out P" pairs: never two holders
        kind, pid = line.split()
        assert (kind, pid) == ("in", pid) if holder is None else (kind, pid) == ("out", holder), lines
        holder = pid if kind == "in" else None
    assert list(tmp_path.glob("_sending-*.lock")) == []


HOLDER = """
import sys, time
from lox_backends.runstore.sent import SentRecord
record = SentRecord(sys.argv[1], "tensorboard", sys.argv[2])  # as a live process sending the run holds it
assert record.lock()
print("holding", flush=True)
time.sleep(600)
"""


def test_lox_sync_leaves_a_run_another_process_sends_and_removes_a_killed_senders_lock(tmp_path):
    (run_id,) = saved_runs(tmp_path / "runs")
    folder, tb = tmp_path / "runs" / run_id, tmp_path / "tb"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), str(tb)], env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "holding\n", holder.stderr.read()
        (lock,) = folder.glob("_sending-tensorboard-*.lock")
        refused = subprocess.run([LOX, "sync", str(tmp_path / "runs"), "--to", f"tensorboard:{tb}"], env=ENV,
                                 capture_output=True, text=True, timeout=300)
        assert refused.returncode == 1
        assert refused.stderr == (
            f"lox sync: error: 1 run(s) could not be synced to tensorboard:{tb}:\n"
            f"  {folder}: Unsendable: another process is sending run 'r' to this destination now (it holds "
            f"{lock}); lox sync leaves live runs to it\n"
            "Run `lox sync` again once the cause is fixed: it sends only what is missing.\n"
        )
        assert lock.exists()  # the holder's, left alone
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert locks(tmp_path / "runs") == [lock.name]  # the killed sender's, held by nobody
    assert cli.main(["sync", str(tmp_path / "runs"), "--to", f"tensorboard:{tb}"]) == 0
    assert locks(tmp_path / "runs") == []


SENDER = """
import os, sys, time
from lox_backends.plugin import hooks
from lox_backends.trackers.sync import SyncError, sync
from lox_backends.trackers.template import TrackerBackend
from lox_backends.plugin.registry import registry

class Logged(TrackerBackend):
    '''Appends "run batch-file" to the target file for each batch it is sent.'''
    tracker = "sendlog"
    def destination(self):
        return self.target
    def start_run(self, run, remote):
        return {"id": run.run_id}
    def send(self, run, remote, batch):
        with open(self.target, "a") as f:
            f.write(f"{run.run_id} {batch.name}\\n")
        time.sleep(0.02)

class Plugin:
    @hooks.hookimpl
    def lox_backends(self):
        return [hooks.BackendSpec("sendlog", Logged)]

registry.register(Plugin(), name="lox-tests:sendlog")
while not os.path.exists(sys.argv[3]):
    time.sleep(0.001)
try:
    sync(sys.argv[1], "sendlog:" + sys.argv[2])
except SyncError as error:
    assert all("another process is sending run" in str(e) for _, e in error.failed), error
print("done", flush=True)
"""


def test_syncs_at_once_send_each_batch_once(tmp_path):
    """Three `lox sync`s of one folder at once, then one more: every batch of every run reaches the tracker once."""
    run_ids = saved_runs(tmp_path / "runs", names=[f"r{i}" for i in range(6)], batches=3)
    sent, go = tmp_path / "sent.log", tmp_path / "go"
    command = [sys.executable, "-c", SENDER, str(tmp_path / "runs"), str(sent), str(go)]
    processes = [subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(3)]
    time.sleep(1)
    go.touch()
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0 and out == "done\n", err
    last = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=300)
    assert last.returncode == 0, last.stderr
    counts = collections.Counter(sent.read_text().splitlines())
    batch_files = sorted(p.name for p in (tmp_path / "runs").glob("*.batches/batch-*.parquet"))
    assert len(batch_files) == 3
    assert counts == {f"{run_id} {name}": 1 for run_id in run_ids for name in batch_files}
    assert locks(tmp_path / "runs") == []
