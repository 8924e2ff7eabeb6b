"""The console backend: plain lines off a terminal, a live table on one, both rate-limited."""

import io
import re
import time

import numpy as np
import pytest

import lox
from lox_backends.console import ConsoleBackend, plain_line
from lox_backends.plugin import hooks
from lox_core import schema
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
                            "are: interval (seconds between plain lines per run: a number >= 0; default 1); every "
                            "(a plain line also at every step that is a multiple of this: an integer >= 1); total "),
    ("console?every=0", "the console backend's option every='0' is refused: it must be an integer >= 1"),
    ("console?total=10.5", "the console backend's option total='10.5' is refused: it must be an integer >= 1"),
    ("console:out.txt", "the console backend takes no target (got 'console:out.txt'). E.g. 'console?interval=5'."),
])
def test_bad_options_are_refused_when_the_logger_is_created(spec, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        lox.loggers.from_config(spec)


def test_options_are_typed():
    backend = ConsoleBackend(None, {"interval": "2.5", "plain": "Yes"})
    assert backend.interval == 2.5 and backend.live_table is False
    assert ConsoleBackend(None, {}).interval == 1.0


def test_every_nth_step_gets_a_line_however_fast_the_run():
    # A short run: 2,000 steps in a few spooled batches, faster than one line per interval.
    backend = ConsoleBackend(None, {"interval": "3600", "every": "500"})
    backend.stream = io.StringIO()
    run = hooks.RunInfo("r", "short", "g")
    backend.open_run(run)
    for start in range(0, 2000, 300):  # batches that do not line up with the multiples of 500
        steps = np.arange(start, min(start + 300, 2000))
        backend.write(run, schema.order_by_step(batch(steps, steps / 10.0)))  # as a Logger hands it over
    backend.close_run(run)
    assert backend.stream.getvalue().splitlines() == [
        "[short] [step=0] loss=0 w=[array]",  # the first, at step 0, a multiple of 500
        "[short] [step=500] loss=50 w=[array]",
        "[short] [step=1000] loss=100 w=[array]",
        "[short] [step=1500] loss=150 w=[array]",
        "[short] [step=1999] loss=199.9 w=[array]",  # the last, at close
    ]


def test_every_nth_step_gets_a_line_also_when_other_keys_lack_the_step():
    backend = ConsoleBackend(None, {"interval": "3600", "every": "10"})
    backend.stream = io.StringIO()
    run = hooks.RunInfo("r", "mixed", "g")
    backend.open_run(run)
    steps = np.arange(25)
    logs = lox.logdict({"loss": steps.astype(np.float32), "val_loss": np.array([0.5], np.float32)},
                       {"step": {"loss": steps}, "epoch": {"val_loss": np.array([0])}})
    backend.write(run, schema.order_by_step(to_arrow(logs, run="r")))  # val_loss's row has no `step`: last
    backend.close_run(run)
    assert backend.stream.getvalue().splitlines() == [
        "[mixed] [step=0] loss=0", "[mixed] [step=10] loss=10", "[mixed] [step=20] loss=20",
        "[mixed] [step=24] loss=24 [epoch=0] val_loss=0.5",
    ]


def test_a_terminal_shows_each_runs_rate_and_with_a_total_its_progress_and_time_left():
    backend = ConsoleBackend(None, {"total": "400"})
    backend.stream = io.StringIO()
    backend.live_table = True
    run = hooks.RunInfo("r", "seed-0", "g")
    backend.open_run(run)
    backend.write(run, batch(np.arange(0, 100), np.ones(100)))
    time.sleep(0.2)
    backend.write(run, batch(np.arange(100, 200), np.ones(100)))
    backend._refresh_live()
    backend.close()
    shown = backend.stream.getvalue()
    assert "steps/s" in shown and "progress" in shown
    rate = float(re.search(r"([\d,]+)/s", shown).group(1).replace(",", ""))
    assert 0 < rate <= 100 / 0.2  # 100 steps in at least 0.2 s
    left = re.search(r"50% (\d+):(\d\d) left", shown)  # step 199 of 400: half done
    assert left is not None and int(left.group(1)) * 60 + int(left.group(2)) >= round(200 / rate) - 1


def kinds_batch(run="r"):
    """Steps 0 and 1 of a loss, a batch of images, a histogram, a clip, a text and a table of text."""
    strings = np.dtypes.StringDType()
    counts = np.array([[1, 2], [400, 600]], np.int32)
    edges = np.array([[0.0, 0.5, 1.0], [-3.25, 0.0, 3.5]], np.float32)
    logs = lox.logdict(
        {"loss": np.array([2.0, 1.0]), "img": lox.image(np.zeros((2, 4, 28, 28, 1), np.uint8)),
         "h": lox.histogram(np.zeros(1), bins=2).replace_arrays([counts, edges]),
         "clip": lox.audio(np.zeros((2, 16000), np.float32), rate=16000),
         "note": np.array(["first", "a  long\nnote " + "x" * 80], strings),
         "tab": np.array([[["a", "b", "c"], ["d", "e", "f"]]] * 2, strings)},
        {"step": {k: np.array([0, 1]) for k in ("loss", "img", "h", "clip", "note", "tab")}},
    )
    return schema.order_by_step(to_arrow(logs, run=run))


def test_kinds_show_their_latest_event_in_a_few_words(monkeypatch):
    backend = ConsoleBackend(None, {"interval": "0"})
    backend.stream = io.StringIO()
    run = hooks.RunInfo("r", "media", "g")
    backend.open_run(run)
    backend.write(run, kinds_batch())
    note = "a long note " + "x" * 47 + "…"  # one line, 60 characters
    assert backend.stream.getvalue().splitlines() == [
        f"[media] [step=1] loss=1 img=image uint8[4, 28, 28, 1] h=histogram of 1000 in [-3.25, 3.5] "
        f"clip=audio float32[16000] at 16000 Hz note='{note}' tab=text[2, 3]"
    ]
    monkeypatch.setenv("COLUMNS", "400")  # the live table's width: no cell wrapped
    live = ConsoleBackend(None, {"interval": "0"})
    live.stream = io.StringIO()
    live.live_table = True
    live.open_run(run)
    live.write(run, kinds_batch())
    live.close()
    shown = live.stream.getvalue()
    for text in ("image uint8[4, 28, 28, 1]", "histogram of 1000", "text[2, 3]", "'a long note"):
        assert text in shown
