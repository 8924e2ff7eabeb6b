"""A process of a multi-process job that dies: real `jax.distributed` jobs on 127.0.0.1 (CPU, gloo
collectives; tests/support/multiprocess_job.py is each process), a real SIGKILL.

JAX's coordination service ends the other processes only a minute or more later (SIGABRT, no exit flush).
Before that, lox's watcher (lox_backends.logger.processes.Watcher) notices the silent process, writes what the
loggers received and prints one line. The tests kill the survivors themselves once that is done.
"""

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from logs_testing import free_port
from paths import REPO

import lox
from lox_backends.logger import processes
from lox_backends.runstore import reader

JOB = REPO / "tests" / "support" / "multiprocess_job.py"
DEADLINE = 120  # seconds for any one wait: a hang fails the test instead of stalling the suite
GONE = re.compile(r"lox: process (\d+) of this job \(([^,]+), pid (\d+)\) is gone: no heartbeat from it for (\d+) s\. "
                  r"JAX will end this process when its coordination service notices \(SIGABRT\); (.*)\.$", re.M)


class Job:
    """A job's processes, started at once, each writing its stdout and stderr to files in `folder`."""

    def __init__(self, scenario: str, folder: pathlib.Path, processes: int, mode: str):
        """`folder` is the job's parquet folder; the processes' outputs go beside it."""
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               "JAX_PLATFORMS": "cpu", "LOX_DEFAULT": "off"}
        port = str(free_port())
        self.folder = folder
        self.outputs = folder.parent / f"{folder.name}-outputs"
        self.outputs.mkdir()
        self.started = time.monotonic()
        self.processes = []
        for i in range(processes):
            with open(self.outputs / f"out{i}", "w") as out, open(self.outputs / f"err{i}", "w") as err:
                self.processes.append(subprocess.Popen(
                    [sys.executable, str(JOB), scenario, str(i), str(processes), port, str(folder), mode],
                    stdout=out, stderr=err, env=env, cwd=JOB.parent))

    def out(self, i: int) -> str:
        return (self.outputs / f"out{i}").read_text()

    def err(self, i: int) -> str:
        return (self.outputs / f"err{i}").read_text()

    def wait_for(self, what: str, done) -> None:
        """Until `done()`, failing after DEADLINE seconds or when a process ended first."""
        while not done():
            codes = [p.poll() for p in self.processes]
            assert time.monotonic() - self.started < DEADLINE, f"waited {DEADLINE} s for {what}:\n{self.errors()}"
            assert not any(code is not None and code != -signal.SIGKILL for code in codes), (
                f"a process ended ({codes}) before {what}:\n{self.errors()}")
            time.sleep(0.2)

    def errors(self) -> str:
        return "\n".join(f"--- process {i}:\n{self.err(i)[-3000:]}" for i in range(len(self.processes)))

    def kill(self, i: int) -> None:
        self.processes[i].send_signal(signal.SIGKILL)
        self.processes[i].wait(DEADLINE)

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(DEADLINE)


def steps_done(job: Job, i: int) -> int:
    """How many steps process `i` printed: each one's logs had reached its logger."""
    return job.out(i).count("step ")


def assert_prefix(values, steps, expected, at_least: int) -> None:
    """`values` at `steps` 0, 1, ... n-1 (n >= at_least), each `expected(step)`."""
    assert steps.tolist() == list(range(len(steps))) and len(steps) >= at_least, steps
    np.testing.assert_array_equal(values, np.array([expected(i) for i in range(len(steps))], np.float32))


@pytest.mark.parametrize(("count", "mode"), [(2, "first"), (3, "each")])
def test_when_a_process_is_killed_the_others_write_what_they_received_and_name_it(tmp_path, count, mode):
    # With 2 processes, process 0 writes every run; with processes="each" and 3, process 0 and process 1
    # each write runs of their own (process 1 learns of the death from process 0, which watches).
    # flush_every is 600 s: without the watcher, nothing would be written before JAX ends the job.
    victim = count - 1
    job = Job("train-until-killed", tmp_path / "runs", count, mode)
    try:
        job.wait_for("4 steps on every process", lambda: all(steps_done(job, i) >= 4 for i in range(count)))
        reached = [steps_done(job, i) for i in range(victim)]  # steps whose logs reached each survivor's logger
        killed_at = time.monotonic()
        job.kill(victim)
        survivors = range(victim)
        job.wait_for("the line of every survivor", lambda: all(GONE.search(job.err(i)) for i in survivors))
        seen_after = time.monotonic() - killed_at
        for i in survivors:
            (line,) = GONE.findall(job.err(i))  # one line
            process, _host, pid, silent, done = line
            assert (int(process), int(pid)) == (victim, job.processes[victim].pid)
            assert processes.GONE_AFTER <= int(silent) + 1 < processes.GONE_AFTER + 10
            assert done == f"lox wrote what this process's loggers had received to parquet:{tmp_path / 'runs'}"
        # Well before JAX's coordination service notices (100 s by default): the survivors still run.
        assert seen_after < processes.GONE_AFTER + 15 and all(job.processes[i].poll() is None for i in survivors)
        # The line is printed once the loggers wrote: every step that reached a survivor's logger is there.
        runs = {info["metadata"].get("process_index", 0): info["run_id"] for info in reader.runs(tmp_path / "runs")}
        writer = lox.load(tmp_path / "runs" / runs[0])
        assert isinstance(writer, lox.logdict)
        # Logged inside jit (process 0's host call): the sum of the batch sharded over every device, times the
        # step; 8 devices in all with 2 processes (0 + 1 + ... + 7), 6 with 3.
        total = sum(range(8 // count * count))
        assert_prefix(writer["total"], writer.step["total"], lambda i: total * i, at_least=reached[0])
        assert_prefix(writer["local"], writer.step["local"], lambda i: i, at_least=reached[0])
        if mode == "each":  # what process 1 logged outside jit, in its own run
            other = lox.load(tmp_path / "runs" / runs[1])
            assert isinstance(other, lox.logdict)
            assert_prefix(other["local"], other.step["local"], lambda i: 100 + i, at_least=reached[1])
    finally:
        job.close()


def test_a_job_whose_processes_end_at_different_times_prints_no_such_line(tmp_path):
    # Two jobs at once. "exit": process 1 finishes and exits first (it waits at exit for process 0) while
    # process 0 logs on alone for 13 s, longer than a watcher waits for a silent process. "shutdown": both
    # call jax.distributed.shutdown(), then process 0 lingers 13 s without the job.
    jobs = {mode: Job("finish-apart", tmp_path / mode, 2, mode) for mode in ("exit", "shutdown")}
    try:
        for mode, job in jobs.items():
            for process in job.processes:
                process.wait(DEADLINE)
            for i, process in enumerate(job.processes):
                assert process.returncode == 0, job.errors()
                assert "lox:" not in job.err(i) and "Traceback" not in job.err(i), job.errors()
            (logs,) = reader.load(tmp_path / mode).values()
            assert logs["total"].tolist() == [0, 28, 56]
            assert logs.step["local"].tolist() == list(range(16 if mode == "exit" else 3))
    finally:
        for job in jobs.values():
            job.close()
