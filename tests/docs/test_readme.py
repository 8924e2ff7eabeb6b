"""The README's examples run and say what they claim."""

import pathlib
import re

from mlflow.tracking import MlflowClient
from neptune_records import offline_runs as neptune_runs
from wandb_records import offline_runs as wandb_runs

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


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
    assert sum(line.startswith("[step=") for line in printed.splitlines()) == 100  # one tapped event per step
    saved = namespace["saved"]
    assert len(saved) == 8  # one run per seed, each with the logs of its own training
    for run_logs in saved.values():
        assert run_logs["loss"].shape == (100,) and run_logs.step["loss"].tolist() == list(range(100))
        assert abs(float(run_logs["loss"][0]) - float(logs["loss"][0])) < 1e-6


def test_readme_tracker_example_sends_every_seed_to_each_tracker(capsys, wandb_env, neptune_env):
    """The second block, after the first (it uses its `train`), with W&B and
    Neptune offline in the test's folder (the fixtures) and MLflow in SQLite."""
    first, trackers = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[:2]
    namespace: dict = {}
    exec(compile(first, str(README), "exec"), namespace)
    exec(compile(trackers, str(README), "exec"), namespace)

    client = MlflowClient(f"sqlite:///{neptune_env / 'mlflow.db'}")  # the README's, in the test's folder
    runs = client.search_runs([client.get_experiment_by_name("demo").experiment_id])
    losses = sorted(tuple(m.value for m in client.get_metric_history(r.info.run_id, "loss")) for r in runs)
    assert len(losses) == 4 and all(len(loss) == 100 for loss in losses)
    assert len(set(losses)) == 1  # every seed trains the same data from w = 0
    assert losses[0][0] == float(namespace["logs"]["loss"][0])

    offline = wandb_runs(wandb_env["WANDB_DIR"])
    assert len(offline) == 4 and all(run.complete and len(run.history) == 100 for run in offline)
    neptune = neptune_runs(neptune_env / "neptune-data")
    assert len(neptune) == 4
    for (run,) in neptune.values():
        assert [s for s, _ in run.series("metrics/loss")] == list(range(100))
