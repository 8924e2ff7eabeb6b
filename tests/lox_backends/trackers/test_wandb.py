"""The wandb backend, with the real W&B client in offline mode: what W&B's own run
files hold (read with wandb_records), after training, tapping, a crash and `lox sync`;
the media files W&B wrote into the run's folder, decoded (PIL, `wave`)."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import wave

import jax
import jax.numpy as jnp
import media_testing as mt
import numpy as np
import pytest
import wandb
from PIL import Image, ImageSequence
from wandb_records import BLOCK, offline_runs, records

import lox
from lox_backends.trackers.sync import sync
from lox_backends.trackers.wandb import (
    HISTOGRAM_BINS,
    WandbBackend,
    _has_exit_record,
    _wait_for_complete_file,
    wandb_id,
)

REPO = pathlib.Path(__file__).resolve().parents[3]
PROJECT = "lox-test"


def spec(tmp_path, **options):
    options = {"mode": "offline", "project": PROJECT, "local": str(tmp_path / "lox-runs"), **options}
    return "wandb?" + "&".join(f"{k}={v}" for k, v in options.items())


def runs_of(env, logger):
    """The offline W&B run of each of the logger's runs (exactly one each)."""
    found = []
    for run in logger.runs():
        runs = offline_runs(env["WANDB_DIR"], wandb_id(run.run_id))
        assert len(runs) == 1, (run.run_id, [r.path for r in runs])
        found.append(runs[0])
    return found


def sent_record(tmp_path, run_id):
    (path,) = (tmp_path / "lox-runs" / run_id).glob("_sent-wandb-*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- training with seeds -------------------------------------------------------------------
STEPS = 8  # per call
CALLS = 3


def train(w, start):
    def step(w, i):
        lox.log({"loss": w, "w": jnp.stack([w, -w, 2 * w]), "count": i * 10}, step=i, epoch=i // 4)
        return w * 0.5, None

    return jax.lax.scan(step, w, start + jnp.arange(STEPS))[0]


def test_vmapped_seeds_become_runs_with_every_step_once(wandb_env, tmp_path):
    logger = lox.loggers.from_config(spec(tmp_path), name="train", flush_every=3600)
    keys = jax.random.split(jax.random.key(0), 3)
    scales = jnp.array([1.0, 2.0, 4.0])
    states = jax.vmap(lambda k, s: logger.init(k, lr=0.1, scale=s))(keys, scales)
    step_fn = jax.jit(jax.vmap(lambda state, w, start: logger.spool(train, state)(w, start), in_axes=(0, 0, None)))
    w = scales
    for call in range(CALLS):
        w = step_fn(states, w, call * STEPS)
        if call == 0:
            logger.flush()  # a batch file of its own: rows of one epoch in two batches
    logger.finish(states)

    runs = logger.runs()
    got = runs_of(wandb_env, logger)
    steps = np.arange(CALLS * STEPS)
    for seed, (run, wb) in enumerate(zip(runs, got, strict=True)):  # one W&B run per run
        assert wb.complete  # finished, and its file complete on disk
        assert (wb.run.run_id, wb.run.project, wb.run.run_group, wb.run.display_name) == (
            run.run_id, PROJECT, logger.group, f"train-{seed}")
        config = wb.config
        assert config["lr"] == 0.1 and config["scale"] == [1.0, 2.0, 4.0][seed]
        assert config["key"] == jax.random.key_data(keys[seed]).tolist()
        # Hand-computed: w halves every step from the seed's scale.
        values = [1.0, 2.0, 4.0][seed] * 0.5 ** steps.astype(np.float64)
        assert wb.series("loss") == list(zip(steps.tolist(), values.tolist(), strict=True))
        assert wb.series("count") == [(s, 10 * s) for s in steps.tolist()]
        assert wb.series("epoch") == [(s, s // 4) for s in steps.tolist()]
        assert [row["_step"] for row in wb.history] == steps.tolist()  # one row per step, in order
        for row, value in zip(wb.history, values, strict=True):  # one row per step (checked above)
            assert row["w/_type"] == "histogram"
            counts, bins = row["w/values"], row["w/bins"]
            assert len(counts) == HISTOGRAM_BINS and sum(counts) == 3
            assert (bins[0], bins[-1]) == (-value, 2 * value)
    record = sent_record(tmp_path, runs[0].run_id)
    assert record[0]["remote"] == {"id": runs[0].run_id}
    assert len([e for e in record if "file" in e]) == 2 and record[-1] == {"closed": True}


def test_tapped_events_and_batches_of_one_step_share_a_row(wandb_env, tmp_path):
    logger = lox.loggers.from_config(spec(tmp_path), name="tapped", flush_every=3600)
    state = logger.init(name="tapped")

    def loop(n):
        def body(i, c):
            lox.log({"acc": c * 0.25}, step=i)
            return c + 1.0

        return jax.lax.fori_loop(0, n, body, 0.0)

    logger.tap(loop, state)(5)  # acc at steps 0..4
    logger.flush()
    logger.log(state, lox.logdict({"loss": np.array([0.5])}, steps={"step": {"loss": np.array([4])}}))
    logger.flush()  # another batch at step 4: the same row
    logger.log(state, lox.logdict({"loss": np.array([0.25])}, steps={"step": {"loss": np.array([5])}}))
    logger.finish(state)

    (wb,) = runs_of(wandb_env, logger)
    assert wb.series("acc") == [(i, i * 0.25) for i in range(5)]
    assert wb.series("loss") == [(4, 0.5), (5, 0.25)]
    assert [row["_step"] for row in wb.history] == [0, 1, 2, 3, 4, 5]


def test_values_wandb_cannot_store_are_warned_about_and_kept_locally(wandb_env, tmp_path):
    logger = lox.loggers.from_config(spec(tmp_path), name="late", flush_every=3600)
    state = logger.init()

    def log(step, **values):
        logger.log(state, lox.logdict({k: np.array([v]) for k, v in values.items()},
                                      steps={"step": {k: np.array([step]) for k in values}}))
        logger.flush()

    with pytest.warns(RuntimeWarning) as caught:  # sent (and warned about) at each flush
        log(10, loss=1.0)
        log(3, acc=0.5)  # its own series is in order, but W&B is at step 10
        log(10, loss=2.0)  # a second value for loss at step 10
        logger.finish(state)
    messages = [str(w.message) for w in caught if str(w.message).startswith("lox: in W&B run")]
    assert len(messages) == 2  # in the order of the flushes
    assert "'late-0', values at steps below the one W&B had reached, which W&B drops: 'acc' (1)." in messages[0]
    assert ("'late-0', values for a key and step that already had a value, which W&B overwrites: 'loss' (1)."
            in messages[1])
    assert all("They are kept in the local log" in m and "log every key with `step=`" in m for m in messages)

    (wb,) = runs_of(wandb_env, logger)
    assert wb.series("loss") == [(10, 2.0)] and wb.series("acc") == []
    local = lox.load(str(tmp_path / "lox-runs" / logger.runs()[0].run_id))
    assert local["acc"].tolist() == [0.5] and local["loss"].tolist() == [1.0, 2.0]


def test_scalars_of_every_kind_and_events_without_a_step(wandb_env, tmp_path):
    logger = lox.loggers.from_config(spec(tmp_path), name="kinds")
    state = logger.init()
    big = 2**53 + 1  # exact as an int64, not as a float64
    logs = lox.logdict(
        {
            "big": np.array([big], np.int64),
            "flag": np.array([True]),
            "z": np.array([1 + 2j], np.complex64),
            "_step": np.array([7.0]),  # W&B's own name
            "nan": np.array([[np.nan, 1.0, np.inf, 3.0]]),
            "val": np.array([0.75, 0.5]),  # epoch only: no W&B step of its own
            "final": np.array([9.0]),  # no step at all
        },
        steps={"step": {k: np.array([2]) for k in ("big", "flag", "z", "_step", "nan")},
               "epoch": {"val": np.array([0, 1])}},
    )
    with pytest.warns(RuntimeWarning, match="'val' \\(1\\)"):  # two values for one row
        logger.log(state, logs)
        logger.finish(state)

    (wb,) = runs_of(wandb_env, logger)
    (row,) = wb.history
    assert row["_step"] == 2
    assert (row["big"], row["flag"], row["z/real"], row["z/imag"], row["lox_step"]) == (big, 1, 1.0, 2.0, 7.0)
    assert sum(row["nan/values"]) == 2 and (row["nan/bins"][0], row["nan/bins"][-1]) == (1.0, 3.0)
    assert (row["final"], row["val"], row["epoch"]) == (9.0, 0.5, 1)  # in the row of the latest step


def pixels(path) -> list[np.ndarray]:
    """The frames of a PNG or GIF file W&B keeps, as pixels (grey in the first channel)."""
    return [np.asarray(frame.convert("RGB")) for frame in ImageSequence.Iterator(Image.open(path))]


def test_every_kind_becomes_w_and_b_media_in_the_row_of_its_step(wandb_env, tmp_path):
    """Two seeds log every kind (spooled at step 0, tapped at step 1, text at
    step 2): each W&B run's rows hold its seed's media beside the scalars,
    and its folder the files, decoded back against what was logged."""
    logger = lox.loggers.from_config(spec(tmp_path), name="media")
    states = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), mt.SEEDS))
    jax.jit(jax.vmap(lambda s, x: logger.spool(mt.log_every_kind, s)(x, 0)))(states, mt.inputs(0))
    jax.vmap(lambda s, x: logger.tap(mt.log_every_kind, s)(x, 1))(states, mt.inputs(1))
    mt.log_text(logger, states, 2)
    logger.finish(states)

    for seed, wb in enumerate(runs_of(wandb_env, logger)):
        files = pathlib.Path(wb.path).parent / "files"
        assert [row["_step"] for row in wb.history] == [0, 1, 2]  # one row per step, media and scalars together
        for row in wb.history[:2]:
            x = {name: value[seed] for name, value in mt.inputs(row["_step"]).items()}
            assert row["loss"] == pytest.approx(float(x["values"].mean()), rel=1e-6)
            # A batch of images: a list of N images under the key.
            assert (row["samples/_type"], row["samples/count"]) == ("images/separated", mt.N)
            assert (row["samples/width"], row["samples/height"]) == (mt.W, mt.H)
            for name, want in zip(row["samples/filenames"], x["pixels"], strict=True):
                (got,) = pixels(files / name)
                np.testing.assert_array_equal(got, want)
            assert row["mask/_type"] == "image-file"  # one image
            (got,) = pixels(files / row["mask/path"])
            np.testing.assert_array_equal(got, np.repeat(x["mask"][..., None], 3, axis=-1))
            # Videos: GIFs (a batch: a list of them).
            assert (row["rollouts/_type"], row["rollouts/count"]) == ("videos", mt.VIDEOS)
            for video, want in zip(row["rollouts/videos"], x["frames"], strict=True):
                assert video["_type"] == "video-file" and video["path"].endswith(".gif")
                np.testing.assert_array_equal(np.stack(pixels(files / video["path"])), want)
            assert row["clip/_type"] == "video-file"
            np.testing.assert_array_equal(np.stack(pixels(files / row["clip/path"])),
                                          np.repeat(x["clip"], 3, axis=-1))
            assert Image.open(files / row["clip/path"]).info["duration"] == 1000 // mt.FPS
            assert row["sound/_type"] == "audio-file"
            with wave.open(str(files / row["sound/path"])) as clip:
                assert (clip.getnchannels(), clip.getsampwidth(), clip.getframerate()) == (2, 2, mt.RATE)
                samples = np.frombuffer(clip.readframes(clip.getnframes()), "<i2").reshape(-1, 2)
            np.testing.assert_array_equal(samples, x["sound"])
            counts, edges = mt.histogram(x["values"])  # the logged counts and edges, not recomputed
            assert row["weights/_type"] == "histogram" and row["weights/values"] == counts.tolist()
            assert row["weights/bins"] == pytest.approx(edges.tolist(), rel=1e-6)
        text = wb.history[2]
        want = mt.texts(2)
        assert text["note"] == want["note"]  # one str: a string value
        for key, columns, rows in [("lines", ["text"], [[line] for line in want["lines"][seed].tolist()]),
                                   ("table", ["0", "1", "2"], want["table"][seed].tolist())]:
            assert (text[f"{key}/_type"], text[f"{key}/nrows"], text[f"{key}/ncols"]) == (
                "table-file", len(rows), len(columns))
            table = json.loads((files / text[f"{key}/path"]).read_text())
            assert (table["columns"], table["data"]) == (columns, rows)


def test_histograms_of_more_bins_than_w_and_b_keeps_are_merged(wandb_env, tmp_path):
    """W&B keeps at most 512 bins: 1000 become 500 of two bins each (counts
    summed), the same span."""
    logger = lox.loggers.from_config(spec(tmp_path), name="bins")
    state = logger.init()
    values = np.arange(1000, dtype=np.float32)
    logger.spool(lambda v: lox.log({"h": lox.histogram(v, bins=1000)}, step=0), state)(values)
    logger.finish(state)
    (wb,) = runs_of(wandb_env, logger)
    (row,) = wb.history
    assert row["h/values"] == [2] * 500
    assert row["h/bins"] == pytest.approx(np.linspace(0, 999, 1001)[::2].tolist(), rel=1e-6)


def test_a_batch_of_more_images_than_w_and_b_keeps_of_a_list_is_cut_with_a_warning(wandb_env, tmp_path):
    logger = lox.loggers.from_config(spec(tmp_path), name="many")
    state = logger.init()
    pixels = np.arange(110, dtype=np.uint8).reshape(110, 1, 1, 1)
    with pytest.warns(RuntimeWarning, match=r"beyond the first 108 images of each, the most W&B keeps of a list: "
                                            r"'many' \(1\)\. .* Log at most 108 images per key and step"):
        logger.spool(lambda p: lox.log({"many": lox.image(p)}, step=0), state)(pixels)
        logger.finish(state)
    (wb,) = runs_of(wandb_env, logger)
    (row,) = wb.history
    files = pathlib.Path(wb.path).parent / "files"
    assert row["many/count"] == 108
    assert [np.asarray(Image.open(files / name)).item() for name in row["many/filenames"]] == list(range(108))


def test_a_finished_run_file_is_complete_only_once_w_and_b_closed_it(wandb_env):
    """`end_run` waits for W&B's exit record: `run.finish()` returns before W&B
    has written the file's last block. Rows of 3000 keys (records over 32 KiB,
    split across blocks) check the file reading too."""
    run = wandb.init(project=PROJECT, id="blocks", mode="offline", reinit="create_new")
    row = {f"k{i}": float(i) for i in range(3000)}
    for step in range(5):
        run.log(row, step=step)
    run.finish()
    _wait_for_complete_file(run.settings.sync_file, 60)
    path = run.settings.sync_file
    data = pathlib.Path(path).read_bytes()
    assert len(data) > 4 * BLOCK and _has_exit_record(path)
    (wb,) = offline_runs(wandb_env["WANDB_DIR"], "blocks")
    assert wb.complete and [r["_step"] for r in wb.history] == list(range(5))
    assert all(r["k2999"] == 2999 for r in wb.history)
    cut = pathlib.Path(path).with_name("cut.wandb")
    for blocks in range(1, len(data) // BLOCK + 1):  # what an open (or killed) run's file holds
        cut.write_bytes(data[: blocks * BLOCK])
        assert not _has_exit_record(str(cut))
        assert len(records(str(cut))) < len(records(path))


# --- a crash, then `lox sync` --------------------------------------------------------------
CRASHER = """
import sys, time
import jax, jax.numpy as jnp
import lox

logger = lox.loggers.from_config(sys.argv[1], name="crash")
state = logger.init(lr=0.5)

def train(start):
    def step(c, i):
        lox.log({"loss": i * 0.5}, step=i)
        return c, None
    return jax.lax.scan(step, 0, start + jnp.arange(4))[0]

spooled = logger.spool(train, state)
for call in range(3):
    spooled(call * 4)
    logger.flush()  # sent to W&B (not complete there before the run finishes)
print(logger.runs()[0].run_id, flush=True)
time.sleep(600)
"""


def test_a_killed_run_is_sent_by_lox_sync_exactly_once(wandb_env, tmp_path):
    config = spec(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen([sys.executable, "-c", CRASHER, config], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    watchdog = threading.Timer(120, proc.kill)  # a stuck child fails the test, not the suite
    watchdog.start()
    try:
        run_id = proc.stdout.readline().strip()
        assert run_id, proc.stderr.read()
    finally:
        watchdog.cancel()
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    # Nothing was confirmed: W&B completes its file only when the run finishes.
    assert [list(e) for e in sent_record(tmp_path, run_id)] == [["remote", "destination"]]
    (killed,) = offline_runs(wandb_env["WANDB_DIR"], run_id)
    assert not killed.complete

    folder = str(tmp_path / "lox-runs" / run_id)
    to = spec(tmp_path)
    assert sync(str(tmp_path / "lox-runs"), to) == [(folder, 3, 12)]
    killed_again, synced = offline_runs(wandb_env["WANDB_DIR"], run_id)
    assert killed_again.path == killed.path and synced.complete
    assert synced.run.resume  # W&B's sync appends it to the run the killed process started
    assert synced.series("loss") == [(i, i * 0.5) for i in range(12)]
    assert synced.config == {"lr": 0.5, "_wandb": synced.config["_wandb"]}
    assert sent_record(tmp_path, run_id)[-1] == {"closed": True}

    assert sync(folder, to) == [(folder, 0, 0)]  # nothing left to send
    assert len(offline_runs(wandb_env["WANDB_DIR"], run_id)) == 2  # and no W&B run started for it


# --- modes and errors ----------------------------------------------------------------------
def test_disabled_mode_keeps_the_local_log_only(wandb_env, tmp_path):
    logger = lox.loggers.from_config(spec(tmp_path, mode="disabled"))
    state = logger.init()
    logger.log(state, lox.logdict({"loss": np.array([1.0])}, steps={"step": {"loss": np.array([0])}}))
    logger.finish(state)
    assert offline_runs(wandb_env["WANDB_DIR"]) == []
    assert lox.load(str(tmp_path / "lox-runs"))[logger.runs()[0].run_id]["loss"].tolist() == [1.0]


@pytest.mark.parametrize(
    "config, message",
    [
        ("wandb?project=p&colour=red",
         "the wandb backend has no option 'colour'; its options are: project (the W&B project, by default "
         "WANDB_PROJECT or else lox); entity (the W&B entity, a user or team, by default yours); mode (how runs "
         "are sent, by default WANDB_MODE or else online: one of online, offline, disabled); local (folder of the "
         "local log that is sent from, if not the Logger's parquet backend's; default lox-runs). "
         "E.g. 'wandb?project=demo&mode=offline'."),
        ("wandb?mode=shared",
         "the wandb backend's option mode='shared' is refused: it must be one of online, offline, disabled (how "
         "runs are sent, by default WANDB_MODE or else online). E.g. 'wandb?project=demo&mode=offline'."),
        ("wandb:https://example.com?project=p",
         "the wandb backend takes no target (got 'wandb:https://example.com'); the server is W&B's "
         "WANDB_BASE_URL. E.g. 'wandb?project=demo&mode=offline'."),
    ],
)
def test_bad_config_strings_are_refused(wandb_env, config, message):
    with pytest.raises(ValueError) as error:
        lox.loggers.from_config(config)
    assert str(error.value) == message


def test_a_wandb_mode_it_cannot_use_is_refused(wandb_env, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "sideways")
    with pytest.raises(ValueError) as error:
        lox.loggers.from_config("wandb?project=p")
    assert str(error.value) == (
        "WANDB_MODE is 'sideways'; the wandb backend sends online, offline or disabled. "
        "Set the mode in the config string, e.g. 'wandb?project=demo&mode=offline'."
    )


def test_online_without_credentials_fails_at_once(wandb_env, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    started = time.monotonic()
    with pytest.raises(ValueError) as error:
        WandbBackend(None, {"mode": "online", "project": "p", "local": str(tmp_path / "lox-runs")})
    assert str(error.value).startswith("the wandb backend (mode=online) found no W&B credentials (")
    assert str(error.value).endswith(
        "). Set WANDB_API_KEY, run `wandb login`, or log offline with 'wandb?mode=offline' and upload "
        "with `wandb sync`."
    )
    assert time.monotonic() - started < 10
    assert not (tmp_path / "lox-runs").exists()
