"""Multi-process jobs: real `jax.distributed` jobs of 2 processes (CPU, gloo
collectives, 4 devices each) on 127.0.0.1, started from here with a deadline,
compared with the same computation in one process of 8 devices
(tests/support/multiprocess_job.py is one process of either).

Covers lox_backends/logger/processes.py, with test_process_death.py."""

import json
import os
import subprocess
import sys

import pytest
from logs_testing import assert_logs_equal, free_port
from paths import REPO

import lox
from lox_backends.runstore import reader

JOB = REPO / "tests" / "support" / "multiprocess_job.py"
DEADLINE = 300  # seconds for a whole job: a hang fails the test instead of stalling the suite


def finished(scenario: str, folder, processes: int = 2, mode: str = "first") -> list[tuple[int, str, str]]:
    """Start the job's processes at once; each one's exit code, stdout and stderr, in process order."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "JAX_PLATFORMS": "cpu",
           "LOX_DEFAULT": "off"}
    port = str(free_port())
    jobs = [subprocess.Popen([sys.executable, str(JOB), scenario, str(i), str(processes), port, str(folder), mode],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=JOB.parent)
            for i in range(processes)]
    results = []
    try:
        for job in jobs:
            out, err = job.communicate(timeout=DEADLINE)
            results.append((job.returncode, out, err))
    finally:
        for job in jobs:
            job.kill()
    return results


def run_job(scenario: str, folder, processes: int = 2, mode: str = "first") -> list[dict]:
    """Start the job's processes at once; what each printed, in process order."""
    reports = []
    for code, out, err in finished(scenario, folder, processes, mode):
        assert code == 0, f"process exited with {code}:\n{err}"
        assert "Traceback" not in err, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The training job in one process of 8 devices: what lox writes without jax.distributed."""
    folder = tmp_path_factory.mktemp("reference")
    (report,) = run_job("train", folder, processes=1)
    return report, reader.load(folder)


def test_a_two_process_job_writes_each_run_once_as_one_process_does(tmp_path, reference):
    one_process, want = reference
    reports = run_job("train", tmp_path)
    # Every process agrees on the run ids (through JAX's distributed runtime).
    assert reports[0]["runs"] == reports[1]["runs"] and len(reports[0]["runs"]) == 2
    got = reader.load(tmp_path)
    assert list(got) == reports[0]["runs"]  # one run per logical run: nothing twice, no run per process
    assert [info["metadata"]["lr"] for info in reader.runs(tmp_path)] == pytest.approx([0.1, 0.2])  # float32
    for run_got, run_want in zip(got.values(), want.values(), strict=True):
        # Spooled in jit, tapped in jit, and logged outside jit (a batch sharded across the two
        # processes, gathered; a replicated array): the same events, steps and values up to the
        # order of the float sums (the reduction runs across processes).
        assert_logs_equal(run_got, run_want, rtol=1e-6)
    assert list(got.values())[0]["batch"].shape == (1, 16, 4)
    # lox.tap in a multi-process jit: each event reaches the callback once per job, on process 0.
    assert reports[0]["tapped"] == one_process["tapped"] == [31.5] and reports[1]["tapped"] == []


def test_programs_every_process_runs_alone_are_written_once(tmp_path):
    # `logger.init` and the steps jitted on process-local arrays: each process runs them itself.
    reports = run_job("local", tmp_path)
    assert reports[0]["runs"] == reports[1]["runs"] and len(reports[0]["runs"]) == 3
    got = reader.load(tmp_path)
    assert list(got) == reports[0]["runs"]
    for seed, logs in enumerate(got.values()):
        assert logs["x"].tolist() == [seed, seed] and logs.step["x"].tolist() == [0, 1]


def test_with_processes_each_every_process_writes_runs_of_its_own(tmp_path, reference):
    _, want = reference
    reports = run_job("train", tmp_path, mode="each")
    first, second = reports[0]["runs"], reports[1]["runs"]
    assert [r.rsplit("-", 2)[-2:] for r in first] == [["p0", "0"], ["p0", "1"]]
    assert [r.replace("-p1-", "-p0-") for r in second] == first  # one job: the same group
    infos = {info["run_id"]: info for info in reader.runs(tmp_path)}
    assert sorted(infos) == sorted(first + second)
    assert {infos[r]["metadata"]["process_index"] for r in first} == {0}
    assert {infos[r]["metadata"]["process_index"] for r in second} == {1}
    got = reader.load(tmp_path)
    # A jitted program's host calls run on its first device: its logs are process 0's.
    for run, run_want in zip(first, want.values(), strict=True):
        assert_logs_equal(got[run], run_want, rtol=1e-6)
    # What each process logged outside jit, it writes itself.
    reference_run = next(iter(want.values()))
    outside = {key: reference_run[key] for key in ("batch", "w")}
    assert_logs_equal(got[second[0]], lox.logdict(outside, {"step": {k: reference_run.step[k] for k in outside}}))


def test_logger_calls_in_shard_map_are_refused_by_default_and_per_process_with_each(tmp_path):
    for report in run_job("refuse", tmp_path / "first"):  # on every process alike: no process hangs
        assert report["error"].startswith("a lox logger is called inside shard_map or pmap in a job of 2 processes")
        assert "processes='each'" in report["error"]
    reports = run_job("refuse", tmp_path / "each", mode="each")
    assert all("error" not in report for report in reports)
    got = reader.load(tmp_path / "each")
    # Each process writes what its own 4 devices logged.
    assert sorted(len(logs["loss"]) for logs in got.values()) == [4, 4]


def test_an_active_run_in_a_two_process_job_is_written_once_as_one_process_writes_it(tmp_path):
    reports = run_job("active", tmp_path / "job")
    (alone,) = run_job("active", tmp_path / "alone", processes=1)
    assert reports[0]["runs"] == reports[1]["runs"] and len(reports[0]["runs"]) == 2
    for report in reports:  # logs inside shard_map, whose host calls run on every device: refused alike
        assert report["error"].startswith("a lox logger is called inside shard_map or pmap in a job of 2 processes")
    assert "error" not in alone
    got, want = reader.load(tmp_path / "job"), reader.load(tmp_path / "alone")
    assert list(got) == reports[0]["runs"]
    for run_got, run_want in zip(got.values(), want.values(), strict=True):
        keys = ["loss", "grad_norm", "done"]  # jitted on a batch sharded across processes, and eager
        expected = lox.logdict({k: run_want[k] for k in keys}, {"step": {k: run_want.step[k] for k in keys}})
        assert_logs_equal(run_got, expected, rtol=1e-6)
        assert run_got.step["loss"].tolist() == [0, 1, 2] and run_got["done"].tolist() == [1]
        assert run_want["rows"].shape == (8,)  # one process of 8 devices: each device's rows, in each run


def test_a_run_id_is_resumed_alike_on_every_process_and_refused_alike_when_it_exists(tmp_path):
    # Process 0 looks for the run (it writes); process 1 takes what it decided.
    reports = run_job("resume", tmp_path)
    assert reports[0]["runs"] == reports[1]["runs"] == [["job", True, 1]]
    assert reports[0]["error"] == reports[1]["error"]
    assert reports[0]["error"].startswith(f"`logger.init` got run_id='job', and run 'job' exists ('{tmp_path}/job')")
    logs = lox.load(tmp_path / "job")
    assert (logs.step["x"].tolist(), logs["x"].tolist()) == ([0, 1, 2], [1.0, 2.0, 2.0])
    assert [r["run_id"] for r in reader.runs(tmp_path)] == ["job"]


def test_a_logger_made_before_the_job_is_joined_is_refused_at_init(tmp_path):
    for report in run_job("early", tmp_path):
        assert report["error"].startswith("this lox Logger was created before `jax.distributed.initialize()`")


def test_loggers_created_differently_on_each_process_fail_with_a_timeout_not_a_hang(tmp_path):
    reports = run_job("mismatch", tmp_path)
    assert "error" not in reports[0]
    assert reports[1]["error"].startswith("lox: process 1 waited 2 s for process 0 to create its Logger number 0")
    assert reports[1]["error"].endswith("Create the same Loggers on every process, in the same order.")


def raised(pid: int) -> str:
    """The end of the traceback of `raising_callback` (tests/support/multiprocess_job.py) on process `pid`."""
    return ("in raising_callback\n    raise ValueError(f\"boom on process {pid}\")\n"
            f"ValueError: boom on process {pid}\n"
            "raised by lox.tap callback main.<locals>.raising_callback while delivering keys 'sum'\n")


def test_a_tap_callback_raising_on_process_0_fails_with_its_message_on_every_process_not_an_abort(tmp_path):
    # Inside jax.jit the host call runs on process 0 only. XLA never sees the exception, so no
    # process is left waiting for a failed program (both used to end by SIGABRT, exit code -6).
    (code0, _, err0), (code1, _, err1) = finished("raise-jit", tmp_path)
    # Process 0: the callback's own exception, raised by its `jax.effects_barrier()`, uncaught.
    assert code0 == 1, err0
    assert "in <module>\n" in err0 and "jax.effects_barrier()" in err0 and raised(0) in err0
    # Process 1 ran the program without a callback: it prints process 0's at exit, and fails too.
    assert code1 == 1, err1
    assert "lox: a host callback raised on process 0 of this job:\nTraceback (most recent call last):\n" in err1
    assert raised(0) in err1


def test_tap_callbacks_raising_on_both_processes_fail_each_with_its_own_and_the_others_message(tmp_path):
    # A program on process-local arrays: each process runs it, and its callback, alone.
    for pid, (code, _, err) in enumerate(finished("raise-local", tmp_path)):
        assert code == 1, err
        assert "summed(jnp.arange(3.0))" in err and raised(pid) in err  # its own, raised by the eager call
        assert f"lox: a host callback raised on process {1 - pid} of this job:\n" in err and raised(1 - pid) in err


def test_the_processes_option_names_what_it_takes():
    with pytest.raises(ValueError, match=r"a Logger's `processes` is 'first' \(process 0 writes, the default\) or "
                                         r"'each' \(every process writes runs of its own\), got 'all'"):
        lox.loggers.from_config("memory", processes="all")
