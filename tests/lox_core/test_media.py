"""Kinds of logged values (lox_core/media.py): `lox.image`, `lox.video`,
`lox.audio`, `lox.histogram` and text, through `lox.log`, spool, tap, vmap,
scan and cond; `logdict.kind`; the errors at the call."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lox
from lox_core import media


# --- the on-device histogram against numpy.histogram -------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_histogram_counts_are_numpys_for_its_edges_and_its_edges_are_numpys(seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(int(rng.integers(1, 5000))) * rng.uniform(1e-3, 1e3)).astype(np.float32)
    x[: seed % 3] = [np.nan, np.inf][: seed % 3]  # non-finite values are not counted
    bins = int(rng.integers(1, 130))
    h = jax.jit(lambda v: lox.histogram(v, bins=bins))(x)
    finite = x[np.isfinite(x)]
    counts, edges = np.histogram(finite, bins=bins)
    np.testing.assert_allclose(np.asarray(h.edges), edges, rtol=1e-5, atol=1e-5 * (edges[-1] - edges[0]))
    # Against NumPy counting with lox's own (float32) edges: bit for bit.
    assert np.asarray(h.counts).tolist() == np.histogram(finite, bins=np.asarray(h.edges))[0].tolist()
    assert int(np.asarray(h.counts).sum()) == finite.size == counts.sum()


def test_histogram_range_ints_constant_and_empty_inputs_count_as_numpy_does():
    x = np.arange(-3, 12)
    h = lox.histogram(x, bins=4, range=(0, 8))  # values outside the range are not counted
    counts, edges = np.histogram(x, bins=4, range=(0, 8))
    assert np.asarray(h.counts).tolist() == counts.tolist()
    assert np.asarray(h.edges).tolist() == edges.tolist()
    constant = np.full(7, 2.5)
    assert np.asarray(lox.histogram(constant, bins=2).edges).tolist() == np.histogram(constant, 2)[1].tolist()
    assert np.asarray(lox.histogram(np.full(7, 2.5), bins=2).counts).tolist() == [0, 7]
    empty = lox.histogram(np.full(3, np.nan), bins=2)
    assert np.asarray(empty.counts).tolist() == [0, 0] and np.asarray(empty.edges).tolist() == [0.0, 0.5, 1.0]
    assert np.asarray(lox.histogram(np.array([True, False, True]), bins=2).counts).tolist() == [1, 2]


def test_histogram_of_values_whose_span_overflows_their_dtype_counts_by_its_edges():
    # high - low overflowed float32 to inf: every value fell in the first bins ([1, 1, 0, 0]), silently.
    x = np.array([-3e38, -1e38, 2e38, 3e38], np.float32)
    h = lox.histogram(x, bins=4)
    assert np.isfinite(np.asarray(h.edges)).all()
    assert np.asarray(h.counts).tolist() == np.histogram(x, bins=np.asarray(h.edges))[0].tolist() == [1, 1, 0, 2]


def test_histogram_under_vmap_is_each_elements_histogram():
    x = np.random.default_rng(1).standard_normal((3, 500)).astype(np.float32)
    h = jax.vmap(lambda v: lox.histogram(v, bins=8))(x)
    for i in range(3):
        assert np.asarray(h.counts[i]).tolist() == np.histogram(x[i], bins=np.asarray(h.edges[i]))[0].tolist()


@pytest.mark.parametrize(("call", "message"), [
    (lambda: lox.histogram(np.zeros(3), bins=0), "bins >= 1"),
    (lambda: lox.histogram(np.zeros(3), bins=2.5), "bins >= 1"),
    (lambda: lox.histogram(np.zeros(3), range=(1, 1)), "low < high"),
    (lambda: lox.histogram(np.zeros(3), range=(0, "x")), "range=(low, high)"),
    (lambda: lox.histogram(np.zeros(3, complex)), "real numbers"),
    (lambda: lox.video(np.zeros((2, 4, 4, 3)), fps=0), "fps > 0"),
    (lambda: lox.video(np.zeros((2, 4, 4, 3)), fps=jnp.float32(3)), "fps > 0"),
    (lambda: lox.audio(np.zeros(8), rate=8000.5), "rate > 0"),
])
def test_a_kinds_bad_option_is_refused_at_its_call(call, message):
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        call()


# --- shapes and dtypes, refused where the key is known ----------------------------------------
@pytest.mark.parametrize(("value", "message"), [
    (lambda: lox.image(jnp.zeros((3, 4, 5))), r"key 'samples' got lox.image\(...\) of shape \(3, 4, 5\)"),
    (lambda: lox.image(jnp.zeros((4,))), r"shape \(4,\)"),
    (lambda: lox.image(jnp.zeros((0, 4, 4, 3))), "no empty axis"),
    (lambda: lox.image(jnp.zeros((4, 4, 3), jnp.int32)), "dtype int32; pixels are floats in"),
    (lambda: lox.video(jnp.zeros((4, 4, 3))), r"lox.video\(...\) of shape \(4, 4, 3\)"),
    (lambda: lox.audio(jnp.zeros((2, 3, 4))), "mono"),
    (lambda: lox.audio(jnp.zeros(8, jnp.int32)), "int16"),
    (lambda: lox.audio(jnp.zeros((2, 1600))), r"1600 channels\? .* channels-first samples: `x.T`"),
    (lambda: media.Histogram(jnp.zeros(3), jnp.zeros(3)), "counts of shape"),
    (lambda: {"a": lox.image(jnp.zeros((2, 2)))}, "inside a pytree"),
    # a WAV file's header holds rate * channels * 2 bytes per second in 32 bits: the worker's encoder failed
    (lambda: lox.audio(jnp.zeros((8, 2)), rate=2**30), r"key 'samples' got lox.audio\(...\) at rate=1073741824"),
])
def test_a_wrong_shape_or_dtype_is_an_error_naming_the_key_at_the_call(value, message):
    with pytest.raises((ValueError, TypeError), match=message):
        lox.spool(lambda: lox.log({"samples": value()}))()
    with pytest.raises((ValueError, TypeError), match=message):  # eagerly too
        lox.log({"samples": value()})


# --- spool, tap, vmap, scan, cond ----------------------------------------------------------------
def _train(x):
    def body(carry, i):
        frames = jnp.stack([carry * (t / 3.0) for t in range(3)])
        lox.log({"samples": lox.image(carry), "rollout": lox.video(frames, fps=8),
                 "sound": lox.audio(carry[0, :, 0], rate=100), "weights": lox.histogram(carry, bins=5),
                 "loss": jnp.mean(carry)}, step=i)
        def even():
            lox.log({"even": lox.image(carry[0])}, step=i)

        jax.lax.cond(i % 2 == 0, even, lambda: None)
        return carry * 0.5, None
    return jax.lax.scan(body, x, jnp.arange(4))[0]


def _reference(x):
    """The images, frames, clips and histograms of `_train`, by hand (NumPy)."""
    images, frames, sounds, counts = [], [], [], []
    for _ in range(4):
        images.append(x)
        frames.append(np.stack([x * (t / 3.0) for t in range(3)]))
        sounds.append(x[0, :, 0])
        finite = x.reshape(-1)
        edges = np.linspace(finite.min(), finite.max(), 6) if finite.min() < finite.max() else None
        counts.append(np.histogram(finite, bins=edges if edges is not None else 5)[0])
        x = x * 0.5
    return np.stack(images), np.stack(frames), np.stack(sounds), np.stack(counts)


X = np.random.default_rng(0).uniform(size=(2, 6, 6, 3)).astype(np.float32)


def test_spool_returns_each_kinds_arrays_with_their_kind():
    _, logs = jax.jit(lox.spool(_train))(X)
    assert logs.kind == {"samples": "image", "rollout": "video", "sound": "audio", "weights": "histogram",
                         "loss": "scalar", "even": "image"}
    images, frames, sounds, counts = _reference(X)
    np.testing.assert_allclose(logs["samples"].pixels, images, rtol=1e-6)
    np.testing.assert_allclose(logs["rollout"].frames, frames, rtol=1e-6)
    assert logs["rollout"].fps == 8 and logs["sound"].rate == 100
    np.testing.assert_allclose(logs["sound"].samples, sounds, rtol=1e-6)
    assert np.asarray(logs["weights"].counts).tolist() == counts.tolist()
    even = logs.trim()  # logged in a cond inside the scan: padded, the steps it did not run left out
    assert even.step["even"].tolist() == [0, 2] and even["even"].pixels.shape == (2, 6, 6, 3)
    np.testing.assert_allclose(even["even"].pixels, images[[0, 2], 0], rtol=1e-6)


def test_what_tap_callbacks_receive_adds_up_to_what_spool_returns():
    events = []
    lox.tap(_train, events.append)(X)
    assert isinstance(events[0]["samples"], media.Image) and events[0]["samples"].pixels.shape == (2, 6, 6, 3)
    tapped = sum(events)
    _, spooled = lox.spool(_train)(X)
    spooled = spooled.trim()
    assert tapped.kind == spooled.kind
    for key in spooled:
        if isinstance(spooled[key], media.Media):
            assert tapped[key] == spooled[key], key  # the same kind, options and arrays
        else:
            np.testing.assert_array_equal(tapped[key], spooled[key])
        assert tapped.step[key].tolist() == spooled.step[key].tolist()


def test_vmapped_seeds_each_get_their_own_media():
    xs = np.stack([X, 1 - X])
    _, logs = jax.vmap(lox.spool(_train))(xs)
    assert logs.kind["samples"] == "image" and logs.kind["loss"] == "scalar"
    for seed in range(2):
        images, _, _, counts = _reference(xs[seed])
        np.testing.assert_allclose(logs["samples"].pixels[seed], images, rtol=1e-6)  # (seeds, events, ...)
        assert np.asarray(logs["weights"].counts[seed]).tolist() == counts.tolist()
    batches = []
    jax.vmap(lox.tap(_train, lambda event, took: batches.append(event), batched=True))(xs)
    assert batches[0]["samples"].pixels.shape == (2, 1, 2, 6, 6, 3)  # one host call for both seeds
    images = _reference(xs[1])[0]
    np.testing.assert_allclose([b["samples"].pixels[1, 0] for b in batches if "samples" in b], images, rtol=1e-6)


def test_a_kind_is_static_the_same_options_do_not_retrace():
    traces = []

    def f(x):
        traces.append(1)
        lox.log({"v": lox.video(x, fps=5)})
        return x

    spooled = jax.jit(lox.spool(f))
    spooled(jnp.zeros((2, 3, 3, 1)))
    spooled(jnp.ones((2, 3, 3, 1)))
    assert len(traces) == 1


@pytest.mark.parametrize(("value", "fix"), [
    (lambda: lox.image(jnp.zeros((4, 28, 28))), r"a batch of grey images: add their channel axis, `x\[..., None\]`"),
    (lambda: lox.image(jnp.zeros((3, 28, 28))), r"channels first: move them last, `jnp.moveaxis\(x, 0, -1\)`"),
    (lambda: lox.image(jnp.zeros((4, 3, 28, 28))), r"`jnp.moveaxis\(x, 1, -1\)`"),
    (lambda: lox.video(jnp.zeros((8, 16, 16))), r"grey frames: add their channel axis, `x\[..., None\]`"),
    (lambda: lox.video(jnp.zeros((8, 3, 16, 16))), r"`jnp.moveaxis\(x, 1, -1\)`"),
    (lambda: lox.video(jnp.zeros((2, 8, 3, 16, 16))), r"`jnp.moveaxis\(x, 2, -1\)`"),
])
def test_a_wrong_image_or_video_layout_gets_the_fix_for_its_shape(value, fix):
    # An MNIST batch (4, 28, 28) was told to `jnp.moveaxis(x, 1, -1)`, which makes it (4, 28, 28) again.
    with pytest.raises(ValueError, match=fix):
        lox.log({"samples": value()})


def test_cond_branches_that_log_a_key_as_other_kinds_or_options_say_which():
    # The message used to show the same shape and dtype for both branches, not what differs.
    def cond(first, second):
        def f(p, x):
            jax.lax.cond(p, lambda: lox.log({"v": first(x)}) and None, lambda: lox.log({"v": second(x)}) and None)
            return x
        return f

    x = jnp.zeros((2, 4, 4, 1))
    with pytest.raises(ValueError, match=r"log key 'v' differently: branch 0 logs lox.video\(float32\[2, 4, 4, 1\], "
                                         r"fps=3\), branch 1 logs lox.video\(float32\[2, 4, 4, 1\], fps=2\)"):
        lox.spool(cond(lambda x: lox.video(x, fps=2), lambda x: lox.video(x, fps=3)))(True, x)
    with pytest.raises(ValueError, match=r"branch 0 logs float32\[2, 4, 4, 1\], branch 1 logs "
                                         r"lox.image\(float32\[2, 4, 4, 1\]\) .* one kind"):
        lox.spool(cond(lox.image, lambda x: x))(True, x)


def test_numpy_numbers_as_options_are_python_numbers_that_files_and_export_store():
    # An np.float32 fps used to stay one: the Parquet writer's JSON of the kinds then failed the run.
    assert type(lox.video(np.zeros((2, 4, 4, 3)), fps=np.float32(2.5)).fps) is float
    assert type(lox.video(np.zeros((2, 4, 4, 3)), fps=np.int64(8)).fps) is int

    def f(x):
        lox.log({"v": lox.video(x, fps=np.float32(2.5))}, step=0)
        return x

    _, logs = lox.spool(f)(jnp.zeros((2, 4, 4, 3)))
    assert lox.logdict.from_arrow(logs.to_arrow())["v"].fps == 2.5
    exported = jax.export.export(jax.jit(lox.spool(f)))(jax.ShapeDtypeStruct((2, 4, 4, 3), jnp.float32))
    assert jax.export.deserialize(exported.serialize()).call(jnp.zeros((2, 4, 4, 3)))[1]["v"].fps == 2.5


def test_media_survive_jax_export():
    exported = jax.export.export(jax.jit(lox.spool(_train)))(jax.ShapeDtypeStruct(X.shape, jnp.float32))
    _, logs = jax.export.deserialize(exported.serialize()).call(X)
    assert logs.kind["rollout"] == "video" and logs["rollout"].fps == 8
    np.testing.assert_allclose(logs["samples"].pixels, _reference(X)[0], rtol=1e-6)


def test_nolog_removes_the_histograms_work_with_the_log():
    def f(x):
        lox.log({"h": lox.histogram(x, bins=4)})
        return x + 1

    compiled = jax.jit(lox.nolog(f)).lower(jnp.zeros(8)).compile().as_text()
    assert "scatter" not in compiled and "scatter" in jax.jit(f).lower(jnp.zeros(8)).as_text()


# --- text ---------------------------------------------------------------------------------------
def test_eager_text_is_printed_and_returned(capsys):
    logs = lox.log({"sample": "the cat sat", "table": [["a", "b"], ["c", "d"]], "n": 3}, step=7)
    assert capsys.readouterr().out == "[step=7] sample='the cat sat' table=text[2, 2] n=3\n"
    assert logs.kind == {"sample": "text", "table": "text", "n": "scalar"}
    assert logs["sample"].tolist() == ["the cat sat"] and logs["table"].tolist() == [[["a", "b"], ["c", "d"]]]
    assert logs.step["sample"].tolist() == [7]
    assert [e["sample"] for e in logs.events()] == ["the cat sat"]


@pytest.mark.parametrize("transform", [jax.jit, lox.spool, lambda f: lox.tap(f, print), jax.vmap])
def test_text_inside_a_traced_function_is_refused_naming_the_key(transform):
    def f(x):
        lox.log({"sample": "text", "x": x})
        return x

    with pytest.raises(TypeError, match=r"text for 'sample' inside a traced function .*`logger.log"):
        transform(f)(jnp.zeros(2))


def test_text_must_be_a_whole_value_and_rectangular():
    with pytest.raises(TypeError, match=r"got a str for key 'm'.*text \(a str, as the whole value of a key\)"):
        lox.log({"m": {"a": jnp.zeros(2), "b": "x"}})
    with pytest.raises(ValueError, match="key 't' holds lists of strings of different lengths"):
        lox.log({"t": [["a", "b"], ["c"]]})


# --- logdict.kind and reductions ----------------------------------------------------------------
def test_kind_of_plain_values_and_of_vmapped_scalars():
    logs = lox.logdict({"loss": np.zeros(3), "w": np.zeros((3, 2)), "tree": {"a": np.zeros(3)}},
                       steps={"step": {"loss": np.arange(3), "w": np.arange(3)}})
    assert logs.kind == {"loss": "scalar", "w": "array", "tree": "scalar"}
    _, vmapped = jax.vmap(lox.spool(lambda x: lox.log({"loss": x}, step=0)))(jnp.zeros(4))
    assert vmapped["loss"].shape == (4, 1) and vmapped.kind == {"loss": "scalar"}


def test_reductions_other_than_first_and_last_refuse_rendered_kinds():
    _, logs = lox.spool(_train)(X)
    with pytest.raises(ValueError, match=r"reduce\('mean'\): key 'samples' holds image, which has no mean"):
        logs.reduce("mean")
    last = logs.reduce("last")
    assert last.kind == logs.kind and last["rollout"].fps == 8
    np.testing.assert_allclose(last["samples"].pixels[0], _reference(X)[0][-1], rtol=1e-6)
    scalars = logs.filter(lambda k, v: logs.kind[k] in ("scalar", "array")).reduce("mean")
    assert list(scalars) == ["loss"]


def test_logdicts_with_media_concatenate_and_refuse_different_options():
    a = lox.logdict({"v": lox.video(np.zeros((1, 2, 3, 3, 1)), fps=4)}, steps={"step": {"v": np.array([0])}})
    b = lox.logdict({"v": lox.video(np.ones((1, 2, 3, 3, 1)), fps=4)}, steps={"step": {"v": np.array([1])}})
    joined = a + b
    assert joined["v"].frames.shape == (2, 2, 3, 3, 1) and joined.step["v"].tolist() == [0, 1]
    c = lox.logdict({"v": lox.video(np.ones((1, 2, 3, 3, 1)), fps=8)}, steps={"step": {"v": np.array([2])}})
    with pytest.raises(ValueError, match="key 'v' was logged with different structures"):
        a + c


def test_repr_of_media_is_a_summary_not_the_pixels():
    _, logs = lox.spool(_train)(X)
    shown = repr(logs)
    assert "'samples': 4 × image float32[2, 6, 6, 3]  step=[0, 1, 2, 3]" in shown
    assert "'rollout': 4 × video float32[3, 2, 6, 6, 3] at 8 fps" in shown
    assert repr(lox.histogram(np.array([0.0, 1.0]), bins=2)) == "lox.histogram(counts=int32[2], edges=float32[3])"
    event = next(logs.events())
    assert "'weights': histogram of 216 in [" in repr(event)  # 2 x 6 x 6 x 3 values


def test_eager_text_beside_kinds_keeps_their_kinds(capsys):
    logs = lox.log({"note": "hi", "h": lox.histogram(jnp.arange(10.0), bins=4), "im": lox.image(jnp.zeros((8, 8, 3)))},
                   step=1)
    assert capsys.readouterr().out == "[step=1] note='hi' h=histogram of 10 in [0.0, 9.0] im=image float32[8, 8, 3]\n"
    assert logs.kind == {"note": "text", "h": "histogram", "im": "image"}
    assert np.asarray(logs["h"].counts).tolist() == [[3, 2, 2, 3]]


def test_a_spooled_kind_iterates_over_its_events_and_refuses_an_index_out_of_range():
    _, logs = lox.spool(lambda x: [lox.log({"im": lox.image(x * i)}, step=i) for i in range(3)])(jnp.ones((2, 2)))
    events = list(logs["im"])  # device arrays clamp an index: the iteration must still end
    assert [float(e.pixels[0, 0]) for e in events] == [0.0, 1.0, 2.0]
    assert float(logs["im"][-1].pixels[0, 0]) == 2.0
    with pytest.raises(IndexError, match="index 7 is out of range for lox.image of 3"):
        logs["im"][7]


def test_a_key_of_uint8_and_float_pixels_does_not_concatenate():
    floats = lox.logdict({"k": lox.image(np.full((1, 2, 2), 0.25))})
    with pytest.raises(ValueError, match="key 'k' holds images of integer and of float numbers"):
        floats + lox.logdict({"k": lox.image(np.full((1, 2, 2), 64, np.uint8))})
