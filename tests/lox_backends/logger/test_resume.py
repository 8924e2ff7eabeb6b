"""Runs named at `logger.init(run_id=...)` and resumed (lox_backends/logger/resume.py):
the ids of one call, which runs exist, and every argument refused at the call."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lox
from lox_backends.logger.resume import Resume


def test_the_ids_of_one_call_are_the_run_id_or_one_per_seed_in_row_major_order():
    assert Resume.of("job", "never", None).ids(()) == ["job"]
    assert Resume.of("job", "never", None).ids((2, 2)) == ["job-0", "job-1", "job-2", "job-3"]
    each = Resume.of("job", "never", None, process=3)
    assert (each.ids(()), each.ids((2,)), each.group) == (["job-p3"], ["job-p3-0", "job-p3-1"], "job-p3")


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"run_id": "job", "resume": True}, ValueError, ["resume=True", "W&B", "resume='allow'"]),
    ({"run_id": "job", "resume": "yes"}, ValueError, ["resume='yes'", "'never'", "'allow'", "'must'"]),
    ({"resume": "allow"}, ValueError, ["resume='allow' without a run_id", "run_id='...'"]),
    ({"from_step": 3}, ValueError, ["from_step=3 without a run_id"]),
    ({"run_id": "a/b"}, ValueError, ["run_id='a/b'", "letters, digits"]),
    ({"run_id": "_x"}, ValueError, ["run_id='_x'", "starting with a letter or digit"]),
    ({"run_id": "x" * 65}, ValueError, ["1 to 64"]),
    ({"run_id": 7}, ValueError, ["run_id=7"]),
    ({"run_id": "job", "from_step": 3}, ValueError, ["from_step=3 with resume='never'", "resume='allow'"]),
    ({"run_id": "job", "resume": "allow", "from_step": -1}, ValueError, ["from_step=-1", "0 or more"]),
    ({"run_id": "job", "resume": "allow", "from_step": 2.5}, TypeError, ["from_step=2.5", "int(checkpoint_step)"]),
    ({"run_id": "job", "resume": "allow", "from_step": True}, TypeError, ["from_step=True"]),
    ({"run_id": "job", "resume": "allow", "from_step": np.ones(2, int)}, TypeError, ["from_step=array"]),
])
def test_init_refuses_what_it_cannot_resume_by_and_says_what_it_takes(tmp_path, kwargs, error, words):
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    with pytest.raises(error) as raised:
        logger.init(**kwargs)
    for word in words:
        assert word in str(raised.value)
    logger.close()
    assert not list(tmp_path.iterdir())  # nothing opened


def test_from_step_may_be_a_numpy_or_a_concrete_jax_integer():
    assert Resume.of("job", "allow", np.int64(7)).from_step == 7
    assert Resume.of("job", "allow", jnp.int32(7)).from_step == 7
    assert Resume.of("job", "allow", None).from_step is None


def test_a_traced_from_step_is_refused_with_what_to_pass_instead():
    with pytest.raises(TypeError, match="known when `init` runs"):
        jax.jit(lambda s: Resume.of("job", "allow", s))(jnp.int32(3))


def test_a_run_id_names_the_run_and_its_group_and_seeds_are_numbered(tmp_path):
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    one = logger.init(run_id="single", lr=0.1)
    seeds = jax.vmap(lambda k: logger.init(k, run_id="sweep"))(jax.random.split(jax.random.key(0), 3))
    named = jax.vmap(lambda k: logger.init(k, run_id="named", name="lr"))(jax.random.split(jax.random.key(1), 2))
    logger.finish(one)
    logger.finish(seeds)
    logger.finish(named)
    runs = [(r.run_id, r.name, r.group, r.resumed, r.from_step, r.metadata.get("lr")) for r in logger.runs()]
    assert runs == [("single", "single", "single", False, None, 0.1),
                    ("sweep-0", "sweep-0", "sweep", False, None, None),
                    ("sweep-1", "sweep-1", "sweep", False, None, None),
                    ("sweep-2", "sweep-2", "sweep", False, None, None),
                    ("named-0", "lr-0", "named", False, None, None),
                    ("named-1", "lr-1", "named", False, None, None)]
    assert all("run_id" not in r.metadata and "resume" not in r.metadata for r in logger.runs())
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".batches")) == [
        "named-0", "named-1", "single", "sweep-0", "sweep-1", "sweep-2"]
    logger.close()


def test_an_id_that_exists_is_refused_by_default_and_resumed_when_allowed(tmp_path):
    first = lox.loggers.from_config(f"parquet:{tmp_path}")
    first.finish(first.init(run_id="job"))
    first.close()
    again = lox.loggers.from_config(f"parquet:{tmp_path}")
    with pytest.raises(ValueError, match=r"run 'job' exists \(.*job'\). To go on with it .*resume='allow'"):
        again.init(run_id="job")
    state = again.init(run_id="job", resume="allow", from_step=5)
    fresh = again.init(run_id="other", resume="allow", from_step=5)
    again.finish(state)
    again.finish(fresh)
    runs = {r.run_id: (r.resumed, r.from_step) for r in again.runs()}
    assert runs == {"job": (True, 5), "other": (False, None)}  # a run that did not exist starts afresh
    again.close()


def test_resume_must_refuses_an_id_with_no_run_naming_where_it_looked(tmp_path):
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    with pytest.raises(ValueError, match=rf"resume='must', but there is no run 'job' \('{tmp_path}'\)"):
        logger.init(run_id="job", resume="must")
    memory = lox.loggers.from_config("memory")
    with pytest.raises(ValueError, match="no backend of this logger keeps runs"):
        memory.init(run_id="job", resume="must")
    logger.close()
    memory.close()


def test_seeds_resume_each_that_exists_and_must_finds_every_one(tmp_path):
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    keys = jax.random.split(jax.random.key(0), 2)
    logger.finish(jax.vmap(lambda k: logger.init(k, run_id="s"))(keys))
    more = jax.random.split(jax.random.key(0), 3)
    jax.vmap(lambda k: logger.init(k, run_id="s", resume="must"))(more)  # under vmap: raised by the next call
    with pytest.raises(ValueError, match="no run 's-2'"):
        logger.flush()
    state = jax.vmap(lambda k: logger.init(k, run_id="s", resume="allow"))(more)
    logger.finish(state)
    assert [(r.run_id, r.resumed) for r in logger.runs()[2:]] == [("s-0", True), ("s-1", True), ("s-2", False)]
    logger.close()


def test_a_run_open_in_this_logger_is_not_opened_twice(tmp_path):
    logger = lox.loggers.from_config("memory")
    state = logger.init(run_id="job")
    with pytest.raises(ValueError, match="run 'job' is open in this logger: `logger.finish` it"):
        logger.init(run_id="job", resume="allow")
    logger.finish(state)
    logger.finish(logger.init(run_id="job", resume="must"))  # this logger opened it: it exists
    logger.close()


def test_under_jit_a_refused_id_is_raised_by_the_next_call_of_lox(tmp_path):
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    logger.finish(logger.init(run_id="job"))
    jax.jit(lambda: logger.init(run_id="job").run)()
    with pytest.raises(ValueError, match="run 'job' exists"):
        logger.flush()
    logger.close()


def test_finish_of_seeds_whose_init_was_refused_raises_that_refusal_alone(tmp_path):
    logger = lox.loggers.from_config(f"parquet:{tmp_path}")
    logger.finish(jax.vmap(lambda k: logger.init(k, run_id="s"))(jax.random.split(jax.random.key(0), 2)))
    state = jax.vmap(lambda k: logger.init(k, run_id="s", resume="must"))(jax.random.split(jax.random.key(0), 3))
    with pytest.raises(ValueError, match="no run 's-2'") as raised:
        logger.finish(state)  # the refusal, not "got run number -1" with it as its context
    assert raised.value.__context__ is None
    logger.close()
