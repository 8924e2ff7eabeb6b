"""The `lox` command: demo, plot, backends."""

import os
import subprocess
import sys

import numpy as np

import lox

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
