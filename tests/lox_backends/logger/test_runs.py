"""The runs a Logger opens (lox_backends/logger/runs.py): ids safe as folder names, names
people read, one group per logger, and which runs are still open."""

import datetime
import re
import threading

import jax
import pytest

import lox
from lox_backends.logger.runs import MAX_NAME, Runs, new_group, safe_name

GROUP = "demo-20240102-030405-abcdef"  # a group as `new_group("demo")` makes them
STAMP = "20240102-030405-abcdef"


@pytest.mark.parametrize(("name", "safe"), [
    ("lox", "lox"),
    ("exp_1.v2-final", "exp_1.v2-final"),  # every character allowed is kept
    ("my run/lr=0.1", "my-run-lr-0.1"),  # a run of other characters becomes one "-"
    ("a  //  b", "a-b"),
    ("café", "caf"),  # non-ASCII is not kept, nor the "-" it leaves at the end
    ("a..b", "a.b"),  # never "..": no way up out of a folder
    ("a.../b", "a.-b"),
    ("../../etc", "etc"),
    ("-.-name-.-", "name"),  # no leading or trailing "-" or "."
    ("", "lox"),  # nothing left: a name all the same
    ("///", "lox"),
    ("..", "lox"),
])
def test_safe_name_keeps_only_what_a_run_id_may_hold(name, safe):
    assert safe_name(name) == safe


def test_safe_name_keeps_at_most_max_name_characters_without_a_dash_at_the_cut():
    assert MAX_NAME == 64
    assert safe_name("x" * 100) == "x" * 64
    assert safe_name("x" * 63 + "/tail") == "x" * 63  # cut after the "-" that "/" became: stripped


def test_a_new_group_is_the_safe_name_the_time_and_random_digits():
    before = datetime.datetime.now().replace(microsecond=0)
    group = new_group("my sweep")
    after = datetime.datetime.now()
    match = re.fullmatch(r"my-sweep-(\d{8}-\d{6})-([0-9a-f]{6})", group)
    assert match, group
    when = datetime.datetime.strptime(match[1], "%Y%m%d-%H%M%S")
    assert before <= when <= after
    assert len({new_group("my sweep") for _ in range(20)}) == 20  # the random digits tell them apart


def test_runs_without_a_name_are_named_after_the_logger_and_numbered():
    runs = Runs("demo", group=GROUP)
    first = runs.open({"lr": 0.1}, position=None)
    second = runs.open({}, position=None)
    assert (first.name, first.run_id, first.group, first.index) == ("demo-0", f"{GROUP}-0", GROUP, 0)
    assert (second.name, second.run_id, second.group, second.index) == ("demo-1", f"{GROUP}-1", GROUP, 1)
    assert first.metadata == {"lr": 0.1} and first.status == "running"
    assert runs[0] is first and runs[1] is second and runs.all() == [first, second]


def test_a_named_run_keeps_its_name_and_its_id_starts_with_it_instead_of_the_loggers():
    runs = Runs("demo", group=GROUP)
    runs.open({}, position=None)
    named = runs.open({"name": "baseline"}, position=None)
    assert (named.name, named.run_id, named.group) == ("baseline", f"baseline-{STAMP}-1", GROUP)
    # Seeds of one `init` (positions in its batch) are numbered after their name; the id keeps the run's number.
    seeds = [runs.open({"name": "sweep lr/2"}, position=p) for p in range(3)]
    assert [s.name for s in seeds] == ["sweep lr/2-0", "sweep lr/2-1", "sweep lr/2-2"]
    assert [s.run_id for s in seeds] == [f"sweep-lr-2-{STAMP}-{n}" for n in (2, 3, 4)]
    assert [s.index for s in seeds] == [2, 3, 4]


def test_run_ids_are_safe_even_where_the_loggers_name_is_not():
    runs = Runs("my logger/v2")
    assert re.fullmatch(r"my-logger-v2-\d{8}-\d{6}-[0-9a-f]{6}", runs.group)
    run = runs.open({}, position=None)
    named = runs.open({"name": "a..b"}, position=None)
    stamp = runs.group.removeprefix("my-logger-v2-")
    assert (run.name, run.run_id) == ("my logger/v2-0", f"{runs.group}-0")  # the name is for people: as given
    assert (named.name, named.run_id) == ("a..b", f"a.b-{stamp}-1")


def test_two_loggers_of_one_name_have_groups_and_run_ids_of_their_own():
    a, b = Runs("same"), Runs("same")
    assert a.group != b.group
    assert a.open({}, None).run_id != b.open({}, None).run_id
    assert a.open({"name": "n"}, None).run_id != b.open({"name": "n"}, None).run_id


def test_runs_opened_from_many_threads_at_once_get_distinct_numbers():
    runs = Runs("threads", group="threads-x")
    start = threading.Barrier(8)

    def open_some():
        start.wait()
        for _ in range(50):
            runs.open({}, position=None)

    threads = [threading.Thread(target=open_some) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    opened = runs.all()
    assert [run.index for run in opened] == list(range(400))
    assert len({run.run_id for run in opened}) == 400 and len({run.name for run in opened}) == 400
    assert all(runs[n].index == n for n in range(400))


def test_finishing_returns_the_runs_still_open_once_each():
    runs = Runs("demo", group=GROUP)
    opened = [runs.open({}, None) for _ in range(4)]
    assert runs.any_open() and runs.open_numbers() == [0, 1, 2, 3]
    assert runs.finishing([2, 0, 2]) == [opened[2], opened[0]]  # in the order given, a repeat once
    assert runs.open_numbers() == [1, 3]
    assert runs.finishing([0, 1]) == [opened[1]]  # 0 finished already
    assert runs.finishing([0, 1, 2]) == []
    assert runs.finishing([3]) == [opened[3]]
    assert not runs.any_open() and runs.open_numbers() == []


def test_finishing_a_number_never_given_out_is_refused_and_finishes_nothing():
    runs = Runs("demo", group=GROUP)
    runs.open({}, None)
    for unknown in (1, 7, -1):
        with pytest.raises(ValueError, match=rf"`logger.finish` got run number {unknown}, which this logger did not"):
            runs.finishing([0, unknown])
    assert runs.open_numbers() == [0]
    # Where runs may be unknown (a process that does not write), they are skipped.
    assert [run.index for run in runs.finishing([5, 0, -2], strict=False)] == [0]
    assert runs.open_numbers() == []


def test_a_runs_status_is_kept_and_shown_by_all():
    runs = Runs("demo", group=GROUP)
    runs.open({"lr": 0.5}, None)
    runs.open({}, None)
    runs.set_status(1, "failed")
    assert [run.status for run in runs.all()] == ["running", "failed"]
    assert runs[1].metadata == {} and runs[1].run_id == f"{GROUP}-1"  # nothing else changed
    assert runs[0].status == "running" and runs[0].metadata == {"lr": 0.5}


def test_logs_of_a_run_marked_finished_are_refused_those_of_others_not():
    runs = Runs("demo", group=GROUP)
    done, other = runs.open({"name": "done"}, None), runs.open({}, None)
    runs.check_open(done)
    runs.mark_finished(done)
    with pytest.raises(ValueError, match=r"logs for run 'done' arrived after `logger.finish` closed it and were not "
                                         r"written; log before `finish`, or open a new run with `logger.init`"):
        runs.check_open(done)
    runs.check_open(other)


def test_a_logger_names_its_runs_and_vmapped_seeds_share_its_group():
    logger = lox.loggers.from_config("memory", name="exp")
    single = logger.init()
    seeds = jax.vmap(lambda key: logger.init(key, name="seed"))(jax.random.split(jax.random.key(0), 3))
    logger.finish(single)
    logger.finish(seeds)
    runs = logger.runs()
    assert [run.name for run in runs] == ["exp-0", "seed-0", "seed-1", "seed-2"]
    assert [run.index for run in runs] == [0, 1, 2, 3]
    assert {run.group for run in runs} == {logger.group} and logger.group.startswith("exp-")
    stamp = logger.group.removeprefix("exp-")
    assert [run.run_id for run in runs] == [f"{logger.group}-0", *(f"seed-{stamp}-{n}" for n in (1, 2, 3))]
    assert sorted(logger.backends[0].runs) == sorted(run.run_id for run in runs)  # what the backend was told
    assert [run.status for run in runs] == ["finished"] * 4
    logger.close()
