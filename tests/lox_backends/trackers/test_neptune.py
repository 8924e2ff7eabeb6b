"""The neptune backend, with the real neptune client in offline mode: what its
offline operation log holds (read back below) is what lox logged, once, in bulk,
also when the logging process is killed and ``lox sync`` sends the rest."""

import csv
import io
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow.parquet as pq
import pytest
import tracker_media
from neptune_records import offline_runs

import lox
from lox_backends.runstore import reader
from lox_backends.tools import cli
from lox_backends.trackers.neptune import NeptuneBackend, custom_run_id
from lox_backends.trackers.sync import sync
from lox_core.logdict import concat

REPO = pathlib.Path(__file__).resolve().parents[3]
SPEC = "neptune:ws/proj?mode=offline"


def sent_records(run_folder):
    """The lines of a lox run folder's record of what reached Neptune."""
    (path,) = pathlib.Path(run_folder).glob("_sent-neptune-*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def batch_files(run_folder):
    """The batch files holding rows of a run (its group's shared files)."""
    return reader.run_files(str(run_folder))


# --- seeds, steps, arrays ------------------------------------------------------------------
def train_chunk(offset, start):
    """50 steps: loss = offset + step (exact in float32), acc, an array, and an epoch every 10 steps."""

    def step(carry, i):
        x = offset + i.astype(jnp.float32)
        lox.log({"loss": x, "acc": -x, "w": jnp.stack([x, -x])}, step=i, epoch=i // 10)
        return carry, None

    jax.lax.scan(step, 0.0, start + jnp.arange(50))
    return offset


def test_seeds_become_offline_runs_with_every_value_once_in_bulk(neptune_env, capsys):
    seeds = 3
    logger = lox.loggers.from_config(SPEC, name="neptune-seeds")
    keys = jax.random.split(jax.random.key(0), seeds)
    lrs = jnp.array([0.1, 0.2, 0.3])
    states = jax.vmap(lambda key, lr: logger.init(key, lr=lr, opt={"name": "adam", "betas": [0.9, 0.99]}))(keys, lrs)
    offsets = 1000.0 * jnp.arange(seeds)
    chunk = jax.jit(jax.vmap(lambda state, offset, start: logger.spool(train_chunk, state)(offset, start),
                             in_axes=(0, 0, None)))
    for call in range(3):
        chunk(states, offsets, 50 * call)
        logger.flush()
    logger.finish(states)

    runs = logger.runs()
    found = offline_runs(neptune_env / "neptune-data")
    assert sorted(found) == sorted(run.run_id for run in runs)
    custom_ids = set()
    for seed, run in enumerate(runs):
        (neptune_run,) = found[run.run_id]
        folder = neptune_env / "lox-runs" / run.run_id
        files = batch_files(folder)
        assert len(files) == 3  # one per flush
        fields = neptune_run.fields()
        assert fields["sys/name"] == f"neptune-seeds-{seed}" == run.name
        assert fields["sys/group_tags"] == {logger.group}
        assert fields["lox/group"] == logger.group and fields["lox/index"] == seed
        assert fields["config/lr"] == pytest.approx([0.1, 0.2, 0.3][seed])
        assert fields["config/opt/name"] == "adam" and fields["config/opt/betas"] == "[0.9, 0.99]"
        assert json.loads(fields["config/key"]) == run.metadata["key"]
        # Every (step, value) once, in order; the epoch as a series of its own.
        steps = np.arange(150)
        assert neptune_run.series("metrics/loss") == [(s, 1000.0 * seed + s) for s in steps]
        assert neptune_run.series("metrics/acc") == [(s, -1000.0 * seed - s) for s in steps]
        assert neptune_run.series("steps/epoch") == [(s, float(s // 10)) for s in steps]  # once per step
        # In bulk: one operation per series per batch file (Neptune splits at 100 values).
        assert len(neptune_run.of_type("LogFloats")) == 3 * len(files)
        # Each batch's values carry its file's timestamp, so a re-send is identical.
        times = {pq.read_schema(f.path).metadata[b"lox.time_ms"] for f in files}
        assert {int(ts * 1000 + 0.5) for ts in neptune_run.timestamps("metrics/loss")} == {int(t) for t in times}
        # Arrays: one Parquet file per batch file, in lox's schema.
        arrays = neptune_run.arrays()
        assert list(arrays) == ["w"]
        np.testing.assert_array_equal(arrays.step["w"], steps)
        np.testing.assert_array_equal(arrays["w"], np.stack([1000.0 * seed + steps, -1000.0 * seed - steps], 1))
        uploaded = [op["path"][2] for op in neptune_run.of_type("UploadFile")]
        assert uploaded == [f.name.removesuffix(".parquet") for f in files]
        # What reached Neptune is recorded, with the custom run id.
        record = sent_records(folder)
        remote = record[0]["remote"]
        assert remote == {"custom_run_id": custom_run_id(run.run_id)} and len(remote["custom_run_id"]) <= 36
        assert sorted(r["file"] for r in record if "file" in r) == [f.name for f in files]
        assert record[-1] == {"closed": True}
        custom_ids.add(remote["custom_run_id"])
    assert len(custom_ids) == seeds
    assert "[neptune]" not in capsys.readouterr().out  # Neptune's per-run info lines are not shown


def test_tapped_events_reach_neptune(neptune_env):
    logger = lox.loggers.from_config(SPEC, name="tapped")
    state = logger.init(lr=0.5)

    def train(w):
        def step(w, i):
            lox.log({"loss": w * w, "grad": {"w": 2 * w}}, step=i)
            return w * 0.5, None

        return jax.lax.scan(step, w, jnp.arange(20))[0]

    logger.tap(train, state)(jnp.float32(1.0))
    logger.finish(state)
    (run,) = logger.runs()
    (neptune_run,) = offline_runs(neptune_env / "neptune-data")[run.run_id]
    w = 0.5 ** np.arange(20, dtype=np.float32)
    assert neptune_run.series("metrics/loss") == [(i, float(v)) for i, v in enumerate(w * w)]
    assert neptune_run.series("metrics/grad/w") == [(i, float(v)) for i, v in enumerate(2 * w)]
    assert neptune_run.fields()["config/lr"] == 0.5
    assert len(neptune_run.of_type("LogFloats")) <= 2 * len(batch_files(neptune_env / "lox-runs" / run.run_id))


def test_what_neptune_cannot_hold_is_skipped_with_one_warning(neptune_env):
    """NaN, a step repeated or going back, a key that is also a namespace; steps
    other than `step`, and events without steps."""
    logger = lox.loggers.from_config(SPEC, name="odd")
    state = logger.init()
    logs = lox.logdict(
        {"loss": np.array([1.0, np.nan, 3.0, 4.0]), "a": np.array([1.0]), "a/b": np.array([2.0]),
         "reward": np.array([5.0, 6.0]), "free": np.array([7.0, 8.0])},
        steps={"step": {"loss": np.array([0, 1, 2, 2]), "a": np.array([0]), "a/b": np.array([0])},
               "episode": {"reward": np.array([3, 4])}},
    )
    with pytest.warns(RuntimeWarning) as caught:
        logger.log(state, logs)
        logger.flush()  # the next batch goes back to step 1: not sent
        logger.log(state, lox.logdict({"loss": np.array([9.0, 10.0])}, steps={"step": {"loss": np.array([1, 5])}}))
        logger.finish(state)
    messages = [str(w.message) for w in caught if "to Neptune" in str(w.message)]
    assert any("1 NaN or infinite value(s) of 'metrics/loss'" in m for m in messages)
    assert any("1 value(s) at a step not above the previous one of 'metrics/loss'" in m for m in messages)
    assert any("'metrics/a/b'" in m and "'metrics/a' is already defined as an attribute" in m for m in messages)
    (run,) = logger.runs()
    (neptune_run,) = offline_runs(neptune_env / "neptune-data")[run.run_id]
    assert neptune_run.series("metrics/loss") == [(0, 1.0), (2, 3.0), (5, 10.0)]
    assert neptune_run.series("metrics/a") == [(0, 1.0)]
    assert neptune_run.series("metrics/reward") == [(3, 5.0), (4, 6.0)]  # its only step name is its step
    assert neptune_run.series("metrics/free") == [(None, 7.0), (None, 8.0)]  # appended, numbered by Neptune
    assert lox.load(neptune_env / "lox-runs" / run.run_id)["loss"].size == 6  # all kept locally


# --- a killed process, then `lox sync` -------------------------------------------------------
CRASHER = """
import sys, threading, time
import jax, jax.numpy as jnp, lox
from lox_backends.trackers.neptune import NeptuneBackend

logger = lox.loggers.from_config(sys.argv[1], name="crash")
state = logger.init(lr=0.1)

def chunk(start):
    def step(c, i):
        lox.log({"loss": i * 0.5, "w": jnp.stack([i, -i])}, step=i, epoch=i // 8)
        return c, None
    jax.lax.scan(step, 0, start + jnp.arange(16))

train = logger.spool(jax.jit(chunk), state)
for call in range(2):  # sent to Neptune
    train(16 * call)
    logger.flush()
# Then the tracker hangs (as a server that stops answering): later batches are
# saved locally, not sent, when the process is killed.
NeptuneBackend.send = lambda *args: threading.Event().wait()
for call in range(2, 5):
    train(16 * call)
    logger.flush(timeout=2)
print("flushed", flush=True)
time.sleep(600)
"""


def test_a_killed_run_is_completed_by_lox_sync_once(neptune_env, capsys):
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen([sys.executable, "-c", CRASHER, SPEC], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=neptune_env)
    try:
        deadline = time.monotonic() + 120
        line = proc.stdout.readline()
        assert line == "flushed\n" and time.monotonic() < deadline, proc.stderr.read()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    (folder,) = [p for p in (neptune_env / "lox-runs").iterdir() if (p / "_run.json").exists()]
    assert len(batch_files(folder)) == 5  # every flush is on disk
    assert len([r for r in sent_records(folder) if "file" in r]) == 2  # two reached Neptune

    done = sync(str(neptune_env / "lox-runs"), SPEC)
    assert [(pathlib.Path(f), files, rows) for f, files, rows in done] == [(folder, 3, 3 * 32)]
    assert cli.main(["sync", str(neptune_env / "lox-runs"), "--to", SPEC]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"sent 0 batch file(s), 0 row(s) to {SPEC}"

    # The crashed process's offline run, then the one `lox sync` wrote: every value once.
    first, second = offline_runs(neptune_env / "neptune-data")[folder.name]
    assert first.series("metrics/loss") == [(s, s * 0.5) for s in range(32)]
    assert second.series("metrics/loss") == [(s, s * 0.5) for s in range(32, 80)]
    assert second.series("steps/epoch") == [(s, float(s // 8)) for s in range(32, 80)]
    both = concat([first.arrays(), second.arrays()])
    np.testing.assert_array_equal(both.step["w"], np.arange(80))
    for run in (first, second):
        fields = run.fields()
        assert fields["sys/name"] == "crash-0" and fields["config/lr"] == 0.1 and fields["lox/run_id"] == folder.name
    remotes = [r["remote"] for r in sent_records(folder) if "remote" in r]
    assert remotes == [{"custom_run_id": custom_run_id(folder.name)}]  # one Neptune id for the lox run


# --- errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, message", [
    ("neptune:ws/proj?mode=offline&project=x", "the neptune backend has no option 'project'; its options are: mode"),
    ("neptune:ws/proj?mode=debug", "the neptune backend's option mode='debug' is refused: it must be one of "
                                   "offline, async, sync"),
    ("neptune:my-project?mode=offline", "project is 'my-project'; a Neptune project is WORKSPACE/PROJECT"),
    ("neptune:ws/proj/extra?mode=offline", "project is 'ws/proj/extra'; a Neptune project is WORKSPACE/PROJECT"),
    ("neptune?mode=async", "needs a project in mode=async: neptune:WORKSPACE/PROJECT, or set NEPTUNE_PROJECT"),
    ("neptune:ws/proj?mode=sync", "needs NEPTUNE_API_TOKEN in mode=sync"),
])
def test_mistakes_are_refused_with_a_clear_message(neptune_env, spec, message):
    with pytest.raises(ValueError, match=message.replace("?", r"\?")):
        lox.loggers.from_config(spec)


def test_settings_come_from_neptunes_environment_variables(neptune_env, monkeypatch):
    monkeypatch.setenv("NEPTUNE_MODE", "nonsense")
    with pytest.raises(ValueError, match="the neptune backend's NEPTUNE_MODE is 'nonsense'"):
        NeptuneBackend("ws/proj")
    monkeypatch.setenv("NEPTUNE_MODE", "offline")
    monkeypatch.setenv("NEPTUNE_PROJECT", "team/vision")
    backend = NeptuneBackend()
    assert (backend.mode, backend.project) == ("offline", "team/vision")
    assert backend.destination() == f"team/vision offline {neptune_env / 'neptune-data'}"
    monkeypatch.setenv("NEPTUNE_API_TOKEN", "secret-token-123")
    monkeypatch.setenv("NEPTUNE_PROJECT", "no-slash")
    with pytest.raises(ValueError, match="NEPTUNE_PROJECT is 'no-slash'") as error:
        NeptuneBackend(None, {"mode": "async"})
    assert "secret-token-123" not in str(error.value)
    assert NeptuneBackend("team/vision", {"mode": "async"}).destination() == "team/vision"


# --- images, video, audio, histograms and text ------------------------------------------------
def check_neptune_media(neptune_runs, seed, steps):
    """Every media event of `seed` at `steps` once across `neptune_runs` (the
    offline runs of one lox run), decoded, against the by-hand references."""
    for key in ("samples", "grey", "rollout", "rollouts"):
        points = [point for run in neptune_runs for point in run.images(f"media/{key}")]
        assert [step for step, _ in points] == list(steps), key  # each step once, in order
        for i, data in points:
            if key in ("samples", "grey"):
                np.testing.assert_array_equal(tracker_media.png_pixels(data), tracker_media.reference(seed, i)[key])
            else:
                tracker_media.check_media_file(key, data, seed, i)
    captions = [point for run in neptune_runs for point in run.strings("media/caption")]
    assert captions == [(i, tracker_media.caption(seed, i)) for i in steps]
    uploads = [upload for run in neptune_runs for upload in run.uploads("media/")]
    assert sorted((path, ext) for path, ext, _ in uploads) == sorted(
        (f"media/{key}/step_{i}", ext) for i in steps for key, ext in [("sound", "wav"), ("weights", "json"),
                                                                          ("table", "csv")])
    for path, _, data in uploads:
        key, i = path.split("/")[1], int(path.rsplit("_", 1)[1])
        if key == "table":
            assert list(csv.reader(io.StringIO(data.decode()))) == tracker_media.table(seed, i)
        else:
            tracker_media.check_media_file(key, data, seed, i)


def test_media_of_vmapped_seeds_become_file_series_string_series_and_files(neptune_env):
    seeds = 2
    logger = lox.loggers.from_config(SPEC, name="media")
    tracker_media.log_batches(logger, jax.random.key(0), seeds, calls=2)

    found = offline_runs(neptune_env / "neptune-data")
    steps = range(2 * tracker_media.MEDIA_STEPS)
    for seed, run in enumerate(logger.runs()):
        (neptune_run,) = found[run.run_id]
        check_neptune_media([neptune_run], seed, steps)
        assert neptune_run.series("metrics/loss") == [(i, (7 * seed + i) * 0.5) for i in steps]
        # Media are neither float series nor array files.
        assert {"/".join(op["path"]) for op in neptune_run.of_type("LogFloats")} == {"metrics/loss"}
        assert {op["path"][0] for op in neptune_run.of_type("UploadFile")} == {"media"}
        # Each image carries its batch file's timestamp.
        times = {p["ts"] for op in neptune_run.of_type("LogImages", "media/samples") for p in op["values"]}
        assert len(times) == 2


def test_tapped_media_reach_neptune(neptune_env):
    logger = lox.loggers.from_config(SPEC, name="tapped")
    state = logger.init()
    jax.jit(logger.tap(tracker_media.media_chunk, state))(0, 0)
    for i in range(tracker_media.MEDIA_STEPS):
        tracker_media.log_text(logger, state, None, i)
    logger.finish(state)
    (run,) = logger.runs()
    (neptune_run,) = offline_runs(neptune_env / "neptune-data")[run.run_id]
    check_neptune_media([neptune_run], 0, range(tracker_media.MEDIA_STEPS))


SYNC_DIES = """
import os, signal, sys
from lox_backends.tools import cli
from lox_backends.trackers.neptune import NeptuneBackend

send, calls = NeptuneBackend.send, []

def send_then_die(self, *args):  # killed as it starts sending the third batch file
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    calls.append(args)
    return send(self, *args)

NeptuneBackend.send = send_then_die
sys.exit(cli.main(["sync", "runs", "--to", {spec!r}]))
"""


def test_lox_sync_sends_media_once_also_when_interrupted_and_run_again(neptune_env):
    """Runs logged while Neptune was out of reach (a parquet log only), then
    `lox sync`, killed after two batch files, then run again: every image,
    GIF, WAV, histogram and text is in Neptune's offline runs once."""
    seeds = 2
    logger = lox.loggers.from_config("parquet:runs", name="offline")
    tracker_media.log_batches(logger, jax.random.key(1), seeds, calls=3)

    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    killed = subprocess.run([sys.executable, "-c", SYNC_DIES.format(spec=SPEC)], cwd=neptune_env, env=env,
                            capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    folders = sorted((p for p in (neptune_env / "runs").iterdir() if (p / "_run.json").exists()),
                     key=lambda p: json.loads((p / "_run.json").read_text())["name"])
    assert [len([r for r in sent_records(f) if "file" in r]) for f in folders[:1]] == [2]

    done = {pathlib.Path(folder).name: files for folder, files, _ in sync(str(neptune_env / "runs"), SPEC)}
    assert done == {f.name: len(batch_files(f)) - (2 if seed == 0 else 0) for seed, f in enumerate(folders)}
    assert [files for _, files, _ in sync(str(neptune_env / "runs"), SPEC)] == [0, 0]
    found = offline_runs(neptune_env / "neptune-data")
    steps = range(3 * tracker_media.MEDIA_STEPS)
    for seed, folder in enumerate(folders):
        neptune_runs = found[folder.name]
        assert len(neptune_runs) == (2 if seed == 0 else 1)  # offline: the killed sync's run, then the next's
        check_neptune_media(neptune_runs, seed, steps)
        loss = [point for run in neptune_runs for point in run.series("metrics/loss")]
        assert loss == [(i, (7 * seed + i) * 0.5) for i in steps]
