"""Runs in buckets: ``parquet:s3://...``, ``lox.load("s3://...")`` and ``lox sync s3://...``
against a real S3-compatible server on 127.0.0.1 (moto's, tests/support/s3_server.py), with
pyarrow's S3 client configured from the standard AWS environment, as users' are.
The same guarantees as on a local disk: whole flushes only, also after SIGKILL,
and each batch sent once."""

import os
import pathlib
import subprocess
import sys
import uuid

import fsspec
import jax
import jax.numpy as jnp
import numpy as np
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from logs_testing import assert_logs_equal, kill_after_confirmed
from mlflow.tracking import MlflowClient
from mlflow_server import CLIENT_ENV as MLFLOW_ENV
from s3_server import S3Server

import lox
from lox_backends.parquet import ParquetBackend
from lox_backends.plugin import hooks
from lox_backends.runstore import filesystems, layout, reader
from lox_backends.runstore.sent import SentRecord
from lox_backends.tools import cli
from lox_backends.tools.plot import plot_runs
from lox_backends.trackers.sync import sync

REPO = pathlib.Path(__file__).resolve().parents[3]
STEPS = 3


@pytest.fixture
def bucket(s3_server, tmp_path, monkeypatch):
    """A fresh bucket (its URI), the AWS environment pointing at the server, and
    the working directory an empty folder: nothing may land there."""
    uri = s3_server.fresh_bucket(monkeypatch)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    yield uri
    assert not any(work.iterdir()), f"lox wrote into the working directory: {sorted(os.listdir(work))}"


def objects(server: S3Server, uri: str) -> list[str]:
    """The keys under a URI, relative to it, sorted (what a bucket listing shows)."""
    fs, path = server.filesystem(), uri.removeprefix("s3://")
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return sorted(info.path[len(path) + 1:] for info in infos if info.type == pafs.FileType.File)


def train(w, call):
    def step(w, i):
        lox.log({"loss": (w - 1.0) ** 2, "w": jnp.stack([w, -w])}, step=call * STEPS + i)
        return 0.5 * (w + 1.0), None

    return jax.lax.scan(step, w, jnp.arange(STEPS))[0]


def train_seeds(spec: str, seeds: int = 4, calls: int = 1, name: str = "seed"):
    """Seeds as a vmapped Logger writing to `spec`, a flush after each call; their runs, by index."""
    logger = lox.loggers.from_config(spec, name=name)
    states = jax.vmap(lambda key: logger.init(key, lr=0.1))(jax.random.split(jax.random.key(0), seeds))
    step = jax.jit(jax.vmap(lambda s, w, call: logger.spool(train, s)(w, call), in_axes=(0, 0, None)))
    w = jnp.arange(float(seeds))
    for call in range(calls):
        w = step(states, w, call)
        logger.flush()
    logger.finish(states)
    return sorted(logger.runs(), key=lambda run: run.index)


def run_python(script, *args):
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=os.getcwd())


# --- writing and reading ----------------------------------------------------------------------
def test_seeds_written_to_a_bucket_read_back_as_from_a_local_folder(s3_server, bucket, tmp_path):
    in_bucket = train_seeds(f"parquet:{bucket}/runs?compression=zstd", name="bucket")
    on_disk = train_seeds(f"parquet:{tmp_path}/runs", name="disk")
    from_bucket, from_disk = lox.load(f"{bucket}/runs"), lox.load(tmp_path / "runs")
    assert list(from_bucket) == [run.run_id for run in in_bucket]  # oldest first, by index
    for a, b in zip(in_bucket, on_disk, strict=True):
        assert_logs_equal(from_bucket[a.run_id], from_disk[b.run_id])
    np.testing.assert_array_equal(from_bucket[in_bucket[2].run_id]["loss"], [1.0, 0.25, 0.0625])

    # The layout of a local folder: whole objects only, no temporary ones, no folder markers.
    group = in_bucket[0].group
    keys = objects(s3_server, f"{bucket}/runs")
    assert [key for key in keys if not key.startswith(f"{group}.batches/")] == sorted(
        f"{run.run_id}/_run.json" for run in in_bucket)
    (batch,) = [key for key in keys if key.startswith(f"{group}.batches/batch-")]  # beside it: the heartbeat
    assert layout.BATCH_FILE.fullmatch(batch.split("/")[1])

    # One run, with or without a trailing slash; its _run.json; any Parquet reader reads the bucket.
    one = lox.load(f"{bucket}/runs/{in_bucket[1].run_id}/")
    assert_logs_equal(one, from_bucket[in_bucket[1].run_id])
    assert [(r["index"], r["status"], r["metadata"]["lr"]) for r in reader.runs(f"{bucket}/runs")] == [
        (i, "finished", 0.1) for i in range(4)]
    table = ds.dataset(f"{bucket.removeprefix('s3://')}/runs", filesystem=s3_server.filesystem(),
                       format="parquet").to_table()
    assert table.num_rows == 4 * STEPS * 2  # loss and w, every step of every seed


def test_a_second_logger_continues_the_group_folder_of_a_bucket(s3_server, bucket):
    """A run opened again (a resumed job) keeps its creation time; its group's
    files continue after the last sequence number."""
    backend = ParquetBackend(f"{bucket}/runs")
    run = hooks.RunInfo("resumed", name="resumed", group="g")
    backend.open_run(run)
    backend.write(run, lox.logdict({"x": np.array([1.0])}, {"step": {"x": np.array([0])}}).to_arrow(run="resumed"))
    backend.close_run(run)
    backend.close()
    created = reader.runs(f"{bucket}/runs")[0]["created"]
    again = ParquetBackend(f"{bucket}/runs")
    again.open_run(run)
    again.write(run, lox.logdict({"x": np.array([2.0])}, {"step": {"x": np.array([1])}}).to_arrow(run="resumed"))
    again.close_run(run)
    again.close()
    assert [key[:12] for key in objects(s3_server, f"{bucket}/runs/g.batches") if key.startswith("batch-")] == [
        "batch-000000", "batch-000001"]
    (info,) = reader.runs(f"{bucket}/runs")
    assert info["created"] == created and info["status"] == "finished"
    np.testing.assert_array_equal(lox.load(f"{bucket}/runs")["resumed"]["x"], [1.0, 2.0])


CRASHER = """
import sys
import numpy as np
from lox_backends.plugin import hooks
from lox_backends.parquet import ParquetBackend
from lox_core.arrow import to_arrow
from lox_core.logdict import logdict

N, WIDTH = 2000, 1600  # 12.8 MB a batch, uncompressed: uploaded in parts, so a kill can land mid-upload
backend = ParquetBackend(sys.argv[1], {"compression": "none"})
run = hooks.RunInfo("crash", name="crash", group="g")
backend.open_run(run)
i = 0
while True:
    step = np.arange(N * i, N * (i + 1))
    w = (step[:, None] + np.arange(WIDTH)).astype(np.float32)
    logs = logdict({"loss": step * 0.25, "w": w}, steps={"step": {"loss": step, "w": step}})
    backend.write(run, to_arrow(logs, run="crash"))
    backend.flush()
    print(i, flush=True)
    i += 1
"""


def test_a_killed_writer_leaves_every_confirmed_batch_readable_in_a_bucket(s3_server, bucket):
    proc = run_python(CRASHER, f"{bucket}/runs")
    confirmed = kill_after_confirmed(proc)
    proc.stdout.close()
    proc.stderr.close()
    assert confirmed == list(range(len(confirmed)))
    keys = objects(s3_server, f"{bucket}/runs")
    batches = [key for key in keys if key.startswith("g.batches/batch-")]
    (heartbeat,) = [key for key in keys if key.startswith("g.batches/_alive-")]  # the writer's
    index = f"g.batches/{layout.RUNS_INDEX}"
    assert keys == ["crash/_run.json", heartbeat, index, *batches]  # nothing partial, nothing temporary
    assert all(layout.BATCH_FILE.fullmatch(key.split("/")[1]) for key in batches)
    fs = s3_server.filesystem()
    for key in batches:  # every visible object is whole
        pq.read_table(f"{bucket.removeprefix('s3://')}/runs/{key}", filesystem=fs)
    logs = lox.load(f"{bucket}/runs/crash")
    n = len(logs["loss"])
    assert n >= 2000 * len(confirmed) and n % 2000 == 0
    np.testing.assert_array_equal(logs.step["loss"], np.arange(n))
    np.testing.assert_array_equal(logs["loss"], np.arange(n) * 0.25)
    np.testing.assert_array_equal(logs["w"][:, 1599], np.arange(n, dtype=np.float32) + 1599)
    assert reader.runs(f"{bucket}/runs")[0]["status"] == "killed"  # its writer is gone (reader.run_status)


EXITER = """
import sys
import jax.numpy as jnp
import lox

logger = lox.loggers.from_config(f"parquet:{sys.argv[1]}", name="exit")
state = logger.init()
logger.log(state, lox.logdict({"loss": jnp.arange(3.0)}, {"step": {"loss": jnp.arange(3)}}))
print("done")
"""


def test_a_script_that_exits_without_finish_leaves_its_logs_in_the_bucket(bucket):
    """lox's exit flush runs before pyarrow shuts its S3 client down: nothing lost, nothing on stderr."""
    proc = run_python(EXITER, f"{bucket}/runs")
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out, err) == (0, "done\n", "")
    (logs,) = lox.load(f"{bucket}/runs").values()
    np.testing.assert_array_equal(logs["loss"], [0.0, 1.0, 2.0])


def test_other_filesystems_through_fsspec_get_a_hidden_name_then_a_move():
    """``memory://`` (fsspec's in-process filesystem) stands for any filesystem pyarrow does not serve."""
    root = f"memory://lox-{uuid.uuid4().hex[:8]}/runs"
    runs = train_seeds(f"parquet:{root}", seeds=2)
    loaded = lox.load(root)
    assert list(loaded) == [run.run_id for run in runs]
    np.testing.assert_array_equal(loaded[runs[0].run_id]["loss"], [1.0, 0.25, 0.0625])
    names = [path.rsplit("/", 1)[1] for path in fsspec.filesystem("memory").find(root) if "/_alive-" not in path]
    assert sorted(names)[:3] == ["_run.json", "_run.json", layout.RUNS_INDEX] and len(names) == 4  # no temporary file
    assert layout.BATCH_FILE.fullmatch(sorted(names)[3])


def test_file_uris_are_local_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (run,) = train_seeds(f"parquet:file://{tmp_path}/runs", seeds=1)
    assert (tmp_path / "runs" / run.run_id / "_run.json").is_file()
    np.testing.assert_array_equal(lox.load(f"file://{tmp_path}/runs")[run.run_id]["loss"], [1.0, 0.25, 0.0625])


def test_lox_plot_reads_a_bucket_and_writes_the_png_here(bucket):
    train_seeds(f"parquet:{bucket}/runs", seeds=2)
    output = plot_runs(f"{bucket}/runs", key="loss")
    assert output == "loss.png" and os.path.getsize(output) > 0
    os.remove(output)  # the working directory must end empty


# --- lox sync from a bucket --------------------------------------------------------------------
@pytest.fixture
def mlflow_env(tmp_path, monkeypatch):
    """MLflow's client settings for tests; its ``mlruns`` folder (artifacts) in a folder of its own."""
    for name, value in MLFLOW_ENV.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "mlflow").mkdir()
    monkeypatch.chdir(tmp_path / "mlflow")


def history(client, run_id, key):
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def mlflow_runs(uri, experiment):
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    return client, {r.info.run_name: r for r in client.search_runs([found.experiment_id])}


def test_lox_sync_from_a_bucket_sends_each_batch_once(s3_server, bucket, tmp_path, mlflow_env, capsys):
    runs = train_seeds(f"parquet:{bucket}/runs", seeds=2, calls=2)
    spec = f"mlflow:sqlite:///{tmp_path}/m.db?experiment=bucket"
    assert cli.main(["sync", f"{bucket}/runs", "--to", spec]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"sent 4 batch file(s), {2 * 2 * STEPS * 2} row(s) to {spec}"
    assert cli.main(["sync", f"{bucket}/runs", "--to", spec]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"sent 0 batch file(s), 0 row(s) to {spec}"

    # The record of what was sent: objects beside each run's _run.json, each written whole.
    run_folder = f"{bucket}/runs/{runs[0].run_id}"
    keys = objects(s3_server, run_folder)
    (folder,) = {key.split("/")[0] for key in keys if key.startswith("_sent-mlflow-")}
    files = sorted(name for name, _, _ in filesystems.scan(f"{bucket}/runs/{runs[0].group}.batches")
                   if layout.BATCH_FILE.fullmatch(name))
    assert keys == sorted(["_run.json", f"{folder}/remote.json", f"{folder}/closed",
                           *(f"{folder}/{name}.sent" for name in files)])
    record = SentRecord(run_folder, "mlflow", f"sqlite:///{tmp_path}/m.db experiment=bucket")
    assert record.path == f"{run_folder}/{folder}" and record.files == set(files) and record.closed

    # A record lost (a crash between sending and recording): sent again, each value once at MLflow.
    s3_server.filesystem().delete_file(f"{run_folder.removeprefix('s3://')}/{folder}/{files[1]}.sent")
    assert [(files, rows) for _, files, rows in sync(f"{bucket}/runs", spec)] == [(1, STEPS * 2), (0, 0)]
    client, found = mlflow_runs(f"sqlite:///{tmp_path}/m.db", "bucket")
    assert sorted(found) == [run.name for run in runs]
    for index, run in enumerate(runs):
        w, expected = float(index), []
        for step in range(2 * STEPS):  # two calls of three steps
            expected.append((step, (w - 1.0) ** 2))
            w = 0.5 * (w + 1.0)
        assert history(client, found[run.name].info.run_id, "loss") == expected
        assert found[run.name].info.status == "FINISHED"


def test_a_tracker_sends_from_its_log_in_a_bucket(s3_server, bucket, tmp_path, mlflow_env):
    """``local=s3://...``: the tracker's local log is the bucket; what it sent is
    recorded there, so `lox sync` from anywhere finds nothing left to send."""
    spec = f"mlflow:sqlite:///{tmp_path}/m.db?experiment=live"
    runs = train_seeds(f"{spec}&local={bucket}/runs", seeds=2)
    client, found = mlflow_runs(f"sqlite:///{tmp_path}/m.db", "live")
    assert history(client, found[runs[1].name].info.run_id, "loss") == [(0, 0.0), (1, 0.0), (2, 0.0)]
    assert [files for _, files, _ in sync(f"{bucket}/runs", spec)] == [0, 0]
    assert any("/_sent-mlflow-" in key for key in objects(s3_server, f"{bucket}/runs"))


# --- errors ------------------------------------------------------------------------------------
@pytest.mark.parametrize("uri, error, message", [
    ("nosuch://bucket/runs", ValueError, r"no filesystem serves the scheme 'nosuch://'.*pyarrow serves s3://"),
    ("oss://bucket/runs", ModuleNotFoundError, r"the scheme 'oss://' needs the package ossfs.*`pip install ossfs`"),
])
def test_a_scheme_that_cannot_be_served_is_named_at_from_config(uri, error, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=message):
        lox.loggers.from_config(f"parquet:{uri}")
    with pytest.raises(error, match=message):
        lox.load(uri)
    assert list(tmp_path.iterdir()) == []  # never a local folder named after the URL


def test_without_fsspec_other_schemes_name_it():
    script = ("import sys; sys.modules['fsspec'] = None\nimport lox\n"
              "try:\n    lox.loggers.from_config('parquet:oss://bucket/runs')\n"
              "except ImportError as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}).stdout
    assert out.startswith("ModuleNotFoundError lox cannot store runs at oss://bucket/...: pyarrow does not serve "
                          "the scheme 'oss://'") and "`pip install fsspec`" in out


def test_a_missing_bucket_is_named_at_from_config(bucket):
    missing = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}"
    with pytest.raises(FileNotFoundError, match=rf"cannot write runs to '{missing}/runs': the bucket "
                                                rf"'{missing[5:]}' does not exist.*AWS_ENDPOINT_URL"):
        lox.loggers.from_config(f"parquet:{missing}/runs")
    with pytest.raises(FileNotFoundError, match=rf"no such folder: '{missing}/runs' \(or its bucket does not exist"):
        lox.load(f"{missing}/runs")


def test_refused_credentials_are_named_at_from_config(tmp_path, monkeypatch):
    """A server that checks every request's signature refuses these credentials, as S3 refuses wrong ones."""
    server = S3Server(tmp_path, authenticate=True).start()
    try:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.chdir(tmp_path)
        with pytest.raises(OSError, match=r"cannot write runs to 's3://bucket/runs': .*ACCESS_DENIED.*"
                                          r"AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY"):
            lox.loggers.from_config("parquet:s3://bucket/runs")
        with pytest.raises(OSError, match=r"'s3://bucket/runs': .*INVALID_ACCESS_KEY_ID.*from the environment"):
            lox.load("s3://bucket/runs")
    finally:
        server.stop()


def test_an_object_is_not_a_folder_of_runs(s3_server, bucket):
    with s3_server.filesystem().open_output_stream(f"{bucket[5:]}/runs") as f:
        f.write(b"not a folder")
    with pytest.raises(ValueError, match=rf"cannot write runs to '{bucket}/runs': it is a file"):
        lox.loggers.from_config(f"parquet:{bucket}/runs")
    with pytest.raises(ValueError, match=rf"'{bucket}/runs' is a file; expected a run folder"):
        lox.load(f"{bucket}/runs")


def test_load_says_what_it_expected_in_a_bucket(bucket):
    with pytest.raises(FileNotFoundError, match=rf"no such folder: '{bucket}/missing'"):
        lox.load(f"{bucket}/missing")
    with pytest.raises(ValueError, match=r"is not a folder URI lox can use: write scheme://bucket/folder, without"):
        lox.load(f"{bucket}/runs?region=x")
    train_seeds(f"parquet:{bucket}/runs/a", seeds=1)
    with pytest.raises(ValueError, match=rf"no lox runs in '{bucket}': expected a run folder"):
        lox.load(bucket)


@pytest.mark.parametrize("source, message", [
    ("oss://bucket/runs", "lox sync: error: lox cannot store runs at oss://bucket/...: the scheme 'oss://' needs "
                          "the package ossfs"),
    ("{bucket}/missing", "lox sync: error: no such folder: '{bucket}/missing'"),
])
def test_lox_sync_errors_with_buckets(source, message, bucket, capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["sync", source.format(bucket=bucket), "--to", "mlflow"])
    assert exit.value.code == 2
    assert message.format(bucket=bucket) in capsys.readouterr().err
