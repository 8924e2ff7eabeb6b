"""Resumed runs in the run store (lox_backends/runstore/writer.py, reader.py, layout.py's
"Resumed runs"): a training job killed by a real SIGKILL at random steps and restarted from
its last checkpoint with ``logger.init(run_id=..., resume="allow", from_step=...)`` reads every
step once, with the values of a run that was never killed (computed here by hand); on a
local disk and in a bucket (moto's S3 server), for one run and for vmapped seeds. And what
``_run.json`` keeps across a resume, and what a resume without ``from_step`` keeps."""

import datetime
import json
import os
import random
import signal
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from paths import REPO

import lox
from lox_backends.parquet import ParquetBackend
from lox_backends.plugin import hooks
from lox_backends.runstore import filesystems, layout, reader

STEPS, EVERY = 40, 10  # steps of the job; a checkpoint every EVERY steps
SEEDS = 3  # the vmapped jobs' seeds

# A process of the jobs: each job does w <- w - 0.05 * err * x, logging the loss and w[0] at
# every step and its start (without a step, flushed at once) once per process. Several jobs
# step together in one process, each with its checkpoints at its own phase: every EVERY
# steps, flush the logs, then save the job's checkpoint (in that order: a checkpoint never
# claims steps whose logs are not durable); half-way between them one more flush (as the
# Logger's periodic flush does), so that a kill after it leaves rows on disk that the
# restart supersedes. It prints each step once done, and "start RUN_ID N" once it knows
# where a job starts.
JOB = r"""
import json, os, sys, time
import numpy as np
import jax, jax.numpy as jnp
import lox

args = json.loads(sys.argv[1])
steps, every = args["steps"], args["every"]
logger = lox.loggers.from_config("parquet:" + args["folder"])

def train_step(w, step):
    x = jnp.sin((step + 1).astype(jnp.float32) * jnp.arange(1, 5, dtype=jnp.float32))
    err = jnp.dot(w, x) - 1.0
    lox.log({"loss": err * err, "w0": w[0]}, step=step)
    return w - 0.05 * err * x

def started(at):
    lox.log({"started_at": at})

one = jax.jit(lambda s, w, i: logger.spool(train_step, s)(w, i))
seeded = jax.jit(jax.vmap(lambda s, w, i: logger.spool(train_step, s)(w, i), in_axes=(0, 0, None)))
jobs = []
for job in args["jobs"]:
    seeds = job["seeds"]
    if os.path.exists(job["checkpoint"]):
        saved = np.load(job["checkpoint"])
        w, start = saved["w"], int(saved["next_step"])
    else:
        w = np.zeros((max(seeds, 1), 4), np.float32) + 0.1 * np.arange(max(seeds, 1), dtype=np.float32)[:, None]
        w, start = (w if seeds else w[0]), 0
    if seeds:
        keys = jax.random.split(jax.random.key(0), seeds)
        state = jax.vmap(lambda k: logger.init(k, run_id=job["run_id"], resume="allow", from_step=start))(keys)
        jax.vmap(lambda s: logger.spool(started, s)(start))(state)
    else:
        state = logger.init(run_id=job["run_id"], resume="allow", from_step=start)
        logger.spool(started, state)(start)
    jobs.append(dict(job, w=w, start=start, state=state, step=seeded if seeds else one))
logger.flush()
for job in jobs:
    print("start", job["run_id"], job["start"], flush=True)
for i in range(min(job["start"] for job in jobs), steps):
    for job in jobs:
        if i < job["start"]:
            continue
        job["w"] = np.asarray(job["step"](job["state"], job["w"], jnp.int32(i)))
        phase = (i + 1 + job["phase"]) % every
        if phase == every // 2:
            logger.flush()
        if phase == 0:
            logger.flush()
            np.savez(job["checkpoint"] + ".tmp.npz", w=job["w"], next_step=i + 1)
            os.replace(job["checkpoint"] + ".tmp.npz", job["checkpoint"])
    print("step", i, flush=True)
    time.sleep(0.01)
for job in jobs:
    logger.finish(job["state"])
"""


def reference(seed: int) -> dict[str, np.ndarray]:
    """The job never killed, by hand (float32, as it computes)."""
    w = np.zeros(4, np.float32) + np.float32(0.1 * seed)
    loss, w0 = [], []
    for step in range(STEPS):
        x = np.sin(np.float32(step + 1) * np.arange(1, 5, dtype=np.float32))
        err = np.float32(w @ x) - np.float32(1.0)
        loss.append(err * err)
        w0.append(w[0])
        w = (w - np.float32(0.05) * err * x).astype(np.float32)
    return {"loss": np.array(loss), "w0": np.array(w0)}


def run_job(args: dict, kill_at: int | None, env: dict | None = None) -> dict[str, int]:
    """One process of the jobs: SIGKILLed once it printed step `kill_at` (if any).
    The step each job started from."""
    environment = {**os.environ, **(env or {}), "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
                   "LOX_DEFAULT": "off"}
    process = subprocess.Popen([sys.executable, "-c", JOB, json.dumps(args)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=environment)
    starts = {}
    try:
        assert process.stdout is not None
        for line in process.stdout:
            words = line.split()
            if words[0] == "start":
                starts[words[1]] = int(words[2])
            elif kill_at is not None and int(words[1]) >= kill_at:
                os.kill(process.pid, signal.SIGKILL)
                break
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == (-signal.SIGKILL if kill_at is not None else 0), err
    assert len(starts) == len(args["jobs"]), err
    return starts


def trials(folder: str, checkpoints, jobs: list[tuple[str, int]], kills: list[int], env=None) -> dict[str, list[int]]:
    """Jobs (run id, seeds) run in one process, killed at each step of `kills` in turn, restarted
    each time from their last checkpoints, and let finish: the steps each job started from."""
    args = {"folder": folder, "steps": STEPS, "every": EVERY,
            "jobs": [{"run_id": run_id, "seeds": seeds, "phase": 3 * number,
                      "checkpoint": str(checkpoints / f"{run_id}.npz")}
                     for number, (run_id, seeds) in enumerate(jobs)]}
    starts: dict[str, list[int]] = {run_id: [] for run_id, _ in jobs}
    for kill_at in [*kills, None]:
        for run_id, start in run_job(args, kill_at, env).items():
            starts[run_id].append(start)
    return starts


def raw_rows(folder: str, run_id: str) -> tuple[int, int]:
    """Rows of the run in its group's batch files as written (read by pyarrow, not
    lox), and of those the rows with a step (loss and w0 at every step)."""
    rows = stepped = 0
    run_folder = filesystems.join(folder, run_id)
    for _, _, path in reader.batch_files(filesystems.join(folder, reader.read_run_json(run_folder)["batches"])):
        table = pq.read_table(pa.BufferReader(filesystems.read_buffer(path)) if filesystems.is_uri(path) else path)
        mine = table.filter(pc.equal(table.column("run"), run_id))
        rows += mine.num_rows
        stepped += mine.num_rows - mine.column("step").null_count if "step" in mine.column_names else 0
    return rows, stepped


def check_run(logs, seed: int, starts: list[int]) -> None:
    """Every step once, with the values of the job never killed; its starts kept (no step)."""
    want = reference(seed)
    for key in ("loss", "w0"):
        assert logs.step[key].tolist() == list(range(STEPS)), key
        np.testing.assert_allclose(np.asarray(logs[key]), want[key], rtol=2e-5, atol=1e-6)
    assert logs["started_at"].tolist() == starts


def test_jobs_killed_at_random_steps_and_resumed_from_their_checkpoints_read_each_step_once(tmp_path):
    folder, checkpoints = tmp_path / "runs", tmp_path / "checkpoints"
    checkpoints.mkdir()
    chosen = random.Random(29)
    # 12 jobs in 4 processes, each killed once or twice at a random step (each job at its own
    # place between its checkpoints), restarted, and let finish; one job of 3 vmapped seeds each.
    processes = [[(f"job{p}{j}", SEEDS if j == 2 else 0) for j in range(3)] for p in range(4)]
    kills = [sorted(chosen.sample(range(1, STEPS - 3), 2 if p % 2 else 1)) for p in range(4)]
    starts: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def one(jobs, kill):
        try:
            starts.update(trials(str(folder), checkpoints, jobs, kill))
        except BaseException as error:  # noqa: BLE001 - raised below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=one, args=pair) for pair in zip(processes, kills, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    jobs = [(run_id, seeds, kill) for group, kill in zip(processes, kills, strict=True) for run_id, seeds in group]
    everything = lox.load(folder)
    superseded = 0
    for run_id, seeds, kill in jobs:
        started = starts[run_id]
        assert started[0] == 0 and len(started) == len(kill) + 1
        for seed, run in enumerate([f"{run_id}-{s}" for s in range(seeds)] if seeds else [run_id]):
            check_run(lox.load(folder / run), seed, started)
            check_run(everything[run], seed, started)
            info = reader.read_run_json(str(folder / run))
            assert info["status"] == "finished" and [r["from_step"] for r in info["resumes"]] == started[1:]
            rows, stepped = raw_rows(str(folder), run)
            assert info["rows"] == rows  # counted across the kills: superseded rows included
            superseded += stepped - 2 * STEPS
    assert superseded > 0  # kills after half-way flushes left rows that the restarts superseded
    # A batch file deleted is still told: the run's rows as written are counted.
    first = reader.batch_files(str(folder / layout.batches_folder("job00")))[0][2]
    os.remove(first)
    with pytest.raises(FileNotFoundError, match=r"run 'job00' .* has lost logs: it ended with \d+ rows"):
        lox.load(folder / "job00")
    with pytest.raises(FileNotFoundError, match="has lost logs"):
        lox.load(folder)


def test_jobs_killed_and_resumed_in_a_bucket_read_each_step_once(s3_server, tmp_path, monkeypatch):
    runs = s3_server.fresh_bucket(monkeypatch) + "/runs"
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    kill = random.Random(30).randrange(EVERY + EVERY // 2, STEPS - 3)  # after a half-way flush: rows to supersede
    starts = trials(runs, checkpoints, [("one", 0), ("seeds", 2)], [kill], env=s3_server.env)
    everything = lox.load(runs)
    superseded = 0
    for seed, run in [(0, "one"), (0, "seeds-0"), (1, "seeds-1")]:
        started = starts[run.split("-")[0]]
        check_run(lox.load(f"{runs}/{run}"), seed, started)
        check_run(everything[run], seed, started)
        info = reader.read_run_json(f"{runs}/{run}")
        assert info["status"] == "finished" and [r["from_step"] for r in info["resumes"]] == started[1:]
        rows, stepped = raw_rows(runs, run)
        assert info["rows"] == rows
        superseded += stepped - 2 * STEPS
    assert superseded > 0


def table(run: str, values: dict, steps: list[int] | None) -> pa.Table:
    """One table of the run, as a Logger hands it: `values` per key at `steps` (None: no step)."""
    data = {key: np.asarray(value, np.float32) for key, value in values.items()}
    return lox.logdict(data, None if steps is None else {"step": {key: np.asarray(steps) for key in data}}
                       ).to_arrow(run=run)


def test_a_killed_run_resumed_by_a_writer_goes_on_in_its_folder_and_counts_its_rows_from_the_files(tmp_path):
    before = ParquetBackend(str(tmp_path))
    run = hooks.RunInfo("job", "job", "job", metadata={"lr": 0.1, "tag": "a"})
    before.open_run(run)
    for first in (0, 2, 4):  # three files: steps 0-5, the last three to be superseded
        before.write(run, table("job", {"loss": [first, first + 1]}, [first, first + 1]))
        before.flush()
    before.write(run, table("job", {"note": [7.0]}, None))  # a file without a step column: kept
    before.flush()
    created = reader.read_run_json(str(tmp_path / "job"))["created"]
    assert "rows" not in reader.read_run_json(str(tmp_path / "job"))  # as after a SIGKILL: never ended
    # The process "dies" here (its writer is left as it is); a new one resumes the run from step 3.
    after = ParquetBackend(str(tmp_path))
    resumed = hooks.RunInfo("job", "job", "job", metadata={"lr": 0.2, "epochs": 9}, resumed=True, from_step=3)
    with pytest.warns(RuntimeWarning, match=r"run 'job' was resumed with other metadata than it was opened with: "
                                            r"lr=0.2 \(it was 0.1\). The run keeps its earlier values"):
        after.open_run(resumed)
    info = reader.read_run_json(str(tmp_path / "job"))
    assert info["created"] == created and info["metadata"] == {"lr": 0.1, "tag": "a", "epochs": 9}  # kept, added to
    assert info["status"] == "running" and "ended" not in info
    assert [(r["from_step"], r["first_batch"]) for r in info["resumes"]] == [(3, 4)]
    assert datetime.datetime.fromisoformat(info["resumes"][0]["time"]).tzinfo == datetime.timezone.utc
    after.write(resumed, table("job", {"loss": [30, 40, 50]}, [3, 4, 5]))
    after.write(resumed, table("job", {"note": [8.0]}, None))
    after.close_run(resumed)
    info = reader.read_run_json(str(tmp_path / "job"))
    assert info["status"] == "finished" and info["rows"] == 6 + 1 + 3 + 1  # as written: superseded rows too
    for logs in (lox.load(tmp_path / "job"), lox.load(tmp_path)["job"]):
        assert logs.step["loss"].tolist() == [0, 1, 2, 3, 4, 5]
        assert logs["loss"].tolist() == [0, 1, 2, 30, 40, 50]
        assert logs["note"].tolist() == [7.0, 8.0]
    # What trackers and `lox sync` send of the files before the resume: the rows not superseded.
    sent = [file.read() for file in reader.run_files(str(tmp_path / "job"))]
    assert [t.column("step").to_pylist() if "step" in t.column_names else None for t in sent] == [
        [0, 1], [2], [], None, [3, 4, 5], None]
    # A batch file deleted is still told: rows counts them as written.
    os.remove(reader.batch_files(str(tmp_path / "job.batches"))[1][2])
    with pytest.raises(FileNotFoundError, match=r"it ended with 11 rows written, but the batch files .* hold 9"):
        lox.load(tmp_path / "job")


def log_steps(logger, state, value: float, steps: list[int]) -> None:
    def train(value, steps):
        for step in steps:
            lox.log({"loss": value}, step=step)

    logger.spool(train, state)(value, steps)


def test_a_run_resumed_twice_keeps_each_step_of_the_latest_process(tmp_path):
    for value, steps, from_step in [(1.0, range(0, 7), None), (2.0, range(4, 8), 4), (3.0, range(6, 10), 6)]:
        logger = lox.loggers.from_config(f"parquet:{tmp_path}")
        resume = {} if from_step is None else {"resume": "allow", "from_step": from_step}
        state = logger.init(run_id="job", **resume)
        log_steps(logger, state, value, list(steps))
        logger.close()
    for logs in (lox.load(tmp_path / "job"), lox.load(tmp_path)["job"]):
        assert logs.step["loss"].tolist() == list(range(10))
        assert logs["loss"].tolist() == [1.0] * 4 + [2.0] * 2 + [3.0] * 4
    info = reader.read_run_json(str(tmp_path / "job"))
    assert [(r["from_step"], r["first_batch"]) for r in info["resumes"]] == [(4, 1), (6, 2)]
    assert info["rows"] == 7 + 4 + 4


def test_a_run_resumed_without_from_step_keeps_every_row_it_had(tmp_path):
    for value, steps, resume in [(1.0, [0, 1, 2, 3, 4], "never"), (2.0, [3, 4, 5], "must")]:
        logger = lox.loggers.from_config(f"parquet:{tmp_path}")
        log_steps(logger, logger.init(run_id="job", resume=resume), value, steps)
        logger.close()
    logs = lox.load(tmp_path / "job")
    assert logs.step["loss"].tolist() == [0, 1, 2, 3, 4, 3, 4, 5]
    assert logs["loss"].tolist() == [1.0] * 5 + [2.0] * 3
    assert [r["from_step"] for r in reader.read_run_json(str(tmp_path / "job"))["resumes"]] == [None]


def test_seeds_resumed_with_a_new_seed_in_their_group_each_read_their_own_steps(tmp_path):
    first = lox.loggers.from_config(f"parquet:{tmp_path}")
    states = jax.vmap(lambda k: first.init(k, run_id="s"))(jax.random.split(jax.random.key(0), 2))
    jax.vmap(lambda s, v: log_steps(first, s, v, [0, 1, 2, 3]))(states, jnp.array([1.0, 2.0]))
    first.close()
    again = lox.loggers.from_config(f"parquet:{tmp_path}")
    keys = jax.random.split(jax.random.key(0), 3)
    states = jax.vmap(lambda k: again.init(k, run_id="s", resume="allow", from_step=2))(keys)
    jax.vmap(lambda s, v: log_steps(again, s, v, [2, 3, 4]))(states, jnp.array([10.0, 20.0, 30.0]))
    again.close()
    want = {"s-0": ([0, 1, 2, 3, 4], [1.0, 1.0, 10.0, 10.0, 10.0]),
            "s-1": ([0, 1, 2, 3, 4], [2.0, 2.0, 20.0, 20.0, 20.0]),
            "s-2": ([2, 3, 4], [30.0, 30.0, 30.0])}  # a new run: nothing of its group's earlier files
    everything = lox.load(tmp_path)
    for run, (steps, values) in want.items():
        for logs in (lox.load(tmp_path / run), everything[run]):
            assert (logs.step["loss"].tolist(), logs["loss"].tolist()) == (steps, values)
    assert "resumes" not in reader.read_run_json(str(tmp_path / "s-2"))


def test_rows_are_superseded_in_files_whose_footer_does_not_say_which_rows_are_whose(tmp_path):
    backend = ParquetBackend(str(tmp_path))
    runs = [hooks.RunInfo(run_id, run_id, "g") for run_id in ("a", "b")]
    for run in runs:
        backend.open_run(run)
        backend.write(run, table(run.run_id, {"loss": [1.0, 2.0, 3.0]}, [0, 1, 2]))
    backend.flush()
    (_, _, path), = reader.batch_files(str(tmp_path / "g.batches"))
    written = pq.read_table(path)
    without = {k: v for k, v in written.schema.metadata.items() if k != layout.RUNS_METADATA}
    pq.write_table(written.replace_schema_metadata(without), path)  # as a writer before `lox.runs` wrote it
    resumed = hooks.RunInfo("a", "a", "g", resumed=True, from_step=1)
    again = ParquetBackend(str(tmp_path))
    again.open_run(resumed)
    again.write(resumed, table("a", {"loss": [20.0]}, [1]))
    again.close_run(resumed)
    everything = lox.load(tmp_path)
    assert (everything["a"].step["loss"].tolist(), everything["a"]["loss"].tolist()) == ([0, 1], [1.0, 20.0])
    assert everything["b"]["loss"].tolist() == [1.0, 2.0, 3.0]


def test_a_run_resumed_by_the_id_of_a_run_opened_without_one_goes_on_in_its_group(tmp_path):
    # A run opened by name (as lox 0.2 opened every run) has its rows in its logger's group
    # (`lox-<time>.batches`); resumed by its id, it goes on there: its earlier rows stay its own.
    first = lox.loggers.from_config(f"parquet:{tmp_path}")
    log_steps(first, first.init(name="plain"), 1.0, [0, 1, 2, 3])
    first.close()
    (run_id,) = [name for name in os.listdir(tmp_path) if not name.endswith(layout.BATCHES_SUFFIX)]
    batches = reader.read_run_json(str(tmp_path / run_id))["batches"]
    again = lox.loggers.from_config(f"parquet:{tmp_path}")
    log_steps(again, again.init(run_id=run_id, resume="must", from_step=2), 2.0, [2, 3, 4])
    again.close()
    info = reader.read_run_json(str(tmp_path / run_id))
    assert info["batches"] == batches and info["rows"] == 4 + 3
    for logs in (lox.load(tmp_path / run_id), lox.load(tmp_path)[run_id]):
        assert (logs.step["loss"].tolist(), logs["loss"].tolist()) == ([0, 1, 2, 3, 4], [1.0, 1.0, 2.0, 2.0, 2.0])
    (row,) = lox.runs(tmp_path).to_pylist()
    assert (row["run_id"], row["loss.count"], row["loss.min"], row["loss.max"]) == (run_id, 5, 1.0, 2.0)
