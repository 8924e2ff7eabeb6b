"""The console backend: plain lines off a terminal, a live table on one, both rate-limited."""

import io
import re

import numpy as np
import pytest

import lox
from lox_backends import hooks
from lox_backends.console import ConsoleBackend, plain_line
from lox_core.arrow import to_arrow


def batch(steps, loss, run="r"):
    logs = lox.logdict({"loss": np.asarray(loss, np.float32), "w": np.ones((len(steps), 3), np.float32)},
                       {"step": {"loss": np.asarray(steps), "w": np.asarray(steps)}})
    return to_arrow(logs, run=run)


def event(step, **values):
    data = {k: np.asarray([v]) for k, v in values.items()}
    return lox.logdict(data, {"step": dict.fromkeys(data, np.asarray([step]))})


def test_plain_lines_show_the_latest_value_of_each_key_grouped_by_step():
    backend = ConsoleBackend(None, {"interval": "0"})
    backend.stream = io.StringIO()
    run = hooks.RunInfo("r", "train-0", "g")
    backend.open_run(run)
    backend.write(run, batch([0, 1, 2], [3.0, 2.0, 1.5]))
    backend.write(run, event(3, val_loss=0.25).to_arrow(run=run.run_id))
    lines = backend.stream.getvalue().splitlines()
    assert lines == [
        "[train-0] [step=2] loss=1.5 w=[array]",
        "[train-0] [step=2] loss=1.5 w=[array] [step=3] val_loss=0.25",
    ]


def test_plain_lines_are_rate_limited_and_the_last_values_shown_at_close():
    backend = ConsoleBackend(None, {"interval": "3600"})
    backend.stream = io.StringIO()
    run = hooks.RunInfo("r", "fast", "g")
    backend.open_run(run)
    for step in range(100):
        backend.write(run, event(step, loss=float(step)).to_arrow(run=run.run_id))
    assert backend.stream.getvalue().count("\n") == 1  # the first event only, then throttled
    backend.close_run(run)
    assert backend.stream.getvalue().splitlines()[-1] == "[fast] [step=99] loss=99"
    backend.close_run(run)  # nothing new: no repeated line
    assert backend.stream.getvalue().count("\n") == 2


def test_live_table_on_a_terminal_has_a_row_per_run():
    backend = ConsoleBackend(None, {"interval": "0"})
    backend.stream = io.StringIO()
    backend.live_table = True  # what a terminal gets
    runs = [hooks.RunInfo(f"r{i}", f"seed-{i}", "g", i) for i in range(2)]
    for i, run in enumerate(runs):
        backend.open_run(run)
        backend.write(run, batch([0, 1], [1.0 + i, 0.5 + i], run=run.run_id))
    backend.close()
    shown = backend.stream.getvalue()
    for text in ("run", "step", "loss", "seed-0", "seed-1", "0.5", "1.5", "[array]"):
        assert text in shown


def test_plain_line_formats_groups():
    assert plain_line({"a": (1.0, {"step": 1}), "b": (2.0, {"step": 1}), "c": (3.0, {})}) == "[step=1] a=1 b=2 c=3"


def test_close_shows_throttled_values_of_unfinished_runs():
    backend = ConsoleBackend(None, {"interval": "3600"})
    backend.stream = io.StringIO()
    run = hooks.RunInfo("r", "never-finished", "g")
    backend.open_run(run)
    backend.write(run, event(0, loss=1.0).to_arrow(run=run.run_id))
    backend.write(run, event(1, loss=0.5).to_arrow(run=run.run_id))  # throttled
    backend.close()
    assert backend.stream.getvalue().splitlines()[-1] == "[never-finished] [step=1] loss=0.5"


@pytest.mark.parametrize("spec, message", [
    ("console?interval=abc", "the console backend's option interval='abc' is refused: it must be a number >= 0 "
                             "(seconds between plain lines per run)"),
    ("console?interval=-1", "the console backend's option interval='-1' is refused: it must be a number >= 0"),
    ("console?interval=nan", "the console backend's option interval='nan' is refused: it must be a number >= 0"),
    ("console?plain=maybe", "the console backend's option plain='maybe' is refused: it must be 1, true, yes, on "
                            "or 0, false, no, off"),
    ("console?intervall=2", "the console backend has no option 'intervall'; did you mean 'interval'? Its options "
                            "are: interval (seconds between plain lines per run: a number >= 0; default 1); plain "),
    ("console:out.txt", "the console backend takes no target (got 'console:out.txt'). E.g. 'console?interval=5'."),
])
def test_bad_options_are_refused_when_the_logger_is_created(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        lox.loggers.from_config(spec)


def test_options_are_typed():
    backend = ConsoleBackend(None, {"interval": "2.5", "plain": "Yes"})
    assert backend.interval == 2.5 and backend.live_table is False
    assert ConsoleBackend(None, {}).interval == 1.0
