"""`logdict` algebra, pytree behaviour and display; and the functions through which the rest of
lox_core builds logdicts and reads their padding (the end of `lox_core/logdict.py`)."""

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from logs_testing import assert_logs_equal

import lox
from lox_core.logdict import concat, event_totals, every, in_key_order, padded_logdict, plain, shared_once, trusted

keys = st.sampled_from(["a", "b", "c"])
step_names = st.sampled_from(["step", "episode"])


@st.composite
def logdicts(draw):
    data, steps = {}, {}
    for key in draw(st.lists(keys, unique=True, max_size=3)):
        n = draw(st.integers(1, 4))
        data[key] = np.asarray(draw(st.lists(st.floats(-1e3, 1e3, width=32), min_size=n, max_size=n)), np.float32)
        for name in draw(st.lists(step_names, unique=True)):
            steps.setdefault(name, {})[key] = np.asarray(draw(st.lists(st.integers(0, 100), min_size=n, max_size=n)))
    return lox.logdict(data, steps)


def events(logs, key):
    return logs[key].shape[0] if key in logs else 0


@settings(max_examples=60, deadline=None)
@given(logdicts(), logdicts(), logdicts())
def test_concatenation_is_associative_and_keeps_every_event(a, b, c):
    left, right = (a + b) + c, a + (b + c)
    for key in set(a) | set(b) | set(c):
        assert events(left, key) == events(a, key) + events(b, key) + events(c, key)
        np.testing.assert_array_equal(left[key], right[key])
        for name in left.step_names(key):
            np.testing.assert_array_equal(left.steps[name][key], right.steps[name][key])


@settings(max_examples=60, deadline=None)
@given(logdicts(), logdicts())
def test_concatenation_keeps_steps_aligned_and_fills_missing_ones(a, b):
    ab = a + b
    for key in ab:
        for name in ab.step_names(key):
            steps = np.asarray(ab.steps[name][key])
            assert steps.shape == (events(ab, key),)
            head = np.asarray(a.steps.get(name, {}).get(key, np.full(events(a, key), lox.NO_STEP)))
            tail = np.asarray(b.steps.get(name, {}).get(key, np.full(events(b, key), lox.NO_STEP)))
            np.testing.assert_array_equal(steps, np.concatenate([head, tail]))


@settings(max_examples=60, deadline=None)
@given(logdicts())
def test_pytree_and_pickle_round_trips(logs):
    leaves, tree = jax.tree_util.tree_flatten(logs)
    back = jax.tree_util.tree_unflatten(tree, leaves)
    again = pickle.loads(pickle.dumps(logs))
    for other in (back, again):
        assert list(other) == list(logs) and other.steps.keys() == logs.steps.keys()
        for key in logs:
            np.testing.assert_array_equal(other[key], logs[key])


@settings(max_examples=60, deadline=None)
@given(logdicts(), st.sampled_from(["mean", "sum", "min", "max", "first", "last"]))
def test_reduce_matches_numpy(logs, mode):
    reduced = logs.reduce(mode)
    for key, value in logs.items():
        ref = {"mean": np.mean, "sum": np.sum, "min": np.min, "max": np.max,
               "first": lambda v: v[0], "last": lambda v: v[-1]}[mode](value)
        np.testing.assert_allclose(reduced[key], [ref], rtol=1e-5, atol=1e-3)
        for name in logs.step_names(key):
            want = logs.steps[name][key][0 if mode == "first" else -1]
            assert reduced.steps[name][key].tolist() == [want]


def test_merge_filter_prefix_slice():
    a = lox.logdict({"x": jnp.arange(4), "y": jnp.ones(4)}, {"step": {"x": jnp.arange(4), "y": jnp.arange(4)}})
    b = lox.logdict({"y": jnp.zeros(2)}, {"epoch": {"y": jnp.array([5, 6])}})
    merged = a | b
    assert merged["y"].tolist() == [0, 0] and merged.step_names("y") == ["epoch"]
    assert merged.step["x"].tolist() == [0, 1, 2, 3]
    assert list(a.filter(lambda k, v: k == "x")) == ["x"]
    assert list(a.prefix("train/")) == ["train/x", "train/y"] and "train/x" in a.prefix("train/").step
    sliced = a.slice[1::2]
    assert sliced["x"].tolist() == [1, 3] and sliced.step["y"].tolist() == [1, 3]
    with pytest.raises(TypeError, match=r"takes a slice such as `logs.slice\[::10\]`"):
        a.slice[0]


def test_errors_name_the_problem():
    a = lox.logdict({"x": jnp.zeros((2, 3))})
    with pytest.raises(ValueError, match=r"key 'x'.*float32\[3\] and float32\[4\]"):
        a + lox.logdict({"x": jnp.zeros((1, 4))})
    with pytest.raises(ValueError, match=r"unknown reduce mode 'median': use one of mean, sum, min, max, first, last"):
        a.reduce("median")
    with pytest.raises(AttributeError, match=r"no step named 'episode'; its step names are \[\]"):
        _ = a.episode


def test_repr_shows_keys_shapes_and_step_names_while_traced():
    shown = []

    def f(x):
        logs = lox.logdict({"loss": x, "w": {"k": jnp.zeros((10, 3), jnp.int32) + x[:, None].astype(int)}},
                           {"step": {"loss": jnp.arange(10)}})
        shown.append(repr(logs))
        return x

    jax.jit(f)(jnp.zeros(10))
    assert shown == ["logdict({\n  'loss': float32[10]  steps: step,\n  'w': {'k': 'int32[10,3]'}\n})"]
    assert repr(lox.logdict()) == "logdict({})"


def test_repr_of_concrete_logs_shows_their_values_and_steps_rounded_and_abbreviated():
    logs = lox.logdict(
        {"loss": jnp.arange(10.0) / 3, "w": {"k": np.arange(6, dtype=np.int32).reshape(3, 2)},
         "r": np.array([0.5, 0.0])},
        {"step": {"loss": jnp.arange(10), "w": np.array([0, lox.NO_STEP, 2])}},
        valid={"r": np.array([True, False])},
    )
    assert str(logs) == repr(logs) == (
        "logdict({\n"
        "  'loss': float32[10] [0.0, 0.3333, 0.6667, ..., 2.333, 2.667, 3.0]  step=[0, 1, 2, ..., 7, 8, 9],\n"
        "  'w': {'k': int32[3,2] [[0, 1], [2, 3], [4, 5]]}  step=[0, -, 2],\n"
        "  'r': float64[2] [0.5, 0.0]  valid=[True, False]\n"
        "})"
    )


def test_concat_of_nothing_is_empty():
    assert concat([]) == {}


def test_concat_ignores_a_step_of_a_key_the_part_does_not_hold():
    stray = lox.logdict({"a": np.array([1.0])}, steps={"step": {"a": np.array([0]), "gone": np.array([5])}})
    other = lox.logdict({"a": np.array([2.0])}, steps={"step": {"a": np.array([1])}})
    for logs in (lox.logdict() + stray, stray + other):
        assert list(logs) == ["a"] and "gone" not in logs.steps["step"]
    np.testing.assert_array_equal((stray + other).step["a"], [0, 1])


def test_events_split_a_logdict_into_its_events_leaving_out_padding_and_missing_steps():
    logs = lox.logdict(
        {"loss": np.array([0.5, 0.25, 0.0]), "acc": np.array([0.75, 1.0, 0.0]), "w": np.arange(6.0).reshape(3, 2),
         "note": np.array([7, 8])},
        steps={"step": {"loss": np.array([0, 1, 2]), "acc": np.array([0, 1, 2]), "w": np.array([0, lox.NO_STEP, 2])},
               "epoch": {"w": np.array([0, 0, 1])}},
        valid={"loss": np.array([True, True, False]), "acc": np.array([True, True, False])},
    )
    events = list(logs.events())
    got = [(list(e), {k: np.asarray(v).tolist() for k, v in e.items()}, e.steps) for e in events]
    assert got == [
        (["loss", "acc"], {"loss": 0.5, "acc": 0.75}, {"step": 0}),
        (["loss", "acc"], {"loss": 0.25, "acc": 1.0}, {"step": 1}),  # the padded third event left out
        (["w"], {"w": [0.0, 1.0]}, {"step": 0, "epoch": 0}),
        (["w"], {"w": [2.0, 3.0]}, {"epoch": 0}),  # this event carried no `step`
        (["w"], {"w": [4.0, 5.0]}, {"step": 2, "epoch": 1}),
        (["note"], {"note": 7}, {}),
        (["note"], {"note": 8}, {}),
    ]
    assert all(np.shape(e["w"]) == (2,) for e in events if "w" in e)


def test_an_event_reads_like_the_values_it_holds_and_adds_up_as_a_logdict():
    event = lox.Event({"loss": np.float32(0.25), "w": np.array([1.5, 2.0], np.float32), "n": np.int32(3)},
                      step=4, epoch=1)
    assert repr(event) == str(event) == "Event({'loss': 0.25, 'w': [1.5, 2.0], 'n': 3}, step=4, epoch=1)"
    assert (event.step, event.epoch, event.steps) == (4, 1, {"step": 4, "epoch": 1})
    message = r"this event has no step named 'stepp'; its step names are \['epoch', 'step'\]\. Pass steps to `lox.log`"
    with pytest.raises(AttributeError, match=message):
        _ = event.stepp
    again = pickle.loads(pickle.dumps(event))
    assert repr(again) == repr(event) and again.steps == event.steps
    doubled = jax.jit(lambda e: jax.tree_util.tree_map(lambda x: 2 * x, e))(event)  # a pytree: values and steps
    assert isinstance(doubled, lox.Event) and list(doubled) == list(event) and doubled.steps == {"step": 8, "epoch": 2}
    np.testing.assert_array_equal(doubled["w"], [3.0, 4.0])
    logs = event.to_logdict() + lox.Event({"loss": np.float32(0.5)}, step=5).to_logdict()
    want = lox.logdict({"loss": np.array([0.25, 0.5], np.float32), "w": np.array([[1.5, 2.0]], np.float32),
                        "n": np.array([3], np.int32)},
                       steps={"step": {"loss": np.array([4, 5]), "w": np.array([4]), "n": np.array([4])},
                              "epoch": {"loss": np.array([1, lox.NO_STEP]), "w": np.array([1]), "n": np.array([1])}})
    assert_logs_equal(logs, want, dtypes=False)


def test_print_shows_values_rounded_and_large_arrays_abbreviated():
    event = lox.Event({"x": np.float32(1.0), "tiny": np.float64(1.23456e-7), "big": np.arange(100.0),
                       "tree": {"a": (np.int8(1), np.array([True, False]))}})
    assert str(event) == ("Event({'x': 1.0, 'tiny': 1.235e-07, 'big': [0.0, 1.0, 2.0, ..., 97.0, 98.0, 99.0], "
                          "'tree': {'a': (1, [True, False])}})")


def test_events_refuse_a_batch_axis_in_front_and_to_logdict_keeps_spools_step_dtype():
    def f(xs):
        def step(c, x):
            lox.log({"loss": x * 1.0}, step=x)
            return c, None

        return jax.lax.scan(step, 0, xs)[0]

    _, batched = jax.vmap(lox.spool(f))(jnp.arange(6).reshape(2, 3))  # (seeds, events): not a series of events
    with pytest.raises(ValueError, match=r"steps 'step' of series 'loss' differ along the axes after the event axis "
                                         r"\(shape \(2, 3\)\); an event has one step of each name\. .*x\[i\]"):
        list(batched.events())
    _, spooled = lox.spool(f)(jnp.arange(3))
    events = list(spooled.events())
    back = concat([e.to_logdict() for e in events])
    assert back.step["loss"].dtype == spooled.step["loss"].dtype == np.int32
    assert_logs_equal(back, spooled)


def test_the_cores_access_builds_padded_logdicts_and_reads_their_counts():
    mask = np.array([True, True, False])
    logs = padded_logdict(
        {"r": np.array([1.0, 2.0, 0.0]), "s": np.array([5.0])},
        {"step": {"r": np.array([0, 1, 0]), "s": np.array([7])}, "empty": {}},
        {"r": mask, "gone": mask},  # masks and counts of keys the logdict does not hold are left out
        {"r": (np.array(2), np.array(3)), "gone": (0, 0)},
    )
    assert list(logs.steps) == ["step"] and list(logs.valid) == ["r"] and list(event_totals(logs)) == ["r"]
    assert int(logs.count["r"]) == 2 and int(logs.dropped["r"]) == 3 and int(logs.count["s"]) == 1
    assert logs.trim()["r"].tolist() == [1.0, 2.0]
    back = in_key_order(logs, ["s", "r"])
    assert list(back) == ["s", "r"] and list(back.steps["step"]) == ["s", "r"] and int(back.dropped["r"]) == 3
    # spool's interval: every 2nd recorded event of a padded key, a slice of the others
    mask = np.array([True, False, True, True])
    sparse = every(padded_logdict({"r": np.arange(4.0)}, {}, {"r": mask}, {"r": (np.array(3), np.array(0))}), 2)
    assert sparse.valid["r"].tolist() == [True, False, False, True] and int(sparse.count["r"]) == 2
    assert every(trusted({"x": np.arange(5.0)}, {}), 2)["x"].tolist() == [0.0, 2.0, 4.0]


def test_spools_output_form_holds_a_shared_step_array_once_and_gives_the_same_logs_back():
    step = np.array([0, 1])
    logs = trusted({"a": np.array([1.0, 2.0]), "b": np.array([3.0, 4.0])}, {"step": {"a": step, "b": step}})
    shared = shared_once(logs)
    assert len(jax.tree_util.tree_leaves(shared)) == 3  # a, b, and their one step array
    again = jax.tree_util.tree_map(lambda x: x, shared)
    assert type(plain(again)) is lox.logdict
    assert_logs_equal(plain(again), logs)
