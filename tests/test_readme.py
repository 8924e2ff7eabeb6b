"""The README's example runs and says what it claims."""

import pathlib
import re

import jax.numpy as jnp

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def test_readme_example_runs(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # it saves runs into ./lox-runs
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    logs = namespace["logs"]
    assert logs["loss"].shape == (100,) and int(logs.step["loss"][-1]) == 99
    assert float(logs["loss"][-1]) < 1e-3 < float(logs["loss"][0])
    assert abs(float(namespace["w"]) - 2.0) < 1e-2
    printed = capsys.readouterr().out
    assert printed.count("logdict(") == 100  # one tapped event per step
    saved = namespace["saved"]
    assert len(saved) == 8  # one run per seed, each with the logs of its own training
    for run_logs in saved.values():
        assert run_logs["loss"].shape == (100,) and run_logs.step["loss"].tolist() == list(range(100))
        assert abs(float(run_logs["loss"][0]) - float(logs["loss"][0])) < 1e-6
