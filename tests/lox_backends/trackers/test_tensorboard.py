"""The tensorboard backend, read back with TensorBoard's own readers (its
EventAccumulator, and its HPARAMS plugin over the data provider its server
uses): every value and step against references computed by hand, while a run
is open, through `lox sync`, and after a killed process; images, video, audio,
text and histograms decoded back (PIL, `wave`) against what was logged."""

import io
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import wave

import jax
import jax.numpy as jnp
import media_testing as mt
import ml_dtypes
import numpy as np
import pytest
from logs_testing import log_epochs
from PIL import Image, ImageSequence
from tensorboard import context
from tensorboard.backend.event_processing import data_provider, plugin_event_accumulator, plugin_event_multiplexer
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.plugins import base_plugin
from tensorboard.plugins.hparams import api_pb2, backend_context, get_experiment, list_session_groups
from tensorboard.plugins.hparams import metadata as hparams_metadata
from tensorboard.plugins.hparams import plugin_data_pb2 as hparams_data
from tensorboardX import SummaryWriter

import lox
from lox_backends.tools import cli
from lox_backends.trackers.sync import sync
from lox_core.logdict import NO_STEP

REPO = pathlib.Path(__file__).resolve().parents[3]
HERE = pathlib.Path(__file__).resolve().parent
STEPS_PER_EPOCH = 4
EVERYTHING = {ea.SCALARS: 0, ea.HISTOGRAMS: 0, ea.TENSORS: 0}  # keep every event (no sampling)


SUMMARY_TAGS = ["summary/loss.count", "summary/loss.last", "summary/loss.max", "summary/loss.min"]  # sorted


def train(w, epoch):
    """Halves w every step; logs loss = w², a 3-vector and the epoch."""

    def step(w, i):
        lox.log({"loss": w * w, "grad": jnp.stack([w, -w, 2 * w])}, step=epoch * STEPS_PER_EPOCH + i, epoch=epoch)
        return w * 0.5, None

    return jax.lax.scan(step, w, jnp.arange(STEPS_PER_EPOCH))[0]


def expected(w0, epochs):
    """(step, epoch, loss, grad) of every event `train` logs from w0, computed by hand in float32."""
    w = np.float32(w0)
    events = []
    for epoch in range(epochs):
        for i in range(STEPS_PER_EPOCH):
            events.append((epoch * STEPS_PER_EPOCH + i, epoch, float(w * w), np.array([w, -w, 2 * w], np.float32)))
            w = np.float32(w * np.float32(0.5))
    return events


def train_seeds(logger, w0s, epochs):
    states = jax.vmap(lambda key, w0: logger.init(key, lr=0.1, w0=w0))(
        jax.random.split(jax.random.key(0), len(w0s)), jnp.asarray(w0s)
    )
    one_epoch = jax.jit(jax.vmap(lambda s, w, e: logger.spool(train, s)(w, e), in_axes=(0, 0, None)))
    w = jnp.asarray(w0s, jnp.float32)
    for epoch in range(epochs):
        w = one_epoch(states, w, epoch)
    return states


def read(folder) -> ea.EventAccumulator:
    accumulator = ea.EventAccumulator(str(folder), size_guidance=EVERYTHING)
    accumulator.Reload()
    return accumulator


def scalar_series(accumulator, tag):
    return [(e.step, e.value) for e in accumulator.Scalars(tag)]


def event_files(folder):
    return sorted(p.name for p in pathlib.Path(folder).iterdir() if "tfevents" in p.name)


def spec(tmp_path, folder="tb"):
    return f"tensorboard:{tmp_path / folder}?local={tmp_path / 'lox-runs'}"


def test_seeds_become_run_folders_with_every_value_at_its_step(tmp_path):
    logger = lox.loggers.from_config(spec(tmp_path), name="seed")
    w0s = [1.0, 2.0, 3.0]
    states = train_seeds(logger, w0s, epochs=3)
    logger.finish(states)

    group = tmp_path / "tb" / logger.group
    assert sorted(os.listdir(tmp_path / "tb")) == [logger.group]  # the seeds of the job, side by side
    assert sorted(os.listdir(group)) == ["seed-0", "seed-1", "seed-2"]
    for index, (w0, run) in enumerate(zip(w0s, logger.runs(), strict=True)):
        folder = group / f"seed-{index}"
        (name,) = event_files(folder)  # one event file per run and process, named after the run
        assert name.startswith("events.out.tfevents.") and name.endswith(f".{run.run_id}.0")
        events = expected(w0, 3)
        tb = read(folder)
        assert sorted(tb.Tags()["scalars"]) == ["epoch", "loss", *SUMMARY_TAGS]
        assert scalar_series(tb, "loss") == [(s, v) for s, _, v, _ in events]
        # The run's summary, at its last step: the loss's last, least and greatest value, and count.
        losses = [v for _, _, v, _ in events]
        stats = (len(losses), losses[-1], max(losses), min(losses))  # as SUMMARY_TAGS name them
        assert [scalar_series(tb, tag) for tag in SUMMARY_TAGS] == [
            [(events[-1][0], float(np.float32(value)))] for value in stats]
        assert scalar_series(tb, "epoch") == [(s, float(e)) for s, e, _, _ in events]
        histograms = tb.Histograms("grad")
        assert [h.step for h in histograms] == [s for s, _, _, _ in events]
        for h, (_, _, _, grad) in zip(histograms, events, strict=True):
            values = grad.astype(np.float64)
            got = h.histogram_value
            assert (got.min, got.max, got.num) == (values.min(), values.max(), 3)
            assert got.sum == pytest.approx(values.sum()) and got.sum_squares == pytest.approx(values @ values)
            assert sum(got.bucket) == 3
            # Each value lies in the bucket its count is in (buckets end at their limit).
            limits = np.array(got.bucket_limit)
            want = np.bincount(np.searchsorted(limits, values), minlength=len(limits))
            assert list(got.bucket) == want.tolist()
        # The metadata, as a text summary beside the scalars.
        (text,) = tb.Tensors("_lox/run")
        table = text.tensor_proto.string_val[0].decode()
        assert f"| name | seed-{index} |" in table and f"| run id | {run.run_id} |" in table
        assert f"| group | {logger.group} |" in table and "| lr | 0.1 |" in table
        assert f"| w0 | {w0} |" in table


def test_events_are_readable_after_flush_while_the_run_is_open(tmp_path):
    """One reader, reloaded after each `logger.flush()`: it sees everything
    logged so far, in the run's one event file (which TensorBoard follows)."""
    logger = lox.loggers.from_config(spec(tmp_path), name="live")
    state = logger.init(lr=0.1)
    step = jax.jit(logger.spool(train, state))
    folder = tmp_path / "tb" / logger.group / "live-0"
    tb = ea.EventAccumulator(str(folder), size_guidance=EVERYTHING)
    w = jnp.float32(1.0)
    for epoch in range(3):
        w = step(w, epoch)
        logger.flush()
        tb.Reload()
        assert scalar_series(tb, "loss") == [(s, v) for s, _, v, _ in expected(1.0, epoch + 1)]
        assert len(tb.Histograms("grad")) == (epoch + 1) * STEPS_PER_EPOCH
    logger.finish(state)
    assert len(event_files(folder)) == 1


def log_every_kind_from_seeds(logger):
    """Two seeds log every kind: spooled at step 0, tapped at step 1, text from Python at step 2."""
    states = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), mt.SEEDS))
    jax.jit(jax.vmap(lambda s, x: logger.spool(mt.log_every_kind, s)(x, 0)))(states, mt.inputs(0))
    jax.vmap(lambda s, x: logger.tap(mt.log_every_kind, s)(x, 1))(states, mt.inputs(1))
    mt.log_text(logger, states, 2)
    logger.finish(states)


def image_files(provider, sequences, tag, step):
    """What the IMAGES dashboard gets of a tag at a step: (width, height), and the files."""
    (datum,) = [d for d in sequences[tag] if d.step == step]
    width, height, *files = [provider.read_blob(context.RequestContext(), blob_key=b.blob_key) for b in datum.values]
    return (int(width), int(height)), files


def decoded(blob: bytes) -> list[np.ndarray]:
    """The frames of a PNG or GIF, as pixels (grey stays grey, colours RGB)."""
    image = Image.open(io.BytesIO(blob))
    mode = "L" if image.mode == "L" or (image.mode == "P" and _grey(image)) else "RGB"
    return [np.asarray(frame.convert(mode)) for frame in ImageSequence.Iterator(image)]


def _grey(image) -> bool:
    palette = np.array(image.getpalette()).reshape(-1, 3)
    return bool((palette == palette[:, :1]).all())


def test_every_kind_is_shown_as_what_it_is(tmp_path):
    """Images (a batch as one tag's N images), videos (animated GIFs), audio,
    text and histograms, as TensorBoard's dashboards get them from its server
    (the data provider) and its EventAccumulator, against what each seed logged."""
    logger = lox.loggers.from_config(spec(tmp_path), name="media")
    log_every_kind_from_seeds(logger)

    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(tmp_path / "tb"))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(tmp_path / "tb"))
    ctx = context.RequestContext()
    images = provider.read_blob_sequences(ctx, experiment_id="", plugin_name="images", downsample=100)
    histograms = provider.read_tensors(ctx, experiment_id="", plugin_name="histograms", downsample=100)
    texts = provider.read_tensors(ctx, experiment_id="", plugin_name="text", downsample=100)
    runs = [f"{logger.group}/media-{seed}" for seed in range(mt.SEEDS)]
    assert sorted(images) == runs
    for seed, run in enumerate(runs):
        tb = read(tmp_path / "tb" / run)
        tags = tb.Tags()
        assert sorted(tags["histograms"]) == ["weights"] and tags["audio"] == ["sound"]
        assert sorted(tags["scalars"]) == ["loss", *SUMMARY_TAGS]
        assert sorted(images[run]) == ["clip", "mask", "rollouts", "samples"]
        assert sorted(texts[run]) == ["_lox/run", "lines", "note", "table"]
        for step in (0, 1):
            x = {name: value[seed] for name, value in mt.inputs(step).items()}

            size, files = image_files(provider, images[run], "samples", step)
            assert size == (mt.W, mt.H) and len(files) == mt.N  # one tag, N images (a sample slider)
            for file, want in zip(files, x["pixels"], strict=True):
                np.testing.assert_array_equal(decoded(file), [want])
            _, (mask,) = image_files(provider, images[run], "mask", step)
            np.testing.assert_array_equal(decoded(mask), [x["mask"]])
            size, rollouts = image_files(provider, images[run], "rollouts", step)  # animated GIFs, one per video
            assert size == (mt.W, mt.H) and len(rollouts) == mt.VIDEOS
            for file, want in zip(rollouts, x["frames"], strict=True):
                np.testing.assert_array_equal(decoded(file), want)
            _, (clip,) = image_files(provider, images[run], "clip", step)
            np.testing.assert_array_equal(decoded(clip), x["clip"][..., 0])
            gif = Image.open(io.BytesIO(clip))
            assert gif.info["duration"] == 1000 // mt.FPS and gif.info["loop"] == 0

            (audio,) = [a for a in tb.Audio("sound") if a.step == step]
            assert (audio.sample_rate, audio.content_type) == (mt.RATE, "audio/wav")
            with wave.open(io.BytesIO(audio.encoded_audio_string)) as clip_file:
                assert (clip_file.getnchannels(), clip_file.getsampwidth(), clip_file.getframerate()) == (2, 2, mt.RATE)
                samples = np.frombuffer(clip_file.readframes(clip_file.getnframes()), "<i2").reshape(-1, 2)
            np.testing.assert_array_equal(samples, x["sound"])

            counts, edges = mt.histogram(x["values"])
            (h,) = [h.histogram_value for h in tb.Histograms("weights") if h.step == step]
            assert list(h.bucket) == [0, *counts.tolist()] and h.num == mt.VALUES
            assert h.bucket_limit == pytest.approx(edges.tolist(), rel=1e-6)
            # The dashboard draws the buckets from the first to the last one that holds values.
            (drawn,) = [d.numpy for d in histograms[run]["weights"] if d.step == step]
            filled = np.flatnonzero(counts)
            want = np.stack([edges[:-1], edges[1:], counts], axis=1)[filled[0] : filled[-1] + 1]
            np.testing.assert_allclose(drawn, want, rtol=1e-6)
        # Text: markdown, and tables (a list, a 2-D table) as the TEXT dashboard's tables.
        want = mt.texts(2)
        for tag, value in [("note", want["note"]), ("lines", want["lines"][seed]), ("table", want["table"][seed])]:
            (datum,) = texts[run][tag]
            assert datum.step == 2
            assert datum.numpy.astype(str).tolist() == np.asarray(value).astype(str).tolist()
        assert [(e.step, e.value) for e in tb.Scalars("loss")] == [
            (step, pytest.approx(float(mt.inputs(step)["values"][seed].mean()), rel=1e-6)) for step in (0, 1)]


def test_a_bad_image_shape_is_refused_at_the_call(tmp_path):
    logger = lox.loggers.from_config(spec(tmp_path), name="bad")
    state = logger.init()
    with pytest.raises(ValueError, match=r"key 'samples' got lox\.image\(\.\.\.\) of shape \(2, 3, 5\)"):
        logger.spool(lambda x: lox.log({"samples": lox.image(x)}, step=0), state)(jnp.zeros((2, 3, 5)))
    logger.finish(state)


def hparams_sessions(logdir):
    """What TensorBoard's HPARAMS dashboard gets from its server: the experiment
    (hparams and metrics) and the session groups, read as its plugin reads them."""
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    hparams = backend_context.Context(
        base_plugin.TBContext(logdir=str(logdir), data_provider=provider, multiplexer=multiplexer))
    request_context = context.RequestContext()
    experiment = get_experiment.Handler(request_context, hparams, "", api_pb2.GetExperimentRequest()).run()
    request = api_pb2.ListSessionGroupsRequest(
        start_index=0, slice_size=100, allowed_statuses=list(api_pb2.Status.values()))
    groups = list_session_groups.Handler(request_context, hparams, "", request).run().session_groups
    return experiment, groups, provider


def test_metadata_becomes_hparams_without_hiding_the_scalars(tmp_path):
    """Each seed is an HPARAMS session with the run's metadata, and its own
    scalars as metrics; the scalars dashboard still lists them for the run."""
    logger = lox.loggers.from_config(spec(tmp_path), name="seed")
    states = train_seeds(logger, [1.0, 2.0], epochs=2)
    logger.finish(states)

    experiment, groups, provider = hparams_sessions(tmp_path / "tb")
    assert sorted(h.name for h in experiment.hparam_infos) == ["key", "lr", "w0"]
    assert sorted(m.name.tag for m in experiment.metric_infos) == ["epoch", "loss", *SUMMARY_TAGS]
    runs = {g.name: g for g in groups}
    assert sorted(runs) == [f"{logger.group}/seed-0", f"{logger.group}/seed-1"]
    for index, (w0, run) in enumerate(zip([1.0, 2.0], logger.runs(), strict=True)):
        (session,) = runs[f"{logger.group}/seed-{index}"].sessions
        assert session.status == api_pb2.STATUS_SUCCESS  # finished
        hparams = runs[f"{logger.group}/seed-{index}"].hparams
        assert hparams["lr"].number_value == 0.1 and hparams["w0"].number_value == w0
        assert json.loads(hparams["key"].string_value) == run.metadata["key"]
        last_step, _, last_loss, _ = expected(w0, 2)[-1]
        loss = next(m for m in session.metric_values if m.name.tag == "loss")
        assert (loss.training_step, loss.value) == (last_step, last_loss)
        # The HPARAMS table's columns of the run's summary: its best loss among them.
        least = next(m for m in session.metric_values if m.name.tag == "summary/loss.min")
        assert (least.training_step, least.value) == (last_step, min(v for _, _, v, _ in expected(w0, 2)))
    # TensorBoard's server lists the scalars of each run, hparams or not.
    listed = provider.list_scalars(context.RequestContext(), experiment_id="", plugin_name="scalars")
    assert {run: sorted(tags) for run, tags in listed.items()} == {
        f"{logger.group}/seed-{i}": ["epoch", "loss", *SUMMARY_TAGS] for i in range(2)}


def test_tensorboardx_add_hparams_in_the_run_folder_hides_the_scalars_written_after_it(tmp_path):
    """Why lox writes the hparams with the run's own writer: add_hparams into
    the run's folder opens a second event file there, and TensorBoard's reader
    follows the newest file only: the scalars written afterwards are hidden."""
    folder = str(tmp_path / "by-hand")
    writer = SummaryWriter(folder)
    tb = ea.EventAccumulator(folder, size_guidance=EVERYTHING)
    writer.add_scalar("loss", 1.0, 0)
    deadline = time.monotonic() + 30  # tensorboardX writes from a queue of its own: until the reader sees it
    while "loss" not in tb.Reload().Tags()["scalars"] and time.monotonic() < deadline:
        writer.flush()
        time.sleep(0.05)
    second = int(time.time())
    while int(time.time()) == second:  # a file name of its own (they hold the second)
        time.sleep(0.05)
    writer.add_hparams({"lr": 0.1}, {"hparam/final": 0.0}, name=".")
    tb.Reload()
    writer.add_scalar("loss", 0.5, 1)
    writer.close()  # everything is in the files now
    tb.Reload()
    assert len(event_files(folder)) == 2
    assert scalar_series(tb, "loss") == [(0, 1.0)]  # step 1 is in the file, unseen
    assert scalar_series(read(folder), "loss") == [(0, 1.0), (1, 0.5)]  # a reader started afresh sees it


def test_keys_of_any_characters_steps_of_any_integer_type_and_values_of_any_dtype(tmp_path):
    logger = lox.loggers.from_config(spec(tmp_path))
    state = logger.init(name="keys")
    big = 2**40 + 3  # an int64 value, kept as float32 (as every TensorBoard scalar)
    values = {
        "train/loss": np.array([0.5, 0.25], np.float32),
        "ünïcödé key": np.array([1.5, -2.0], np.float64),
        "with spaces / and slashes": np.array([True, False]),
        "count": np.array([7, big], np.int64),
        "half": np.array([0.1, 0.2], ml_dtypes.bfloat16),
    }
    steps = {"step": {"train/loss": np.array([0, 1], np.int32), "ünïcödé key": np.array([2**31, 2**33], np.int64),
                      "with spaces / and slashes": np.array([-1, 3], np.int64), "count": np.array([5, 6], np.int32),
                      "half": np.array([0, 1], np.int32)}}
    logger.log(state, lox.logdict(values, steps))
    logger.finish(state)
    (run,) = logger.runs()
    tb = read(tmp_path / "tb" / run.group / "keys")
    assert sorted(tag for tag in tb.Tags()["scalars"] if not tag.startswith("summary/")) == sorted(values)
    assert scalar_series(tb, "train/loss") == [(0, 0.5), (1, 0.25)]
    assert scalar_series(tb, "ünïcödé key") == [(2**31, 1.5), (2**33, -2.0)]
    assert scalar_series(tb, "with spaces / and slashes") == [(-1, 1.0), (3, 0.0)]
    assert scalar_series(tb, "count") == [(5, 7.0), (6, float(np.float32(big)))]
    assert scalar_series(tb, "half") == [(0, float(np.float32(ml_dtypes.bfloat16(0.1)))),
                                         (1, float(np.float32(ml_dtypes.bfloat16(0.2))))]


def test_an_event_without_step_uses_its_other_step_name_else_step_0(tmp_path):
    """`val` is logged per epoch only, `loss` per step and epoch, `note` with no
    step at all: each goes to its own step name's step (as in the other trackers)."""
    logger = lox.loggers.from_config(spec(tmp_path))
    state = logger.init(name="epochs")
    log_epochs(logger, state)
    logger.log(state, lox.logdict({"note": np.array([4.0])}, {"step": {"note": np.array([NO_STEP])}}))
    logger.finish(state)
    (info,) = logger.runs()
    tb = read(tmp_path / "tb" / info.group / "epochs")
    assert scalar_series(tb, "val") == [(0, 10.25), (1, 10.0625), (2, 10.015625)]
    assert scalar_series(tb, "loss") == [(s, 0.5**s) for s in range(6)]
    assert scalar_series(tb, "epoch") == [(s, float(s // 2)) for s in range(6)]  # at the loss steps
    assert scalar_series(tb, "note") == [(0, 4.0)]


def test_scalars_and_histograms_go_to_the_step_named_step_whatever_the_order_of_the_step_names(tmp_path):
    """`epoch=` given before `step=`: `step` is still the TensorBoard step of
    scalars and histograms; a vector logged per epoch only goes to its epoch."""
    logger = lox.loggers.from_config(spec(tmp_path))
    state = logger.init(name="order")

    def epoch(w, e):
        def step(w, i):
            lox.log({"w": w, "ws": jnp.stack([w, 2 * w])}, epoch=e, step=e * 2 + i)
            return w * 0.5, None

        w = jax.lax.scan(step, w, jnp.arange(2))[0]
        lox.log({"per_epoch": jnp.stack([w, w, w])}, epoch=e)
        return w

    run = jax.jit(logger.spool(epoch, state))
    w = jnp.float32(1.0)
    for e in range(2):
        w = run(w, e)
    logger.finish(state)
    (info,) = logger.runs()
    tb = read(tmp_path / "tb" / info.group / "order")
    assert scalar_series(tb, "w") == [(s, 0.5**s) for s in range(4)]
    assert [(h.step, h.histogram_value.max) for h in tb.Histograms("ws")] == [(s, 2 * 0.5**s) for s in range(4)]
    assert [(h.step, h.histogram_value.min) for h in tb.Histograms("per_epoch")] == [(0, 0.25), (1, 0.0625)]
    assert scalar_series(tb, "epoch") == [(s, float(s // 2)) for s in range(4)]


def test_complex_values_nonfinite_entries_and_arrays_of_other_dtypes(tmp_path):
    logger = lox.loggers.from_config(spec(tmp_path))
    state = logger.init(name="arrays")
    z = np.array([1 + 2j, 3 - 4j], np.complex64)
    za = np.array([[1 + 1j, 2 - 2j], [3 + 0j, -1j]], np.complex64)
    nan = np.array([[1.0, np.nan, np.inf, -2.0], [np.nan, np.nan, np.nan, np.nan]], np.float32)
    ints = np.array([[1, 2, 2, 9]], np.int32)
    half = np.array([[0.5, -0.25]], ml_dtypes.bfloat16)
    at = {"step": {"z": np.array([0, 1]), "za": np.array([0, 1]), "nan": np.array([0, 1]),
                   "ints": np.array([4]), "half": np.array([5])}}
    logger.log(state, lox.logdict({"z": z, "za": za, "nan": nan, "ints": ints, "half": half}, at))
    logger.finish(state)
    (info,) = logger.runs()
    tb = read(tmp_path / "tb" / info.group / "arrays")
    assert scalar_series(tb, "z/real") == [(0, 1.0), (1, 3.0)]
    assert scalar_series(tb, "z/imag") == [(0, 2.0), (1, -4.0)]

    def stats(tag):
        return [(h.step, h.histogram_value.min, h.histogram_value.max, h.histogram_value.num,
                 h.histogram_value.sum) for h in tb.Histograms(tag)]

    assert stats("za/real") == [(0, 1.0, 2.0, 2, 3.0), (1, 0.0, 3.0, 2, 3.0)]
    assert stats("za/imag") == [(0, -2.0, 1.0, 2, -1.0), (1, -1.0, 0.0, 2, -1.0)]
    assert stats("nan") == [(0, -2.0, 1.0, 2, -1.0)]  # finite entries only; none at step 1: left out
    assert stats("ints") == [(4, 1.0, 9.0, 4, 14.0)]
    assert stats("half") == [(5, -0.25, 0.5, 2, 0.25)]
    huge = lox.logdict({"huge": np.array([[1e30, -1e25, 0.0]])}, {"step": {"huge": np.array([0])}})
    state = logger.init(name="huge")
    logger.log(state, huge)
    logger.finish(state)
    (h,) = read(tmp_path / "tb" / info.group / "huge").Histograms("huge")
    assert (h.histogram_value.min, h.histogram_value.max, sum(h.histogram_value.bucket)) == (-1e25, 1e30, 3)


def test_tapped_events_arrive(tmp_path):
    logger = lox.loggers.from_config(spec(tmp_path))
    state = logger.init(name="tapped")
    w = jax.jit(logger.tap(train, state))(jnp.float32(2.0), 0)
    jax.jit(logger.tap(train, state))(w, 1)
    logger.finish(state)
    (info,) = logger.runs()
    tb = read(tmp_path / "tb" / info.group / "tapped")
    assert scalar_series(tb, "loss") == [(s, v) for s, _, v, _ in expected(2.0, 2)]


def test_two_runs_of_one_name_get_a_folder_each(tmp_path):
    logger = lox.loggers.from_config(spec(tmp_path))
    a, b = logger.init(name="a"), logger.init(name="a")
    logger.log(a, lox.logdict({"x": np.array([1.0])}, {"step": {"x": np.array([0])}}))
    logger.log(b, lox.logdict({"x": np.array([2.0])}, {"step": {"x": np.array([0])}}))
    logger.finish(a)
    logger.finish(b)
    group = tmp_path / "tb" / logger.group
    assert sorted(os.listdir(group)) == ["a", "a-1"]
    assert scalar_series(read(group / "a"), "x") == [(0, 1.0)]
    assert scalar_series(read(group / "a-1"), "x") == [(0, 2.0)]


def test_the_default_folder_is_tb_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    logger = lox.loggers.TensorboardLogger()
    state = logger.init(name="default")
    logger.log(state, lox.logdict({"x": np.array([1.0])}, {"step": {"x": np.array([3])}}))
    logger.finish(state)
    assert scalar_series(read(tmp_path / "tb-runs" / logger.group / "default"), "x") == [(3, 1.0)]
    assert (tmp_path / "lox-runs").is_dir()  # the local log it was written from


def test_lox_sync_converts_saved_parquet_runs_once(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    logger = lox.loggers.from_config(f"parquet:{tmp_path / 'runs'}", name="seed")
    states = train_seeds(logger, [1.0, 2.0], epochs=2)
    logger.finish(states)
    out = tmp_path / "out"
    assert cli.main(["sync", str(tmp_path / "runs"), "--to", f"tensorboard:{out}"]) in (None, 0)
    assert capsys.readouterr().out.splitlines()[-1] == f"sent 2 batch file(s), 32 row(s) to tensorboard:{out}"
    for index, w0 in enumerate([1.0, 2.0]):
        tb = read(out / logger.group / f"seed-{index}")
        assert scalar_series(tb, "loss") == [(s, v) for s, _, v, _ in expected(w0, 2)]
        assert [h.step for h in tb.Histograms("grad")] == list(range(2 * STEPS_PER_EPOCH))
    _, groups, _ = hparams_sessions(out)
    assert sorted(g.name for g in groups) == [f"{logger.group}/seed-0", f"{logger.group}/seed-1"]
    assert all(g.sessions[0].status == api_pb2.STATUS_SUCCESS for g in groups)
    assert cli.main(["sync", str(tmp_path / "runs"), "--to", f"tensorboard:{out}"]) in (None, 0)
    assert capsys.readouterr().out.splitlines()[-1] == f"sent 0 batch file(s), 0 row(s) to tensorboard:{out}"
    assert [len(event_files(out / logger.group / f"seed-{i}")) for i in range(2)] == [1, 1]


def test_a_parquet_backend_on_the_local_folder_is_the_local_log(tmp_path):
    runs = tmp_path / "runs"
    logger = lox.loggers.from_config(f"parquet:{runs},tensorboard:{tmp_path / 'tb'}?local={runs}", name="seed")
    states = train_seeds(logger, [1.0, 2.0], epochs=2)
    logger.finish(states)
    local = lox.load(runs)  # each event saved once (one writer for the folder)...
    assert [logs["loss"].tolist() for logs in local.values()] == [
        [v for _, _, v, _ in expected(w0, 2)] for w0 in (1.0, 2.0)]
    for index, w0 in enumerate([1.0, 2.0]):  # ... and written to TensorBoard
        tb = read(tmp_path / "tb" / logger.group / f"seed-{index}")
        assert scalar_series(tb, "loss") == [(s, v) for s, _, v, _ in expected(w0, 2)]


def test_sync_after_the_record_of_what_was_written_is_lost_writes_each_event_once(tmp_path):
    """A crash between writing a batch and recording it (here: every record
    deleted): `lox sync` writes into a new event file of the same folders,
    and leaves out what the first one holds."""
    target = spec(tmp_path)
    logger = lox.loggers.from_config(target, name="seed")
    states = train_seeds(logger, [1.0, 2.0], epochs=2)
    logger.finish(states)
    for record in (tmp_path / "lox-runs").glob("*/_sent-tensorboard-*.jsonl"):
        record.unlink()
    assert [files for _, files, _ in sync(str(tmp_path / "lox-runs"), target)] == [1, 1]
    for index, w0 in enumerate([1.0, 2.0]):
        folder = tmp_path / "tb" / logger.group / f"seed-{index}"
        assert len(event_files(folder)) == 2  # found again by the run id in its file names
        tb = read(folder)
        assert scalar_series(tb, "loss") == [(s, v) for s, _, v, _ in expected(w0, 2)]
        assert scalar_series(tb, "epoch") == [(s, float(e)) for s, e, _, _ in expected(w0, 2)]
        assert [h.step for h in tb.Histograms("grad")] == list(range(2 * STEPS_PER_EPOCH))
        assert len(tb.Tensors("_lox/run")) == 1


def test_sync_after_the_record_is_lost_writes_each_image_audio_text_and_histogram_once(tmp_path):
    target = spec(tmp_path)
    log_every_kind_from_seeds(lox.loggers.from_config(target, name="media"))
    for record in (tmp_path / "lox-runs").glob("*/_sent-tensorboard-*.jsonl"):
        record.unlink()
    sync(str(tmp_path / "lox-runs"), target)
    (group,) = os.listdir(tmp_path / "tb")
    for seed in range(mt.SEEDS):
        folder = tmp_path / "tb" / group / f"media-{seed}"
        assert len(event_files(folder)) == 2
        tb = read(folder)
        for tag in ("samples", "mask", "rollouts", "clip"):
            assert [e.step for e in tb.Tensors(tag)] == [0, 1]
        assert [e.step for e in tb.Audio("sound")] == [0, 1]
        assert [e.step for e in tb.Histograms("weights")] == [0, 1]
        assert [[e.step for e in tb.Tensors(tag)] for tag in ("note", "lines", "table")] == [[2]] * 3


CRASHING = """
import os, signal, sys, jax, jax.numpy as jnp, lox
sys.path[:0] = {paths!r}  # this test module, and the helpers it imports
from test_tensorboard import train
logger = lox.loggers.from_config({spec!r})
state = logger.init(name="crashed", lr=0.1)
step = jax.jit(logger.spool(train, state))
w = step(jnp.float32(1.0), 0)
logger.flush()
w = step(w, 1)
logger.flush()
print("flushed", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_process_then_lox_sync_leaves_every_event_once(tmp_path):
    """The process is killed; the record of its last batch is lost (as if
    killed between writing and recording it): `lox sync` finds the run's
    folder, writes only what its event file lacks, and ends the run's session
    as failed (its process was killed); the killed sender's lock file goes."""
    target = spec(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    script = CRASHING.format(paths=[str(HERE), str(REPO / "tests" / "support")], spec=target)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL and done.stdout == "flushed\n", done.stderr
    (record,) = (tmp_path / "lox-runs").glob("*/_sent-tensorboard-*.jsonl")
    lines = record.read_text().splitlines()
    assert sum('"file"' in line for line in lines) == 2
    record.write_text("\n".join(lines[:-1]) + "\n")  # the second batch: written, not recorded
    assert len(list((tmp_path / "lox-runs").glob("*/_sending-*.lock"))) == 1  # the killed sender's

    command = [sys.executable, "-m", "lox_backends.tools.cli", "sync", "lox-runs", "--to", target]
    first = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[-1] == f"sent 1 batch file(s), 8 row(s) to {target}"
    (group,) = os.listdir(tmp_path / "tb")
    folder = tmp_path / "tb" / group / "crashed"
    assert len(event_files(folder)) == 2
    tb = read(folder)
    assert scalar_series(tb, "loss") == [(s, v) for s, _, v, _ in expected(1.0, 2)]
    assert len(tb.Histograms("grad")) == 2 * STEPS_PER_EPOCH
    _, (session_group,), _ = hparams_sessions(tmp_path / "tb")
    assert session_group.sessions[0].status == api_pb2.STATUS_FAILURE  # killed
    assert list((tmp_path / "lox-runs").glob("*/_sending-*.lock")) == []

    again = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert again.stdout.splitlines()[-1] == f"sent 0 batch file(s), 0 row(s) to {target}"
    assert len(event_files(folder)) == 2  # nothing to write: no file opened


def test_the_hparams_summary_holds_the_metadata_as_tensorboard_parses_it(tmp_path):
    logger = lox.loggers.from_config(spec(tmp_path))
    metadata = {"lr": 0.1, "layers": 3, "name_of_opt": "adam", "nested": {"a": [1, 2]}, "flag": True, "none": None}
    state = logger.init(name="meta", **metadata)
    logger.finish(state)
    (info,) = logger.runs()
    accumulator = plugin_event_accumulator.EventAccumulator(str(tmp_path / "tb" / info.group / "meta"))
    accumulator.Reload()
    content = accumulator.SummaryMetadata(hparams_metadata.SESSION_START_INFO_TAG).plugin_data.content
    start = hparams_metadata.parse_session_start_info_plugin_data(content)
    hparams = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}
    assert hparams == {"name": "meta", "lr": 0.1, "layers": 3.0, "name_of_opt": "adam", "nested": '{"a": [1, 2]}',
                       "flag": True, "none": "null"}
    end = hparams_data.HParamsPluginData.FromString(
        accumulator.SummaryMetadata(hparams_metadata.SESSION_END_INFO_TAG).plugin_data.content)
    assert end.session_end_info.status == api_pb2.STATUS_SUCCESS


# --- errors --------------------------------------------------------------------------------
def test_an_unknown_option_is_refused_with_the_options_there_are():
    with pytest.raises(ValueError, match=r"the tensorboard backend has no option 'flush_secs'; its options are: "
                                         r"local \(.*\)\. E\.g\. 'tensorboard:tb-runs'\."):
        lox.loggers.from_config("tensorboard:tb?flush_secs=5")


def test_folders_behind_a_file_are_refused_when_the_logger_is_created(tmp_path):
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a folder")
    with pytest.raises(ValueError, match=re.escape(
        f"the tensorboard backend's local folder (option local) '{blocker}/runs' cannot be written: "
        f"a file is in the way: '{blocker}'."
    )):
        lox.loggers.from_config(f"tensorboard:{tmp_path}/tb?local={blocker}/runs")
    with pytest.raises(ValueError, match=re.escape(
        f"the tensorboard backend's folder '{blocker}/tb' cannot be written: a file is in the way: '{blocker}'."
    )):
        lox.loggers.from_config(f"tensorboard:{blocker}/tb?local={tmp_path}/runs")


def test_a_uri_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match=r"the tensorboard backend writes to a local folder, got 's3://bucket/tb'; "
                                         r"write to a folder \(e\.g\. 'tensorboard:tb-runs'\) "
                                         r"and copy it where it should go\."):
        lox.loggers.from_config("tensorboard:s3://bucket/tb")


def test_a_file_in_place_of_the_folder_is_refused(tmp_path):
    (tmp_path / "tb").write_text("not a folder")
    with pytest.raises(ValueError, match=rf"the tensorboard backend's folder '{tmp_path / 'tb'}' is a file; "
                                         r"give it a folder, e\.g\. 'tensorboard:tb-runs'\."):
        lox.loggers.from_config(f"tensorboard:{tmp_path / 'tb'}")


def test_a_folder_that_cannot_be_written_is_warned_about_once_and_kept_locally(tmp_path, recwarn):
    """The run's folder cannot be created (a file is in the way): not retried
    forever; lox warns once, names the sync command, and the logs stay in the local log."""
    target = spec(tmp_path)
    logger = lox.loggers.from_config(target, name="blocked")
    (tmp_path / "tb").mkdir(exist_ok=True)  # created, and checked writable, by from_config
    (tmp_path / "tb" / logger.group).write_text("in the way")
    state = logger.init()
    logger.log(state, lox.logdict({"x": np.array([1.0])}, {"step": {"x": np.array([0])}}))
    logger.flush()
    logger.log(state, lox.logdict({"x": np.array([2.0])}, {"step": {"x": np.array([1])}}))
    logger.finish(state, timeout=30)
    messages = [str(w.message) for w in recwarn]
    refused = [m for m in messages if "refused to open run 'blocked-0'" in m]
    assert len(refused) == 1, messages
    assert "NotADirectoryError" in refused[0]
    assert f"lox sync {tmp_path / 'lox-runs'} --to 'tensorboard:{tmp_path / 'tb'}'" in refused[0]
    assert not any("were not sent within" in m for m in messages), messages
    (logs,) = lox.load(tmp_path / "lox-runs").values()
    assert logs["x"].tolist() == [1.0, 2.0]
