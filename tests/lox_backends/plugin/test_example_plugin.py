"""The example third-party plugin of plugins.md (tests/support/plugins/lox-jsonl), installed
like any plugin: found through its entry point, and writing what was logged; and the
backend plugins.md builds method by method, its tracker, and the PNG backend of its Kinds
section, as the page shows them."""

import doctest
import importlib.metadata
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import lox
from lox_backends.logger.logger import Logger
from lox_backends.plugin.registry import registry
from lox_core.logdict import concat

ROOT = pathlib.Path(__file__).resolve().parents[3]
PLUGIN = ROOT / "tests" / "support" / "plugins" / "lox-jsonl"


def read_run(path):
    """A .jsonl file written by the plugin: its run line, and per key the values and steps."""
    lines = [json.loads(line) for line in pathlib.Path(path).read_text(encoding="utf-8").splitlines()]
    run, values, steps = lines[0], {}, {}
    for record in lines[1:]:
        values.setdefault(record["key"], []).append(record["value"])
        steps.setdefault(record["key"], []).append(record["steps"])
    return run, values, steps


# --- a small training loop: linear regression, SGD, several seeds -----------------------------
STEPS, BATCH, FEATURES, EPOCHS = 8, 16, 3, 2


def mse(params, x, y):
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def train(params, xs, ys, start):
    """SGD over `xs`, logging the loss and the weights (an array) at each step."""

    def step(params, batch):
        i, x, y = batch
        loss, grad = jax.value_and_grad(mse)(params, x, y)
        lox.log({"loss": loss, "w": params["w"]}, step=start + i)
        return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grad), None

    params, _ = jax.lax.scan(step, params, (jnp.arange(STEPS), xs, ys))
    return params


def evaluate(params, x, y, step):
    lox.log({"val_loss": mse(params, x, y)}, step=step)
    return params


def init_params(key):
    return {"w": jax.random.normal(key, (FEATURES,)), "b": jnp.zeros(())}


def data(key):
    kx, kv = jax.random.split(key)
    true_w = jnp.array([1.0, -2.0, 0.5])
    xs = jax.random.normal(kx, (EPOCHS, STEPS, BATCH, FEATURES))
    xv = jax.random.normal(kv, (BATCH, FEATURES))
    return xs, xs @ true_w + 0.3, xv, xv @ true_w + 0.3


# --- the tests ---------------------------------------------------------------------------------
def test_the_package_is_installed_and_its_entry_point_found():
    dist = importlib.metadata.distribution("lox-jsonl")
    assert [(ep.group, ep.name, ep.value) for ep in dist.entry_points] == [("lox", "jsonl", "lox_jsonl")]
    (offer,) = registry.offers()["jsonl"]
    assert offer.package == "lox-jsonl" and offer.spec.name == "jsonl"


def test_a_training_loop_over_three_seeds_round_trips(tmp_path):
    logger = lox.loggers.from_config("jsonl:" + str(tmp_path), name="fit")
    keys = jax.random.split(jax.random.key(0), 3)
    states = jax.vmap(lambda k: logger.init(k, lr=0.1))(keys)
    xs, ys, xv, yv = data(jax.random.key(42))
    spooled = jax.jit(jax.vmap(lambda s, p, x, y, start: logger.spool(train, s)(p, x, y, start),
                               in_axes=(0, 0, None, None, None)))
    tapped = jax.vmap(lambda s, p, step: logger.tap(evaluate, s)(p, xv, yv, step), in_axes=(0, 0, None))
    params = jax.vmap(init_params)(keys)
    for epoch in range(EPOCHS):
        params = spooled(states, params, xs[epoch], ys[epoch], epoch * STEPS)
        tapped(states, params, (epoch + 1) * STEPS)
    logger.finish(states)

    runs = logger.runs()
    assert sorted(os.listdir(tmp_path)) == sorted(f"{r.run_id}.jsonl" for r in runs)
    for seed, info in enumerate(runs):
        # The same training, computed independently with lox.spool, without vmap.
        parts, p = [], init_params(keys[seed])
        for epoch in range(EPOCHS):
            p, logs = lox.spool(train)(p, xs[epoch], ys[epoch], epoch * STEPS)
            parts.append(logs)
            parts.append(lox.spool(evaluate)(p, xv, yv, (epoch + 1) * STEPS)[1])
        expected = concat(parts)

        run, values, steps = read_run(tmp_path / f"{info.run_id}.jsonl")
        assert run == {"run_id": info.run_id, "name": f"fit-{seed}", "group": info.group, "index": seed,
                       "metadata": {"lr": 0.1, "key": jax.random.key_data(keys[seed]).tolist()}}
        assert sorted(values) == sorted(expected)
        for key in expected:
            np.testing.assert_allclose(np.array(values[key]), np.asarray(expected[key]), rtol=1e-5, atol=1e-6)
            assert steps[key] == [{"step": int(s)} for s in expected.step[key]]
        assert np.shape(values["w"]) == (EPOCHS * STEPS, FEATURES)
        assert len(values["val_loss"]) == EPOCHS
    assert len({read_run(tmp_path / f"{r.run_id}.jsonl")[1]["loss"][0] for r in runs}) == 3  # seeds differ


def test_arrays_and_other_dtypes_round_trip_with_their_shape(tmp_path):
    logger = lox.loggers.JsonlLogger(str(tmp_path))  # every backend has a Logger named after it
    state = logger.init(name="arrays")
    grid = np.arange(2 * 2 * 3, dtype=np.float32).reshape(2, 2, 3)  # two events of shape (2, 3)
    logs = lox.logdict(
        {
            "grid": grid,
            "count": np.array([2**40, -5], np.int64),  # 64-bit: stored as bytes, not as a float
            "half": np.array([[1.5, -2.0], [0.25, 8.0]], ml_dtypes.bfloat16),
            "flag": np.array([True, False]),
            "z": np.array([1 + 2j, 3j], np.complex64),
        },
        steps={"step": dict.fromkeys(["grid", "count", "half", "flag", "z"], np.array([0, 1]))},
    )
    logger.log(state, logs)

    def log_grid(x):
        lox.log({"grid": x}, step=2)

    logger.tap(log_grid, state)(jnp.asarray(grid[0] + 100))  # a tapped event
    logger.finish(state)

    (path,) = tmp_path.iterdir()
    run, values, steps = read_run(path)
    assert run["name"] == "arrays"
    assert np.array(values["grid"]).shape == (3, 2, 3)
    assert values["grid"][:2] == grid.tolist() and values["grid"][2] == (grid[0] + 100).tolist()
    assert values["count"] == [2**40, -5]
    assert values["half"] == [[1.5, -2.0], [0.25, 8.0]]
    assert values["flag"] == [1.0, 0.0]  # scalars come from the float64 value column
    assert values["z"] == ["(1+2j)", "3j"]
    assert steps["grid"] == [{"step": 0}, {"step": 1}, {"step": 2}]


def test_a_key_never_becomes_a_path(tmp_path):
    logger = lox.loggers.from_config("jsonl:" + str(tmp_path / "logs"))
    state = logger.init()
    keys = ["../../x", "/tmp/evil", "a/../../b", "..\\y"]
    logger.log(state, lox.logdict({k: np.array([1.0]) for k in keys}, {"step": {k: np.array([0]) for k in keys}}))
    logger.finish(state)
    (run,) = logger.runs()
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert written == ["logs", os.path.join("logs", f"{run.run_id}.jsonl")]
    _, values, _ = read_run(tmp_path / "logs" / f"{run.run_id}.jsonl")
    assert values == {k: [1.0] for k in keys}


def test_arrays_0_writes_scalars_only(tmp_path):
    logger = lox.loggers.from_config(f"jsonl:{tmp_path}?arrays=0")
    assert logger.backends[0].settings == {"arrays": False}
    state = logger.init()
    steps = {"step": {"loss": np.arange(2), "w": np.arange(2)}}
    logger.log(state, lox.logdict({"loss": np.array([0.5, 0.25]), "w": np.ones((2, 3))}, steps))
    logger.finish(state)
    (path,) = tmp_path.iterdir()
    _, values, _ = read_run(path)
    assert values == {"loss": [0.5, 0.25]}


def test_options_are_checked_when_the_logger_is_created(tmp_path):
    listed = ("arrays (write array-valued events too (0: scalars only): 1, true, yes, on or 0, false, no, off; "
              "default 1)")
    with pytest.raises(ValueError, match=re.escape(f"the jsonl backend has no option 'indent'; its options are: "
                                                   f"{listed}. E.g. 'jsonl:logs?arrays=0'.")):
        lox.loggers.from_config(f"jsonl:{tmp_path}?indent=2")
    with pytest.raises(ValueError, match=re.escape("the jsonl backend has no option 'array'; did you mean 'arrays'?")):
        lox.loggers.from_config(f"jsonl:{tmp_path}?array=0")
    with pytest.raises(ValueError, match=re.escape("the jsonl backend's option arrays='some' is refused: it must be "
                                                   "1, true, yes, on or 0, false, no, off (write array-valued events "
                                                   "too (0: scalars only)). E.g. 'jsonl:logs?arrays=0'.")):
        lox.loggers.from_config(f"jsonl:{tmp_path}?arrays=some")
    assert not any(tmp_path.iterdir())  # refused before anything was written


def fenced_blocks(text):
    """``{title: code}`` for the fenced blocks of a Markdown text opened with ```lang title="..."."""
    pattern = re.compile(r'^```\w+ title="([^"]+)"\n(.*?)^```$', re.S | re.M)
    return {m.group(1): m.group(2) for m in pattern.finditer(text)}


def lines(text):
    return [line.rstrip() for line in text.rstrip().splitlines()]


@pytest.mark.parametrize("name", ["pyproject.toml", "lox_jsonl.py"])
def test_the_tutorial_shows_the_package_exactly(name):
    blocks = fenced_blocks((ROOT / "plugins.md").read_text(encoding="utf-8"))
    assert f"lox-jsonl/{name}" in blocks, f"plugins.md has no block titled lox-jsonl/{name}"
    assert lines(blocks[f"lox-jsonl/{name}"]) == lines((PLUGIN / name).read_text(encoding="utf-8"))


def test_lox_backends_lists_the_plugin_with_its_package():
    env = {k: v for k, v in os.environ.items() if k != "LOX_DISABLE_PLUGIN_AUTOLOAD"}

    def backends(**extra):
        command = [sys.executable, "-m", "lox_backends.tools.cli", "backends"]
        out = subprocess.run(command, capture_output=True, text=True, check=True, env={**env, **extra}).stdout
        return {line.split()[0]: line.split()[1:3] for line in out.splitlines()[1:]}

    assert backends()["jsonl"] == ["lox-jsonl", "yes"]
    assert "jsonl" not in backends(LOX_DISABLE_PLUGIN_AUTOLOAD="1")  # only lox's own


# --- the backend of "The backend: hooks.Backend", and the tracker, as plugins.md shows them -------
def section(text, title):
    """The part of a Markdown text under the ``## `` heading that starts with `title`."""
    start = text.index(f"\n## {title}")
    return text[start : text.index("\n## ", start + 1)]


def code_blocks(text, lang):
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, re.S | re.M)


def test_the_backend_plugins_md_builds_method_by_method_runs(tmp_path):
    text = section((ROOT / "plugins.md").read_text(encoding="utf-8"), "The backend")
    header, *methods = code_blocks(text, "python")
    assert header.rstrip().endswith("    ...") and all(m.startswith("    ") for m in methods)
    namespace = {"__name__": "plugins_md"}
    exec(header.replace("    ...\n", "\n".join(methods)), namespace)  # noqa: S102 - the page's own code
    backend_class = namespace["MyBackend"]

    # What the page shows of its options.
    (shown,) = code_blocks(text, "pycon")
    test = doctest.DocTestParser().get_doctest(shown, {"MyBackend": backend_class}, "plugins.md", "plugins.md", 0)
    result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS).run(test)
    assert (result.failed, result.attempted) == (0, 2), "plugins.md shows other messages than MyBackend gives"

    # It writes the scalars of every n-th table to a file per run.
    backend = backend_class(str(tmp_path), {"every": "2"})
    assert backend.settings == {"every": 2}
    logger = Logger([backend])
    state = logger.init(name="mine", lr=0.5)
    for step in range(4):
        logs = lox.logdict({"loss": np.array([step / 2]), "w": np.ones((1, 2))}, {"step": {"loss": np.array([step]),
                                                                                           "w": np.array([step])}})
        logger.log(state, logs)
        logger.flush()  # one table each
    logger.finish(state)
    (run,) = logger.runs()
    lines = (tmp_path / f"{run.run_id}.txt").read_text().splitlines()
    assert lines[0] == f"{run.name}: run 0 of group {run.group}, config {run.metadata}" and run.metadata["lr"] == 0.5
    assert lines[1:] == ["loss {'step': 1} 0.5", "loss {'step': 3} 1.5"]
    with pytest.raises(ValueError, match=r"two mine backends write to"):
        Logger([backend_class(str(tmp_path)), backend_class(str(tmp_path))])


def test_the_tracker_plugins_md_shows_is_a_valid_backend_class():
    text = section((ROOT / "plugins.md").read_text(encoding="utf-8"), "A plugin for a tracker")
    (code,) = code_blocks(text, "python")
    namespace = {"__name__": "plugins_md"}
    exec(code, namespace)  # noqa: S102 - defines the class: OPTIONS and EXAMPLE are checked there
    tracker = namespace["MyTracker"]
    assert set(tracker.OPTIONS) == {"project", "local"} and tracker.EXAMPLE.startswith(f"{tracker.tracker}:")


# --- the plugin of "Kinds": each image event as a PNG file, as plugins.md shows it ------------------
def test_the_kinds_plugin_writes_each_image_event_as_the_png_of_its_grid(tmp_path, monkeypatch):
    """plugins.md, section Kinds: the backend and its use run as shown, and write
    what the page shows: a PNG per image event (the grid of its batch, decoded
    back to the logged pixels), and an index naming its key and steps."""
    from PIL import Image

    monkeypatch.chdir(tmp_path)
    text = section((ROOT / "plugins.md").read_text(encoding="utf-8"), "Kinds")
    backend, use = code_blocks(text, "python")
    namespace = {"__name__": "plugins_md"}
    exec(backend, namespace)  # noqa: S102 - the page's own code
    spec, = namespace["lox_backends"]()
    assert spec.name == "png" and spec.backend is namespace["PngBackend"]
    exec(use, namespace)  # noqa: S102

    (run,) = namespace["logger"].runs()
    folder = tmp_path / "pngs" / run.run_id
    assert sorted(p.name for p in folder.iterdir()) == ["1.png", "2.png", "3.png", "images.jsonl"]
    (shown,) = code_blocks(text, "console")
    shown_index = [line for line in shown.splitlines() if line.startswith("{")]
    assert (folder / "images.jsonl").read_text(encoding="utf-8").splitlines() == shown_index
    for i in range(3):
        logged = np.asarray(jax.random.uniform(jax.random.key(i), (4, 8, 8, 1)))[..., 0]  # what `sample` logs
        by_hand = np.zeros((17, 17), np.uint8)  # 2 x 2 images of 8 x 8, 1-pixel black gaps
        for n, (r, c) in enumerate([(0, 0), (0, 9), (9, 0), (9, 9)]):
            by_hand[r : r + 8, c : c + 8] = np.floor(logged[n] * 255 + 0.5)
        with Image.open(folder / f"{i + 1}.png") as image:
            assert image.mode == "L" and image.size == (17, 17)
            np.testing.assert_array_equal(np.asarray(image), by_hand)
    # The scalar of the same calls is not an image: no file, no line.
    assert all(json.loads(line)["key"] == "samples" for line in shown_index)
