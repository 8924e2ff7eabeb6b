"""The `lox` command: demo, plot, backends, runs (the table of runs), sync's errors, --version, help
(`lox runs --short`, the earlier listing, and `lox sync --timeout`: test_tracker_status.py,
test_sync_timeout.py).

Covers lox_backends/tools/demo.py and lox_backends/tools/plot.py through the command."""

import importlib.metadata
import os
import subprocess
import sys

import numpy as np
import pytest

import lox
from lox_backends.runstore import reader as lox_store
from lox_backends.tools.cli import main
from lox_backends.tools.plot import plot_figure
from lox_core.logdict import NO_STEP

LOX = os.path.join(os.path.dirname(sys.executable), "lox")  # the installed console script


def run(*args, cwd=None):
    result = subprocess.run(
        [LOX, *args], capture_output=True, text=True, cwd=cwd, env=dict(os.environ, LOX_DEFAULT="off")
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def is_png(path) -> bool:
    with open(path, "rb") as f:
        return f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_demo_trains_seeds_saves_runs_and_plots(tmp_path):
    out = run("demo", "--dir", "runs", "--seeds", "3", "--epochs", "2", "--steps", "25", cwd=tmp_path)
    runs = lox.load(tmp_path / "runs")
    assert len(runs) == 3
    for logs in runs.values():
        assert logs["loss"].shape == (50,) and logs.step["loss"].tolist() == list(range(50))
        assert logs["val_loss"].shape == (2,) and logs.step["val_loss"].tolist() == [25, 50]
        assert np.all(np.isfinite(logs["loss"]))
    # Different seeds, different runs.
    assert len({float(logs["loss"][0]) for logs in runs.values()}) == 3
    assert f"3 runs (3 seeds) saved under {tmp_path / 'runs'}" in out
    assert is_png(tmp_path / "runs" / "loss.png")
    assert "[demo-0]" in out  # the console backend's lines


def test_plot_writes_a_png_per_key_and_names_missing_keys(tmp_path):
    logger = lox.loggers.SaveLogger(tmp_path / "runs")
    state = logger.init(name="p")
    logger.log(state, lox.logdict({"loss": np.array([3.0, 2.0, 1.0])}, {"step": {"loss": np.array([0, 1, 2])}}))
    logger.finish(state)
    out = run("plot", str(tmp_path / "runs"), "--key", "loss", "-o", str(tmp_path / "loss.png"))
    assert out.strip() == str(tmp_path / "loss.png") and is_png(tmp_path / "loss.png")
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if (p / "_run.json").exists()]
    assert is_png(run(*["plot", str(run_dir)]).strip())  # one run's folder; default output in it
    failed = subprocess.run([LOX, "plot", str(tmp_path / "runs"), "--key", "acc"], capture_output=True, text=True)
    assert failed.returncode != 0 and "no run under" in failed.stderr
    assert "logged 'acc'; the keys logged are: loss" in failed.stderr


def test_backends_lists_name_package_and_status():
    out = run("backends")
    lines = out.splitlines()
    assert lines[0].split() == ["backend", "package", "installed", "description"]
    rows = {line.split()[0]: line.split()[1:3] for line in lines[1:]}
    for name in ("console", "memory", "parquet"):
        assert rows[name] == ["jax-lox", "yes"]


# --- lox --version, bare lox, help texts ------------------------------------------------------------

def cli(capsys, *args) -> tuple[int, str, str]:
    """`lox ARGS` in this process, as a user runs it: (exit status, stdout, stderr)."""
    try:
        status = main(list(args))
    except SystemExit as exit:
        status = exit.code if isinstance(exit.code, int) else 1
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_version_is_the_installed_distributions(capsys):
    expected = f"lox {importlib.metadata.version('jax-lox')}\n"
    assert cli(capsys, "--version") == (0, expected, "")
    assert run("--version") == expected  # the console script


def test_bare_lox_prints_help(capsys):
    status, out, err = cli(capsys)
    assert status == 0 and err == ""
    assert out.startswith("usage: lox [-h] [--version] COMMAND ...")
    for command in ("demo", "plot", "backends", "runs", "sync"):
        assert f"\n    {command} " in out


def help_text(capsys, monkeypatch, command: str) -> str:
    """`lox COMMAND --help`, its whitespace collapsed (argparse wraps at the terminal's width)."""
    monkeypatch.setenv("COLUMNS", "200")
    status, out, _ = cli(capsys, command, "--help")
    assert status == 0
    return " ".join(out.split())


def test_demo_help_describes_the_demo_and_its_defaults(capsys, monkeypatch):
    text = help_text(capsys, monkeypatch, "demo")
    assert "Train a two-layer network on y = sin(3x) with minibatch SGD, one run per seed" in text
    assert "--dir DIR where the runs are saved (default: lox-runs)" in text
    assert "--seeds SEEDS how many seeds (runs) are trained side by side (default: 4)" in text
    assert "--epochs EPOCHS training epochs (default: 20)" in text
    assert "--steps STEPS SGD steps per epoch (default: 100)" in text


def test_plot_help_says_the_defaults(capsys, monkeypatch):
    text = help_text(capsys, monkeypatch, "plot")
    assert "--key KEY a key to plot (default: loss; repeat for several, e.g. --key loss --key val_loss)" in text
    assert "--smooth WEIGHT smooth each curve with an exponential moving average of this weight, from 0 (the " \
           "default: none) to below 1" in text
    assert "--title TITLE the plot's title (default: none)" in text
    assert "--step STEP the step name on the x axis (default: step;" in text
    assert "--run RUN plot only this run: its name, GROUP/NAME or run id (repeat for several)" in text
    assert "--group GROUP plot only the runs of this group (repeat for several)" in text


# --- backends whose extra is missing ----------------------------------------------------------------

def without(*modules: str, argv: list[str]) -> subprocess.CompletedProcess:
    """`lox ARGV` in a fresh Python where `modules` cannot be imported
    (``sys.modules[name] = None``, Python's way to make an import fail)."""
    code = (
        "import sys\n"
        f"for name in {list(modules)!r}:\n"
        "    sys.modules[name] = None\n"
        "from lox_backends.tools.cli import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, LOX_DEFAULT="off")
    )


def save_run(folder, name="p", values=(3.0, 2.0, 1.0), **steps):
    logger = lox.loggers.SaveLogger(folder)
    state = logger.init(name=name)
    values = np.asarray(values)
    steps = steps or {"step": np.arange(values.shape[0])}
    logger.log(state, lox.logdict({"loss": values}, {n: {"loss": np.asarray(s)} for n, s in steps.items()}))
    logger.finish(state)
    logger.close()


def test_sync_to_a_tracker_whose_package_is_missing_says_how_to_install_it(tmp_path):
    save_run(tmp_path / "runs")
    result = without("mlflow", argv=["sync", str(tmp_path / "runs"), "--to", "mlflow:http://127.0.0.1:9"])
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "lox sync: error: the lox backend 'mlflow' needs mlflow, which is not installed: "
        "run `pip install 'jax-lox[mlflow]'`.\n"
    )


def test_backends_marks_those_whose_extra_is_missing():
    result = without("mlflow", "wandb", "neptune", argv=["backends"])
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    for name in ("mlflow", "wandb", "neptune"):
        assert f"  no: pip install 'jax-lox[{name}]'  " in rows[name]
    for name in ("console", "parquet", "tensorboard"):
        assert rows[name].split()[1:3] == ["jax-lox", "yes"]


def test_unknown_backend_error_marks_installed_backends_whose_extra_is_missing(capsys, monkeypatch, tmp_path):
    save_run(tmp_path / "runs")
    monkeypatch.setitem(sys.modules, "wandb", None)
    status, out, err = cli(capsys, "sync", str(tmp_path / "runs"), "--to", "wandbb")
    assert status == 2
    assert "unknown lox backend 'wandbb' in 'wandbb'. Did you mean 'wandb'? Installed backends: console, " in err
    # (Backends registered by other tests may follow.)
    assert ", tensorboard, wandb (needs: pip install 'jax-lox[wandb]')" in err and "Run `lox backends`" in err
    assert ", mlflow, neptune, " in err  # installed here: not marked


# --- lox plot: steps, labels, choosing runs, arrays -------------------------------------------------

def legend(figure) -> list[str]:
    return [text.get_text() for text in figure.axes[0].get_legend().get_texts()]


def test_plot_refuses_a_step_no_run_logged(capsys, tmp_path):
    save_run(tmp_path / "runs")
    status, out, err = cli(capsys, "plot", str(tmp_path / "runs"), "--step", "epoch")
    assert (status, out) == (2, "")
    assert err == (
        f"lox plot: error: no run under {str(tmp_path / 'runs')!r} logged 'loss' with the step 'epoch'; "
        "'loss' was logged with the step(s): step. Pass one of them as --step.\n"
    )
    assert not (tmp_path / "runs" / "loss.png").exists()


def test_plot_names_the_runs_that_lack_the_step(tmp_path):
    save_run(tmp_path / "runs", name="with-epoch", epoch=[0, 1, 2])
    save_run(tmp_path / "runs", name="without")
    with pytest.raises(LookupError, match=r"^the runs lox-[0-9a-f-]+/without under .* logged 'loss' with the "
                       r"step 'epoch'; 'loss' was logged with the step\(s\): epoch, step\. Pass one of them as "
                       r"--step, or choose runs with --run/--group\.$"):
        plot_figure(tmp_path / "runs", step="epoch")
    figure = plot_figure(tmp_path / "runs", step="epoch", runs=["with-epoch"])
    assert legend(figure) == ["with-epoch"] and figure.axes[0].get_xlabel() == "epoch"


def test_plot_leaves_out_events_without_the_step(tmp_path):
    save_run(tmp_path / "runs", values=[3.0, 2.0, 1.0], epoch=[NO_STEP, 5, 6])
    (line,) = plot_figure(tmp_path / "runs", step="epoch").axes[0].get_lines()
    assert line.get_xdata().tolist() == [5, 6] and line.get_ydata().tolist() == [2.0, 1.0]


def test_plot_labels_runs_of_two_groups_uniquely_and_chooses_runs_and_groups(capsys, tmp_path):
    for group in range(2):  # two demos in one folder: two groups of runs named seed-0, seed-1
        logger = lox.loggers.SaveLogger(tmp_path / "runs")
        for seed in range(2):
            state = logger.init(name=f"seed-{seed}")
            logger.log(state, lox.logdict({"loss": np.array([3.0, 2.0]) + group + seed},
                                          {"step": {"loss": np.array([0, 1])}}))
            logger.finish(state)
        logger.close()
    groups = list(dict.fromkeys(r["group"] for r in lox_store.runs(tmp_path / "runs")))
    labels = legend(plot_figure(tmp_path / "runs"))
    assert labels == [f"{g}/seed-{s}" for g in groups for s in range(2)]
    assert legend(plot_figure(tmp_path / "runs", groups=[groups[1]])) == ["seed-0", "seed-1"]
    assert legend(plot_figure(tmp_path / "runs", runs=["seed-1"])) == [f"{g}/seed-1" for g in groups]
    assert legend(plot_figure(tmp_path / "runs", runs=[f"{groups[0]}/seed-0", "nope"])) == ["seed-0"]
    # The command line: --group and --run, repeatable.
    output = tmp_path / "chosen.png"
    status, out, err = cli(capsys, "plot", str(tmp_path / "runs"), "--group", groups[0], "--run", "seed-1",
                           "-o", str(output))
    assert (status, out, err) == (0, f"{output}\n", "") and is_png(output)
    status, out, err = cli(capsys, "plot", str(tmp_path / "runs"), "--run", "seed-7")
    assert status == 2 and err == (
        f"lox plot: error: no run under {str(tmp_path / 'runs')!r} matches --run seed-7; the runs there "
        f"(GROUP/NAME) are: {', '.join(f'{g}/seed-{s}' for g in groups for s in range(2))}. --run takes a "
        "name, GROUP/NAME or run id; --group a group.\n"
    )


def test_plot_says_when_it_averages_an_array_valued_key(tmp_path):
    logger = lox.loggers.SaveLogger(tmp_path / "runs")
    state = logger.init(name="arrays")
    logger.log(state, lox.logdict({"loss": np.arange(12.0).reshape(3, 2, 2)}, {"step": {"loss": np.arange(3)}}))
    logger.finish(state)
    logger.close()
    figure = plot_figure(tmp_path / "runs")
    assert legend(figure) == ["arrays (mean of 2×2 values)"]
    assert figure.axes[0].get_ylabel() == "loss (mean per event)"
    assert figure.axes[0].get_lines()[0].get_ydata().tolist() == [1.5, 5.5, 9.5]


def test_plot_draws_several_keys_smoothed_with_the_raw_curves_faint_and_a_title(capsys, tmp_path):
    rng = np.random.default_rng(0)
    loss = np.exp(-np.arange(200) / 50) + 0.05 * rng.random(200)
    logger = lox.loggers.SaveLogger(tmp_path / "runs")
    for seed in range(2):
        state = logger.init(name=f"seed-{seed}")
        logger.log(state, lox.logdict({"loss": loss + seed}, {"step": {"loss": np.arange(200)}}))
        logger.log(state, lox.logdict({"val_loss": np.array([0.5, 0.25]) + seed}, {"step": {"val_loss": [100, 200]}}))
        logger.finish(state)
    logger.close()
    figure = plot_figure(tmp_path / "runs", key=["loss", "val_loss"], smoothing=0.6, title="two keys")
    axes = figure.axes[0]
    assert axes.get_title() == "two keys" and axes.get_ylabel() == "loss, val_loss"
    assert legend(figure) == ["seed-0 loss", "seed-1 loss", "seed-0 val_loss", "seed-1 val_loss"]
    lines = axes.get_lines()
    raw, smooth = lines[0], lines[1]  # seed-0's loss: the raw curve faint, then the smoothed one
    assert raw.get_alpha() == 0.25 and smooth.get_alpha() is None and raw.get_color() == smooth.get_color()
    np.testing.assert_array_equal(raw.get_ydata(), loss)
    average, by_hand = 0.0, []
    for i, value in enumerate(loss):  # TensorBoard's smoothing: a debiased exponential moving average
        average = 0.6 * average + 0.4 * value
        by_hand.append(average / (1 - 0.6 ** (i + 1)))
    np.testing.assert_allclose(smooth.get_ydata(), by_hand, rtol=1e-12)
    # Two points per run: drawn raw, marked, dashed, in the run's colour.
    sparse = [line for line in lines if line.get_label() == "seed-1 val_loss"][0]
    assert sparse.get_ydata().tolist() == [1.5, 1.25] and sparse.get_marker() == "o"
    assert sparse.get_linestyle() == "--" and sparse.get_color() == lines[2].get_color()  # seed-1's loss colour
    with pytest.raises(ValueError, match=r"the smoothing must be from 0 \(none\) to below 1, got 1\.0\."):
        plot_figure(tmp_path / "runs", smoothing=1.0)
    # A NaN is shown as it is and left out of the average, as TensorBoard does.
    logger_with_nan = lox.loggers.SaveLogger(tmp_path / "nan")
    state = logger_with_nan.init(name="nan")
    logger_with_nan.log(state, lox.logdict({"loss": np.r_[loss[:60], np.nan, loss[60:]]},
                                           {"step": {"loss": np.arange(201)}}))
    logger_with_nan.finish(state)
    logger_with_nan.close()
    smooth = plot_figure(tmp_path / "nan", smoothing=0.6).axes[0].get_lines()[1].get_ydata()
    assert np.isnan(smooth[60]) and np.isfinite(np.delete(smooth, 60)).all()
    np.testing.assert_allclose(np.delete(smooth, 60), by_hand, rtol=1e-12)
    # Keys plotted against the event index and against a step do not share an axis.
    with pytest.raises(LookupError, match=r"^'acc' was logged without any step and 'loss' with 'step': one x axis "
                                          r"cannot show both\. Plot them apart, or log every key with `step=`\.$"):
        figure_with_acc(tmp_path)
    output = tmp_path / "both.png"
    status, out, err = cli(capsys, "plot", str(tmp_path / "runs"), "--key", "loss", "--key", "val_loss",
                           "--smooth", "0.6", "--title", "demo", "-o", str(output))
    assert (status, out, err) == (0, f"{output}\n", "") and is_png(output)


def figure_with_acc(tmp_path):
    logger = lox.loggers.SaveLogger(tmp_path / "acc")
    state = logger.init(name="acc")
    logger.log(state, lox.logdict({"acc": np.array([0.5, 0.7]), "loss": np.array([1.0, 0.5])},
                                  {"step": {"loss": np.array([0, 10])}}))
    logger.finish(state)
    logger.close()
    return plot_figure(tmp_path / "acc", key=["loss", "acc"])


# --- lox runs: the table of runs ------------------------------------------------------------------
def sweep(folder):
    """Three finished runs of a learning rate each; their best losses by name, by hand."""
    logger = lox.loggers.from_config(f"parquet:{folder}")
    best = {}
    for lr in (0.1, 0.01, 1.0):
        state = logger.init(name=f"lr{lr}", lr=lr, config={"opt": "sgd", "note": "n" * 40})
        loss = np.array([1.0, 0.5 * lr, np.nan])
        logger.log(state, lox.logdict({"loss": loss}, steps={"step": {"loss": np.arange(3)}}))
        logger.summary(state, {"best_acc": 2 * lr})
        logger.finish(state)
        best[f"lr{lr}"] = float(np.nanmin(loss))
    logger.close()
    return best


def test_lox_runs_prints_the_table_name_id_status_start_duration_first(tmp_path, capsys, monkeypatch):
    best = sweep(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")
    status, out, err = cli(capsys, "runs", str(tmp_path))
    assert (status, err) == (0, "")
    header, *lines = out.splitlines()
    assert header.split() == ["name", "run_id", "status", "start", "(UTC)", "duration", "(s)", "lr", "config.opt",
                              "config.note", "loss.last", "loss.min", "loss.max", "loss.count", "best_acc", "group",
                              "end"]
    rows = [line.split() for line in lines]
    ids = {run["name"]: run["run_id"] for run in lox.runs(tmp_path).to_pylist()}
    assert [row[:3] for row in rows] == [[name, ids[name], "finished"] for name in ("lr0.1", "lr0.01", "lr1.0")]
    assert [float(row[10]) for row in rows] == list(best.values())  # loss.min
    assert all(row[8] == "n" * 21 + "..." for row in rows)  # a long value is cut


def test_lox_runs_chooses_sorts_and_names_the_columns_left_out(tmp_path, capsys, monkeypatch):
    best = sweep(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")
    status, out, _ = cli(capsys, "runs", str(tmp_path), "--where", "lr < 0.5", "--sort=-loss.min", "--columns",
                         "lr,loss.min,opt")
    assert status == 0
    ids = {run["name"]: run["run_id"] for run in lox.runs(tmp_path).to_pylist()}
    assert [line.split() for line in out.splitlines()[1:]] == [
        [name, ids[name], lr, f"{best[name]:.6g}", "sgd"] for name, lr in (("lr0.1", "0.1"), ("lr0.01", "0.01"))]
    assert out.splitlines()[0].split() == ["name", "run_id", "lr", "loss.min", "config.opt"]
    monkeypatch.setenv("COLUMNS", "60")
    out = cli(capsys, "runs", str(tmp_path), "--status", "finished")[1]
    assert out.splitlines()[0].split()[:3] == ["name", "run_id", "status"]
    assert out.splitlines()[-1].startswith("(12 more columns: start, duration, lr, config.opt")
    monkeypatch.setenv("COLUMNS", "400")
    assert cli(capsys, "runs", str(tmp_path), "--status", "killed")[1].splitlines()[1:] == []  # a header only


def test_lox_runs_writes_csv_and_json_for_scripts(tmp_path, capsys):
    import json

    import pyarrow.csv

    best = sweep(tmp_path)
    table = lox.runs(tmp_path)
    out = cli(capsys, "runs", str(tmp_path), "--format", "json")[1]
    rows = json.loads(out)
    assert [row["name"] for row in rows] == list(best) and [row["loss.min"] for row in rows] == list(best.values())
    assert rows[0]["loss.last"] == "NaN" and rows[0]["start"] == table["start"][0].as_py().isoformat()
    out = cli(capsys, "runs", str(tmp_path), "--format", "csv")[1]
    read = pyarrow.csv.read_csv(pyarrow.py_buffer(out.encode()))
    assert read.column_names == table.column_names and read["loss.min"].to_pylist() == list(best.values())


def test_lox_runs_writes_lists_and_dicts_as_json_in_csv_and_after_the_numbers_in_text(tmp_path, capsys, monkeypatch):
    import json

    import jax
    import pyarrow.csv

    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    state = logger.init(jax.random.key(3), layers=[64, 32], lr=0.1)  # the PRNG key: a list column
    logger.spool(lambda: lox.log({"loss": 0.5}, step=0), state)()
    logger.finish(state)
    logger.close()
    key = lox.runs(tmp_path)["key"][0].as_py()
    read = pyarrow.csv.read_csv(pyarrow.py_buffer(cli(capsys, "runs", str(tmp_path), "--format", "csv")[1].encode()))
    assert json.loads(read["key"][0].as_py()) == key and json.loads(read["layers"][0].as_py()) == [64, 32]
    assert read["lr"].to_pylist() == [0.1] and read["loss.min"].to_pylist() == [0.5]
    monkeypatch.setenv("COLUMNS", "400")
    header = cli(capsys, "runs", str(tmp_path))[1].splitlines()[0].split()
    assert header.index("loss.min") < header.index("key") and header.index("lr") < header.index("layers")


@pytest.mark.parametrize(("args", "words"), [
    (["--where", "lrr < 1"], ["lox runs: error: where: the runs have no column 'lrr'", "loss.min"]),
    (["--where", "lr ~ 1"], ["cannot read the condition 'lr ~ 1'"]),
    (["--columns", "lr,nothing"], ["--columns: the runs have no column 'nothing'"]),
    (["--sort", "nothing"], ["sort: the runs have no column 'nothing'"]),
])
def test_lox_runs_names_what_it_cannot_do(tmp_path, capsys, args, words):
    sweep(tmp_path)
    status, out, err = cli(capsys, "runs", str(tmp_path), *args)
    assert status == 2 and out == ""
    for word in words:
        assert word in err
