"""Bad input is refused at the call, naming the option or key and what to pass
(issue 27, point 8): Logger options, empty keys, `logger.init`'s key and its
metadata; and float32 metadata is stored as the float32's shortest decimal.

Covers lox_backends/logger/metadata.py (what `logger.init` takes)."""

import json
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import lox
from lox_backends.memory import MemoryBackend
from lox_backends.runstore import reader

# --- Logger options ---------------------------------------------------------------------------
REFUSED_OPTIONS = [
    ({"flush_every": "5"}, TypeError, r"`flush_every` is a number of seconds .* got '5' \(a str\); pass a number, "
                                      r"e\.g\. flush_every=5\.0"),
    ({"flush_every": -1}, ValueError, r"`flush_every` is a finite number of seconds > 0 .* got -1; pass e\.g\. "
                                      r"flush_every=5\.0"),
    ({"flush_every": 0}, ValueError, r"`flush_every` .* got 0;"),
    ({"flush_every": math.nan}, ValueError, r"`flush_every` .* got nan;"),
    ({"flush_every": math.inf}, ValueError, r"`flush_every` .* got inf; pass a large number, e\.g\. flush_every=3600"),
    ({"flush_every": True}, TypeError, r"`flush_every` .* got True \(a bool\)"),
    ({"timeout": -3}, ValueError, r"`timeout` is a finite number of seconds > 0 \(how long `finish`, `flush` and "
                                  r"`close` wait for a slow backend\), got -3; pass e\.g\. timeout=60"),
    ({"timeout": math.nan}, ValueError, r"`timeout` .* got nan;"),
    ({"timeout": math.inf}, ValueError, r"`timeout` .* got inf; pass a large number"),
    ({"timeout": None}, TypeError, r"`timeout` is a number of seconds .* got None \(every wait is bounded\)"),
    ({"timeout": "60"}, TypeError, r"`timeout` .* got '60' \(a str\)"),
    ({"max_pending": True}, TypeError, r"`max_pending` is a number of bytes .* got True \(a bool\); pass an int"),
    ({"max_pending": 1e9}, TypeError, r"`max_pending` .* got 1000000000\.0 \(a float\); pass an int, "
                                      r"e\.g\. max_pending=256 \* 2\*\*20"),
    ({"max_pending": "256MB"}, TypeError, r"`max_pending` .* got '256MB' \(a str\)"),
    ({"max_pending": 0}, ValueError, r"`max_pending` is a number of bytes > 0 .* got 0;"),
    ({"max_pending": -1}, ValueError, r"`max_pending` .* got -1;"),
    ({"on_error": "ignore"}, ValueError, r"`on_error` is 'raise' or 'warn', got 'ignore'"),
    ({"on_error": "RAISE"}, ValueError, r"`on_error` is 'raise' or 'warn', got 'RAISE'"),
    ({"on_error": None}, ValueError, r"`on_error` is 'raise' or 'warn', got None"),
]


@pytest.mark.parametrize(("options", "error", "message"), REFUSED_OPTIONS)
def test_a_bad_logger_option_is_refused_when_the_logger_is_made(options, error, message):
    with pytest.raises(error, match=message):
        lox.loggers.from_config("memory", **options)
    with pytest.raises(error, match=message):
        lox.loggers.Logger([MemoryBackend()], **options)


def test_every_way_of_making_a_logger_checks_its_options(tmp_path):
    with pytest.raises(TypeError, match=r"`flush_every` .* got '5'"):
        lox.loggers.backend_logger("memory", flush_every="5")
    with pytest.raises(ValueError, match=r"`timeout` .* got -3;"):
        lox.loggers.SaveLogger(tmp_path / "runs", timeout=-3)
    with pytest.raises(ValueError, match=r"`on_error` .* got 'skip'"):
        lox.loggers.ConsoleLogger(on_error="skip")
    assert not (tmp_path / "runs").exists()  # refused before anything was written


def test_good_logger_options_are_taken_as_python_numbers():
    logger = lox.loggers.from_config("memory", timeout=np.float32(2.5), flush_every=np.int64(3),
                                     max_pending=np.int64(1024), on_error="warn")
    assert (logger.timeout, logger.max_pending, logger.on_error) == (2.5, 1024, "warn")
    assert type(logger.timeout) is float and type(logger.max_pending) is int
    state = logger.init(name="ok")  # the logger works with them
    logger.log(state, lox.logdict({"x": np.array([1.0])}, {"step": {"x": np.array([0])}}))
    logger.finish(state)
    assert logger.backends[0].logs()["x"].tolist() == [1.0]
    logger.close()


# --- empty keys ---------------------------------------------------------------------------------
EMPTY_KEY = r"a key is empty \(''\): an empty key cannot be a series name .* Give the value a name"


def test_an_empty_key_is_refused_by_lox_log():
    with pytest.raises(ValueError, match=EMPTY_KEY):
        lox.spool(lambda x: lox.log({"": x}))(1.0)
    with pytest.raises(ValueError, match=EMPTY_KEY):
        lox.tap(lambda x: lox.log({"loss": x, "": x}), lambda event: None)(1.0)
    with pytest.raises(ValueError, match=EMPTY_KEY):
        lox.log({"": 1.0})  # outside any transform too


def test_an_empty_dict_key_inside_a_value_is_refused_naming_where_it_is():
    with pytest.raises(ValueError, match=r"key 'm' holds an empty dict key \(m\[''\]\): .* an empty part cannot "
                                         r"name a series \('m/'\)\. Give the dict key a name"):
        lox.spool(lambda x: lox.log({"m": {"": x}}))(1.0)
    with pytest.raises(ValueError, match=r"key 'm' holds an empty dict key \(m\['a'\]\[''\]\): .* \('m/a//0'\)"):
        lox.spool(lambda x: lox.log({"m": {"a": {"": [x]}, "b": x}}))(1.0)


def test_a_logdict_with_an_empty_key_is_refused_when_logged():
    logger = lox.loggers.from_config("memory")
    state = logger.init(name="empty")
    series = np.array([1.0, 2.0])
    empty = lox.logdict({"": series}, {"step": {"": np.array([0, 1])}})
    with pytest.raises(ValueError, match=EMPTY_KEY):
        logger.log(state, empty)
    with pytest.raises(ValueError, match=r"key 'm' holds an empty dict key \(m\[''\]\)"):
        logger.log(state, lox.logdict({"m": {"": series}}))
    with pytest.raises(ValueError, match=EMPTY_KEY):
        logger.spool(lambda x: lox.log({"": x}), state)(1.0)
    with pytest.raises(ValueError, match=EMPTY_KEY):
        logger.tap(lambda x: lox.log({"": x}), state)(1.0)
    logger.finish(state)
    assert logger.backends[0].logs() == {}  # nothing of the refused calls was written


def test_keys_that_are_not_empty_still_log_under_their_names():
    _, logs = lox.spool(lambda x: lox.log({"a": {"b": x, "c": [x]}, "train//loss": x}, prefix="p/"))(1.0)
    assert sorted(set(logs.to_arrow()["key"].to_pylist())) == ["p/a/b", "p/a/c/0", "p/train//loss"]


# --- logger.init's key ------------------------------------------------------------------------
NOT_A_KEY = (r"`logger\.init`'s `key` is a PRNG key or None, got {}; "
             r"pass e\.g\. `logger\.init\(jax\.random\.key\(0\)\)`.* "
             r"one run per seed: `jax\.vmap\(logger\.init\)\(jax\.random\.split\(jax\.random\.key\(0\), 4\)\)`")


@pytest.mark.parametrize(("key", "shown"), [
    ("notakey", r"'notakey' \(a str\)"),
    (0, r"0 \(an int\)"),
    ([0, 0], r"\[0, 0\] \(a list\)"),
    (jnp.arange(2), r"an int32 array of shape \(2,\)"),
    (np.zeros(2, np.float32), r"a float32 array of shape \(2,\)"),
    (np.uint32(7), r"a uint32 array of shape \(\)"),
])
def test_what_is_not_a_prng_key_is_refused_naming_key(key, shown):
    logger = lox.loggers.from_config("memory")
    with pytest.raises(TypeError, match=NOT_A_KEY.format(shown)):
        logger.init(key)
    with pytest.raises(TypeError, match=NOT_A_KEY.format(shown)):
        jax.jit(lambda: logger.init(key))()
    assert logger.runs() == []


def test_several_keys_outside_vmap_are_refused_pointing_at_vmap():
    logger = lox.loggers.from_config("memory")
    keys = jax.random.split(jax.random.key(0), 4)
    vmapped = r"it opens one run per call, .* `jax\.vmap\(logger\.init\)\(keys\)` opens a run per seed"
    with pytest.raises(ValueError, match=r"`logger\.init` got 4 PRNG keys as `key` \(shape \(4,\)\); " + vmapped):
        logger.init(keys)
    with pytest.raises(ValueError, match=r"got 4 PRNG keys as `key` \(shape \(4, 2\)\); " + vmapped):
        logger.init(jax.random.key_data(keys))
    assert logger.runs() == []


def test_every_kind_of_key_opens_runs_with_its_data():
    logger = lox.loggers.from_config("memory")
    key = jax.random.key(3)
    data = jax.random.key_data(key).tolist()
    states = [
        logger.init(key),
        logger.init(jax.random.PRNGKey(3)),
        jax.jit(logger.init)(key),
        jax.jit(logger.init)(jax.random.PRNGKey(3)),
        logger.init(),
        logger.init(None),
    ]
    seeds = jax.random.split(key, 4)
    states.append(jax.vmap(logger.init)(seeds))
    states.append(jax.jit(jax.vmap(logger.init))(jax.random.key_data(seeds)))
    for state in states:
        logger.finish(state)
    seed_data = [k.tolist() for k in jax.random.key_data(seeds)]
    expected = [data] * 4 + [None, None] + seed_data * 2
    assert [run.metadata.get("key") for run in logger.runs()] == expected


# --- logger.init's metadata --------------------------------------------------------------------
JSON_LIKE = (r"Metadata values are None, bool, int, float, str, NumPy or JAX numbers and arrays, and lists, "
             r"tuples and dicts \(with str keys\) of those")


@pytest.mark.parametrize(("metadata", "error", "message"), [
    ({"lr": object()}, TypeError, r"metadata 'lr' is an object, which a run's record \(JSON\) cannot hold\. "
                                  + JSON_LIKE + r": pass it as one of these, e\.g\. str\(value\)\."),
    ({"config": {"opt": {"betas": (0.9, object())}}}, TypeError,
     r"metadata config\['opt'\]\['betas'\]\[1\] is an object"),
    ({"path": [{"dir": __import__("pathlib").Path("/tmp")}]}, TypeError, r"metadata path\[0\]\['dir'\] is a \w*Path"),
    ({"config": {1: 0.5}}, TypeError, r"metadata 'config' has the key 1 \(an int\); the keys of metadata dicts are "
                                      r"str, as in JSON: e\.g\. '1'"),
    ({"z": 1j}, TypeError, r"metadata 'z' is complex \(complex128\), which JSON cannot hold; pass its real and "
                           r"imaginary parts"),
    ({"z": jnp.ones(2, jnp.complex64)}, TypeError, r"metadata 'z' is complex \(complex64\)"),
    ({"k": jax.random.key(0)}, TypeError, r"metadata 'k' is a PRNG key \(key<fry>\); .* Pass the run's key as `key`"),
    ({"when": np.array(["2020-01-01"], "datetime64[D]")}, TypeError,
     r"metadata 'when' is an array of dtype datetime64\[D\], which a run's record \(JSON\) cannot hold"),
    ({"blob": b"abc"}, TypeError, r"metadata 'blob' is a bytes"),
    ({"fn": print}, TypeError, r"metadata 'fn' is a builtin_function_or_method"),
])
def test_metadata_that_json_cannot_hold_is_refused_naming_the_key(metadata, error, message):
    logger = lox.loggers.from_config("memory")
    with pytest.raises(error, match=r"`logger\.init`: " + message):
        logger.init(jax.random.key(0), **metadata)
    with pytest.raises(error, match=message):
        jax.vmap(lambda k: logger.init(k, **metadata))(jax.random.split(jax.random.key(0), 2))
    assert logger.runs() == []


def test_metadata_that_contains_itself_is_refused():
    loop: list = [1]
    loop.append(loop)
    logger = lox.loggers.from_config("memory")
    with pytest.raises(ValueError, match=r"metadata loop\[1\] contains itself; JSON cannot hold it"):
        logger.init(loop=loop)


def test_json_like_metadata_is_stored_as_json_has_it():
    logger = lox.loggers.from_config("memory")
    state = logger.init(
        name="kinds", n=3, flag=True, none=None, text="adam", nested={"betas": (0.9, 0.999), "eps": [1e-8]},
        ints=np.array([1, 2], np.int64), small=np.int8(-3), mask=np.array([True, False]), names=np.array(["a", "b"]),
        exact=np.float64(0.1), nan=float("nan"),
    )
    logger.finish(state)
    (run,) = logger.runs()
    meta = dict(run.metadata)
    assert math.isnan(meta.pop("nan"))
    assert meta == {"name": "kinds", "n": 3, "flag": True, "none": None, "text": "adam",
                    "nested": {"betas": [0.9, 0.999], "eps": [1e-8]}, "ints": [1, 2], "small": -3,
                    "mask": [True, False], "names": ["a", "b"], "exact": 0.1}
    assert type(meta["small"]) is int and type(meta["exact"]) is float


# --- float32 metadata: the float32's shortest decimal -------------------------------------------------
def test_float32_metadata_is_stored_as_its_shortest_decimal(tmp_path):
    logger = lox.loggers.from_config(f"memory,parquet:{tmp_path}")
    state = logger.init(
        name="eager", lr=np.float32(0.6), jax_lr=jnp.float32(0.6), half=np.float16(0.1),
        brain=jnp.asarray(0.6, jnp.bfloat16), betas=np.array([0.9, 0.999], np.float32),
        opt={"eps": jnp.array([1e-8, 3e-7], jnp.float32)}, big=np.float32(1e30), inf=np.float32(np.inf),
    )
    jitted = jax.jit(lambda lr: logger.init(name="jit", lr=lr, opt={"lr": lr}))(jnp.float32(0.7))
    lrs = jnp.array([0.1, 0.2, 0.3], jnp.float32)
    seeds = jax.vmap(lambda key, lr: logger.init(key, name="seed", lr=lr, opt={"lr2": lr * 2}))(
        jax.random.split(jax.random.key(0), 3), lrs)
    for s in (state, jitted, seeds):
        logger.finish(s)
    expected = {
        "eager": {"name": "eager", "lr": 0.6, "jax_lr": 0.6, "half": 0.1, "brain": 0.6, "betas": [0.9, 0.999],
                  "opt": {"eps": [1e-8, 3e-7]}, "big": 1e30, "inf": math.inf},
        "jit": {"name": "jit", "lr": 0.7, "opt": {"lr": 0.7}},
        "seed-0": {"name": "seed", "lr": 0.1, "opt": {"lr2": 0.2}},
        "seed-1": {"name": "seed", "lr": 0.2, "opt": {"lr2": 0.4}},
        "seed-2": {"name": "seed", "lr": 0.3, "opt": {"lr2": 0.6}},
    }
    stored = {run.name: {k: v for k, v in run.metadata.items() if k != "key"} for run in logger.runs()}
    assert stored == expected
    # The parquet backend's _run.json holds the same (infinity as JSON has it: a string).
    expected["eager"]["inf"] = "Infinity"
    on_disk = {r["name"]: {k: v for k, v in r["metadata"].items() if k != "key"} for r in reader.runs(tmp_path)}
    assert on_disk == expected
    (folder,) = [p for p in tmp_path.iterdir() if (p / "_run.json").exists() and p.name.startswith("eager")]
    text = (folder / "_run.json").read_text()
    assert '"lr": 0.6,' in text and "0.6000000238418579" not in text
    assert json.loads(text)["metadata"]["betas"] == [0.9, 0.999]


def test_shortest_decimals_are_numpys_and_the_same_low_precision_floats():
    """float32 and float16 metadata is stored as NumPy shows it (its shortest
    decimal that is the same float); bfloat16, which NumPy's `str` shows to 6
    digits, as the shortest decimal that is the same bfloat16."""
    logger = lox.loggers.from_config("memory")
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.standard_normal(300) * 10.0 ** rng.integers(-12, 12, 300),
                             [0.0, -0.0, 1.0, 3e-45, 65504.0, 2.0**24 + 2]])
    for dtype in (np.float32, np.float16):
        with np.errstate(over="ignore"):
            exact = values.astype(dtype)
        logger.finish(logger.init(v=exact))
        stored = logger.runs()[-1].metadata["v"]
        assert stored == [float(str(x)) for x in exact]  # inf as inf
    exact = values.astype(ml_dtypes.bfloat16)
    logger.finish(logger.init(v=exact, few=np.array([0.6, 0.1, 3.14, -2.5e-3, 1e10], ml_dtypes.bfloat16)))
    stored = logger.runs()[-1].metadata
    assert np.array_equal(np.array(stored["v"]).astype(ml_dtypes.bfloat16), exact)  # the same floats
    assert stored["few"] == [0.6, 0.1, 3.14, -0.0025, 1e10]
