"""Where uncaptured logs go inside an active block (lox_core/active.py), with a
destination written here that keeps what it is given: which block an event
reaches, in how many host calls, keyed and unkeyed blocks, threads, retraces.
A Logger's runs as the destination: tests/lox_backends/logger/test_active_run.py."""

import asyncio
import gc
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from devices import DEVICES
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import lox
from lox_core import active


class Kept:
    """A destination that keeps each delivery: ("event" | "block", batch_ndim, logs)."""

    per_device_error = None

    def __init__(self):
        self.key = active.new_key()
        self.got = []
        self.lock = threading.Lock()

    def deliver(self, batch_ndim, event, took):
        with self.lock:
            self.got.append(("event", batch_ndim, event))

    def deliver_block(self, batch_ndim, logs):
        with self.lock:
            self.got.append(("block", batch_ndim, logs))

    def values(self, key):
        return [np.asarray(logs[key]).tolist() for _, _, logs in self.got if key in logs]


@pytest.fixture
def default_off():
    lox.set_default("off")
    try:
        yield
    finally:
        lox.set_default("console")


def counted(fun):
    """`fun` jitted, and the number of times JAX traced it."""
    traces = []

    def traced(*args):
        traces.append(1)
        return fun(*args)

    return jax.jit(traced), traces


def metric(x, i):
    lox.log({"x": x}, step=i)
    return x + 1


def test_a_function_compiled_before_the_block_reaches_it_without_a_retrace_and_prints_after(capsys):
    f, traces = counted(metric)
    f(1.0, 0)
    kept = Kept()
    with active.activate(kept):
        f(2.0, 1)
        f(3.0, 2)
    f(4.0, 3)
    jax.effects_barrier()
    assert len(traces) == 1
    assert kept.values("x") == [[2.0], [3.0]]
    assert [int(np.asarray(logs.step["x"])[0]) for _, _, logs in kept.got] == [1, 2]
    printed = capsys.readouterr().out.splitlines()
    assert printed == ["[step=0] x=1", "[step=3] x=4"]


def test_with_the_default_off_a_function_is_compiled_once_more_for_the_block_and_is_fast_again_after(
        default_off, capsys):
    f, traces = counted(metric)
    f(1.0, 0)
    kept = Kept()
    with active.activate(kept):
        f(2.0, 1)
    f(3.0, 2)  # the version without a host call, from the cache
    with active.activate(kept):  # the same destination again: its version, from the cache
        f(4.0, 3)
    jax.effects_barrier()
    assert len(traces) == 2
    assert kept.values("x") == [[2.0], [4.0]]
    assert capsys.readouterr().out == ""
    assert "callback" not in f.lower(1.0, 0).as_text()  # outside the block: no host call at all


def test_blocks_nest_and_the_innermost_wins():
    f = jax.jit(metric)
    outer, inner = Kept(), Kept()
    with active.activate(outer):
        f(1.0, 0)
        with active.activate(inner):
            f(2.0, 1)
            lox.log({"x": 3.0}, step=2)
        f(4.0, 3)
    assert outer.values("x") == [[1.0], [4.0]]
    assert inner.values("x") == [[2.0], [3.0]]


def test_blocks_belong_to_their_thread(capsys):
    f = jax.jit(metric)
    f(0.0, 0)  # compiled before any block
    kept = [Kept() for _ in range(3)]
    started = threading.Barrier(3)

    def work(k):
        with active.activate(kept[k]):
            started.wait()  # every block open at once
            for i in range(5):
                f(float(k), i)
                lox.log({"eager": k}, step=i)
            started.wait()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    capsys.readouterr()
    for k in range(3):
        assert kept[k].values("x") == [[float(k)]] * 5
        assert kept[k].values("eager") == [[k]] * 5
    lox.log({"outside": 1}, step=0)  # no block in this thread: printed
    assert capsys.readouterr().out == "[step=0] outside=1\n"


def test_a_vmapped_event_is_one_host_call_with_every_element():
    kept = Kept()
    with active.activate(kept):
        jax.jit(jax.vmap(metric, in_axes=(0, None)))(jnp.arange(4.0), 3)
        jax.vmap(metric, in_axes=(0, None))(jnp.arange(2.0), 4)  # eagerly
    (_, nd, logs), (_, nd_eager, eager) = kept.got
    assert nd == 1 and np.asarray(logs["x"]).tolist() == [[0.0], [1.0], [2.0], [3.0]]
    assert np.asarray(logs.step["x"]).tolist() == [[3]] * 4
    assert nd_eager == 1 and np.asarray(eager["x"]).tolist() == [[0.0], [1.0]]


def test_a_tap_without_a_callback_streams_to_the_block_buffered():
    def loop(xs):
        def step(c, x):
            lox.log({"c": c + x}, step=x)
            return c + x, None

        return jax.lax.scan(step, 0, xs)[0]

    kept = Kept()
    with active.activate(kept):
        lox.tap(loop, buffer=4)(jnp.arange(10))
    blocks = [logs for kind, _, logs in kept.got if kind == "block"]
    assert len(blocks) == len(kept.got) == 3  # 10 events, 4 at a time: 3 host calls
    got = np.concatenate([np.asarray(b["c"]) for b in blocks]).tolist()
    assert got == np.cumsum(np.arange(10)).tolist()
    assert np.concatenate([np.asarray(b.step["c"]) for b in blocks]).tolist() == list(range(10))


def test_spool_still_captures_inside_a_block():
    kept = Kept()
    with active.activate(kept):
        _, logs = lox.spool(metric)(1.0, 0)
    assert kept.got == [] and logs["x"].tolist() == [1.0]


def test_leaving_the_block_raises_what_a_delivery_raised():
    class Refusing(Kept):
        def deliver(self, batch_ndim, event, took):
            raise ValueError("refused by the destination")

    with pytest.raises(ValueError, match="refused by the destination") as caught:
        with active.activate(Refusing()):
            jax.jit(metric)(1.0, 0)
    assert "raised by lox while sending an event of keys 'x' to the active run" in caught.value.__notes__[0]


def test_runs_for_names_both_shapes_when_a_vmap_does_not_match_the_runs():
    runs = np.arange(2)
    assert active.runs_for(runs, (2, 3), ["x"])[0].tolist() == [[0, 0, 0], [1, 1, 1]]
    assert active.runs_for(runs, (), ["x"])[1] is True
    assert active.runs_for(np.array(5), (3,), ["x"])[0].tolist() == [5, 5, 5]
    with pytest.raises(ValueError, match=r"state holds runs of shape \(2,\).*vmapped over \(3,\)"):
        active.runs_for(runs, (3,), ["x"])


def test_a_block_left_by_an_exception_keeps_the_events_of_its_programs_and_is_closed():
    kept = Kept()
    f = jax.jit(metric)
    with pytest.raises(KeyError, match="the training failed"):
        with active.activate(kept):
            f(1.0, 0)
            f(2.0, 1)
            raise KeyError("the training failed")
    assert kept.values("x") == [[1.0], [2.0]]
    assert active.current() is None and active.for_host_call(0) is None


def test_a_block_of_a_second_asyncio_task_in_one_thread_is_refused_and_the_first_still_works(capsys):
    # JAX keys compiled functions per thread: interleaved tasks' blocks would swap their events.
    f = jax.jit(metric)
    f(0.0, 0)  # compiled before any block, with the default console
    first, second = Kept(), Kept()
    refused = []

    async def task(kept, k):
        try:
            with active.activate(kept):
                for i in range(3):
                    f(float(k), i)
                    await asyncio.sleep(0)  # the other task runs meanwhile, in this thread
        except RuntimeError as error:
            refused.append(str(error))

    async def main():
        await asyncio.gather(task(first, 1), task(second, 2))

    asyncio.run(main())
    assert first.values("x") == [[1.0]] * 3 and second.got == []
    (message,) = refused
    assert "a block of another asyncio task (or context) is open in this thread" in message
    assert "asyncio.to_thread" in message
    capsys.readouterr()
    f(5.0, 5)
    with active.activate(second):  # once the first block is closed, a block opens again
        f(6.0, 6)
    jax.effects_barrier()
    assert capsys.readouterr().out == "[step=5] x=5\n" and second.values("x") == [[6.0]]


def test_the_default_turned_off_inside_a_block_still_sends_to_the_block(capsys):
    f, traces = counted(metric)
    kept = Kept()
    try:
        with active.activate(kept):  # opened with the default "console"
            f(1.0, 0)
            lox.set_default("off")
            f(2.0, 1)  # traced again for the new default: still to the block
            lox.log({"x": 3.0}, step=2)  # eagerly too
        f(4.0, 3)  # outside: "off", nothing
        lox.log({"x": 5.0}, step=4)
        jax.effects_barrier()
    finally:
        lox.set_default("console")
    assert kept.values("x") == [[1.0], [2.0], [3.0]]
    assert capsys.readouterr().out == ""


def test_a_tap_without_a_callback_is_compiled_once_for_every_block_and_keeps_no_destination_alive():
    traces = []

    def loop(x, i):
        traces.append(1)
        lox.log({"x": x}, step=i)
        return x

    tapped = lox.tap(loop)
    kept = [Kept() for _ in range(3)]
    for k, destination in enumerate(kept):  # a new run per block, as in a sweep
        with active.activate(destination):
            tapped(float(k), k)
    assert [d.values("x") for d in kept] == [[[0.0]], [[1.0]], [[2.0]]]
    assert len(traces) == 1
    gone = weakref.ref(kept[0])
    del kept, destination
    gc.collect()
    assert gone() is None  # the tapped function does not hold the blocks' destinations (a Logger each)


def test_a_tap_in_a_program_compiled_in_a_block_prints_when_run_after_it(capsys):
    outer = jax.jit(lambda x, i: lox.tap(metric)(x, i))
    kept = Kept()
    with active.activate(kept):
        outer(1.0, 0)
    outer(2.0, 1)  # the program compiled in the block (the default "console" keys nothing)
    jax.effects_barrier()
    assert kept.values("x") == [[1.0]]
    assert capsys.readouterr().out == "[step=1] x=2\n"


def test_the_events_of_programs_dispatched_before_a_block_do_not_reach_it(capsys):
    # A program on several devices runs asynchronously (on a GPU every program does): its events
    # reach the host after the call returns, and belong to where it was dispatched.
    mesh = jax.make_mesh((DEVICES,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))

    def per_device(x):
        x = jax.lax.fori_loop(0, 50, lambda _, x: jnp.tanh(x @ x.T), x)  # long enough to return first
        lox.log({"s": jax.lax.axis_index("d")}, step=0)
        return x

    f = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("d"), out_specs=P("d")))
    x = jax.device_put(jnp.ones((DEVICES * 300, 300)) / 300, NamedSharding(mesh, P("d")))
    f(x).block_until_ready()
    capsys.readouterr()
    outer, inner = Kept(), Kept()
    f(x)  # before any block: printed
    with active.activate(outer):
        f(x)  # the outer block's
        with active.activate(inner):
            pass
    assert sorted(v for (v,) in outer.values("s")) == list(range(DEVICES)) and inner.got == []
    assert sorted(capsys.readouterr().out.splitlines()) == [f"[step=0] s={d}" for d in range(DEVICES)]


def test_a_function_traced_in_another_thread_with_a_keyed_blocks_context_is_refused(default_off):
    # `asyncio.to_thread` copies the context (the block) into a thread, but not JAX's configuration,
    # which is per thread: a function compiled there has no key, and its events nowhere to go.
    f = jax.jit(metric)
    kept = Kept()

    async def main():
        with active.activate(kept):
            lox.log({"x": 0.0}, step=0)  # eagerly the block's, in any thread
            await asyncio.to_thread(lox.log, {"x": 1.0}, step=1)
            with pytest.raises(RuntimeError, match=r"lox.log of 'x' is traced in a thread .*asyncio.to_thread"):
                await asyncio.to_thread(f, 2.0, 2)
            f(3.0, 3)

    asyncio.run(main())
    assert kept.values("x") == [[0.0], [1.0], [3.0]]
