"""What a Logger refuses at the call and warns about (lox_backends/logger/checks.py), through
the Logger as users meet it: `logger.log` / `spool` / `tap` refuse, in the caller's thread,
what no run could hold, naming the key (and take nothing of a refused call); the router
warns once per run and key of steps that go backwards and of events a spooled loop dropped."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lox

COLUMNS = ["run", "key", "value", "dtype", "shape", "data", "kind"]  # the columns of lox's tables (plugins.md)


@pytest.fixture
def logger():
    logger = lox.loggers.from_config("memory")
    yield logger
    logger.close()


def seeds(logger, n=2, **metadata):
    return jax.vmap(lambda key: logger.init(key, **metadata))(jax.random.split(jax.random.key(0), n))


def f32(*shape) -> np.ndarray:
    return np.zeros(shape, np.float32)


def lox_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning) and "lox" in str(w.message)]


# --- refused at the call ---------------------------------------------------------------------
@pytest.mark.parametrize("name", COLUMNS)
def test_a_step_named_like_a_column_of_lox_tables_is_refused(logger, name):
    state = logger.init()
    message = (f"the step name '{name}' is reserved for a column of lox's tables (run, key, value, dtype, shape, "
               f"data, kind); rename the step, e.g. `lox.log(..., {name}_step=i)`.")
    with pytest.raises(ValueError, match=re.escape(message)):
        logger.log(state, lox.logdict({"x": f32(1)}, {name: {"x": np.zeros(1, np.int32)}}))
    logger.log(state, lox.logdict({"x": f32(1)}, {f"{name}_step": {"x": np.zeros(1, np.int32)}}))


def test_a_key_keeps_one_event_shape_in_all_of_a_loggers_runs(logger):
    first, second = logger.init(), logger.init()
    logger.log(first, lox.logdict({"preds": f32(1, 8)}))
    logger.log(first, lox.logdict({"preds": f32(4, 8)}))  # more events: fine
    message = ("lox logger: 'preds' was logged as float32[8] and now as float32[5]; a key keeps one event shape in "
               "a logger's runs. Log the new values under another key (e.g. pad a smaller last batch, or log its "
               "mean).")
    for state in (first, second):  # in another run of the logger too
        with pytest.raises(ValueError, match=re.escape(message)):
            logger.log(state, lox.logdict({"preds": f32(1, 5)}))
    with pytest.raises(ValueError, match=re.escape("'preds' was logged as float32[8] and now as float32[]")):
        logger.log(first, lox.logdict({"preds": f32(1)}))
    other = lox.loggers.from_config("memory")  # each logger its own
    other.log(other.init(), lox.logdict({"preds": f32(1, 5)}))
    other.close()
    logger.finish(first)
    assert logger.backends[0].logs(logger.runs()[0].run_id)["preds"].shape == (5, 8)


def test_the_event_shape_of_vmapped_seeds_comes_after_their_axes_and_the_event_axis(logger):
    states = seeds(logger, 2)
    logger.log(states, lox.logdict({"p": {"w": f32(2, 1, 3)}}))
    logger.log(states, lox.logdict({"p": {"w": f32(2, 6, 3)}}))
    with pytest.raises(ValueError, match=re.escape("'p/w' was logged as float32[3] and now as float32[4]")):
        logger.log(states, lox.logdict({"p": {"w": f32(2, 1, 4)}}))
    single = logger.init()
    with pytest.raises(ValueError, match=re.escape("'p/w' was logged as float32[3] and now as float32[1, 3]")):
        logger.log(single, lox.logdict({"p": {"w": f32(2, 1, 3)}}))  # one run: (events, 1, 3)


def test_dtypes_mix_where_one_dtype_holds_both_and_the_key_keeps_the_wider_one(logger):
    state = logger.init()
    logger.log(state, lox.logdict({"n": np.array([1], np.int32)}))
    logger.log(state, lox.logdict({"n": np.array([2.5], np.float32)}))  # int32 and float32: float64
    logger.log(state, lox.logdict({"n": np.array([True])}))
    message = ("lox logger: 'n' was logged as float64[] and now as int64[], and no dtype holds the values of both "
               "exactly (a key mixes bool, integers and floats only, and int64 not with floats). Cast the values "
               "to one dtype before logging them, or log the new ones under another key.")
    with pytest.raises(ValueError, match=re.escape(message)):
        logger.log(state, lox.logdict({"n": np.array([3], np.int64)}))
    logger.log(state, lox.logdict({"z": np.array([1.0], np.float32)}))
    with pytest.raises(ValueError, match=re.escape("'z' was logged as float32[] and now as complex64[], and no dtype")):
        logger.log(state, lox.logdict({"z": np.array([1j], np.complex64)}))
    logger.finish(state)
    assert logger.backends[0].logs()["n"].tolist() == [1.0, 2.5, 1.0]


def test_two_keys_that_give_one_series_name_are_refused(logger):
    state = logger.init()
    logger.log(state, lox.logdict({"a/b": f32(1)}))
    message = ("lox logger: key 'a' gives the series 'a/b', which key 'a/b' gave before (a pytree's leaves are named "
               "key/path, in files and trackers); rename one of the keys.")
    with pytest.raises(ValueError, match=re.escape(message)):
        logger.log(state, lox.logdict({"a": {"b": f32(1)}}))
    with pytest.raises(ValueError, match=re.escape("key 'x/y' gives the series 'x/y', which key 'x' gave before")):
        logger.log(state, lox.logdict({"x": {"y": f32(1)}, "x/y": f32(1)}))  # within one call
    logger.log(state, lox.logdict({"a": {"c": f32(1)}, "a/b": f32(1)}))  # 'a/c' is a name of its own


def test_two_leaves_of_one_key_that_give_one_series_name_are_refused(logger):
    message = ("lox logger: key 'c' gives the series 'c/d/e' from two of its leaves (c['d']['e'] and c['d/e']): "
               "pytree leaves are named key/path, so one name would hold both. Rename a dict key inside its value "
               "(e.g. one without '/'), so that each leaf has a name of its own.")
    with pytest.raises(ValueError, match=re.escape(message)):
        logger.log(logger.init(), lox.logdict({"c": {"d/e": f32(1), "d": {"e": f32(1)}}}))


def test_values_and_steps_must_lead_with_the_runs_axes(logger):
    states = seeds(logger, 3)
    message = ("`logger.log`: the state holds runs of shape (3,) (one per seed), but 'x' has shape (1,); its "
               "leading axes must be the runs' (call `logger.log` inside the vmapped function, or vmap the spooled "
               "function).")
    with pytest.raises(ValueError, match=re.escape(message)):
        logger.log(states, lox.logdict({"x": f32(1)}))
    with pytest.raises(ValueError, match=re.escape("but the steps 'step' of 'x' has shape (2,)")):
        logger.log(states, lox.logdict({"x": f32(3, 2)}, {"step": {"x": np.arange(2)}}))
    with pytest.raises(ValueError, match=re.escape("but 'p' has shape (2, 1)")):
        logger.log(states, lox.logdict({"p": {"a": f32(3, 1), "b": f32(2, 1)}}))
    grid = jax.vmap(jax.vmap(logger.init))(jax.random.split(jax.random.key(1), 6).reshape(2, 3))
    with pytest.raises(ValueError, match=re.escape("runs of shape (2, 3) (one per seed), but 'x' has shape (3, 2, 1)")):
        logger.log(grid, lox.logdict({"x": f32(3, 2, 1)}))
    logger.log(grid, lox.logdict({"x": f32(2, 3, 1)}, {"step": {"x": np.zeros((2, 3, 1), np.int32)}}))
    logger.log(states, lox.logdict({"x": f32(3, 2)}, {"step": {"x": np.zeros((3, 2), np.int32)}}))


def test_a_refused_call_leaves_nothing_behind(logger):
    """Kinds and series names are the logger's only once a whole call is accepted."""
    states = seeds(logger, 2)
    with pytest.raises(ValueError, match="'bad' has shape"):
        logger.log(states, lox.logdict({"a": f32(2, 1, 5), "a/b": f32(2, 1), "bad": f32(1)}))
    logger.log(states, lox.logdict({"a": {"b": f32(2, 1, 8)}}))  # neither a[5] nor the key 'a/b' were kept
    with pytest.raises(ValueError, match=re.escape("'a/b' was logged as float32[8] and now as float32[5]")):
        logger.log(states, lox.logdict({"a": {"b": f32(2, 1, 5)}}))
    logger.finish(states)
    for run in logger.runs():
        assert logger.backends[0].logs(run.run_id)["a"]["b"].shape == (1, 8)


def test_padding_per_vmap_element_is_refused_vmap_outside_the_spool_is_not(logger):
    def count_to(n):
        def body(i):
            lox.log({"n": i}, step=i)
            return i + 1

        return jax.lax.while_loop(lambda i: i < n, body, 0)

    state = logger.init()
    message = ("`logger.log`: key 'n' has padding per `jax.vmap` element (a `while_loop` vmapped inside "
               "`lox.spool(..., max_events=N)`), which a run's table cannot hold. Apply `jax.vmap` outside the spool, "
               "with one run per element (`jax.vmap(logger.init)`).")
    with pytest.raises(ValueError, match=re.escape(message)):
        logger.spool(jax.vmap(count_to), state, max_events=4)(jnp.array([1, 3]))
    states = seeds(logger, 2)
    jax.vmap(lambda s, n: logger.spool(count_to, s, max_events=4)(n))(states, jnp.array([1, 3]))
    logger.finish(states)
    assert [logger.backends[0].logs(run.run_id)["n"].tolist() for run in logger.runs()[1:]] == [[0], [0, 1, 2]]


def test_under_jit_and_in_a_tap_the_call_is_refused_while_tracing(logger):
    state = logger.init()
    logger.log(state, lox.logdict({"x": f32(1)}))

    @jax.jit
    def step(state, x):
        logger.log(state, lox.logdict({"x": x[None]}))
        return x

    with pytest.raises(ValueError, match=re.escape("'x' was logged as float32[] and now as float32[3]")):
        step(state, jnp.zeros(3))

    def tapped(x):
        lox.log({"x": x}, step=0)
        return x

    with pytest.raises(ValueError, match=re.escape("'x' was logged as float32[] and now as float32[2]")):
        logger.tap(tapped, state)(jnp.zeros(2))
    with pytest.raises(ValueError, match=re.escape("the step name 'value' is reserved")):
        logger.tap(lambda x: lox.log({"y": x}, value=1), state)(1.0)
    step(state, jnp.float32(2.0))
    logger.finish(state)
    assert logger.backends[0].logs()["x"].tolist() == [0.0, 2.0]


# --- warned about in the router ------------------------------------------------------------------
def steps_of(values, steps, key="x", name="step") -> lox.logdict:
    return lox.logdict({key: np.asarray(values, np.float32)}, {name: {key: np.asarray(steps)}})


def backwards(run, key, was, now, name="step") -> str:
    return (f"lox: in run {run!r} the {name} of {key!r} goes backwards ({was} then {now}). lox sends each batch "
            "ordered by step, but trackers such as W&B drop rows whose step is below one already sent: log in step "
            "order, or use another step name for this key.")


def test_a_step_below_one_sent_before_warns_once_per_run_and_key(logger):
    r, q = logger.init(name="r"), logger.init(name="q")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger.log(r, steps_of([0, 1, 2], [0, 1, 2]))
        logger.flush()
        logger.log(r, steps_of([5], [5]))
        logger.flush()
        logger.log(r, steps_of([3], [3]))  # below 5, sent before
        logger.flush()
        logger.log(r, steps_of([1], [1]))  # once per run and key
        logger.log(r, steps_of([9, 4], [9, 4], key="acc"))  # another key: within the call
        logger.log(q, steps_of([2], [2]))  # another run, whose steps are its own
        logger.flush()
    assert lox_warnings(caught) == [backwards("r", "x", 5, 3), backwards("r", "acc", 9, 4)]


def test_repeated_steps_and_events_without_the_step_do_not_warn(logger):
    state = logger.init(name="r")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger.log(state, steps_of([1, 2, 3], [4, 4, 4]))
        logger.log(state, steps_of([4, 5], [lox.NO_STEP, 5]))
        logger.log(state, steps_of([6], [lox.NO_STEP]))
        logger.log(state, steps_of([7], [5]))
        logger.flush()
    assert lox_warnings(caught) == []


def test_only_the_primary_step_is_checked(logger):
    state = logger.init(name="r")
    both = lox.logdict({"x": f32(2)}, {"epoch": {"x": np.array([2, 1])}, "step": {"x": np.array([10, 11])}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger.log(state, both)  # "step" is the primary step: the epoch may go down
        logger.flush()
        logger.log(state, steps_of([1, 2], [2, 1], key="y", name="epoch"))  # without "step", the first name is
        logger.flush()
    assert lox_warnings(caught) == [backwards("r", "y", 2, 1, name="epoch")]


def test_among_vmapped_seeds_only_the_seed_whose_step_goes_backwards_warns(logger):
    states = seeds(logger, 3, name="s")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logger.log(states, steps_of(np.zeros((3, 2)), [[0, 1], [0, 1], [0, 1]]))
        logger.flush()
        logger.log(states, steps_of(np.zeros((3, 2)), [[2, 3], [0, 4], [2, 3]]))
        logger.flush()
    assert lox_warnings(caught) == [backwards("s-1", "x", 1, 0)]


def dropped(run, counts) -> str:
    return (f"lox: in run {run!r}, events did not fit in the buffer of a spooled `while_loop` and were dropped "
            f"({counts}); the first `max_events` of each run of the loop are kept. Raise `max_events` of "
            "`lox.spool`/`logger.spool`.")


def collatz_steps(n, first=0):
    """n halved, or 3n+1, until 1; logging n and whether it was odd, at steps from `first`."""
    def body(carry):
        n, i = carry
        lox.log({"n": n, "odd": n % 2}, step=i)
        return jnp.where(n % 2 == 0, n // 2, 3 * n + 1), i + 1

    return jax.lax.while_loop(lambda carry: carry[0] != 1, body, (n, first))


def test_events_a_spooled_loop_dropped_warn_once_per_run_and_key(logger):
    state = logger.init(name="d")
    spooled = logger.spool(collatz_steps, state, max_events=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spooled(6)  # 6 3 10 5 16 8 4 2: 8 events, 3 dropped
        logger.flush()
        spooled(7, 5)  # dropped again: warned already
        logger.flush()
    assert lox_warnings(caught) == [dropped("d", "3 of 'n', 3 of 'odd'")]
    logger.finish(state)
    assert logger.backends[0].logs()["n"].tolist() == [6, 3, 10, 5, 16, 7, 22, 11, 34, 17]  # the first five of each


def test_among_vmapped_seeds_only_those_that_dropped_events_warn(logger):
    states = seeds(logger, 3, name="s")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jax.vmap(lambda s, n: logger.spool(collatz_steps, s, max_events=5)(n))(states, jnp.array([4, 6, 8]))
        logger.flush()  # 4 2: 2 events; 6...: 8, 3 dropped; 8 4 2: 3
    assert lox_warnings(caught) == [dropped("s-1", "3 of 'n', 3 of 'odd'")]


# --- kinds (lox.image...) and the media limit ---------------------------------------------------
def test_a_key_keeps_one_kind_and_its_options(logger):
    state = logger.init(name="kinds")
    logger.log(state, {"clip": lox.video(np.zeros((2, 4, 4, 3)), fps=4)}, step=0)
    with pytest.raises(ValueError, match=r"key 'clip' was logged as video \(fps=4, float numbers\) and now as "
                                         r"video \(fps=8, float numbers\)"):
        logger.log(state, {"clip": lox.video(np.zeros((2, 4, 4, 3)), fps=8)}, step=1)
    with pytest.raises(ValueError, match=r"key 'clip' was logged as video \(fps=4, float numbers\) and now as image"):
        logger.spool(lambda: lox.log({"clip": lox.image(jnp.zeros((4, 4, 3)))}), state)()
    with pytest.raises(ValueError, match="key 'clip' was logged as video .* and now as scalar or array"):
        logger.log(state, {"clip": 1.0}, step=2)
    # uint8 pixels after float ones would be read as floats (64 as white): refused like another fps
    with pytest.raises(ValueError, match=r"as video \(fps=4, float numbers\) and now as video \(fps=4, integer"):
        logger.log(state, {"clip": lox.video(np.full((2, 4, 4, 3), 64, np.uint8), fps=4)}, step=3)
    logger.log(state, {"clip": lox.video(np.ones((2, 4, 4, 3)), fps=4)}, step=3)  # the same kind: taken
    logger.finish(state)


def test_an_event_above_the_media_limit_is_refused_at_the_call_naming_the_key():
    logger = lox.loggers.from_config("memory", media_limit={"big": 1000})
    state = logger.init(name="limits")
    tapped = logger.tap(lambda x: lox.log({"big": lox.image(x)}, step=0), state)
    with pytest.raises(ValueError, match=r"one event of key 'big' \(image\) holds 4,800 bytes, above the logger's "
                                         r"media_limit of 1,000 bytes .* media_limit=\{'big': 4800\}"):
        tapped(jnp.zeros((20, 20, 3)))  # refused while tracing, before anything runs
    with pytest.raises(ValueError, match=r"key 'big' \(text\) holds 1,200 bytes"):
        logger.log(state, {"big": "é" * 600}, step=1)  # text by its UTF-8 bytes
    logger.log(state, {"small": lox.image(np.zeros((400, 400, 3), np.uint8))}, step=0)  # other keys: 64 MiB
    logger.finish(state)
    assert [t.column("key").to_pylist() for t in logger.backends[0].tables()] == [["small"]]


@pytest.mark.parametrize(("limit", "message"), [
    (0, r"`media_limit` is a number of bytes > 0 .* got 0"),
    (True, r"`media_limit` is a number of bytes > 0 .* got True"),
    ({"x": 1.5}, r"`media_limit` for key 'x' is a number of bytes > 0 .* got 1.5"),
    ({3: 10}, r"maps keys \(str\) to bytes, got the key 3"),
])
def test_a_bad_media_limit_is_refused_naming_it(limit, message):
    with pytest.raises((TypeError, ValueError), match=message):
        lox.loggers.from_config("memory", media_limit=limit)


# --- logger.log with a plain dict of one event -----------------------------------------------------
def test_a_plain_dict_is_one_event_at_the_steps_given(logger):
    state = logger.init(name="plain")
    logger.log(state, {"acc": 0.5, "w": np.arange(3.0)}, step=4, epoch=1)
    logger.finish(state)
    (logs,) = [lox.logdict.from_arrow(t) for t in logger.backends[0].tables()]
    assert logs["acc"].tolist() == [0.5] and logs["w"].tolist() == [[0.0, 1.0, 2.0]]
    assert logs.step["acc"].tolist() == [4] and logs.epoch["w"].tolist() == [1]


def test_a_plain_dict_for_vmapped_runs_gives_numbers_to_every_run_and_arrays_per_run(logger):
    state = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), 2))
    logger.log(state, {"lr": 0.1, "score": np.array([1.0, 2.0])}, step=0)
    logger.finish(state)
    memory = logger.backends[0]
    values = [[v for t in memory.tables(run.run_id) for v in t.column("value").to_pylist()] for run in logger.runs()]
    assert values == [[0.1, 1.0], [0.1, 2.0]]
    with pytest.raises(TypeError, match="`logger.log` got steps \\(step\\) with a lox.logdict"):
        logger.log(state, lox.logdict({"a": np.zeros((2, 1))}), step=1)
    with pytest.raises(TypeError, match="step 'step' must be an integer scalar, got 1.5"):
        logger.log(state, {"a": 1.0}, step=1.5)


@pytest.mark.parametrize(("value", "message"), [
    (b"abc", r"`logger.log` got a bytes for key 'k'"),
    (np.array([b"a"]), r"`logger.log` got an array of dtype \|S1 for key 'k'"),
    (np.array(["a", "b"], dtype=object), "`logger.log` got an array of dtype object for key 'k'"),
    ({"a": "x"}, r"`logger.log` got a str for key 'k'"),  # text is the whole value of a key
    ({"a": lox.image(np.zeros((2, 2)))}, r"`logger.log`: key 'k' holds a lox.image\(...\) inside a pytree"),
    (lox.image(np.zeros((3, 4, 5))), r"`logger.log`: key 'k' got lox.image\(...\) of shape \(3, 4, 5\)"),
])
def test_a_plain_dict_value_nothing_can_store_is_refused_at_the_call_naming_the_key(logger, value, message):
    # Taken, these failed in the background and the run lost all of its logs, or lost the value's kind.
    state = logger.init(name="bad")
    with pytest.raises((TypeError, ValueError), match=message):
        logger.log(state, {"k": value, "ok": 1.0}, step=0)
    logger.log(state, {"ok": 2.0}, step=1)
    logger.finish(state)
    (logs,) = [lox.logdict.from_arrow(t) for t in logger.backends[0].tables()]
    assert list(logs) == ["ok"] and logs["ok"].tolist() == [2.0]


def test_a_key_of_text_keeps_one_shape(logger):
    state = logger.init(name="text")
    logger.log(state, {"t": "a str"}, step=0)
    with pytest.raises(ValueError, match=r"'t' was logged as text of shape \(\) and now of shape \(2,\); a key "
                                         r"of text keeps one shape"):
        logger.log(state, {"t": ["a", "list"]}, step=1)
    logger.finish(state)


def test_a_plain_dict_logged_under_jit_is_one_event_with_its_kinds(logger):
    state = logger.init(name="jitted")

    @jax.jit
    def step(x, state):
        logger.log(state, {"acc": x * 2, "h": lox.histogram(x, bins=2)}, step=3)
        return x

    step(jnp.arange(4.0), state)
    logger.finish(state)
    logs = logger.backends[0].logs()
    assert logs["acc"].tolist() == [[0.0, 2.0, 4.0, 6.0]] and logs.step["acc"].tolist() == [3]
    assert logs.kind["h"] == "histogram" and logs["h"].counts.tolist() == [[2, 2]]


def test_python_numbers_inside_a_plain_dicts_pytree_go_to_every_vmapped_run(logger):
    # A number inside a pytree was not given to every run: NumPy's "axis 1 is out of bounds", naming nothing.
    state = jax.vmap(logger.init)(jax.random.split(jax.random.key(0), 2))
    logger.log(state, {"opt": {"lr": 0.1, "decay": np.array([1.0, 2.0])}}, step=0)
    logger.finish(state)
    memory = logger.backends[0]
    got = [memory.logs(run.run_id)["opt"] for run in logger.runs()]
    assert [(g["lr"].tolist(), g["decay"].tolist()) for g in got] == [([0.1], [1.0]), ([0.1], [2.0])]
