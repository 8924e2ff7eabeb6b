"""Throughput into trackers through lox, against the same data sent by hand with
each tracker's batch API, side by side (``python -m benchmarks trackers``).

Both sides start a run, send scalar events (10 keys, a step each) and end the
run; lox's side also writes its local log (Parquet files, fsynced), reads each
file back and converts it: that is the cost of losing nothing. Each tracker gets
enough events for a run to take about a second or more by hand, so that the
per-run costs (a few milliseconds of fsync) do not hide the rate.
"""

from __future__ import annotations

import os
import pathlib
import sys
import tempfile
import time
import uuid

import numpy as np

import lox

KEYS = [f"metric_{i}" for i in range(10)]


def data(steps: int):
    rng = np.random.default_rng(0)
    values = {k: rng.standard_normal(steps).astype(np.float32) for k in KEYS}
    step = np.arange(steps, dtype=np.int32)
    return values, step, lox.logdict(values, steps={"step": dict.fromkeys(KEYS, step)})


def interleaved(candidates: dict, rounds: int) -> dict[str, float]:
    times = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: float(np.median(ts)) for name, ts in times.items()}


def report(tracker: str, t: dict[str, float], events: int, target: str = "lox >= 90% of by hand") -> None:
    print(f"  {tracker + ' by hand':<52} {events / t['hand']:>10,.0f} /s")
    print(f"  {tracker + ' through lox (local log, then sent)':<52} {events / t['lox']:>10,.0f} /s"
          f"  {t['hand'] / t['lox']:6.1%} of by hand  ({target})")


def mlflow(rounds: int = 5, steps: int = 4000) -> None:
    print(f"MLflow: log_batch to a local `mlflow server` (SQLite), {len(KEYS)} keys x {steps:,} steps per run")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient
    from mlflow_server import CLIENT_ENV, MlflowServer

    os.environ.update(CLIENT_ENV)
    values, step, logs = data(steps)
    with tempfile.TemporaryDirectory() as folder:
        server = MlflowServer(folder).start()
        try:
            client = MlflowClient(server.url)
            experiment = client.create_experiment(f"bench-{uuid.uuid4().hex[:6]}")

            def by_hand():
                run_id = client.create_run(experiment, run_name="hand").info.run_id
                now = int(time.time() * 1000)
                metrics = [Metric(k, float(v), now, int(s)) for k in KEYS for v, s in zip(values[k], step, strict=True)]
                for start in range(0, len(metrics), 1000):
                    client.log_batch(run_id, metrics=metrics[start : start + 1000])
                client.set_terminated(run_id)

            spec = f"mlflow:{server.url}?experiment={client.get_experiment(experiment).name}&local={folder}/lox"
            _compare("MLflow", spec, logs, by_hand, rounds)
        finally:
            server.stop()


def wandb(rounds: int = 7, steps: int = 10_000) -> None:
    print(f"W&B offline: run.log per step ({len(KEYS)} keys x {steps:,} steps) into a local offline run")
    import wandb as wb

    with tempfile.TemporaryDirectory() as folder:
        for name in ["WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"]:
            os.makedirs(os.path.join(folder, name.lower()), exist_ok=True)
            os.environ[name] = os.path.join(folder, name.lower())
        os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_CONSOLE="off", WANDB_DISABLE_GIT="true",
                          WANDB_DISABLE_CODE="true", WANDB_ERROR_REPORTING="false", WANDB_X_DISABLE_STATS="true",
                          WANDB_X_DISABLE_META="true", WANDB_X_DISABLE_MACHINE_INFO="true")
        values, step, logs = data(steps)

        def by_hand():
            run = wb.init(project="bench", mode="offline", reinit="create_new")
            columns = [values[k].tolist() for k in KEYS]
            for i, s in enumerate(step.tolist()):
                run.log({k: column[i] for k, column in zip(KEYS, columns, strict=True)}, step=s)
            run.finish()

        spec = f"wandb?project=bench&mode=offline&local={folder}/lox"
        _compare("W&B", spec, logs, by_hand, rounds)


def neptune(rounds: int = 7, steps: int = 20_000) -> None:
    print(f"Neptune offline (neptune 1.x client): one extend per key ({len(KEYS)} keys x {steps:,} steps)")
    import logging

    import neptune as nep

    logging.getLogger("neptune").setLevel(logging.WARNING)  # its info lines, per run
    with tempfile.TemporaryDirectory() as folder:
        os.environ["NEPTUNE_DATA_DIRECTORY"] = os.path.join(folder, ".neptune")
        values, step, logs = data(steps)

        def by_hand():
            run = nep.init_run(project="bench/bench", mode="offline", capture_stdout=False, capture_stderr=False,
                               capture_hardware_metrics=False, capture_traceback=False, source_files=[],
                               git_ref=False)
            now = time.time()
            for k in KEYS:
                run[k].extend(values[k].tolist(), steps=step.tolist(), timestamps=[now] * steps)
            run.stop()

        _compare("Neptune", f"neptune:bench/bench?mode=offline&local={folder}/lox", logs, by_hand, rounds)


def tensorboard(rounds: int = 5, steps: int = 5000) -> None:
    print(f"TensorBoard: tensorboardX add_scalar per value ({len(KEYS)} keys x {steps:,} steps) into an event file")
    from tensorboardX import SummaryWriter

    values, step, logs = data(steps)
    with tempfile.TemporaryDirectory() as folder:
        columns, step_list = [values[k].tolist() for k in KEYS], step.tolist()

        def by_hand():
            writer = SummaryWriter(os.path.join(folder, "hand", uuid.uuid4().hex[:8]))
            for i, s in enumerate(step_list):
                for k, column in zip(KEYS, columns, strict=True):
                    writer.add_scalar(k, column[i], s)
            writer.close()

        _compare("TensorBoard", f"tensorboard:{folder}/tb?local={folder}/lox", logs, by_hand, rounds)


def _compare(tracker: str, spec: str, logs, by_hand, rounds: int) -> None:
    """Time `by_hand` against a Logger for `spec` sending `logs` (init to finish)."""

    def through_lox():
        logger = lox.loggers.from_config(spec, name="lox")
        t0 = time.perf_counter()
        state = logger.init()
        logger.log(state, logs)
        logger.finish(state)
        elapsed = time.perf_counter() - t0
        logger.close()
        return elapsed

    through_lox(), by_hand()  # warm up
    lox_times = []
    t = interleaved({"hand": by_hand, "lox": lambda: lox_times.append(through_lox())}, rounds)
    t["lox"] = float(np.median(lox_times))  # without creating the logger
    report(tracker, t, sum(v.shape[0] for v in logs.values()))


def trackers() -> None:
    for name, section in SECTIONS.items():
        try:
            section()
        except ModuleNotFoundError as error:
            print(f"  {name}: not installed ({error.name}); pip install 'jax-lox[{name}]'")


SECTIONS = {"mlflow": mlflow, "wandb": wandb, "neptune": neptune}
