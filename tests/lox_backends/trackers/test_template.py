"""`TrackerBackend`'s sending, with a tracker of the tests' own that is slow but answers:
what the exit flush still sends (the trackers' own tests talk to MLflow, W&B and Neptune)."""

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[3]

SLOW_TRACKER = """
import time, numpy as np, lox
from lox_backends.logger.logger import Logger
from lox_backends.trackers.template import TrackerBackend

class Slow(TrackerBackend):  # answers, but takes 2 s a batch
    tracker = "slow"
    def destination(self):
        return "slow"
    def start_run(self, run, remote):
        return {{"id": run.run_id}}
    def send(self, run, remote, batch):
        time.sleep(2.0)
        print("sent", run.name, flush=True)

logger = Logger([Slow(None, {{"local": {local!r}}})], name="slow")
one = lambda v: lox.logdict({{"a": np.array([v])}}, steps={{"step": {{"a": np.array([0])}}}})
first = logger.init(name="first")
logger.log(first, one(1.0))
logger.finish(first, timeout=0.5)  # times out: the tracker is slow, not down
second = logger.init(name="second")
logger.log(second, one(2.0))
print("exiting", flush=True)  # `second` is left to the exit flush
"""


def test_the_exit_flush_still_sends_to_a_slow_tracker_after_finish_timed_out(tmp_path):
    script = SLOW_TRACKER.format(local=str(tmp_path / "lox-runs"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, text=True,
                            capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert sorted(lines) == ["exiting", "sent first", "sent second"], result.stdout
    assert result.stderr.count("were not sent within 0.5 s") == 1, result.stderr  # finish's, not the exit's


def test_a_tracker_without_example_is_named_by_its_config_name_when_an_option_is_refused():
    """As before `OPTIONS`: a tracker's messages name it by `tracker` (its config name),
    not by its class, when it declares no `EXAMPLE`."""
    import pytest

    from lox_backends.plugin.config import Option
    from lox_backends.trackers.template import TrackerBackend

    class Mine(TrackerBackend):
        tracker = "mine"
        OPTIONS = {"project": Option("the project"), **TrackerBackend.OPTIONS}

    with pytest.raises(ValueError, match=r"^the mine backend has no option 'projet'; did you mean 'project'\?"):
        Mine(None, {"projet": "x"})
