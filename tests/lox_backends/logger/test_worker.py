"""The background threads (lox_backends/logger/worker.py): a `Worker` runs tasks in order in
one thread; a `BackendWorker` calls a backend in a thread of its own, makes a call that raised
an OSError again with backoff while the calls behind it wait, counts the bytes no flush has
confirmed, and reports a refusal once. The backend is a plugin of the tests' own whose store
fails on purpose."""

import collections
import errno
import threading
import time
import warnings

import pyarrow as pa
import pytest

from lox_backends.logger import worker
from lox_backends.logger.worker import BackendError, BackendWorker, Worker
from lox_backends.plugin import hooks


def until(condition, timeout=10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


# --- Worker ------------------------------------------------------------------------------------
def test_tasks_run_in_the_order_submitted_in_one_thread_of_the_workers_name():
    w = Worker("lox-test-order")
    seen = []
    for i in range(100):
        w.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
    assert w.barrier().wait(10)
    assert [i for i, _ in seen] == list(range(100))
    assert {name for _, name in seen} == {"lox-test-order"} != {threading.current_thread().name}
    w.stop()


def test_submitting_never_waits_for_a_task_and_backlog_counts_what_is_queued_or_running():
    w = Worker("lox-test-backlog")
    gate = threading.Event()
    w.submit(lambda: gate.wait(10), "slow")
    until(lambda: w.backlog("slow") == 1 and w.backlog() == 1)  # running
    began = time.monotonic()
    for i in range(500):
        w.submit(lambda: None, "write" if i % 2 else None)
    assert time.monotonic() - began < 1.0
    assert (w.backlog(), w.backlog("write"), w.backlog("slow"), w.backlog("flush")) == (501, 250, 1, 0)
    assert not w.wait_idle(0.05)
    gate.set()
    assert w.wait_idle(10) and w.backlog() == 0
    w.stop()


def test_a_tasks_exception_is_kept_and_handed_to_on_error_and_the_next_task_runs():
    handed = []
    w = Worker("lox-test-errors", on_error=lambda e: handed.append((e, threading.current_thread().name)))
    first, second = ValueError("first"), KeyError("second")
    ran = []

    def fail(error):
        raise error

    w.submit(lambda: fail(first))
    w.submit(lambda: ran.append(1))
    w.submit(lambda: fail(second))
    w.submit(lambda: ran.append(2))
    assert w.barrier().wait(10)
    assert ran == [1, 2]
    assert w.take_errors() == [first, second]
    assert w.take_errors() == []  # once
    assert handed == [(first, "lox-test-errors"), (second, "lox-test-errors")]
    w.stop()


def test_stop_runs_what_is_queued_then_ignores_what_is_submitted():
    w = Worker("lox-test-stop")
    gate, ran = threading.Event(), []
    w.submit(lambda: gate.wait(10))
    for i in range(3):
        w.submit(lambda i=i: ran.append(i))
    threading.Timer(0.1, gate.set).start()
    w.stop()  # waits for the queue
    assert ran == [0, 1, 2] and not w.alive()
    w.submit(lambda: ran.append("late"))
    assert w.barrier().is_set()  # nothing more runs: a barrier does not wait
    time.sleep(0.05)
    assert ran == [0, 1, 2] and w.backlog() == 0


def test_a_task_may_stop_its_own_worker():
    w = Worker("lox-test-self-stop")
    ran = []
    w.submit(lambda: w.stop())
    w.submit(lambda: ran.append("queued before the stop"))
    until(lambda: not w.alive())
    assert ran == ["queued before the stop"]


def test_periodic_runs_after_a_task_while_it_has_work_and_an_idle_worker_sleeps():
    work, calls = ["a", "b", "c"], []

    def periodic():
        calls.append(work.pop())
        return bool(work)  # True: work left, call again after `every`

    w = Worker("lox-test-periodic", every=0.01, periodic=periodic)
    time.sleep(0.2)
    assert calls == []  # no task ran yet: nothing to do
    w.submit(lambda: None)
    until(lambda: len(calls) == 3)
    time.sleep(0.2)
    assert calls == ["c", "b", "a"]  # no more once it said it had none
    w.stop()


def test_a_periodic_call_that_raises_is_reported_and_tried_again():
    failure, calls = RuntimeError("tick failed"), []

    def periodic():
        calls.append(1)
        if len(calls) == 1:
            raise failure
        return False

    w = Worker("lox-test-periodic-error", every=0.01, periodic=periodic)
    w.submit(lambda: None)
    until(lambda: len(calls) == 2)
    time.sleep(0.1)
    assert len(calls) == 2 and w.take_errors() == [failure]
    w.stop()


# --- BackendWorker ------------------------------------------------------------------------------
NO_SPACE = "[Errno 28] No space left on device"


class Store(hooks.Backend):
    """A plugin-like backend over a store that fails on purpose: while `down`, every call raises
    an OSError (a full disk); `failures[method]` and `run_failures[run id]` make that many calls
    fail once; the tables of runs in `refused` are refused (a ValueError); while `gate` is set to
    an unset Event, calls hang on it. It records every call it gets (`attempts`)."""

    def __init__(self):
        super().__init__()
        self.down = False
        self.failures: collections.Counter = collections.Counter()
        self.run_failures: collections.Counter = collections.Counter()
        self.refused: set[str] = set()
        self.gate: threading.Event | None = None
        self.attempts: list[tuple[str, str | None, float, str]] = []  # (method, run id, when, thread)
        self.written: list[tuple[str, list]] = []  # (run id, the table's values), once taken
        self.closed: list[str] = []

    def _call(self, method: str, run_id: str | None = None) -> None:
        self.attempts.append((method, run_id, time.monotonic(), threading.current_thread().name))
        if self.gate is not None:
            self.gate.wait(10)
        if run_id in self.refused:
            raise ValueError(f"run {run_id} is refused")
        if self.down or self.failures[method] > 0 or self.run_failures[run_id] > 0:
            for counter, what in ((self.failures, method), (self.run_failures, run_id)):
                counter[what] = max(counter[what] - 1, 0)
            raise OSError(errno.ENOSPC, "No space left on device")

    def open_run(self, run):
        self._call("open_run", run.run_id)

    def write(self, run, table):
        self._call("write", run.run_id)
        self.written.append((run.run_id, table.column("i").to_pylist()))

    def flush(self):
        self._call("flush")

    def close_run(self, run):
        self._call("close_run", run.run_id)
        self.closed.append(run.run_id)

    def tried(self, method: str) -> list:
        return [run_id for m, run_id, _, _ in self.attempts if m == method]


def run(run_id: str) -> hooks.RunInfo:
    return hooks.RunInfo(run_id, name=run_id, group="g")


def table(*values) -> pa.Table:
    return pa.table({"i": list(values)})


@pytest.fixture
def store():
    return Store()


@pytest.fixture
def outlet(store):
    outlet = BackendWorker(store, "store:test", "tests")
    yield outlet
    store.down = False
    if store.gate is not None:
        store.gate.set()
    outlet.stop(timeout=5)


@pytest.fixture
def fast_retries(monkeypatch):
    """Retries after 0.02, 0.04, then every 0.08 s (not 0.5 s doubling up to 30 s)."""
    monkeypatch.setattr(worker, "RETRY_FIRST", 0.02)
    monkeypatch.setattr(worker, "RETRY_MAX", 0.08)


def messages(caught) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def cannot(label: str) -> str:
    return (f"lox: backend store:test cannot {label}: {NO_SPACE}. lox keeps the logs it could not write and tries "
            "again until the fault clears (nothing is lost meanwhile, up to the logger's max_pending bytes).")


WORKS_AGAIN = "lox: backend store:test works again; what it held is written."


def test_a_backend_is_called_in_order_in_a_thread_of_its_own(store, outlet):
    store.gate = threading.Event()  # a slow store: the caller does not wait for it
    first, second = table(0), table(1)  # (pyarrow's first table takes a while to make)
    began = time.monotonic()
    outlet.call(lambda b: b.open_run(run("a")), "open_run")
    outlet.write([(run("a"), first)], 10)
    outlet.write([(run("a"), second)], 10)
    outlet.flush()
    outlet.call(lambda b: b.close_run(run("a")), "close_run")
    assert time.monotonic() - began < 1.0
    store.gate.set()
    assert outlet.barrier().wait(10)
    assert [(m, r) for m, r, _, _ in store.attempts] == [
        ("open_run", "a"), ("write", "a"), ("write", "a"), ("flush", None), ("close_run", "a")]
    assert {thread for *_, thread in store.attempts} == {"lox-tests-Store"}
    assert store.written == [("a", [0]), ("a", [1])] and outlet.progress() == 5


def test_an_oserror_is_retried_with_backoff_and_the_calls_behind_it_wait(store, outlet, fast_retries):
    store.failures["write"] = 5
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outlet.write([(run("a"), table(0))], 100)
        outlet.call(lambda b: b.close_run(run("a")), "close_run")
        assert outlet.barrier().wait(10)
    writes = [when for m, _, when, _ in store.attempts if m == "write"]
    assert len(writes) == 6  # five failures, then the write
    gaps = [later - earlier for earlier, later in zip(writes, writes[1:], strict=False)]
    assert all(gap >= 0.9 * least for gap, least in zip(gaps, [0.02, 0.04, 0.08, 0.08, 0.08], strict=True)), gaps
    assert [m for m, *_ in store.attempts] == ["write"] * 6 + ["close_run"]  # the close waited for the write
    assert store.written == [("a", [0])] and store.closed == ["a"]  # written once
    assert messages(caught) == [cannot("write"), WORKS_AGAIN]  # once per outage, not per try
    assert not outlet.failing() and outlet.fault is None and outlet.errors() == []


def test_each_outage_warns_once_naming_the_call_that_failed(store, outlet, fast_retries):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store.failures["flush"] = 3
        outlet.flush()
        assert outlet.barrier().wait(10)
        store.failures["write"] = 2
        outlet.write([(run("a"), table(0))], 1)
        assert outlet.barrier().wait(10)
    assert messages(caught) == [cannot("flush"), WORKS_AGAIN, cannot("write"), WORKS_AGAIN]


def test_while_a_call_fails_the_backend_is_failing_and_holds_what_was_handed_to_it(store, outlet):
    store.down = True
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outlet.write([(run("a"), table(0)), (run("b"), table(1))], 1536)
        outlet.flush()
        until(lambda: outlet.fault is not None)
        assert outlet.failing() and outlet.fault.errno == errno.ENOSPC
        assert outlet.unwritten() == 1536
        assert outlet.holds("a") and outlet.holds("b") and not outlet.holds("c")
        assert outlet.unwritten_summary() == "2 batch(es) (1.5 KiB) of run(s) 'a', 'b'"
        assert store.tried("flush") == []  # behind the write
        store.down = False
        outlet.retry_now()
        assert outlet.barrier().wait(10)
    assert store.written == [("a", [0]), ("b", [1])] and len(store.tried("flush")) == 1
    assert not outlet.failing() and outlet.fault is None
    assert outlet.unwritten() == 0 and not outlet.holds("a")
    assert outlet.unwritten_summary() == "0 batch(es) (0.0 KiB) of run(s) (none)"
    assert messages(caught) == [cannot("write"), WORKS_AGAIN]


def test_written_tables_stay_unwritten_until_a_flush_after_them_succeeds(store, outlet):
    outlet.write([(run("a"), table(0))], 100)
    assert outlet.barrier().wait(10)
    assert store.written == [("a", [0])]
    assert outlet.unwritten() == 100 and outlet.holds("a")  # taken, not yet made durable
    store.down = True
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        outlet.flush()
        outlet.write([(run("b"), table(1))], 7)  # after the flush: not confirmed by it
        until(lambda: outlet.fault is not None)
        assert store.tried("flush") == [None]
        assert outlet.unwritten() == 107 and outlet.holds("a")  # the failing flush confirms nothing
        store.down = False
        outlet.retry_now()
        assert outlet.barrier().wait(10)
    assert store.written == [("a", [0]), ("b", [1])]
    assert outlet.unwritten() == 7 and not outlet.holds("a") and outlet.holds("b")
    outlet.flush()
    assert outlet.barrier().wait(10)
    assert outlet.unwritten() == 0 and not outlet.holds("b")


def test_the_summary_of_what_is_held_names_five_runs_and_counts_the_rest(store, outlet):
    store.gate = threading.Event()
    outlet.write([(run(f"r{i}"), table(i)) for i in (6, 5, 4)], 2**20)
    outlet.write([(run(f"r{i}"), table(i)) for i in (3, 2, 1, 0)], 2 * 2**20)
    assert outlet.unwritten_summary() == "7 batch(es) (3.0 MiB) of run(s) 'r0', 'r1', 'r2', 'r3', 'r4' and 2 more"
    store.gate.set()


def test_a_call_that_runs_longer_than_hangs_after_counts_as_failing(store, outlet, monkeypatch):
    monkeypatch.setattr(worker, "HANGS_AFTER", 1.0)
    store.gate = threading.Event()
    outlet.call(lambda b: b.open_run(run("a")), "open_run")
    until(lambda: store.attempts)
    assert not outlet.failing()  # running, not yet for long
    time.sleep(1.2)
    assert outlet.failing() and outlet.fault is None and outlet.progress() == 0
    store.gate.set()
    assert outlet.barrier().wait(10)
    assert not outlet.failing() and outlet.progress() == 1


def test_retry_now_makes_the_failed_call_again_without_waiting_for_its_backoff(store, outlet, monkeypatch):
    monkeypatch.setattr(worker, "RETRY_FIRST", 30.0)
    store.failures["write"] = 1
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        outlet.write([(run("a"), table(0))], 10)
        until(lambda: outlet.fault is not None)
        time.sleep(0.3)
        assert store.tried("write") == ["a"]  # waiting out its backoff
        began = time.monotonic()
        outlet.retry_now()
        assert outlet.barrier().wait(10)
    assert time.monotonic() - began < 5  # not the 30 s of the backoff
    assert store.tried("write") == ["a", "a"] and store.written == [("a", [0])]


def test_a_write_of_several_runs_retries_only_what_failed_each_runs_tables_in_order(store, outlet, fast_retries):
    store.run_failures["a"] = 1  # run a's folder is on the full disk, the others are not
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        outlet.write([(run("a"), table(0)), (run("b"), table(1)), (run("a"), table(2)), (run("c"), table(3))], 40)
        assert outlet.barrier().wait(10)
    assert store.tried("write") == ["a", "b", "c", "a", "a"]  # a's second table waited for its first
    assert store.written == [("b", [1]), ("c", [3]), ("a", [0]), ("a", [2])]  # each once


def test_a_refusal_warns_at_once_is_not_retried_and_is_reported_once_naming_the_backend(store, outlet):
    store.refused = {"r"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outlet.write([(run("r"), table(0)), (run("s"), table(1))], 10)
        outlet.call(lambda b: b.close_run(run("s")), "close_run")
        assert outlet.barrier().wait(10)
    assert messages(caught) == [
        "lox: backend store:test failed: ValueError('run r is refused'). The other backends keep their data; "
        "this error is raised by the logger's next call or `finish`."]
    assert store.tried("write") == ["r", "s"] and store.written == [("s", [1])] and store.closed == ["s"]
    assert outlet.lost_runs == {"r"} and outlet.progress() == 2
    (error,) = outlet.errors()
    assert isinstance(error, BackendError) and str(error) == "store:test: ValueError('run r is refused')"
    assert isinstance(error.__cause__, ValueError) and str(error.__cause__) == "run r is refused"
    assert outlet.errors() == []  # reported once
    assert not outlet.failing()  # a refusal is not a fault that passes


def test_a_call_refused_on_its_retry_leaves_no_fault_behind(store, outlet, monkeypatch):
    """A write that raised an OSError (a timeout), then is refused when made again, is over:
    no call is retried any more, so the backend is not failing (`failing`: "a call raised an
    OSError and is being retried"; `fault`: "what the call being retried raised")."""
    monkeypatch.setattr(worker, "RETRY_FIRST", 30.0)
    store.run_failures["r"] = 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outlet.write([(run("r"), table(0))], 10)
        until(lambda: outlet.fault is not None)
        store.refused = {"r"}
        outlet.retry_now()
        assert outlet.barrier().wait(10)
    assert messages(caught)[0] == cannot("write")
    assert store.tried("write") == ["r", "r"] and outlet.lost_runs == {"r"}
    (error,) = outlet.errors()
    assert str(error) == "store:test: ValueError('run r is refused')"
    assert outlet.fault is None and not outlet.failing()


def test_a_backend_error_raised_by_a_call_is_reported_as_it_is(store, outlet):
    raised = BackendError("store:test: gave up")

    def fail(backend):
        raise raised

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outlet.call(fail)
        assert outlet.barrier().wait(10)
    assert outlet.errors() == [raised]
    assert messages(caught) == ["lox: backend store:test failed: store:test: gave up. The other backends keep their "
                                "data; this error is raised by the logger's next call or `finish`."]


def test_stop_makes_each_failing_call_once_more_and_counts_its_runs_as_lost(store, outlet, monkeypatch):
    monkeypatch.setattr(worker, "RETRY_FIRST", 30.0)
    store.down = True
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        outlet.write([(run("a"), table(0)), (run("b"), table(1))], 10)
        outlet.call(lambda b: b.close_run(run("a")), "close_run")
        until(lambda: outlet.fault is not None)
        began = time.monotonic()
        outlet.stop(timeout=10)
    assert time.monotonic() - began < 5 and not outlet.alive()  # the backoff's wait was cut short
    assert store.tried("write") == ["a", "b", "a", "b"]  # the first try, and the last
    assert store.tried("close_run") == ["a"]  # one try only
    assert outlet.lost_runs == {"a", "b"} and store.written == []
    assert outlet.errors() == []  # the fault was told about when it began (and by the logger that gave up)
