"""`lox_backends/trackers/sending.py`: what the sending thread hands a tracker, with a
tracker of the tests' own that records its calls (the trackers' own tests talk to
MLflow, W&B, Neptune and TensorBoard): every call in order, each batch once; a call
that fails while the error may pass retried with one warning; a batch or a run the
tracker refuses skipped with one warning; a call unanswered too long warned about."""

import re
import time

import numpy as np

import lox
from lox_backends.logger.logger import Logger
from lox_backends.plugin import hooks
from lox_backends.runstore.sent import SentRecord
from lox_backends.trackers import sending
from lox_backends.trackers.sync import local_runs
from lox_backends.trackers.template import TrackerBackend, Unsendable


class Recording(TrackerBackend):
    """Records each call it answers; `failures` maps a method's name to the
    errors its next calls raise, one each; `delays` to seconds its next calls take."""

    tracker = "recording"

    def __init__(self, target=None, options=None):
        super().__init__(target, options)
        self.calls: list[tuple] = []
        self.failures: dict[str, list[Exception]] = {}
        self.delays: dict[str, list[float]] = {}

    def _answer(self, *call) -> None:
        delays = self.delays.get(call[0])
        if delays:
            time.sleep(delays.pop(0))
        failures = self.failures.get(call[0])
        if failures:
            raise failures.pop(0)
        self.calls.append(call)

    def destination(self):
        return "recording"

    def start_run(self, run, remote):
        self._answer("start_run", run.name, remote)
        return {"id": run.run_id}

    def send(self, run, remote, batch):
        self._answer("send", run.name, batch.table.column("value").to_pylist())

    def end_run(self, run, remote):
        self._answer("end_run", run.name, run.status)

    def shutdown(self):
        self._answer("shutdown")


def log_two_batches(tracker, name="a"):
    """A run with two batch files, x = 1.0 then x = 2.0; the Logger closed and every item handled."""
    logger = Logger([tracker], name="sending")
    state = logger.init(name=name)
    for i in range(2):
        logger.log(state, lox.logdict({"x": np.array([float(i + 1)])}, steps={"step": {"x": np.array([i])}}))
        logger.flush()
    logger.finish(state)
    logger.close()
    assert tracker.sender.wait(30)


def ours(recwarn) -> list[str]:
    return [str(w.message) for w in recwarn if str(w.message).startswith("lox: ")]


def test_every_item_reaches_the_tracker_once_in_order_and_is_recorded(tmp_path, recwarn):
    tracker = Recording(None, {"local": str(tmp_path / "runs")})
    log_two_batches(tracker)
    assert tracker.calls == [("start_run", "a", None), ("send", "a", [1.0]), ("send", "a", [2.0]),
                             ("end_run", "a", "finished"), ("shutdown",)]
    (folder,) = local_runs(str(tmp_path / "runs"))
    record = SentRecord(folder, "recording", "recording")
    assert len(record.files) == 2 and record.closed
    assert tracker.sender.unsent() == 0 and tracker.sender.progress() == (2, 5)  # 2 files; 5 items handled
    assert ours(recwarn) == []


def test_a_call_that_may_succeed_later_is_retried_with_one_warning(tmp_path, recwarn, monkeypatch):
    monkeypatch.setattr(sending, "RETRY_FIRST", 0.01)
    tracker = Recording(None, {"local": str(tmp_path / "runs")})
    tracker.failures["send"] = [ConnectionError("down"), ConnectionError("still down")]
    log_two_batches(tracker)
    assert [call for call in tracker.calls if call[0] == "send"] == [("send", "a", [1.0]), ("send", "a", [2.0])]
    assert ours(recwarn) == [
        f"lox: sending to recording failed (ConnectionError: down). lox keeps retrying in the background; "
        f"your logs are safe in {str(tmp_path / 'runs')!r}."
    ]
    assert isinstance(tracker.sender.last_error, ConnectionError)


def test_a_batch_the_tracker_refuses_is_skipped_with_one_warning(tmp_path, recwarn):
    tracker = Recording(None, {"local": str(tmp_path / "runs")})
    tracker.failures["send"] = [Unsendable("no such metric")]
    log_two_batches(tracker)
    assert tracker.calls == [("start_run", "a", None), ("send", "a", [2.0]), ("end_run", "a", "finished"),
                             ("shutdown",)]
    runs = str(tmp_path / "runs")
    (warning,) = ours(recwarn)
    assert re.fullmatch(
        rf"lox: recording refused batch-\d+-[0-9a-f]{{8}}\.parquet of run 'a' \(Unsendable: no such metric\)\. "
        rf"What it refused stays in {re.escape(repr(runs))}; lox goes on without retrying it \(after fixing the "
        rf"cause: `lox sync {re.escape(runs)} --to 'recording'`\)\.", warning), warning
    (folder,) = local_runs(runs)
    assert len(SentRecord(folder, "recording", "recording").files) == 1  # the refused one stays unrecorded


def test_a_run_the_tracker_refuses_to_open_stays_local_with_one_warning(tmp_path, recwarn):
    tracker = Recording(None, {"local": str(tmp_path / "runs")})
    tracker.failures["start_run"] = [ValueError("bad run name")]
    log_two_batches(tracker)
    assert tracker.calls == [("shutdown",)]  # nothing of the run: its files and its end are skipped
    (warning,) = ours(recwarn)
    assert warning.startswith("lox: recording refused to open run 'a' (ValueError: bad run name).")


def test_a_call_unanswered_too_long_is_warned_about_once_while_it_goes_on(tmp_path, recwarn, monkeypatch):
    monkeypatch.setattr(sending, "SLOW_CALL", 0.2)  # read when the tracker's watchdog starts
    tracker = Recording(None, {"local": str(tmp_path / "runs")})
    tracker.delays["send"] = [1.0]
    log_two_batches(tracker)
    assert [call[0] for call in tracker.calls] == ["start_run", "send", "send", "end_run", "shutdown"]
    (warning,) = ours(recwarn)
    assert re.fullmatch(
        r"lox: recording has not answered for 0\.2 s \(sending batch-\d+-[0-9a-f]{8}\.parquet of run 'a'\)\. lox "
        r"keeps trying in the background and training goes on; your logs are safe in .*\.", warning), warning


def test_work_items_describe_the_call_they_make():
    run = hooks.RunInfo("id", "a", "g")
    assert sending.describe(sending.OpenRun(run, "/runs/id")) == "opening run 'a'"
    assert sending.describe(sending.SendFile(run, "/runs/g.batches/batch-000001-0a0b0c0d.parquet")) == (
        "sending batch-000001-0a0b0c0d.parquet of run 'a'")
    assert sending.describe(sending.CloseRun(run, "/runs/id")) == "closing run 'a'"
    assert sending.describe(sending.Shutdown()) == "shutting down"
